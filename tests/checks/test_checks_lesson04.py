"""Lesson 04's checks: right answers pass with the stored line, stubs say so, wrong answers are named.

The references behind the checks are also tested against PyTorch's own modules (float64).
"""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from helpers.attention import MultiHeadAttention
from helpers.checks import (
    check_grouped_query_attention,
    check_mha_param_count,
    check_pattern_mass,
    check_predict_weights_ratio,
    check_split_qkv,
)
from helpers.checks.lesson04 import (
    grouped_query_attention_reference,
    mha_param_count_reference,
    pattern_mass_reference,
    split_qkv_reference,
)

DT = torch.float64


# --- the references against PyTorch --------------------------------------------------------------

@given(d_model_per_head=st.integers(1, 12), n_heads=st.integers(1, 8), bias=st.booleans())
def test_param_count_reference_equals_both_modules(d_model_per_head, n_heads, bias):
    d_model = d_model_per_head * n_heads
    ours = MultiHeadAttention(d_model, n_heads, bias=bias)
    ref = nn.MultiheadAttention(d_model, n_heads, bias=bias)
    expected = mha_param_count_reference(d_model, n_heads, bias)
    assert expected == sum(p.numel() for p in ours.parameters())
    assert expected == sum(p.numel() for p in ref.parameters())


