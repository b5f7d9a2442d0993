"""helpers.attention against PyTorch's own attention modules (float64, copied weights)."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers.attention import MultiHeadAttention, scaled_dot_product_attention, softmax
from helpers.masks import causal_mask, padding_mask

DT = torch.float64


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=DT)


def random_mask(shape, seed):
    """A random boolean mask whose every row keeps at least its first key (no fully masked row)."""
    g = torch.Generator().manual_seed(seed)
    m = torch.rand(*shape, generator=g) > 0.4
    m[..., 0] = True
    return m


# --- softmax ---------------------------------------------------------------------------------

def test_softmax_matches_torch():
    x = rand(3, 4, 7)
    for dim in (-1, 0, 1):
        assert torch.allclose(softmax(x, dim=dim), torch.softmax(x, dim=dim), atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_softmax_is_stable_on_huge_logits(dtype):
    x = torch.tensor([[1e4, -1e4, 0.0], [1e4, 1e4, -1e4]], dtype=dtype)
    if dtype == torch.float16:
        x = x.clamp(-6e4, 6e4)
    p = softmax(x)
    assert torch.isfinite(p).all()
    expected = torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0]], dtype=dtype)
    assert torch.allclose(p, expected, atol=1e-3)
    # the naive formula overflows on the same input: the reason the max is subtracted
    naive = torch.exp(x) / torch.exp(x).sum(-1, keepdim=True)
    assert torch.isnan(naive).any()


def test_softmax_all_minus_inf_row_gives_zeros():
    x = torch.tensor([[float("-inf")] * 3, [0.0, float("-inf"), 0.0]])
    p = softmax(x)
    assert torch.equal(p[0], torch.zeros(3))
    assert torch.allclose(p[1], torch.tensor([0.5, 0.0, 0.5]))


# --- scaled dot-product attention vs F.scaled_dot_product_attention --------------------------

MASK_SHAPES = [(5, 7), (1, 7), (5, 1), (2, 1, 5, 7), (2, 3, 5, 7), (1, 3, 1, 7), (2, 1, 1, 7),
               (3, 5, 7), (7,)]


@pytest.mark.parametrize("mask_shape", [None, *MASK_SHAPES])
def test_sdpa_matches_torch_cross_attention(mask_shape):
    q, k, v = rand(2, 3, 5, 8, seed=1), rand(2, 3, 7, 8, seed=2), rand(2, 3, 7, 4, seed=3)
    mask = None if mask_shape is None else random_mask(mask_shape, seed=4)
    out, weights = scaled_dot_product_attention(q, k, v, mask=mask)
    # torch wants at least a 2-D mask; ours also takes a 1-D key mask (S,)
    ref_mask = mask.expand(5, 7) if mask is not None and mask.dim() == 1 else mask
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=ref_mask)
    assert out.shape == (2, 3, 5, 4) and weights.shape == (2, 3, 5, 7)
    assert (out - ref).abs().max() < 1e-12
    assert torch.allclose(weights.sum(-1), torch.ones(2, 3, 5, dtype=DT), atol=1e-12)


def test_sdpa_causal_matches_is_causal():
    q, k, v = rand(2, 6, 8, seed=5), rand(2, 6, 8, seed=6), rand(2, 6, 8, seed=7)
    out, weights = scaled_dot_product_attention(q, k, v, mask=causal_mask(6))
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert (out - ref).abs().max() < 1e-12
    assert torch.all(weights.triu(diagonal=1) == 0)


def test_fully_masked_row_gives_zeros_not_nan():
    q, k, v = rand(1, 3, 4), rand(1, 5, 4), rand(1, 5, 2)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[1] = False
    out, weights = scaled_dot_product_attention(q, k, v, mask=mask)
    assert torch.isfinite(out).all() and torch.isfinite(weights).all()
    assert torch.equal(out[0, 1], torch.zeros(2, dtype=DT))
    assert torch.equal(weights[0, 1], torch.zeros(5, dtype=DT))
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    keep = torch.tensor([0, 2])
    assert (out[:, keep] - ref[:, keep]).abs().max() < 1e-12


# --- multi-head attention vs nn.MultiheadAttention --------------------------------------------

def twin_modules(d_model=16, n_heads=4, bias=True, seed=0):
    torch.manual_seed(seed)
    ours = MultiHeadAttention(d_model, n_heads, bias=bias).to(DT)
    ref = nn.MultiheadAttention(d_model, n_heads, bias=bias, batch_first=True, dtype=DT)
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([ours.w_q.weight, ours.w_k.weight, ours.w_v.weight]))
        ref.out_proj.weight.copy_(ours.w_o.weight)
        if bias:
            ref.in_proj_bias.copy_(torch.cat([ours.w_q.bias, ours.w_k.bias, ours.w_v.bias]))
            ref.out_proj.bias.copy_(ours.w_o.bias)
    return ours.eval(), ref.eval()


def compare_mha(ours, ref, query, key, value, our_mask=None, **ref_kwargs):
    out, w = ours(query, key, value, mask=our_mask)
    ref_out, ref_w = ref(query, key, value, average_attn_weights=False, **ref_kwargs)
    return (out - ref_out).abs().max().item(), (w - ref_w).abs().max().item()


@pytest.mark.parametrize("bias", [True, False])
def test_mha_self_attention(bias):
    ours, ref = twin_modules(bias=bias)
    x = rand(3, 6, 16, seed=8)
    assert max(compare_mha(ours, ref, x, x, x)) < 1e-12


def test_mha_cross_attention():
    ours, ref = twin_modules()
    x, memory = rand(2, 4, 16, seed=9), rand(2, 9, 16, seed=10)
    assert max(compare_mha(ours, ref, x, memory, memory)) < 1e-12


def test_mha_causal():
    ours, ref = twin_modules()
    x = rand(2, 7, 16, seed=11)
    # polarity: ours True = may attend, nn.MultiheadAttention True = blocked
    diff = compare_mha(ours, ref, x, x, x, our_mask=causal_mask(7), attn_mask=~causal_mask(7))
    assert max(diff) < 1e-12


def test_mha_key_padding():
    ours, ref = twin_modules()
    x, memory = rand(3, 4, 16, seed=12), rand(3, 6, 16, seed=13)
    lengths = torch.tensor([6, 3, 1])
    ours_mask = padding_mask(lengths, 6)  # (B, 1, 1, S)
    kpm = ~ours_mask[:, 0, 0, :]  # (B, S), True = ignore
    assert max(compare_mha(ours, ref, x, memory, memory, our_mask=ours_mask,
                           key_padding_mask=kpm)) < 1e-12


def test_mha_causal_and_padding_combined():
    ours, ref = twin_modules()
    x = rand(2, 5, 16, seed=14)
    lengths = torch.tensor([5, 3])
    mask = causal_mask(5) & padding_mask(lengths, 5)  # (B, 1, 5, 5)
    diff = compare_mha(ours, ref, x, x, x, our_mask=mask, attn_mask=~causal_mask(5),
                       key_padding_mask=~padding_mask(lengths, 5)[:, 0, 0])
    assert max(diff) < 1e-12


def test_mha_parameter_count_equals_four_full_width_projections():
    ours, ref = twin_modules(d_model=32, n_heads=8)
    n = sum(p.numel() for p in ours.parameters())
    assert n == 4 * (32 * 32 + 32) == sum(p.numel() for p in ref.parameters())


# --- bad input gets a clear message -------------------------------------------------------------

def test_error_width_not_divisible_by_heads():
    with pytest.raises(ValueError, match=r"d_model=10 is not divisible by n_heads=3"):
        MultiHeadAttention(10, 3)


def test_error_mask_does_not_broadcast():
    q = k = v = rand(2, 5, 8)
    with pytest.raises(ValueError, match=r"mask of shape \(4, 5\) does not broadcast.*\(2, 5, 5\)"):
        scaled_dot_product_attention(q, k, v, mask=torch.ones(4, 5, dtype=torch.bool))
    mha = MultiHeadAttention(8, 2).to(DT)
    with pytest.raises(ValueError, match=r"mask of shape \(3, 1, 1, 5\).*\(B, H, T, S\) = \(2, 2, 5, 5\)"):
        mha(q, k, v, mask=torch.ones(3, 1, 1, 5, dtype=torch.bool))


def test_error_query_and_key_widths_differ():
    with pytest.raises(ValueError, match=r"q is \(2, 5, 8\) \(D=8\), k is \(2, 5, 6\) \(D=6\)"):
        scaled_dot_product_attention(rand(2, 5, 8), rand(2, 5, 6), rand(2, 5, 6))


def test_error_non_boolean_mask():
    q = k = v = rand(2, 5, 8)
    with pytest.raises(TypeError, match=r"mask must be boolean.*got dtype torch.float32"):
        scaled_dot_product_attention(q, k, v, mask=torch.zeros(5, 5))


def test_error_key_value_lengths_differ():
    with pytest.raises(ValueError, match=r"k is \(1, 5, 4\), v is \(1, 6, 4\)"):
        scaled_dot_product_attention(rand(1, 3, 4), rand(1, 5, 4), rand(1, 6, 4))


def test_error_mha_input_width():
    mha = MultiHeadAttention(8, 2)
    with pytest.raises(ValueError, match=r"query must have shape \(B, L, d_model=8\), got \(2, 5, 6\)"):
        mha(torch.randn(2, 5, 6), torch.randn(2, 5, 8), torch.randn(2, 5, 8))


def test_error_integer_inputs():
    with pytest.raises(TypeError, match=r"q must be a floating-point tensor, got dtype torch.int64"):
        scaled_dot_product_attention(torch.ones(2, 3, dtype=torch.long), rand(2, 3), rand(2, 3))
