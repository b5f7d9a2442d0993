"""Bad input to the public helpers: each gets a clear error naming the argument and what was expected.

One test per input found to give a silent wrong result or an obscure error (issues 15 and 16); the
shared checks live in helpers/_validate.py.
"""

import re
from pathlib import Path

import numpy as np
import pytest
import setuptools
import torch
import torch.nn.functional as F

from helpers._validate import as_int, positive_int, probability
from helpers.attention import AdditiveAttention, MultiHeadAttention, scaled_dot_product_attention, softmax
from helpers.data import DataFileError, load_dates, read_date_tsv
from helpers.device import seed_everything
from helpers.masks import causal_mask, padding_mask
from helpers.positional import (
    LearnedPositionalEmbedding,
    PositionalEncoding,
    apply_rotary,
    rotary_angles,
    sinusoidal_encoding,
    wavelengths,
)
from helpers.rnn import Encoder
from helpers.train import sequence_loss, train
from helpers.transformer import FeedForward, Transformer, TransformerConfig, greedy_decode

ROOT = Path(__file__).resolve().parents[1]
DT = torch.float64
META = torch.device("meta")  # a device other than the CPU, with no GPU: shapes only, no data


def rand(*shape, seed=0, dtype=DT):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# --- integer-like scalars ---------------------------------------------------------------------------

@pytest.mark.parametrize("value", [5, np.int64(5), np.int32(5), torch.tensor(5), torch.tensor(5, dtype=torch.int32)])
def test_integer_like_scalars_are_accepted(value):
    assert positive_int(value, "n") == 5 and type(positive_int(value, "n")) is int
    assert causal_mask(value).shape == (5, 5)
    assert padding_mask([5, 2], value).shape == (2, 1, 1, 5)


@pytest.mark.parametrize("value, got", [
    (True, "True"), (5.0, "5.0"), (np.float64(5), r"(np\.float64\()?5\.0\)?"), ("5", "'5'"), (None, "None"),
    (torch.tensor(5.0), r"a tensor of shape \(\) dtype torch.float32"),
    (torch.tensor([5]), r"a tensor of shape \(1\) dtype torch.int64"),
    (torch.tensor(True), r"a tensor of shape \(\) dtype torch.bool"),
    (0, "0"), (-3, "-3"), (torch.tensor(0), "0"),
])
def test_other_values_are_rejected_naming_the_argument(value, got):
    with pytest.raises(ValueError, match=rf"^T must be a positive int, got {got}$"):
        causal_mask(value)


def test_as_int_bounds_and_probability():
    assert as_int(np.int64(0), "offset", minimum=0) == 0 and as_int(-2, "k", minimum=None) == -2
    with pytest.raises(ValueError, match=r"offset must be a non-negative int, got -1"):
        as_int(-1, "offset", minimum=0)
    with pytest.raises(ValueError, match=r"k must be an int >= 2, got 1"):
        as_int(1, "k", minimum=2)
    assert probability(0, "p") == 0.0 and probability(np.float32(0.5), "p") == 0.5
    for bad in (1.0, 1.5, -0.1, True, "0.1", float("nan")):
        with pytest.raises(ValueError, match=r"p must be a probability in \[0, 1\), got "):
            probability(bad, "p")


# --- masks --------------------------------------------------------------------------------------------

def test_padding_mask_empty_and_float_lengths():
    with pytest.raises(ValueError, match=r"lengths must hold one length per batch item, got an empty list"):
        padding_mask([], 3)
    with pytest.raises(ValueError, match=r"lengths must be a 1-D sequence of ints .* got \[1.0, 2.0\] "
                                         r"\(shape \(2,\), dtype torch.float32\)"):
        padding_mask([1.0, 2.0], 3)
    with pytest.raises(ValueError, match=r"S must be a positive int, got 2.5"):
        padding_mask([1, 2], 2.5)


# --- multi-head attention: construction ----------------------------------------------------------------

