"""Lesson 09's checks: right answers pass with the stored line, stubs say so, wrong answers are named.

Every line is checked to be the only one printed (the checks once printed two when they named a bug).
"""

import torch

from helpers.attention import scaled_dot_product_attention
from helpers.checks import (
    check_global_window_mask,
    check_kept_pairs,
    check_kv_cache_bytes,
    check_local_attention,
    check_predict_memory_ratio,
)
from helpers.masks import causal_mask, dilated_mask, sliding_window_mask


def test_kv_cache_bytes(accepts, rejects):
    accepts(check_kv_cache_bytes, lambda n, B, H, L, D, b: 2 * n * B * H * L * D * b,
            "✓ kv_cache_bytes: matches the reference on all 3 cases")
    rejects(check_kv_cache_bytes, lambda *a: None, "not implemented yet")
    rejects(check_kv_cache_bytes, lambda n, B, H, L, D, b: n * B * H * L * D * b, "both the keys and the values")
    rejects(check_kv_cache_bytes, lambda n, B, H, L, D, b: 2 * B * H * L * D * b, "every layer caches")
    rejects(check_kv_cache_bytes, lambda n, B, H, L, D, b: 2 * n * B * H * L * D, "counts elements, not bytes")
    rejects(check_kv_cache_bytes, lambda n, B, H, L, D, b: 2.0 * n * B * H * L * D * b, "return an int, got float")
    rejects(check_kv_cache_bytes, lambda n, B, H, L, D, b: 2 * n * H * L * D * b, "✗ kv_cache_bytes: on 6 layers, B=8")


def kept_pairs(T, w, d):
    return sum(min(w, t // d + 1) for t in range(T))


def test_kept_pairs(accepts, rejects):
    accepts(check_kept_pairs, kept_pairs, "✓ kept_pairs: matches the reference on all 5 cases")
    rejects(check_kept_pairs, lambda T, w, d: None, "not implemented yet")
    rejects(check_kept_pairs, lambda T, w, d: w * T - d * w * (w - 1) // 2, "assumes T >= (window-1)*dilation")
    rejects(check_kept_pairs, lambda T, w, d: w * T, "fewer than `window`")
    rejects(check_kept_pairs, lambda T, w, d: w * T - w * (w - 1) // 2, "the sliding-window count")
    rejects(check_kept_pairs, lambda T, w, d: torch.tensor(kept_pairs(T, w, d)), "return an int, got Tensor")
    rejects(check_kept_pairs, lambda T, w, d: kept_pairs(T, w, d) / 1, "return an int, got float")
    rejects(check_kept_pairs, lambda T, w, d: int(dilated_mask(T, w, d).sum()), "as much as a (T, T) mask")


def global_window(T, window, n_global):
    s = torch.arange(T)
    return sliding_window_mask(T, window) | ((s[None, :] < n_global) & causal_mask(T))


def test_global_window_mask(accepts, rejects):
    accepts(check_global_window_mask, global_window, "✓ global_window_mask: matches the reference on all 4 cases")
    rejects(check_global_window_mask, lambda *a: None, "not implemented yet")
    rejects(check_global_window_mask, lambda T, w, g: ~global_window(T, w, g), "True = may attend")
    rejects(check_global_window_mask, lambda T, w, g: sliding_window_mask(T, w), "✗ global_window_mask")
    rejects(check_global_window_mask,
            lambda T, w, g: sliding_window_mask(T, w) | (torch.arange(T)[None, :] < g).expand(T, T),
            "a later global token")
    rejects(check_global_window_mask, lambda T, w, g: global_window(T, w, g).int(), "return dtype torch.bool")


def chunked(q, k, v, window):  # blocks of `window` queries against their nearby keys only
    B, H, T, D = q.shape
    out = torch.empty_like(q)
    for start in range(0, T, window):
        lo = max(0, start - window + 1)
        qs, ks, vs = q[:, :, start:start + window], k[:, :, lo:start + window], v[:, :, lo:start + window]
        t = torch.arange(start, start + qs.shape[2])[:, None]
        s = torch.arange(lo, lo + ks.shape[2])[None, :]
        mask = (s <= t) & (t - s < window)
        out[:, :, start:start + window] = scaled_dot_product_attention(qs, ks, vs, mask=mask)[0]
    return out


def test_local_attention(accepts, rejects):
    line = accepts(check_local_attention, chunked)
    assert line.startswith("✓ local_attention: matches the reference on all 4 cases, and at T=512, window=16 it")

    def masked_full(q, k, v, window):  # right values, but it builds the whole (T, T) matrix
        return scaled_dot_product_attention(q, k, v, mask=sliding_window_mask(q.shape[-2], window))[0]
    rejects(check_local_attention, masked_full, "at least one full")
    rejects(check_local_attention, lambda q, k, v, w: None, "not implemented yet")
    rejects(check_local_attention, lambda q, k, v, w: scaled_dot_product_attention(q, k, v)[0], "the mask is missing")
    rejects(check_local_attention, lambda q, k, v, w: chunked(q, k, v, w + 1), "window keys in all")

    def blocks_unmasked(q, k, v, window):  # the right keys for each block, but no mask inside it
        out = torch.empty_like(q)
        for start in range(0, q.shape[2], window):
            lo = max(0, start - window + 1)
            out[:, :, start:start + window] = scaled_dot_product_attention(
                q[:, :, start:start + window], k[:, :, lo:start + window], v[:, :, lo:start + window])[0]
        return out
    rejects(check_local_attention, blocks_unmasked, "queries see later keys of their own block")

    def whole_blocks_only(q, k, v, window):  # drops the last, shorter block when window does not divide T
        T = q.shape[2] - q.shape[2] % window
        out = torch.zeros_like(q)
        out[:, :, :T] = chunked(q[:, :, :T], k[:, :, :T], v[:, :, :T], window)
        return out
    rejects(check_local_attention, whole_blocks_only, "T not a multiple of the window")
    rejects(check_local_attention, lambda q, k, v, w: chunked(q.double(), k.double(), v.double(), w),
            "return dtype torch.float32")


def test_predict_memory_ratio(verdict):
    assert not verdict(check_predict_memory_ratio, None)[0]
    ok, line = verdict(check_predict_memory_ratio, 16)
    assert ok and line.startswith("✓ predict_memory_ratio: you predicted 16; the measured")
    assert not verdict(check_predict_memory_ratio, 4)[0]  # "4x more tokens, 4x more memory"
