"""Lesson 06's checks: right answers pass with the stored line, stubs say so, wrong answers are named."""

import math

import torch

from helpers.checks import (
    check_alibi_bias,
    check_distance_scores,
    check_predict_self_dot,
    check_rotate_half,
    check_shift_matrix,
)
from helpers.checks.lesson06 import _distance_scores, _rotate_half
from helpers.positional import apply_rotary, sinusoidal_encoding


def shift_matrix(k, d_model):  # a loop over the 2 x 2 rotation blocks of each frequency
    m = torch.zeros(d_model, d_model, dtype=torch.float64)
    for i in range(d_model // 2):
        w = 10000.0 ** (-2 * i / d_model)
        c, s = math.cos(k * w), math.sin(k * w)
        m[2 * i, 2 * i], m[2 * i, 2 * i + 1], m[2 * i + 1, 2 * i], m[2 * i + 1, 2 * i + 1] = c, s, -s, c
    return m.float()


def test_shift_matrix(accepts, rejects):
    accepts(check_shift_matrix, shift_matrix, "✓ shift_matrix: matches the reference on all 4 cases")
    rejects(check_shift_matrix, lambda k, d: None, "not implemented yet")
    rejects(check_shift_matrix, lambda k, d: shift_matrix(k, d).T, "transpose, which shifts by -k")
    rejects(check_shift_matrix, lambda k, d: torch.eye(d), "✗ shift_matrix: on k=1, d_model=4: values differ")
    # the exercise states no dtype: float64 (the lesson's own precision) passes on its values; float16 does not
    accepts(check_shift_matrix, lambda k, d: shift_matrix(k, d).double(),
            "✓ shift_matrix: matches the reference on all 4 cases")
    rejects(check_shift_matrix, lambda k, d: shift_matrix(k, d).double().T, "transpose, which shifts by -k")
    rejects(check_shift_matrix, lambda k, d: shift_matrix(k, d).half(), "return dtype torch.float32")
    rejects(check_shift_matrix, lambda k, d: shift_matrix(k, d).numpy(), "return a torch.Tensor")
    rejects(check_shift_matrix, lambda k, d: shift_matrix(abs(k), d), "✗ shift_matrix: on k=-3")


def test_distance_scores(accepts, rejects):
    accepts(check_distance_scores, _distance_scores, "✓ distance_scores: matches the reference on all 3 cases")
    # the exercise forbids building the encoding: right values from PE @ PE.T are rejected
    rejects(check_distance_scores, lambda n, d: sinusoidal_encoding(n, d) @ sinusoidal_encoding(n, d).T,
            "builds the encoding")

    def by_hand(n, d):
        pos = torch.arange(n, dtype=torch.float64)[:, None]
        w = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
        pe = torch.stack((torch.sin(pos * w), torch.cos(pos * w)), dim=-1).flatten(1)
        return (pe @ pe.T).float()
    rejects(check_distance_scores, by_hand, "builds the encoding")
    rejects(check_distance_scores, lambda n, d: None, "not implemented yet")
    accepts(check_distance_scores, lambda n, d: _distance_scores(n, d).double())  # float64 counts by its values
    rejects(check_distance_scores, lambda n, d: 2 * _distance_scores(n, d).double(), "twice the reference")

    def all_frequencies(n, d):  # one frequency per feature instead of per pair
        w = 10000.0 ** (-torch.arange(d, dtype=torch.float64) / d)
        p = torch.arange(n, dtype=torch.float64)
        return torch.cos((p[:, None] - p[None, :])[..., None] * w).sum(-1).float()
    rejects(check_distance_scores, all_frequencies, "d_model / 2 of them")
    rejects(check_distance_scores, lambda n, d: 2 * sinusoidal_encoding(n, d) @ sinusoidal_encoding(n, d).T,
            "twice the reference")
    rejects(check_distance_scores, lambda n, d: (sinusoidal_encoding(n, d) @ sinusoidal_encoding(n, d).T).numpy(),
            "return a torch.Tensor")


def test_rotate_half(accepts, rejects):
    accepts(check_rotate_half, _rotate_half, "✓ rotate_half: matches the reference on all 3 cases")
    rejects(check_rotate_half, lambda x: None, "not implemented yet")
    rejects(check_rotate_half, apply_rotary, "interleaved layout of apply_rotary")
    rejects(check_rotate_half, lambda x: _rotate_half(x, sign=-1.0), "wrong way")
    rejects(check_rotate_half, lambda x: x[..., :1], "shape")

    def rotates_in_place(x):
        out = _rotate_half(x)
        x.copy_(out)
        return out
    rejects(check_rotate_half, rotates_in_place, "in place")
    rejects(check_rotate_half, lambda x: _rotate_half(x.double()), "return dtype torch.float32")


def alibi(T, slope):
    pos = torch.arange(T)
    return -slope * (pos[:, None] - pos[None, :]).abs().float()


def test_alibi_bias(accepts, rejects):
    accepts(check_alibi_bias, alibi, "✓ alibi_bias: matches the reference on all 3 cases")
    rejects(check_alibi_bias, lambda T, s: None, "not implemented yet")
    rejects(check_alibi_bias, lambda T, s: -alibi(T, s), "sign is flipped")
    rejects(check_alibi_bias, lambda T, s: -s * (torch.arange(T)[:, None] - torch.arange(T)[None, :]).float(),
            "use the distance |m - n|")
    rejects(check_alibi_bias, lambda T, s: alibi(T, s).double(), "return dtype torch.float32")
    rejects(check_alibi_bias, lambda T, s: alibi(T, s).tril(), "the bias is 0 above the diagonal")


def test_predict_self_dot(verdict):
    assert not verdict(check_predict_self_dot, None)[0]
    ok, line = verdict(check_predict_self_dot, 32)
    assert ok and line.startswith("✓ predict_self_dot: you predicted 32; the measured PE(37) . PE(37)")
    assert not verdict(check_predict_self_dot, 64)[0]  # "64 features": each (sin, cos) pair gives 1, not 2
    assert not verdict(check_predict_self_dot, 1)[0]


def test_predict_self_dot_names_the_classic_slips(verdict):
    for wrong, words in [(64, "d_model / 2 = 32 pairs"), (1, "not normalised"), (8, "length of a 64-vector"),
                         (37, "the position does not matter"), (20, "what does one pair contribute")]:
        ok, line = verdict(check_predict_self_dot, wrong)
        assert not ok and words in line, line