def test_mha_rejects_bad_sizes_and_dropout_at_construction():
    with pytest.raises(ValueError, match=r"n_heads must be a positive int, got 4.0"):
        MultiHeadAttention(16, 4.0)
    with pytest.raises(ValueError, match=r"d_model must be a positive int, got 0"):
        MultiHeadAttention(0, 4)
    for bad in (1.5, -0.1, 1.0, "0.1"):
        with pytest.raises(ValueError, match=r"dropout must be a probability in \[0, 1\), got "):
            MultiHeadAttention(16, 4, dropout=bad)
    mha = MultiHeadAttention(np.int64(16), torch.tensor(4), dropout=0.25)
    assert (mha.d_model, mha.n_heads, mha.head_dim) == (16, 4, 4) and type(mha.n_heads) is int
    assert isinstance(mha.dropout, torch.nn.Dropout) and mha.dropout.p == 0.25  # a module, like every .dropout


def test_mha_input_dtype_or_kind_that_differs_from_the_module():
    mha = MultiHeadAttention(8, 2)  # float32 weights
    x = rand(2, 3, 8)  # float64
    with pytest.raises(TypeError, match=r"query is torch.float64 on cpu but the module's weights are "
                                        r"torch.float32 on cpu: convert one of them"):
        mha(x, x, x)
    with pytest.raises(TypeError, match=r"key must be a floating-point tensor, got dtype torch.int64"):
        mha(x.float(), torch.ones(2, 3, 8, dtype=torch.long), x.float())
    with pytest.raises(ValueError, match=r"query \(B, T, C\), key \(B, S, C\) and value \(B, S, C\) must agree "
                                         r"on B and S: got \(2, 3, 8\), \(2, 4, 8\), \(2, 5, 8\)"):
        mha(x.float(), rand(2, 4, 8).float(), rand(2, 5, 8).float())


# --- multi-head attention: the 2-D mask rule -----------------------------------------------------------

def test_a_2d_key_padding_mask_is_rejected_and_points_to_padding_mask():
    mha = MultiHeadAttention(8, 2).to(DT)
    x, memory = rand(3, 4, 8), rand(3, 6, 8)  # B=3, T=4, S=6
    keep = padding_mask([6, 3, 1], 6)[:, 0, 0]  # (B, S) = (3, 6): the form nn.MultiheadAttention takes
    with pytest.raises(ValueError, match=r"a 2-D mask is read as \(T, S\) = \(4, 6\).*got \(3, 6\)\. A key-padding "
                                         r"mask \(B, S\) must be given as \(B, 1, 1, S\): "
                                         r"helpers.masks.padding_mask\(lengths, S\)"):
        mha(x, memory, memory, mask=keep)
    with pytest.raises(ValueError, match=r"a 2-D mask is read as \(T, S\) = \(4, 6\).*got \(1, 6\)"):
        mha(x, memory, memory, mask=keep[:1])  # a broadcast 2-D form is not accepted either


@pytest.mark.parametrize("shape", [(6,), (3, 4, 6), (1, 1, 3, 4, 6)])
def test_masks_that_are_neither_2d_nor_4d_are_rejected(shape):
    mha = MultiHeadAttention(8, 2).to(DT)
    x, memory = rand(3, 4, 8), rand(3, 6, 8)
    with pytest.raises(ValueError, match=rf"mask must be 2-D \(T, S\) = \(4, 6\) or 4-D, broadcastable to "
                                         rf"\(B, H, T, S\) = \(3, 2, 4, 6\); got {len(shape)}-D"):
        mha(x, memory, memory, mask=torch.ones(shape, dtype=torch.bool))


def test_a_2d_mask_is_t_by_s_even_when_b_equals_t():
    """PyTorch's rule: a 2-D mask is (T, S) whatever the batch size, so B == T is a normal call."""
    mha = MultiHeadAttention(8, 2).to(DT).eval()
    x = rand(4, 4, 8)  # B = T = 4
    _, w_2d = mha(x, x, x, mask=causal_mask(4))
    _, w_4d = mha(x, x, x, mask=causal_mask(4)[None, None])  # the same mask with all four axes
    assert torch.equal(w_2d, w_4d)
    assert torch.all(w_2d[:, :, 0, 1:] == 0) and torch.all(w_2d[:, :, 3] > 0)


