"""helpers.attention against PyTorch's own attention modules (float64, copied weights)."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers.attention import MultiHeadAttention, scaled_dot_product_attention, softmax, to_torch_mha
from helpers.masks import causal_mask, padding_mask, padding_mask_from_ids

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
               (1, 3, 5, 7), (7,)]  # a 3-D mask on 4-D scores is refused (test_validation)


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
    ours = MultiHeadAttention(d_model, n_heads, bias=bias).to(DT).eval()
    return ours, to_torch_mha(ours)


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


# --- to_torch_mha: the weight copy of lesson 04 ----------------------------------------------------

@pytest.mark.parametrize("bias", [True, False])
def test_to_torch_mha_copies_every_weight_dtype_device_and_mode(bias):
    ours = MultiHeadAttention(16, 4, dropout=0.25, bias=bias).to(DT)
    theirs = to_torch_mha(ours)
    assert isinstance(theirs, nn.MultiheadAttention) and theirs.batch_first and theirs.training
    assert theirs.in_proj_weight.dtype == DT and theirs.in_proj_weight.device == ours.w_q.weight.device
    assert theirs.dropout == 0.25 and theirs.num_heads == 4
    C = 16
    for i, w in enumerate((ours.w_q, ours.w_k, ours.w_v)):
        assert torch.equal(theirs.in_proj_weight[i * C:(i + 1) * C], w.weight)
        if bias:
            assert torch.equal(theirs.in_proj_bias[i * C:(i + 1) * C], w.bias)
    assert torch.equal(theirs.out_proj.weight, ours.w_o.weight)
    assert (theirs.in_proj_bias is None) == (not bias) and (theirs.out_proj.bias is None) == (not bias)
    assert not to_torch_mha(ours.eval()).training
    theirs.in_proj_weight.data.zero_()  # a copy, not a view: ours is untouched
    assert ours.w_q.weight.abs().sum() > 0


def test_to_torch_mha_rejects_other_modules():
    with pytest.raises(TypeError, match=r"module must be a helpers.attention.MultiHeadAttention, got Linear"):
        to_torch_mha(nn.Linear(4, 4))


# --- need_weights=False: PyTorch's fused kernel ------------------------------------------------------

def every_mask_shape(B=3, H=4, T=5, S=6, seed=0):
    """One boolean mask of every shape MultiHeadAttention accepts, each with a fully masked row."""
    g = torch.Generator().manual_seed(seed)
    shapes = [(T, S), (B, 1, 1, S), (B, H, T, S), (1, H, T, S), (B, 1, T, S), (1, 1, T, S), (B, H, 1, S),
              (1, 1, 1, S), (B, 1, T, 1), (1, 1, 1, 1)]
    masks = {}
    for shape in shapes:
        m = torch.rand(*shape, generator=g) > 0.4
        m.view(-1, m.shape[-1])[0] = False  # a row with no key at all: zeros, never NaN
        masks[shape] = m
    return masks


@pytest.mark.parametrize("shape", list(every_mask_shape()), ids=str)
def test_need_weights_false_equals_the_weights_path(shape):
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4).to(DT).eval()
    x, memory = rand(3, 5, 16, seed=1), rand(3, 6, 16, seed=2)
    mask = every_mask_shape()[shape]
    out, weights = mha(x, memory, memory, mask=mask)
    fused, none = mha(x, memory, memory, mask=mask, need_weights=False)
    assert none is None and torch.isfinite(fused).all()
    assert (fused - out).abs().max().item() < 1e-10
    empty = ~mask.expand(3, 4, 5, 6).any(-1)  # (B, H, T): rows with no key
    assert empty.any() and torch.all(weights[empty] == 0)


def test_need_weights_false_without_mask_and_in_cross_attention():
    mha = MultiHeadAttention(16, 4).to(DT).eval()
    x, memory = rand(2, 7, 16, seed=3), rand(2, 3, 16, seed=4)
    for q, kv in ((x, x), (x, memory)):
        assert (mha(q, kv, kv, need_weights=False)[0] - mha(q, kv, kv)[0]).abs().max() < 1e-10


def test_need_weights_false_fully_masked_rows_give_zeros_not_nan():
    mha = MultiHeadAttention(8, 2).to(DT).eval()
    x = rand(2, 4, 8, seed=5)
    nothing = torch.zeros(2, 1, 1, 4, dtype=torch.bool)
    nothing[0, ..., :2] = True  # item 0 reads its first two keys, item 1 reads nothing
    out, _ = mha(x, x, x, mask=nothing, need_weights=False)
    assert torch.isfinite(out).all()
    assert torch.allclose(out[1], mha.w_o.bias.expand(4, 8))  # zero attention, then W_O's bias


def test_need_weights_false_applies_dropout_in_training_only():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4, dropout=0.5).to(DT)
    x = rand(2, 6, 16, seed=6)
    mask = causal_mask(6)
    assert torch.equal(mha.eval()(x, x, x, mask=mask, need_weights=False)[0],
                       mha(x, x, x, mask=mask, need_weights=False)[0])  # eval: deterministic
    mha.train()
    a, b = (mha(x, x, x, mask=mask, need_weights=False)[0] for _ in range(2))
    assert (a - b).abs().max() > 1e-3  # train: dropout on the weights, a fresh draw each call
    # dropout scales kept weights by 1 / (1 - p), so the mean over many draws is the eval output
    mean = torch.stack([mha(x, x, x, mask=mask, need_weights=False)[0] for _ in range(2000)]).mean(0)
    expected = mha.eval()(x, x, x, mask=mask)[0]
    assert (mean - expected).abs().max() < 0.1


def test_need_weights_must_be_bool():
    mha = MultiHeadAttention(8, 2)
    x = torch.randn(1, 3, 8)
    with pytest.raises(TypeError, match=r"need_weights must be True or False, got 0"):
        mha(x, x, x, need_weights=0)


# --- float16 / bfloat16: scores and softmax in float32 ----------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_with_large_scores_stay_finite_and_match_pytorch(dtype):
    g = torch.Generator().manual_seed(0)
    q, k, v = (100 + torch.randn(3, 2, 8, 64, generator=g)).to(dtype).unbind(0)  # q.k ~ 640000 > 65504
    assert not torch.isfinite((q @ k.transpose(-2, -1)).float()).all() or dtype == torch.bfloat16
    out, weights = scaled_dot_product_attention(q, k, v)
    assert out.dtype == weights.dtype == dtype
    assert torch.isfinite(out).all() and torch.isfinite(weights).all()
    ref = F.scaled_dot_product_attention(q, k, v)
    assert torch.isfinite(ref).all()
    tol = 0.07 if dtype == torch.float16 else 0.5  # 1 ulp at 100: 0.0625 (float16), 0.5 (bfloat16)
    assert (out.float() - ref.float()).abs().max().item() <= tol
    exact = scaled_dot_product_attention(q.double(), k.double(), v.double())[0]
    assert (out.double() - exact).abs().max().item() <= tol


def test_half_inputs_through_multi_head_attention_both_paths():
    torch.manual_seed(0)
    mha = MultiHeadAttention(64, 1).half().eval()
    with torch.no_grad():
        for w in (mha.w_q, mha.w_k, mha.w_v, mha.w_o):
            w.weight.copy_(torch.eye(64))
            w.bias.zero_()
    x = (100 + torch.randn(1, 5, 64)).half()
    out, _ = mha(x, x, x, mask=causal_mask(5))
    fused, _ = mha(x, x, x, mask=causal_mask(5), need_weights=False)
    assert out.dtype == torch.float16 and torch.isfinite(out).all() and torch.isfinite(fused).all()
    assert (out.float() - fused.float()).abs().max().item() <= 0.07


# --- NaN in padding: a key nobody may read may hold anything ---------------------------------------

@pytest.mark.parametrize("need_weights", [True, False])
def test_nan_in_masked_padding_does_not_reach_the_output(need_weights):
    mha = MultiHeadAttention(8, 2).to(DT).eval()
    x = rand(2, 5, 8, seed=7)
    mask = padding_mask([5, 3], 5) & causal_mask(5)  # item 1: keys 3, 4 are padding
    clean, _ = mha(x, x, x, mask=mask, need_weights=need_weights)
    dirty = x.clone()
    dirty[1, 3:] = float("nan")
    out, _ = mha(dirty, dirty, dirty, mask=mask, need_weights=need_weights)
    assert torch.isfinite(out[1, :3]).all()  # the real queries of item 1 never see the NaN
    assert (out[:, :3] - clean[:, :3]).abs().max() < 1e-12 and torch.equal(out[0], clean[0])


def test_nan_in_a_key_that_some_query_reads_does_propagate():
    """Documented limit: a key that any query may attend must be finite; its NaN is a real NaN, and in
    the product weights @ v it reaches every query of its item, even those masked from it (0 * NaN)."""
    q, k, v = rand(2, 3, 4, seed=8), rand(2, 3, 4, seed=9), rand(2, 3, 4, seed=10)
    v[0, 2] = float("nan")
    out, _ = scaled_dot_product_attention(q, k, v, mask=causal_mask(3))
    assert torch.isnan(out[0]).all() and torch.isfinite(out[1]).all()


def test_additive_attention_ignores_nan_in_masked_values():
    from helpers.attention import AdditiveAttention

    torch.manual_seed(0)
    attn = AdditiveAttention(4, 4, 8).to(DT)
    query, keys = rand(1, 2, 4, seed=11), rand(1, 3, 4, seed=12)
    values = rand(1, 3, 4, seed=13)
    mask = torch.tensor([[[True, True, False]] * 2])  # (B, T, S): key 2 is padding
    clean, _ = attn(query, keys, values, mask=mask)
    values[0, 2] = float("nan")
    keys[0, 2] = float("nan")
    out, _ = attn(query, keys, values, mask=mask)
    assert torch.equal(out, clean)


# --- grouped-query attention ----------------------------------------------------------------------

PAD = 0


def seeded_mha(seed, d_model=16, n_heads=4, n_kv_heads=None):
    torch.manual_seed(seed)
    return MultiHeadAttention(d_model, n_heads, n_kv_heads=n_kv_heads).to(DT).eval()


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
def test_grouped_query_attention_equals_torch_with_enable_gqa(n_kv_heads):
    module = seeded_mha(0, n_kv_heads=n_kv_heads)
    assert module.w_k.weight.shape == (n_kv_heads * 4, 16) and module.w_v.weight.shape == (n_kv_heads * 4, 16)
    x, mem = rand(2, 5, 16, seed=1), rand(2, 7, 16, seed=2)
    mask = padding_mask_from_ids(torch.tensor([[3, 4, 5, 6, 7, 0, 0], [1, 2, 3, 4, 5, 6, 7]]), PAD)  # (B, 1, 1, S)
    out, weights = module(x, mem, mem, mask=mask)
    q = module.w_q(x).view(2, 5, 4, 4).transpose(1, 2)  # (B, H, T, D)
    k = module.w_k(mem).view(2, 7, n_kv_heads, 4).transpose(1, 2)  # (B, Hkv, S, D)
    v = module.w_v(mem).view(2, 7, n_kv_heads, 4).transpose(1, 2)
    theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)  # (B, H, T, D)
    expected = module.w_o(theirs.transpose(1, 2).reshape(2, 5, 16))
    assert (out - expected).abs().max() < 1e-12
    assert weights.shape == (2, 4, 5, 7)
    fused, none = module(x, mem, mem, mask=mask, need_weights=False)
    assert none is None and (fused - expected).abs().max() < 1e-12



def test_query_heads_of_one_group_read_the_same_keys():
    """With one KV head (multi-query) every head's weights come from the same keys: changing w_q of head 0
    only changes head 0's weights."""
    module = seeded_mha(1, n_kv_heads=1)
    x = rand(1, 3, 16, seed=3)
    _, before = module(x, x, x)
    with torch.no_grad():
        module.w_q.weight[:4] += 1.0  # the rows of query head 0
    _, after = module(x, x, x)
    assert not torch.allclose(before[:, 0], after[:, 0]) and torch.equal(before[:, 1:], after[:, 1:])