@pytest.mark.parametrize("B, T, C, H", [(2, 5, 12, 3), (1, 7, 16, 4), (3, 1, 8, 8)])
def test_split_qkv_reference_rebuilds_nn_multiheadattention(B, T, C, H):
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(C, H, batch_first=True, dtype=DT)
    x = torch.randn(B, T, C, dtype=DT)
    q, k, v = split_qkv_reference(x, ref.in_proj_weight, ref.in_proj_bias, H)
    assert q.shape == k.shape == v.shape == (B, H, T, C // H)
    heads = F.scaled_dot_product_attention(q, k, v)  # (B, H, T, D)
    out = ref.out_proj(heads.transpose(1, 2).reshape(B, T, C))
    expected, _ = ref(x, x, x)
    assert (out - expected).abs().max().item() < 1e-12


@pytest.mark.parametrize("H, G", [(4, 2), (6, 3), (8, 1), (4, 4)])
def test_gqa_reference_equals_torch_enable_gqa(H, G):
    torch.manual_seed(1)
    q = torch.randn(2, H, 3, 8, dtype=DT)
    k, v = torch.randn(2, G, 5, 8, dtype=DT), torch.randn(2, G, 5, 8, dtype=DT)
    expected = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    assert (grouped_query_attention_reference(q, k, v) - expected).abs().max().item() < 1e-12


@given(seed=st.integers(0, 2**16), T=st.integers(1, 6), S=st.integers(1, 6))
def test_pattern_mass_is_one_on_all_keys_and_matches_a_loop(seed, T, S):
    g = torch.Generator().manual_seed(seed)
    weights = torch.randn(2, 3, T, S, generator=g, dtype=DT).softmax(dim=-1)
    full = torch.ones(T, S, dtype=torch.bool)
    assert torch.allclose(pattern_mass_reference(weights, full), torch.ones(3, dtype=DT))
    pattern = torch.rand(T, S, generator=g) < 0.4
    got = pattern_mass_reference(weights, pattern)
    rows = [t for t in range(T) if pattern[t].any()]
    for h in range(3):  # a plain loop over heads, items and rows
        masses = [sum(weights[b, h, t, s].item() for s in range(S) if pattern[t, s])
                  for b in range(2) for t in rows]
        expected = sum(masses) / len(masses) if masses else float("nan")
        assert (torch.isnan(got[h]) and not masses) or abs(got[h].item() - expected) < 1e-12


# --- the checks: right answers pass, stubs and bugs are reported ----------------------------------

def test_check_mha_param_count(capsys):
    assert check_mha_param_count(lambda c, h, bias=True: 4 * c * c + 4 * c * bias)
    assert "✓ mha_param_count" in capsys.readouterr().out
    assert not check_mha_param_count(lambda c, h, bias=True: None)
    assert "not implemented yet" in capsys.readouterr().out
    assert not check_mha_param_count(lambda c, h, bias=True: 4 * c * c + 4 * c)  # bias always counted
    out = capsys.readouterr().out
    assert "bias=False" in out and "the biases are counted although bias=False" in out
    assert not check_mha_param_count(lambda c, h, bias=True: 4 * h * (c // h) ** 2 + 4 * c)  # per-head D x D
    assert "✗ mha_param_count" in capsys.readouterr().out


def _project(x, w, b):
    return F.linear(x, w, b).chunk(3, dim=-1)  # 3 x (B, T, C)


def test_check_split_qkv(capsys):
    def right(x, w, b, n_heads):
        B, T, C = x.shape
        return [t.reshape(B, T, n_heads, C // n_heads).permute(0, 2, 1, 3) for t in _project(x, w, b)]
    assert check_split_qkv(right)
    assert "✓ split_qkv" in capsys.readouterr().out
    assert not check_split_qkv(lambda x, w, b, n_heads: None)
    assert "not implemented yet" in capsys.readouterr().out

    def wrong_view(x, w, b, n_heads):  # the lesson's trap: right shape, tokens mixed
        B, T, C = x.shape
        return [t.reshape(B, n_heads, T, C // n_heads) for t in _project(x, w, b)]
    assert not check_split_qkv(wrong_view)
    assert "mixes tokens" in capsys.readouterr().out

    def k_and_v_swapped(x, w, b, n_heads):
        q, k, v = right(x, w, b, n_heads)
        return q, v, k
    assert not check_split_qkv(k_and_v_swapped)
    assert "q, k and v come out in the wrong order" in capsys.readouterr().out


def test_check_grouped_query_attention(capsys):
    assert check_grouped_query_attention(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
    assert "✓ grouped_query_attention" in capsys.readouterr().out
    assert not check_grouped_query_attention(lambda q, k, v: None)
    assert "not implemented yet" in capsys.readouterr().out

    def tiled(q, k, v):  # repeat instead of repeat_interleave: heads paired with the wrong group
        r = q.shape[1] // k.shape[1]
        return F.scaled_dot_product_attention(q, k.repeat(1, r, 1, 1), v.repeat(1, r, 1, 1))
    assert not check_grouped_query_attention(tiled)
    out = capsys.readouterr().out
    assert "H=4 query heads sharing G=2" in out and "consecutive heads share a group" in out
    assert not check_grouped_query_attention(lambda q, k, v: F.scaled_dot_product_attention(q, k, v))
    assert "raised RuntimeError" in capsys.readouterr().out  # G != H cannot broadcast


def test_check_pattern_mass(capsys):
    assert check_pattern_mass(pattern_mass_reference)
    assert "✓ pattern_mass" in capsys.readouterr().out
    assert not check_pattern_mass(lambda w, p: None)
    assert "not implemented yet" in capsys.readouterr().out
    all_rows = lambda w, p: (w * p).sum(-1).mean(dim=(0, 2))  # noqa: E731  (counts empty rows as 0)
    assert not check_pattern_mass(all_rows)
    out = capsys.readouterr().out
    assert "row 0 has no True" in out and "must be left out of the mean" in out
    per_item = lambda w, p: (w * p).sum(-1)[..., p.any(-1)].mean(dim=-1)  # noqa: E731  (forgot the batch)
    assert not check_pattern_mass(per_item)
    assert "shape (3, 2), but the reference gives (2,)" in capsys.readouterr().out


def test_more_wrong_answers(accepts, rejects):
    accepts(check_mha_param_count, mha_param_count_reference, "✓ mha_param_count: matches the reference on all 4 cases")
    rejects(check_mha_param_count, lambda c, h, bias=True: float(mha_param_count_reference(c, h, bias)),
            "return an int, got float")
    rejects(check_mha_param_count, lambda c, h, bias=True: 3 * c * c + 3 * c * bias, "output projection is missing")
    rejects(check_mha_param_count, lambda c, h, bias=True: h * (4 * c * c + 4 * c * bias), "depends on n_heads")
    rejects(check_mha_param_count, lambda c, h, bias=True: sum(p.numel() for p in MultiHeadAttention(c, h, bias=bias)
                                                                .parameters()), "without building the module")
    accepts(check_split_qkv, split_qkv_reference, "✓ split_qkv: matches the reference on all 3 cases")
    rejects(check_split_qkv, lambda x, w, b, h: split_qkv_reference(x, w, None, h), "the bias is missing")
    rejects(check_split_qkv, lambda x, w, b, h: [t.double() for t in split_qkv_reference(x, w, b, h)],
            "return dtype torch.float32")

    def flat_view(x, w, b, h):  # view on the input: crashes on a transposed x
        B, T, C = x.shape
        return split_qkv_reference(x.view(B * T, C).view(B, T, C), w, b, h)
    rejects(check_split_qkv, flat_view, "non-contiguous")
    accepts(check_grouped_query_attention, grouped_query_attention_reference,
            "✓ grouped_query_attention: matches the reference on all 4 cases")
    rejects(check_grouped_query_attention, lambda q, k, v: grouped_query_attention_reference(q, k, v).numpy(),
            "return a torch.Tensor")
    rejects(check_grouped_query_attention, lambda q, k, v: grouped_query_attention_reference(q, k[:, :1], v[:, :1]),
            "✗ grouped_query_attention")
    accepts(check_pattern_mass, pattern_mass_reference, "✓ pattern_mass: matches the reference on all 3 cases")
    rejects(check_pattern_mass, lambda w, p: (w * p).sum(-1)[..., p.any(-1)].mean(dim=(1, 2)),
            "return one number per head")

    def zeroes_in_place(w, p):
        w.mul_(p)
        return pattern_mass_reference(w, p)
    rejects(check_pattern_mass, zeroes_in_place, "in place")


def test_predict_weights_ratio(verdict):
    assert not verdict(check_predict_weights_ratio, None)[0]
    ok, line = verdict(check_predict_weights_ratio, 8)
    assert ok and line.startswith("✓ predict_weights_ratio: you predicted 8; the measured")
    assert not verdict(check_predict_weights_ratio, 1)[0]  # "the same, like the parameters"
    assert not verdict(check_predict_weights_ratio, 1 / 8)[0]


def test_predict_weights_ratio_names_the_classic_slips(verdict):
    for wrong, words in [(1, "every head has its own (T, T) matrix"), (1 / 8, "upside down"), (64, "64 is C"),
                         (3, "count them for H = 8 and for H = 1")]:
        ok, line = verdict(check_predict_weights_ratio, wrong)
        assert not ok and words in line, line