def test_a_3d_mask_that_would_put_the_batch_on_the_heads_is_refused():
    """(B, T, S) on (B, H, T, S) scores broadcasts when B == H, silently reading item b's mask as head b's."""
    q = rand(2, 2, 3, 4)  # (B, H, T, D) with B == H
    keep = torch.ones(2, 3, 3, dtype=torch.bool)  # (B, T, S)
    with pytest.raises(ValueError, match=r"a 3-D mask \(2, 3, 3\) on 4-D scores .* would be broadcast onto "
                                         r"the wrong axes .*mask\[:, None\] for \(B, 1, T, S\)"):
        scaled_dot_product_attention(q, q, q, mask=keep)
    out, _ = scaled_dot_product_attention(q, q, q, mask=keep[:, None])  # (B, 1, T, S): fine
    assert out.shape == (2, 2, 3, 4)
    qa = rand(2, 3, 4)  # (B, T, D): 3-D scores take a 3-D mask
    assert scaled_dot_product_attention(qa, qa, qa, mask=keep)[0].shape == (2, 3, 4)


@pytest.mark.parametrize("B, T", [(1, 1), (1, 5), (3, 5)])
def test_a_2d_t_by_s_mask_is_accepted_when_it_cannot_be_mistaken(B, T):
    mha = MultiHeadAttention(8, 2).to(DT).eval()
    x = rand(B, T, 8)
    out, w = mha(x, x, x, mask=causal_mask(T))
    out4, w4 = mha(x, x, x, mask=causal_mask(T)[None, None])
    assert torch.equal(out, out4) and torch.equal(w, w4)


# --- scaled dot-product attention -----------------------------------------------------------------------

def test_sdpa_batch_sizes_that_do_not_broadcast():
    with pytest.raises(ValueError, match=r"batch dimensions .* of q, k and v must broadcast: got q \(2, 3, 4\), "
                                         r"k \(3, 5, 4\), v \(3, 5, 4\)"):
        scaled_dot_product_attention(rand(2, 3, 4), rand(3, 5, 4), rand(3, 5, 4))


def test_sdpa_dtypes_that_differ():
    with pytest.raises(TypeError, match=r"q, k and v must have the same dtype, got torch.float32, torch.float64 "
                                        r"and torch.float64"):
        scaled_dot_product_attention(rand(2, 3, 4).float(), rand(2, 5, 4), rand(2, 5, 4))


@pytest.mark.parametrize("S, D", [(0, 4), (5, 0)])
def test_sdpa_empty_keys_or_width(S, D):
    with pytest.raises(ValueError, match=r"the width D and the key length S must be >= 1"):
        scaled_dot_product_attention(rand(2, 3, D), rand(2, S, D), rand(2, S, 4))


def test_sdpa_dropout_is_checked_and_applied():
    q, k, v = rand(2, 4, 8, seed=1), rand(2, 6, 8, seed=2), rand(2, 6, 8, seed=3)
    for bad in (1.0, -0.5, True):
        with pytest.raises(ValueError, match=r"dropout_p must be a probability in \[0, 1\)"):
            scaled_dot_product_attention(q, k, v, dropout_p=bad)
    plain, w0 = scaled_dot_product_attention(q, k, v)
    torch.manual_seed(0)
    out, w = scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    dropped = w == 0
    assert 0.3 < dropped.double().mean() < 0.7  # about half the weights are dropped
    assert torch.allclose(w[~dropped], 2 * w0[~dropped], atol=1e-12)  # the rest scaled by 1 / (1 - p)
    assert torch.allclose(out, w @ v, atol=1e-12)  # the returned weights are the ones applied
    mean = torch.stack([scaled_dot_product_attention(q, k, v, dropout_p=0.5)[0] for _ in range(3000)]).mean(0)
    assert (mean - plain).abs().max() < 0.1  # unbiased on average