def test_bad_n_kv_heads_are_refused():
    with pytest.raises(ValueError, match="n_heads=4 is not divisible by n_kv_heads=3"):
        MultiHeadAttention(16, 4, n_kv_heads=3)
    with pytest.raises(ValueError, match="n_kv_heads must be a positive int, got 0"):
        MultiHeadAttention(16, 4, n_kv_heads=0)


# --- values that poison the output ----------------------------------------------------------------

def test_softmax_of_a_row_holding_plus_inf_is_its_limit_with_a_finite_gradient():
    inf = float("inf")
    x = torch.tensor([[0.0, inf, 0.0], [inf, 1.0, inf], [1.0, 2.0, 3.0]], dtype=DT, requires_grad=True)
    p = softmax(x)
    assert p[0].tolist() == [0.0, 1.0, 0.0] and p[1].tolist() == [0.5, 0.0, 0.5]
    assert torch.allclose(p[2], torch.softmax(x[2], dim=-1))
    (p * torch.arange(3, dtype=DT)).sum().backward()
    assert torch.isfinite(x.grad).all()
    assert torch.isnan(softmax(torch.tensor([1.0, float("nan")]))).all()  # NaN stays NaN, as in torch



def test_a_nan_in_a_masked_key_gives_no_nan_gradient():
    q = rand(1, 2, 3, 4, seed=1).requires_grad_()
    k, v = rand(1, 2, 5, 4, seed=2), rand(1, 2, 5, 4, seed=3)
    k[..., 4, :] = float("nan")  # padding that nobody reads
    v[..., 4, :] = float("inf")
    mask = torch.tensor([True, True, True, True, False])[None, None, None, :]  # (1, 1, 1, S)
    out, _ = scaled_dot_product_attention(q, k, v, mask=mask)
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(q.grad).all()
    q2 = q.detach().clone().requires_grad_()
    ref = F.scaled_dot_product_attention(q2, k[..., :4, :], v[..., :4, :])
    ref.sum().backward()
    assert (out - ref).abs().max() < 1e-12 and (q.grad - q2.grad).abs().max() < 1e-12
