"""Property tests (hypothesis) of the invariants of attention."""

import torch
from hypothesis import given
from hypothesis import strategies as st

from helpers.attention import MultiHeadAttention, scaled_dot_product_attention, softmax
from helpers.masks import causal_mask, padding_mask

dims = st.integers(min_value=1, max_value=6)


def tensor(seed, *shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@given(B=dims, T=dims, S=dims, D=dims, seed=st.integers(0, 10_000), scale=st.sampled_from([1.0, 30.0]))
def test_weight_rows_sum_to_one(B, T, S, D, seed, scale):
    q, k, v = tensor(seed, B, T, D) * scale, tensor(seed + 1, B, S, D) * scale, tensor(seed + 2, B, S, 3)
    _, w = scaled_dot_product_attention(q, k, v)
    assert torch.allclose(w.sum(-1), torch.ones(B, T, dtype=torch.float64), atol=1e-12)
    assert (w >= 0).all()


@given(rows=st.integers(1, 5), cols=st.integers(1, 9), seed=st.integers(0, 10_000),
       scale=st.sampled_from([1.0, 1e3, 1e4]))
def test_softmax_rows_sum_to_one_even_for_huge_logits(rows, cols, seed, scale):
    p = softmax(tensor(seed, rows, cols).float() * scale)
    assert torch.isfinite(p).all()
    assert torch.allclose(p.sum(-1), torch.ones(rows), atol=1e-5)


@given(T=st.integers(2, 7), seed=st.integers(0, 10_000))
def test_self_attention_is_permutation_equivariant(T, seed):
    torch.manual_seed(seed)
    mha = MultiHeadAttention(8, 2).double().eval()
    x = tensor(seed, 2, T, 8)
    perm = torch.randperm(T, generator=torch.Generator().manual_seed(seed))
    out, _ = mha(x, x, x)
    out_perm, _ = mha(x[:, perm], x[:, perm], x[:, perm])
    assert torch.allclose(out[:, perm], out_perm, atol=1e-12)


@given(T=st.integers(2, 8), cut=st.integers(1, 7), seed=st.integers(0, 10_000))
def test_causal_outputs_ignore_the_future(T, cut, seed):
    cut = min(cut, T - 1)
    torch.manual_seed(seed)
    mha = MultiHeadAttention(8, 2).double().eval()
    x = tensor(seed, 1, T, 8)
    changed = x.clone()
    changed[:, cut:] = tensor(seed + 1, 1, T - cut, 8)  # new future from position `cut` on
    mask = causal_mask(T)
    out, _ = mha(x, x, x, mask=mask)
    out_changed, _ = mha(changed, changed, changed, mask=mask)
    assert torch.allclose(out[:, :cut], out_changed[:, :cut], atol=1e-12)
    assert not torch.allclose(out[:, cut:], out_changed[:, cut:])


@given(S=st.integers(2, 8), length=st.integers(1, 7), seed=st.integers(0, 10_000))
def test_padded_keys_change_nothing(S, length, seed):
    length = min(length, S - 1)
    torch.manual_seed(seed)
    mha = MultiHeadAttention(8, 2).double().eval()
    x, memory = tensor(seed, 1, 3, 8), tensor(seed + 1, 1, S, 8)
    other = memory.clone()
    other[:, length:] = tensor(seed + 2, 1, S - length, 8)  # garbage in the padded slots
    mask = padding_mask([length], S)
    out, w = mha(x, memory, memory, mask=mask)
    out_other, _ = mha(x, other, other, mask=mask)
    assert torch.allclose(out, out_other, atol=1e-12)
    assert torch.all(w[..., length:] == 0)