def test_sdpa_mask_may_not_add_batch_dimensions_that_only_v_has():
    """The scores (..., T, S) take the batch dimensions of q and k; PyTorch refuses a mask that would
    add v's larger batch to them, and so do we, with a message naming the scores' shape."""
    q, k, v = rand(1, 3, 4), rand(1, 5, 4), rand(2, 5, 6)
    keep = torch.rand(2, 3, 5, generator=torch.Generator().manual_seed(0)) > 0.3
    with pytest.raises(RuntimeError):
        F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    with pytest.raises(ValueError, match=r"mask of shape \(2, 3, 5\) does not broadcast to the attention scores' "
                                         r"shape \(\.\.\., T, S\) = \(1, 3, 5\)"):
        scaled_dot_product_attention(q, k, v, mask=keep)
    out, w = scaled_dot_product_attention(q, k, v, mask=keep[:1])  # a mask over q and k's batch is fine
    assert out.shape == (2, 3, 6) and w.shape == (1, 3, 5)
    assert torch.allclose(out, F.scaled_dot_product_attention(q, k, v, attn_mask=keep[:1]), atol=1e-12)


# --- devices (the meta device stands in for a GPU) -------------------------------------------------------

def test_sdpa_mask_on_another_device_names_both_devices_and_the_fix():
    q = torch.zeros(2, 3, 4, device=META)
    with pytest.raises(ValueError, match=r"^mask is on cpu but q is on meta: build the mask there, e\.g\. "
                                         r"causal_mask\(T, device=q\.device\), or move it with mask\.to\(q\.device\)$"):
        scaled_dot_product_attention(q, q, q, mask=causal_mask(3))
    out, w = scaled_dot_product_attention(q, q, q, mask=causal_mask(3, device=q.device))
    assert out.device == w.device == META and w.shape == (2, 3, 3)
    x = rand(2, 3, 4)  # the ordinary case: CPU tensors and a CPU mask
    out, w = scaled_dot_product_attention(x, x, x, mask=causal_mask(3))
    assert torch.all(w[:, 0, 1:] == 0) and torch.allclose(w.sum(-1), torch.ones(2, 3, dtype=DT))


def test_sdpa_q_k_v_on_different_devices():
    q = torch.zeros(2, 3, 4, device=META)
    with pytest.raises(ValueError, match=r"q, k and v must be on the same device, got meta, cpu and cpu"):
        scaled_dot_product_attention(q, torch.zeros(2, 3, 4), torch.zeros(2, 3, 4))


@pytest.mark.parametrize("need_weights", [True, False])
def test_mha_mask_on_another_device_names_both_devices(need_weights):
    mha = MultiHeadAttention(8, 2).to(META)
    x = torch.zeros(2, 3, 8, device=META)
    for mask in (causal_mask(3), padding_mask([3, 2], 3)):  # 2-D (T, S) and 4-D (B, 1, 1, S), both on the CPU
        with pytest.raises(ValueError, match=r"^mask is on cpu but query is on meta: build the mask there, e\.g\. "
                                             r"causal_mask\(T, device=query\.device\), or move it with "
                                             r"mask\.to\(query\.device\)$"):
            mha(x, x, x, mask=mask, need_weights=need_weights)
        out, _ = mha(x, x, x, mask=mask.to(META), need_weights=need_weights)
        assert out.shape == (2, 3, 8) and out.device == META
    cpu = MultiHeadAttention(8, 2).to(DT).eval()  # the ordinary case still works on both paths
    y = rand(2, 3, 8)
    a, _ = cpu(y, y, y, mask=causal_mask(3) & padding_mask([3, 2], 3), need_weights=need_weights)
    b, _ = cpu(y, y, y, mask=causal_mask(3) & padding_mask([3, 2], 3), need_weights=not need_weights)
    assert torch.allclose(a, b, atol=1e-12)


def test_mha_key_on_another_device_than_the_module():
    mha = MultiHeadAttention(8, 2)
    x = torch.zeros(2, 3, 8)
    with pytest.raises(TypeError, match=r"key is torch.float32 on meta but the module's weights are "
                                        r"torch.float32 on cpu"):
        mha(x, x.to(META), x)


# --- additive attention ---------------------------------------------------------------------------------

