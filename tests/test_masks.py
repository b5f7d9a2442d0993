"""helpers.masks: the masks of lessons 05 and 09 by hand, and their properties against loops and PyTorch."""


import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from helpers.attention import MultiHeadAttention, scaled_dot_product_attention
from helpers.masks import (
    cached_causal_mask,
    causal_mask,
    dilated_mask,
    padding_mask,
    padding_mask_from_ids,
    sliding_window_mask,
)


def tensor(seed, *shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


# --- properties of the masks --------------------------------------------------------------------

@given(T=st.integers(1, 12))
def test_causal_mask_is_the_loop_definition(T):
    m = causal_mask(T)
    assert m.dtype == torch.bool and m.shape == (T, T)
    assert all(m[t, s].item() == (s <= t) for t in range(T) for s in range(T))
    assert m.sum().item() == T * (T + 1) // 2


@given(lengths=st.lists(st.integers(0, 9), min_size=1, max_size=5), extra=st.integers(0, 3))
def test_padding_mask_counts_and_prefix(lengths, extra):
    S = max(max(lengths), 1) + extra
    m = padding_mask(lengths, S)
    assert m.shape == (len(lengths), 1, 1, S) and m.dtype == torch.bool
    assert m.sum(-1).flatten().tolist() == lengths
    assert all(m[b, 0, 0, :n].all() and not m[b, 0, 0, n:].any() for b, n in enumerate(lengths))


@given(B=st.integers(1, 3), H=st.integers(1, 3), T=st.integers(1, 7), D=st.integers(1, 5),
       seed=st.integers(0, 10_000))
def test_causal_attention_equals_torch_is_causal(B, H, T, D, seed):
    q, k, v = tensor(seed, B, H, T, D), tensor(seed + 1, B, H, T, D), tensor(seed + 2, B, H, T, D)
    ours, w = scaled_dot_product_attention(q, k, v, mask=causal_mask(T))
    theirs = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.allclose(ours, theirs, atol=1e-12)
    assert torch.all(w.triu(1) == 0)


@given(T=st.integers(2, 7), seed=st.integers(0, 10_000))
def test_minus_inf_and_renormalise_agree(T, seed):
    scores = tensor(seed, 2, T, T) * 3
    keep = causal_mask(T)
    way1 = torch.softmax(scores.masked_fill(~keep, float("-inf")), -1)
    p = torch.softmax(scores, -1) * keep
    way2 = p / p.sum(-1, keepdim=True)
    assert torch.allclose(way1, way2, atol=1e-12)


@given(lengths=st.lists(st.integers(1, 6), min_size=1, max_size=3), seed=st.integers(0, 10_000))
def test_combined_mask_matches_torch_mha_with_inverted_masks(lengths, seed):
    T = max(lengths)
    torch.manual_seed(seed)
    ours = MultiHeadAttention(8, 2).double().eval()
    ref = nn.MultiheadAttention(8, 2, batch_first=True, dtype=torch.float64).eval()
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([ours.w_q.weight, ours.w_k.weight, ours.w_v.weight]))
        ref.in_proj_bias.copy_(torch.cat([ours.w_q.bias, ours.w_k.bias, ours.w_v.bias]))
        ref.out_proj.weight.copy_(ours.w_o.weight)
        ref.out_proj.bias.copy_(ours.w_o.bias)
    x = tensor(seed, len(lengths), T, 8)
    keep = causal_mask(T) & padding_mask(lengths, T)  # (B, 1, T, S); no row is empty: key 0 is real
    out, w = ours(x, x, x, mask=keep)
    out_ref, w_ref = ref(x, x, x, attn_mask=~causal_mask(T), key_padding_mask=~padding_mask(lengths, T)[:, 0, 0],
                         average_attn_weights=False)
    assert torch.allclose(out, out_ref, atol=1e-10) and torch.allclose(w, w_ref, atol=1e-10)


@given(T=st.integers(1, 6), seed=st.integers(0, 10_000))
def test_fully_masked_rows_give_zeros_not_nan(T, seed):
    q, k, v = tensor(seed, 2, T, 4), tensor(seed + 1, 2, T, 4), tensor(seed + 2, 2, T, 3)
    keep = causal_mask(T) & padding_mask([0, T], T)[:, 0]  # item 0: every key is padding
    out, w = scaled_dot_product_attention(q, k, v, mask=keep)
    assert torch.isfinite(out).all() and torch.all(out[0] == 0) and torch.all(w[0] == 0)
    assert torch.allclose(w[1].sum(-1), torch.ones(T, dtype=torch.float64))


