"""Lesson 00's checks: right answers pass with the stored line, stubs say so, wrong answers are named."""

import numpy as np
import torch

from helpers.checks import check_merge_heads, check_scores_shape, check_split_heads


def split_heads(x, n_heads):
    B, T, C = x.shape
    return x.view(B, T, n_heads, C // n_heads).transpose(1, 2)


def merge_heads(x):
    B, H, T, D = x.shape
    return x.transpose(1, 2).reshape(B, T, H * D)


def test_split_heads(accepts, rejects):
    accepts(check_split_heads, split_heads, "✓ split_heads: matches the reference on all 3 cases")
    rejects(check_split_heads, lambda x, h: None, "not implemented yet")
    rejects(check_split_heads, lambda x, h: x.reshape(x.shape[0], h, x.shape[1], -1), "view(B, T, H, D) first")
    rejects(check_split_heads, lambda x, h: x.view(x.shape[0], x.shape[1], h, -1), "the transpose is missing")
    rejects(check_split_heads, lambda x, h: split_heads(x, h).numpy(), "return a torch.Tensor")
    rejects(check_split_heads, lambda x, h: split_heads(x, h).double(), "return dtype torch.float32")


def test_merge_heads(accepts, rejects):
    accepts(check_merge_heads, merge_heads, "✓ merge_heads: matches the reference on all 2 cases")
    accepts(check_merge_heads, lambda x: x.permute(0, 2, 1, 3).flatten(2))
    rejects(check_merge_heads, lambda x: None, "not implemented yet")
    # the known hole: view after transpose only works on the transposed output of split_heads
    rejects(check_merge_heads, lambda x: x.transpose(1, 2).view(x.shape[0], x.shape[2], -1), "raised RuntimeError")
    rejects(check_merge_heads, lambda x: x.reshape(x.shape[0], x.shape[2], -1), "the transpose is missing")
    rejects(check_merge_heads, lambda x: merge_heads(x.mul_(2)) / 2, "in place")
    rejects(check_merge_heads, lambda x: merge_heads(x).numpy(), "return a torch.Tensor")
    rejects(check_merge_heads, lambda x: x.permute(0, 2, 3, 1).reshape(x.shape[0], x.shape[2], -1),
            "✗ merge_heads: on the output of split_heads(x (2, 3, 8), 2)")


def test_scores_shape(accepts, rejects):
    accepts(check_scores_shape, lambda B, H, T, S: (B, H, T, S), "✓ scores_shape: matches the reference on all 2 cases")
    accepts(check_scores_shape, lambda B, H, T, S: torch.Size([B, H, T, S]))
    rejects(check_scores_shape, lambda B, H, T, S: None, "not implemented yet")
    rejects(check_scores_shape, lambda B, H, T, S: (B, H, S, T), "T and S are swapped")
    rejects(check_scores_shape, lambda B, H, T, S: (B, T, S), "the head axis is missing")
    rejects(check_scores_shape, lambda B, H, T, S: (B, H, T, T), "✗ scores_shape: on B=2, H=4, T=3, S=5")
    rejects(check_scores_shape, lambda B, H, T, S: (B, H, T, S / 1), "✗ scores_shape")
    rejects(check_scores_shape, lambda B, H, T, S: np.array([B, H, T, S]), "expected a tuple of 4 results, got ndarray")