def test_additive_attention_checks_values_and_sizes():
    attn = AdditiveAttention(4, 6, 8).to(DT)
    query, keys = rand(2, 3, 4), rand(2, 5, 6)
    with pytest.raises(ValueError, match=r"values must have shape \(B, S, Dv\), got \(2, 5\)"):
        attn(query, keys, rand(2, 5))
    with pytest.raises(TypeError, match=r"values must be a floating-point tensor, got dtype torch.int64"):
        attn(query, keys, torch.ones(2, 5, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"must agree on B and S: got \(2, 3, 4\), \(2, 5, 6\), \(2, 4, 3\)"):
        attn(query, keys, rand(2, 4, 3))
    with pytest.raises(ValueError, match=r"keys must have shape \(B, S, Dk=6\), got \(2, 5, 4\)"):
        attn(query, rand(2, 5, 4))
    with pytest.raises(ValueError, match=r"hidden_dim must be a positive int, got 0"):
        AdditiveAttention(4, 6, 0)


def test_additive_attention_checks_dtypes_devices_and_empty_keys():
    attn = AdditiveAttention(4, 6, 8).to(DT)
    query, keys = rand(2, 3, 4), rand(2, 5, 6)
    with pytest.raises(ValueError, match=r"the key length S must be >= 1 \(softmax over no keys is undefined\): "
                                         r"got query, keys and values \(2, 3, 4\), \(2, 0, 6\), \(2, 0, 6\)"):
        attn(query, rand(2, 0, 6))
    with pytest.raises(TypeError, match=r"query, keys and values must have the same dtype, got torch.float64, "
                                        r"torch.float32 and torch.float32"):
        attn(query, keys.float())
    with pytest.raises(TypeError, match=r"query, keys and values must have the same dtype, got torch.float64, "
                                        r"torch.float64 and torch.float32"):
        attn(query, keys, rand(2, 5, 3).float())
    with pytest.raises(TypeError, match=r"query, keys and values are torch.float32 on cpu but the module's weights "
                                        r"are torch.float64 on cpu: convert one of them"):
        attn(query.float(), keys.float())
    with pytest.raises(ValueError, match=r"query, keys and values must be on the same device, got cpu, cpu and meta"):
        attn(query, keys, torch.zeros(2, 5, 3, dtype=DT, device=META))
    with pytest.raises(TypeError, match=r"query, keys and values are torch.float64 on meta but the module's weights "
                                        r"are torch.float64 on cpu"):
        attn(query.to(META), keys.to(META))
    out, w = attn(query, keys, mask=padding_mask([5, 2], 5)[:, 0])  # the good call: (B, 1, S) mask
    assert out.shape == (2, 3, 6) and torch.all(w[1, :, 2:] == 0)
    assert torch.allclose(w.sum(-1), torch.ones(2, 3, dtype=DT))


def test_additive_attention_mask_on_another_device():
    attn = AdditiveAttention(4, 6, 8).to(META)
    query, keys = torch.zeros(2, 3, 4, device=META), torch.zeros(2, 5, 6, device=META)
    keep = padding_mask([5, 2], 5)[:, 0]  # (B, 1, S) on the CPU
    with pytest.raises(ValueError, match=r"^mask is on cpu but query is on meta: build the mask there"):
        attn(query, keys, mask=keep)
    out, w = attn(query, keys, mask=keep.to(META))
    assert out.shape == (2, 3, 6) and w.shape == (2, 3, 5) and w.device == META


# --- softmax --------------------------------------------------------------------------------------------

def test_softmax_over_an_empty_dimension_is_refused():
    with pytest.raises(ValueError, match=r"softmax over an empty dimension is undefined: x has shape \(2, 0\), "
                                         r"and dim=-1 has size 0"):
        softmax(torch.zeros(2, 0))
    with pytest.raises(ValueError, match=r"x has shape \(0, 3\), and dim=0 has size 0"):
        softmax(torch.zeros(0, 3), dim=0)
    empty_rows = softmax(torch.zeros(0, 3))  # no rows, each of 3 entries: nothing to normalise, no error
    assert empty_rows.shape == (0, 3) and torch.equal(empty_rows, torch.softmax(torch.zeros(0, 3), dim=-1))
    assert torch.equal(softmax(torch.tensor(2.0)), torch.tensor(1.0))  # a 0-d tensor, as torch.softmax


# --- the Transformer: token ids and the feed-forward block ------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.uint8])
def test_token_ids_narrower_than_int32_are_refused(dtype):
    model = Transformer(TransformerConfig.tiny(13, 11)).eval()
    src, tgt = torch.randint(3, 11, (2, 5)), torch.randint(3, 11, (2, 4))
    with pytest.raises(TypeError, match=rf"^src must hold integer token ids of dtype torch.int64 \(torch.long\) "
                                        rf"or torch.int32, the ones nn.Embedding takes, got dtype {dtype}; convert "
                                        rf"them with src.long\(\)$"):
        model(src.to(dtype), tgt)
    with pytest.raises(TypeError, match=rf"tgt must hold integer token ids .* got dtype {dtype}"):
        model(src, tgt.to(dtype))
    with pytest.raises(TypeError, match=rf"src must hold integer token ids .* got dtype {dtype}"):
        greedy_decode(model, src.to(dtype), 1, 2, 5)
    assert torch.equal(model(src.int(), tgt.int()), model(src, tgt))  # int32 and int64 are both fine


def test_float_token_ids_get_no_advice_to_convert():
    model = Transformer(TransformerConfig.tiny(13, 11)).eval()
    with pytest.raises(TypeError, match=r"^src must hold integer token ids .* got dtype torch.float32$"):
        model(torch.ones(2, 5), torch.ones(2, 4, dtype=torch.long))


def test_token_ids_on_another_device_than_the_model():
    model = Transformer(TransformerConfig.tiny(13, 11)).to(META)
    src, tgt = torch.randint(3, 11, (2, 5)), torch.randint(3, 11, (2, 4))
    with pytest.raises(ValueError, match=r"^src is on cpu but the model is on meta: move the ids there with "
                                         r"src.to\('meta'\)$"):
        model(src, tgt)
    with pytest.raises(ValueError, match=r"^src is on cpu but the model is on meta"):
        model.encode(src)
    with pytest.raises(ValueError, match=r"^tgt is on cpu but the model is on meta"):
        model.decode(tgt, torch.zeros(2, 5, 32, device=META))
    with pytest.raises(ValueError, match=r"^src is on cpu but the model is on meta"):
        greedy_decode(model, src, 1, 2, 5)


def test_feed_forward_checks_its_sizes_dropout_and_input():
    with pytest.raises(ValueError, match=r"d_ff must be a positive int, got 0"):
        FeedForward(8, 0)
    with pytest.raises(ValueError, match=r"d_model must be a positive int, got 8.0"):
        FeedForward(8.0, 16)
    for bad in (2.0, -0.1, 1.0):
        with pytest.raises(ValueError, match=rf"dropout must be a probability in \[0, 1\), got {bad}"):
            FeedForward(8, 16, dropout=bad)
    ff = FeedForward(np.int64(8), 16, dropout=0)
    assert (ff.linear1.in_features, ff.linear1.out_features, ff.dropout.p) == (8, 16, 0.0)
    with pytest.raises(ValueError, match=r"x must have shape \(B, T, C=8\), got \(2, 3, 5\)"):
        ff(torch.zeros(2, 3, 5))
    with pytest.raises(TypeError, match=r"x must be a floating-point tensor, got dtype torch.int64"):
        ff(torch.zeros(2, 3, 8, dtype=torch.long))
    x = torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(ff(x), ff.linear2(torch.relu(ff.linear1(x))))  # the good call: Eq. 2


# --- positions ------------------------------------------------------------------------------------------

def test_positional_encoding_names_max_len_and_checks_its_input():
    with pytest.raises(ValueError, match=r"max_len must be a positive int, got 0"):
        PositionalEncoding(7, max_len=0)
    with pytest.raises(ValueError, match=r"dropout must be a probability in \[0, 1\), got 1.5"):
        PositionalEncoding(8, dropout=1.5)
    pe = PositionalEncoding(8, max_len=10)
    with pytest.raises(TypeError, match=r"x must be a floating-point tensor, got dtype torch.int64"):
        pe(torch.ones(1, 3, 8, dtype=torch.long))
    for offset in (-5, -1):
        with pytest.raises(ValueError, match=rf"offset must be a non-negative int, got {offset}"):
            pe(torch.zeros(1, 3, 8), offset=offset)
    with pytest.raises(ValueError, match=r"offset must be a non-negative int, got 1.0"):
        pe(torch.zeros(1, 3, 8), offset=1.0)
    x = torch.zeros(1, 3, 8)
    assert torch.equal(pe(x, offset=np.int64(2)), pe(x, offset=torch.tensor(2)))
    assert torch.equal(pe(x, offset=2)[0], sinusoidal_encoding(10, 8)[2:5])
    with pytest.raises(ValueError, match=r"offset must be a non-negative int, got -1"):
        LearnedPositionalEmbedding(10, 8)(x, offset=-1)


def test_wavelengths_and_rotary_sizes():
    with pytest.raises(ValueError, match=r"d_model must be a positive int, got -4"):
        wavelengths(-4)
    assert torch.equal(wavelengths(np.int64(8)), wavelengths(8))
    with pytest.raises(ValueError, match=r"dim must be a positive even int .* got 5"):
        rotary_angles(4, 5)
    assert torch.equal(rotary_angles(np.int64(4), 8), rotary_angles(4, 8))
    with pytest.raises(ValueError, match=r"positions \(a count\) must be a positive int, got 0"):
        rotary_angles(0, 8)
    with pytest.raises(ValueError, match=r"last dimension D of x must be even; got x of shape \(2, 3\) \(D=3\)"):
        apply_rotary(torch.zeros(2, 3))


# --- training, rnn, device ------------------------------------------------------------------------------

def test_train_and_loss_arguments():
    with pytest.raises(ValueError, match=r"steps must be a positive int, got 0"):
        train(None, None, None, steps=0)
    with pytest.raises(ValueError, match=r"clip_grad_norm must be None or a positive number in \(0, inf\], got 0"):
        train(None, None, None, steps=1, clip_grad_norm=0)
    with pytest.raises(TypeError, match=r"targets must hold integer token ids, got dtype torch.float32"):
        sequence_loss(torch.zeros(2, 3, 5), torch.zeros(2, 3))


def test_integer_like_sizes_elsewhere():
    assert Encoder(np.int64(12), 4, torch.tensor(6)).gru.hidden_size == 6
    seed_everything(np.int64(3))
    a = torch.rand(1)
    seed_everything(3)
    assert torch.equal(a, torch.rand(1))
    with pytest.raises(ValueError, match=r"seed must be a non-negative int, got -1"):
        seed_everything(-1)


# --- data files -----------------------------------------------------------------------------------------

def test_a_file_that_is_not_utf8_names_the_file(tmp_path):
    path = tmp_path / "dates_test.tsv"
    path.write_bytes("source\ttarget\n3 march 2021\t2021-03-03\nm\xe4rz 3\t2021-03-03\n".encode("latin-1"))
    with pytest.raises(DataFileError, match=rf"{re.escape(str(path))}, line 3: the file is not UTF-8 text "
                                            r"\(byte 0xe4 at offset \d+\); save it as UTF-8"):
        read_date_tsv(path)


def test_a_well_formed_but_changed_row_fails_the_sha256_check(tmp_path):
    for name in ("README.md", "dates_test.tsv"):
        (tmp_path / name).write_bytes((ROOT / "data" / name).read_bytes())
    assert load_dates("test", tmp_path) == load_dates("test", ROOT / "data")
    path = tmp_path / "dates_test.tsv"
    lines = path.read_text().split("\n")
    source, target = lines[1].split("\t")
    lines[1] = f"{source}\t{target[:-1]}{(int(target[-1]) + 1) % 9}"  # still a valid date, now wrong
    path.write_text("\n".join(lines))
    assert read_date_tsv(path)  # every line is well formed ...
    with pytest.raises(DataFileError, match=rf"{re.escape(str(path))} differs from the committed file: its sha256 "
                                            r"is [0-9a-f]{64}, README.md lists [0-9a-f]{64}"):
        load_dates("test", tmp_path)  # ... but the file is not the committed one


# --- packaging ------------------------------------------------------------------------------------------

def test_every_helpers_package_is_found_by_the_build():
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    find = config["tool"]["setuptools"]["packages"]["find"]
    found = set(setuptools.find_packages(str(ROOT), include=find["include"]))
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "helpers").rglob("__init__.py")}
    assert on_disk and found == on_disk