# --- sparse masks ----------------------------------------------------------------------------------

def test_sliding_window_mask_values():
    assert sliding_window_mask(4, 2).int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]]
    assert dilated_mask(5, 2, 2).int().tolist() == [[1, 0, 0, 0, 0], [0, 1, 0, 0, 0], [1, 0, 1, 0, 0],
                                                    [0, 1, 0, 1, 0], [0, 0, 1, 0, 1]]


@given(T=st.integers(1, 60), window=st.integers(1, 12), dilation=st.integers(1, 5))
def test_kept_pairs_exact_and_causal(T, window, dilation):
    m = dilated_mask(T, window, dilation)
    assert m.dtype == torch.bool and m.shape == (T, T)
    assert not (m & ~causal_mask(T)).any()  # nothing above the diagonal: causal
    assert m.diagonal().all()  # every query sees itself, so no row is empty
    per_row = [min(window, t // dilation + 1) for t in range(T)]
    assert m.sum(dim=1).tolist() == per_row
    if T >= (window - 1) * dilation:  # the closed form of the lesson
        assert int(m.sum()) == window * T - dilation * window * (window - 1) // 2
    assert torch.equal(dilated_mask(T, window, 1), sliding_window_mask(T, window))


def test_window_covering_everything_is_causal():
    assert torch.equal(sliding_window_mask(7, 7), causal_mask(7))
    assert torch.equal(sliding_window_mask(7, 100), causal_mask(7))
    assert torch.equal(sliding_window_mask(7, 1), torch.eye(7, dtype=torch.bool))


def test_mask_errors_name_the_values():
    with pytest.raises(ValueError, match=r"T must be a positive int, got 0"):
        sliding_window_mask(0, 2)
    with pytest.raises(ValueError, match=r"window must be a positive int, got -1"):
        sliding_window_mask(3, -1)
    with pytest.raises(ValueError, match=r"dilation must be a positive int, got True"):
        dilated_mask(3, 2, True)


# --- mask values by hand --------------------------------------------------------------------------

def test_causal_mask_values():
    m = causal_mask(4)
    assert m.dtype == torch.bool and m.shape == (4, 4)
    assert m.tolist() == [[True, False, False, False], [True, True, False, False],
                          [True, True, True, False], [True, True, True, True]]



def test_padding_mask_values():
    m = padding_mask([3, 1, 0], 4)
    assert m.shape == (3, 1, 1, 4)
    assert m[:, 0, 0].tolist() == [[True, True, True, False], [True, False, False, False],
                                   [False, False, False, False]]



def test_causal_and_padding_mask_errors_name_the_values():
    with pytest.raises(ValueError, match=r"T must be a positive int, got 0"):
        causal_mask(0)
    with pytest.raises(ValueError, match=r"every length must lie in \[0, S=4\], got \[5\] at batch positions \[1\]"):
        padding_mask([2, 5], 4)
    with pytest.raises(ValueError, match=r"lengths must be a 1-D sequence of ints"):
        padding_mask(torch.tensor([1.5]), 4)


# --- masks from ids, and the cached causal mask ---------------------------------------------------

def test_padding_mask_from_ids():
    ids = torch.tensor([[5, 6, 0, 0], [0, 3, 4, 0]])
    mask = padding_mask_from_ids(ids, 0)
    assert mask.shape == (2, 1, 1, 4) and mask[:, 0, 0].tolist() == [[True, True, False, False],
                                                                     [False, True, True, False]]
    with pytest.raises(TypeError, match="ids must hold integer token ids, got dtype torch.float32"):
        padding_mask_from_ids(ids.float(), 0)
    with pytest.raises(ValueError, match=r"ids must have shape \(B, S\), got \(4\)"):
        padding_mask_from_ids(ids[0], 0)



def test_cached_causal_mask_shifts_the_causal_mask_by_the_cached_positions():
    assert torch.equal(cached_causal_mask(0, 5, 5), causal_mask(5))
    assert torch.equal(cached_causal_mask(3, 2, 5), causal_mask(5)[3:])  # the last two rows of the full mask
    assert torch.equal(cached_causal_mask(torch.tensor(3), 2, 7)[:, :5], causal_mask(5)[3:])  # a static cache's slots
    assert not cached_causal_mask(torch.tensor(3), 2, 7)[:, 5:].any()  # slots not written yet
