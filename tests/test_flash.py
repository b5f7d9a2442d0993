"""helpers.flash against PyTorch's SDPA and the course's attention; its memory (lesson 10's checks: tests/checks/)."""

import importlib.util
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from helpers.attention import _fused_attention, scaled_dot_product_attention
from helpers.device import peak_memory
from helpers.flash import (
    FlashAttentionFunction,
    flash_attention,
    flash_attention_backward,
    flash_attention_forward,
    triton_flash_attention,
    triton_flash_attention_backward,
)
from helpers.masks import causal_mask


def tensor(seed, *shape, dtype=torch.float64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def random_mask(seed, shape, p):
    return torch.rand(*shape, generator=torch.Generator().manual_seed(seed)) < p  # True = may attend


def oracles(q, k, v, mask=None):
    """PyTorch's SDPA (NaN rows of fully masked queries set to 0, as the course defines them) and the course's."""
    torch_out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    if mask is not None:
        blocked = ~mask.expand(*q.shape[:3], k.shape[2]).any(dim=-1, keepdim=True)  # (B, H, T, 1)
        torch_out = torch_out.masked_fill(blocked, 0.0)
    return torch_out, scaled_dot_product_attention(q, k, v, mask=mask)[0]


mask_shapes = st.sampled_from(["none", "BHTS", "TS", "B11S", "1H1S", "causal"])


@given(B=st.integers(1, 2), H=st.integers(1, 3), T=st.integers(1, 40), S=st.integers(1, 40),
       D=st.integers(1, 9), Dv=st.integers(1, 9), block_q=st.integers(1, 17), block_k=st.integers(1, 17),
       kind=mask_shapes, p=st.sampled_from([0.1, 0.5, 0.9]), scale=st.sampled_from([1.0, 20.0]),
       seed=st.integers(0, 10_000))
def test_equals_sdpa_in_float64(B, H, T, S, D, Dv, block_q, block_k, kind, p, scale, seed):
    q, k, v = tensor(seed, B, H, T, D) * scale, tensor(seed + 1, B, H, S, D) * scale, tensor(seed + 2, B, H, S, Dv)
    shapes = {"BHTS": (B, H, T, S), "TS": (T, S), "B11S": (B, 1, 1, S), "1H1S": (1, H, 1, S)}
    if kind == "none":
        mask = None
    elif kind == "causal":
        mask = torch.ones(T, S, dtype=torch.bool).tril(diagonal=S - T)  # the last query sees every key
    else:
        mask = random_mask(seed + 3, shapes[kind], p)
    originals = [t.clone() for t in (q, k, v)] + ([] if mask is None else [mask.clone()])
    out = flash_attention(q, k, v, mask=mask, block_q=block_q, block_k=block_k)
    assert out.shape == (B, H, T, Dv) and out.dtype == torch.float64
    assert torch.isfinite(out).all()
    for expected in oracles(q, k, v, mask):
        assert (out - expected).abs().max().item() <= 1e-10
    for before, after in zip(originals, [q, k, v] + ([] if mask is None else [mask]), strict=True):
        assert torch.equal(before, after)  # inputs are never modified


@given(T=st.integers(1, 30), S=st.integers(1, 30), block_q=st.integers(1, 11), block_k=st.integers(1, 11),
       seed=st.integers(0, 10_000))
def test_log_sum_exp_and_fully_masked_rows(T, S, block_q, block_k, seed):
    q, k, v = tensor(seed, 1, 2, T, 5), tensor(seed + 1, 1, 2, S, 5), tensor(seed + 2, 1, 2, S, 5)
    mask = random_mask(seed + 3, (1, 2, T, S), 0.5)
    mask[0, 0, 0] = False  # query 0 of head 0 may attend to nothing
    out, lse = flash_attention_forward(q, k, v, mask=mask, block_q=block_q, block_k=block_k)
    scores = (q @ k.transpose(-2, -1) / math.sqrt(5)).masked_fill(~mask, float("-inf"))  # (1, 2, T, S)
    expected = torch.logsumexp(scores, dim=-1)  # (1, 2, T), -inf for a fully masked row
    assert torch.equal(torch.isinf(lse), torch.isinf(expected))
    finite = torch.isfinite(expected)
    assert torch.allclose(lse[finite], expected[finite], atol=1e-12, rtol=0)
    assert torch.equal(out[0, 0, 0], torch.zeros(5, dtype=torch.float64))
    assert torch.equal(out[~mask.any(-1)], torch.zeros_like(out[~mask.any(-1)]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_lower_precisions(dtype):
    q, k, v = (tensor(s, 2, 3, 70, 16) for s in (1, 2, 3))
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(70))
    out = flash_attention(q.to(dtype), k.to(dtype), v.to(dtype), mask=causal_mask(70), block_q=32, block_k=16)
    assert out.dtype == dtype
    tolerance = {torch.float32: 1e-6, torch.bfloat16: 2e-2, torch.float16: 3e-3}[dtype]
    assert (out.double() - expected).abs().max().item() < tolerance


def test_huge_scores_do_not_overflow():
    q, k, v = tensor(0, 1, 1, 50, 8) * 1e3, tensor(1, 1, 1, 50, 8) * 1e3, tensor(2, 1, 1, 50, 8)
    out = flash_attention(q.float(), k.float(), v.float(), block_q=16, block_k=16)
    assert torch.isfinite(out).all()
    assert torch.allclose(out.double(), F.scaled_dot_product_attention(q, k, v), atol=1e-5)


def test_peak_memory_grows_linearly_and_holds_no_score_matrix():
    B, H, D, bq, bk = 1, 2, 16, 64, 64
    peaks, sizes = [], (256, 512, 1024)
    for T in sizes:
        q, k, v = (tensor(s, B, H, T, D, dtype=torch.float32) for s in (1, 2, 3))
        for mask in (None, causal_mask(T)):
            peak = peak_memory(flash_attention, q, k, v, mask=mask, block_q=bq, block_k=bk, device="cpu")
            output = B * H * T * D * 4 + B * H * T * 4  # the output and the log-sum-exp
            tile = B * H * bq * bk * 4  # one (block_q, block_k) tile of scores
            assert peak < B * H * T * T * 4  # less than one (T, S) score matrix
            assert peak <= output + 6 * tile, (T, mask is not None, peak, output, tile)
        peaks.append(peak)
    # doubling T at most doubles the peak (plus the fixed tiles): linear, not quadratic
    for small, large in zip(peaks[:-1], peaks[1:], strict=True):
        assert large <= 2 * small + 6 * B * H * bq * bk * 4
    naive = peak_memory(lambda: scaled_dot_product_attention(q, k, v)[0], device="cpu")
    assert naive > 20 * peaks[-1]


def test_block_sizes_do_not_change_the_result():
    q, k, v = (tensor(s, 1, 2, 33, 4) for s in (1, 2, 3))
    reference = flash_attention(q, k, v, block_q=64, block_k=64)  # a single block each way
    for bq, bk in [(1, 1), (1, 33), (33, 1), (7, 5), (32, 32), (100, 3)]:
        assert torch.allclose(flash_attention(q, k, v, block_q=bq, block_k=bk), reference, atol=1e-13, rtol=0)


def test_bad_input_gets_a_clear_error():
    q, k, v = tensor(0, 1, 2, 5, 4), tensor(1, 1, 2, 6, 4), tensor(2, 1, 2, 6, 4)
    with pytest.raises(ValueError, match=r"q must have shape \(B, H, L, D\).*\(2, 5, 4\)"):
        flash_attention(q[0], k, v)
    with pytest.raises(ValueError, match=r"same width D.*D=4.*D=3"):
        flash_attention(q, k[..., :3], v)
    with pytest.raises(ValueError, match=r"same length S.*\(1, 2, 6, 4\).*\(1, 2, 5, 4\)"):
        flash_attention(q, k, v[:, :, :5])
    with pytest.raises(ValueError, match=r"agree on B and H"):
        flash_attention(q, k[:, :1], v[:, :1])
    with pytest.raises(ValueError, match=r"block_q must be a positive int, got 0"):
        flash_attention(q, k, v, block_q=0)
    with pytest.raises(ValueError, match=r"block_k must be a positive int, got 2.5"):
        flash_attention(q, k, v, block_k=2.5)
    with pytest.raises(ValueError, match=r"block_q must be a positive int, got True"):
        flash_attention(q, k, v, block_q=True)
    with pytest.raises(ValueError, match=r"mask of shape \(5, 5\) does not broadcast.*\(B, H, T, S\) = \(1, 2, 5, 6\)"):
        flash_attention(q, k, v, mask=torch.ones(5, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match=r"mask must be boolean.*torch.float32"):
        flash_attention(q, k, v, mask=torch.ones(5, 6))
    with pytest.raises(TypeError, match=r"q, k and v must have the same dtype"):
        flash_attention(q.float(), k, v)
    with pytest.raises(TypeError, match=r"q must be a torch.Tensor, got ndarray"):
        flash_attention(q.numpy(), k, v)
    with pytest.raises(TypeError, match=r"floating-point"):
        flash_attention(q.long(), k.long(), v.long())
    with pytest.raises(ValueError, match=r"at least 1"):
        flash_attention(q, k[:, :, :0], v[:, :, :0])
    for bad in (np.float64(4.0), 4.0, np.bool_(True), "4", torch.tensor(4.0)):
        with pytest.raises(ValueError, match=r"block_q must be a positive int"):
            flash_attention(q, k, v, block_q=bad)


def test_integer_like_block_sizes_are_accepted():
    q, k, v = tensor(0, 1, 2, 9, 4), tensor(1, 1, 2, 7, 4), tensor(2, 1, 2, 7, 4)
    expected = flash_attention(q, k, v, block_q=4, block_k=3)
    for bq, bk in [(np.int64(4), np.int32(3)), (torch.tensor(4), torch.tensor(3, dtype=torch.int32))]:
        assert torch.equal(flash_attention(q, k, v, block_q=bq, block_k=bk), expected)
        assert torch.equal(flash_attention_forward(q, k, v, block_q=bq, block_k=bk)[0], expected)


def test_nan_and_inf_in_padded_keys_reach_no_output_and_no_gradient():
    """What lesson 02's attention and SDPA with the padding zeroed give: padding that no query reads is inert."""
    B, H, T, S, D = 2, 2, 11, 9, 4
    padding = torch.arange(S) < torch.tensor([9, 5]).view(B, 1, 1, 1)  # (B, 1, 1, S): 4 pads in sequence 1
    for poison in (float("nan"), float("inf"), float("-inf")):
        q, k, v = tensor(0, B, H, T, D), tensor(1, B, H, S, D), tensor(2, B, H, S, D)
        clean = [t.clone().requires_grad_() for t in (q, k, v)]
        k[1, :, 5:], v[1, :, 5:] = poison, poison  # the padded keys and values hold garbage
        dirty = [t.clone().requires_grad_() for t in (q, k, v)]
        d_out = tensor(3, B, H, T, D)
        out = flash_attention(*dirty, mask=padding, block_q=4, block_k=3)
        expected = flash_attention(*clean, mask=padding, block_q=4, block_k=3)
        assert torch.isfinite(out).all()
        assert (out - scaled_dot_product_attention(q, k, v, mask=padding)[0]).abs().max() <= 1e-12
        assert torch.equal(out, expected)
        grads = torch.autograd.grad(out, dirty, d_out)
        for got, want in zip(grads, torch.autograd.grad(expected, clean, d_out), strict=True):
            assert torch.isfinite(got).all() and torch.equal(got, want)
        assert torch.equal(grads[1][1, :, 5:], torch.zeros(H, 4, D, dtype=torch.float64))  # pads: no gradient
        # a key that some query reads is not padding: its NaN reaches that query, as in SDPA
        some = padding.expand(B, 1, T, S).clone()
        some[1, 0, 0, 6] = True
        assert torch.isnan(flash_attention(q, k, v, mask=some)[1, :, 0]).all()


# --- the backward (FlashAttention-2, Algorithm 2) -------------------------------------------------

def sdpa_gradients(q, k, v, d_out, mask=None):
    """dq, dk, dv by autograd through PyTorch's SDPA, with fully masked rows zeroed as the course defines them."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    if mask is None:
        out = F.scaled_dot_product_attention(*leaves)
    else:  # a fully masked row is let see every key (SDPA would give NaN), then its output is zeroed
        seen = mask.expand(*q.shape[:3], k.shape[2]).any(dim=-1, keepdim=True)  # (B, H, T, 1)
        out = F.scaled_dot_product_attention(*leaves, attn_mask=mask | ~seen).masked_fill(~seen, 0.0)
    return torch.autograd.grad(out, leaves, d_out)


def flash_gradients(q, k, v, d_out, mask=None, block_q=64, block_k=64):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = flash_attention(*leaves, mask=mask, block_q=block_q, block_k=block_k)
    assert type(out.grad_fn).__name__ == "FlashAttentionFunctionBackward"  # not autograd's record of the loops
    return torch.autograd.grad(out, leaves, d_out)


@given(B=st.integers(1, 2), H=st.integers(1, 2), T=st.integers(1, 30), S=st.integers(1, 30),
       D=st.integers(1, 8), Dv=st.integers(1, 8), block_q=st.integers(1, 13), block_k=st.integers(1, 13),
       kind=mask_shapes, p=st.sampled_from([0.1, 0.5, 0.9]), seed=st.integers(0, 10_000))
def test_gradients_equal_autograd_through_sdpa_in_float64(B, H, T, S, D, Dv, block_q, block_k, kind, p, seed):
    q, k, v = tensor(seed, B, H, T, D) * 3, tensor(seed + 1, B, H, S, D) * 3, tensor(seed + 2, B, H, S, Dv)
    d_out = tensor(seed + 4, B, H, T, Dv)
    shapes = {"BHTS": (B, H, T, S), "TS": (T, S), "B11S": (B, 1, 1, S), "1H1S": (1, H, 1, S)}
    mask = {"none": None, "causal": torch.ones(T, S, dtype=torch.bool).tril(diagonal=S - T)}.get(kind)
    if kind in shapes:
        mask = random_mask(seed + 3, shapes[kind], p)
    for name, got, expected in zip("qkv", flash_gradients(q, k, v, d_out, mask, block_q, block_k),
                                   sdpa_gradients(q, k, v, d_out, mask), strict=True):
        assert got.shape == expected.shape and got.dtype == torch.float64
        assert (got - expected).abs().max().item() <= 1e-10, name


def test_gradients_equal_autograd_through_sdpa_in_float32():
    B, H, T, S, D = 2, 3, 150, 130, 32
    q, k, v, d_out = (tensor(s, B, H, L, D, dtype=torch.float32) for s, L in zip(range(4), (T, S, S, T), strict=True))
    for mask in (None, torch.ones(T, S, dtype=torch.bool).tril(S - T),
                 random_mask(9, (B, 1, 1, S), 0.7)):
        for got, expected in zip(flash_gradients(q, k, v, d_out, mask, 32, 48), sdpa_gradients(q, k, v, d_out, mask),
                                 strict=True):
            assert got.dtype == torch.float32
            assert (got - expected).abs().max().item() <= 1e-5


@pytest.mark.parametrize("dtype, tolerance", [(torch.bfloat16, 6e-2), (torch.float16, 8e-3)])
def test_gradients_in_half_precision(dtype, tolerance):
    q, k, v, d_out = (tensor(s, 1, 2, 70, 16) for s in range(4))
    expected = sdpa_gradients(q, k, v, d_out, causal_mask(70))
    got = flash_gradients(*(t.to(dtype) for t in (q, k, v, d_out)), mask=causal_mask(70), block_q=32, block_k=16)
    for g, e in zip(got, expected, strict=True):
        assert g.dtype == dtype and (g.double() - e).abs().max().item() < tolerance


@pytest.mark.parametrize("masked", [False, True])
def test_gradcheck(masked):
    B, H, T, S, D = 1, 2, 7, 5, 3
    q, k, v = (tensor(s, B, H, L, D).requires_grad_() for s, L in zip(range(3), (T, S, S), strict=True))
    mask = None
    if masked:
        mask = random_mask(5, (B, H, T, S), 0.6)
        mask[0, 0, 2] = False  # a fully masked row
        mask[0, 1, :, 4] = False  # a key that no query of head 1 reads
    for block_q, block_k in [(3, 2), (7, 5), (2, 4)]:  # neither divides T = 7 nor S = 5, one tile, mixed
        assert torch.autograd.gradcheck(FlashAttentionFunction.apply, (q, k, v, mask, block_q, block_k), eps=1e-6,
                                        atol=1e-8)


def test_a_fully_masked_row_gets_zero_gradients_not_nan():
    q, k, v, d_out = tensor(0, 1, 1, 6, 4), tensor(1, 1, 1, 5, 4), tensor(2, 1, 1, 5, 4), tensor(3, 1, 1, 6, 4)
    mask = torch.ones(6, 5, dtype=torch.bool)
    mask[2] = False  # query 2 may attend to nothing
    mask[:, 3] = False  # key 3 is read by no query
    dq, dk, dv = flash_gradients(q, k, v, d_out, mask, 4, 2)
    for grad in (dq, dk, dv):
        assert torch.isfinite(grad).all()
    assert torch.equal(dq[0, 0, 2], torch.zeros(4, dtype=torch.float64))
    assert torch.equal(dk[0, 0, 3], torch.zeros(4, dtype=torch.float64))
    assert torch.equal(dv[0, 0, 3], torch.zeros(4, dtype=torch.float64))
    every = torch.zeros(6, 5, dtype=torch.bool)  # nothing may attend to anything
    for grad in flash_gradients(q, k, v, d_out, every, 4, 2):
        assert torch.equal(grad, torch.zeros_like(grad))


def test_backward_uses_the_saved_statistics_only():
    """The function form: dq, dk, dv from (q, k, v, out, lse, dO), equal to what autograd gets through the class."""
    q, k, v, d_out = tensor(0, 2, 1, 13, 5), tensor(1, 2, 1, 8, 5), tensor(2, 2, 1, 8, 6), tensor(3, 2, 1, 13, 6)
    mask = random_mask(4, (2, 1, 13, 8), 0.5)
    out, lse = flash_attention_forward(q, k, v, mask=mask, block_q=4, block_k=3)
    direct = flash_attention_backward(q, k, v, out, lse, d_out, mask=mask, block_q=np.int64(4), block_k=3)
    for got, expected in zip(direct, sdpa_gradients(q, k, v, d_out, mask), strict=True):
        assert (got - expected).abs().max().item() <= 1e-12
    with pytest.raises(ValueError, match=r"lse must have shape \(2, 1, 13\).*got \(2, 1, 12\)"):
        flash_attention_backward(q, k, v, out, lse[:, :, :12], d_out)
    with pytest.raises(ValueError, match=r"grad_out must have shape \(2, 1, 13, 6\).*got \(2, 1, 13, 5\)"):
        flash_attention_backward(q, k, v, out, lse, d_out[..., :5])
    with pytest.raises(TypeError, match=r"out must be a torch.Tensor"):
        flash_attention_backward(q, k, v, out.numpy(), lse, d_out)
    with pytest.raises(ValueError, match=r"block_k must be a positive int, got 0"):
        flash_attention_backward(q, k, v, out, lse, d_out, block_k=0)


def test_backward_peak_memory_grows_linearly_and_holds_no_score_matrix():
    B, H, D, bq, bk = 1, 2, 16, 64, 64
    tile = B * H * bq * bk * 4  # one (block_q, block_k) tile of float32
    extras = []
    for T in (256, 512, 1024):
        q, k, v, d_out = (tensor(s, B, H, T, D, dtype=torch.float32) for s in range(4))
        for mask in (None, causal_mask(T)):
            out, lse = flash_attention_forward(q, k, v, mask=mask)
            peak = peak_memory(flash_attention_backward, q, k, v, out, lse, d_out, mask=mask, block_q=bq,
                               block_k=bk, device="cpu")
            grads = 3 * B * H * T * D * 4  # dq, dk and dv
            rows = 2 * B * H * T * 4  # D_i and the lse, one number per query
            assert peak < B * H * T * T * 4  # less than one (T, S) matrix
            extras.append(peak - grads - rows)
    assert max(extras) <= 10 * tile, extras  # beyond the gradients: a few tiles at every T
    assert max(extras) - min(extras) <= tile, extras  # ... the same few: linear in T
    naive = [t.clone().requires_grad_() for t in (q, k, v)]
    autograd_peak = peak_memory(lambda: torch.autograd.grad(scaled_dot_product_attention(*naive)[0], naive, d_out),
                                device="cpu")
    assert autograd_peak > 10 * (peak - grads)



# --- the Triton kernels: on a CUDA GPU, or in Triton's interpreter on CPU tensors ------------------

TRITON_CASES = """
import sys
import torch, torch.nn.functional as F
from helpers.flash import flash_attention_forward, triton_flash_attention, triton_flash_attention_backward
device, dtypes = sys.argv[1], [getattr(torch, name) for name in sys.argv[2:]]
g = torch.Generator().manual_seed(0)
for dtype in dtypes:
    for causal, T, S in [(False, 45, 45), (False, 100, 37), (True, 77, 77)]:
        q, k, v = (torch.randn(2, 2, L, 32, generator=g, dtype=torch.float64).to(device, dtype) for L in (T, S, S))
        out = triton_flash_attention(q, k, v, causal=causal, block_q=32, block_k=16)
        expected = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
        assert out.dtype == dtype and out.shape == (2, 2, T, 32) and out.device.type == device
        tolerance = {torch.float16: 3e-3, torch.bfloat16: 2e-2, torch.float32: 1e-5}[dtype]
        error = (out.double() - expected).abs().max().item()
        assert error < tolerance, (dtype, causal, T, S, error)
        d_out = torch.randn(2, 2, T, 32, generator=g, dtype=torch.float64).to(device, dtype)
        leaves = [t.double().requires_grad_() for t in (q, k, v)]
        expected = torch.autograd.grad(F.scaled_dot_product_attention(*leaves, is_causal=causal), leaves,
                                       d_out.double())
        mask = torch.ones(T, S, dtype=torch.bool, device=device).tril() if causal else None
        out, lse = flash_attention_forward(q, k, v, mask=mask)  # the saved statistics, from any forward
        grads = triton_flash_attention_backward(q, k, v, out, lse, d_out, causal=causal, block_q=32, block_k=16)
        tolerance = {torch.float16: 8e-3, torch.bfloat16: 6e-2, torch.float32: 1e-5}[dtype]
        for name, got, want in zip(("dq", "dk", "dv"), grads, expected, strict=True):
            assert got.dtype == dtype and got.shape == want.shape, (name, got.dtype, got.shape)
            error = (got.double() - want).abs().max().item()
            assert error < tolerance, (dtype, causal, T, S, name, error)
        print(dtype, causal, T, S, f"{error:.1e}")
"""


def run_triton_cases(interpret: bool, device: str, dtypes: list[str]) -> None:
    """Run TRITON_CASES in a fresh process: TRITON_INTERPRET must be set before Triton is first imported."""
    env = dict(os.environ, TRITON_INTERPRET="1" if interpret else "0")
    done = subprocess.run([sys.executable, "-c", TRITON_CASES, device, *dtypes], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [line.split()[0] for line in done.stdout.splitlines()] == [f"torch.{d}" for d in dtypes for _ in range(3)]


needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="Triton is not installed (it is not in requirements.txt: its wheel is 286 MB)")


@needs_triton
def test_triton_kernel_equals_sdpa_in_the_interpreter():
    """On CPU tensors, on any machine: Triton 3.9's interpreter multiplies bf16 tiles wrongly, so fp16 and fp32."""
    run_triton_cases(True, "cpu", ["float16", "float32"])


@needs_triton
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the compiled kernel needs a CUDA GPU")
def test_triton_kernel_equals_sdpa_on_a_gpu():
    """tl.dot on bf16 tiles compiles only from compute capability 8 (not on a T4 or V100)."""
    run_triton_cases(False, "cuda", ["float16"] + (["bfloat16"] if torch.cuda.get_device_capability()[0] >= 8 else []))


def test_triton_wrapper_rejects_what_the_kernel_cannot_do(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    q = tensor(0, 1, 1, 32, 16, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"D must be a power of two >= 16 for the Triton kernel, got 12"):
        triton_flash_attention(q[..., :12], q[..., :12], q[..., :12])
    with pytest.raises(ValueError, match=r"block_k must be a power of two >= 16.*got 24"):
        triton_flash_attention(q, q, q, block_k=24)
    with pytest.raises(ValueError, match=r"causal needs T == S.*T=32 and S=16"):
        triton_flash_attention(q, q[:, :, :16], q[:, :, :16], causal=True)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"Triton kernels run on CUDA tensors, got cpu.*TRITON_INTERPRET=1"):
            triton_flash_attention(q, q, q)
        with pytest.raises(ValueError, match=r"Triton kernels run on CUDA tensors, got cpu"):
            triton_flash_attention_backward(q, q, q, q, q[..., 0], q)
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # past the device rule: the saved tensors are checked too
    with pytest.raises(ValueError, match=r"lse must have shape \(1, 1, 32\).*got \(1, 1, 32, 16\)"):
        triton_flash_attention_backward(q, q, q, q, q, q)
    with pytest.raises(ValueError, match=r"block_q must be a power of two >= 16.*got 8"):
        triton_flash_attention_backward(q, q, q, q, q[..., 0], q, block_q=8)

def test_the_lessons_triton_kernel_is_the_tested_one():
    """Lesson 10 writes the kernel that only a GPU runs; it must be the helper's kernel, comments aside."""
    import ast
    import json
    from pathlib import Path

    def kernel(tree):
        found = [node for node in ast.walk(tree)
                 if isinstance(node, ast.FunctionDef) and node.name == "flash_forward_kernel"]
        assert len(found) == 1
        return ast.dump(found[0])

    notebook = Path(__file__).resolve().parents[1] / "notebooks" / "10_flash_attention.ipynb"
    cells = [c["source"] for c in json.loads(notebook.read_text())["cells"] if c["cell_type"] == "code"]
    lesson = [c for c in cells if "def flash_forward_kernel" in c]
    assert len(lesson) == 1
    helper = Path(__file__).resolve().parents[1] / "helpers" / "_flash_triton.py"  # imports Triton: read, not import
    assert kernel(ast.parse(lesson[0])) == kernel(ast.parse(helper.read_text()))


def test_a_nan_query_that_reads_nothing_reaches_no_gradient():
    """A fully masked query reads nothing: a NaN in it must leave dk, dv and the other rows of dq finite."""
    torch.manual_seed(0)
    q, k, v, d_out = (torch.randn(1, 2, 6, 8, dtype=torch.float64) for _ in range(4))
    mask = torch.ones(1, 1, 6, 6, dtype=torch.bool)
    mask[..., 2, :] = False  # query 2 may read no key
    q[:, :, 2] = float("nan")
    out, lse = flash_attention_forward(q, k, v, mask=mask, block_q=4, block_k=4)
    dq, dk, dv = flash_attention_backward(q, k, v, out, lse, d_out, mask, 4, 4)
    assert torch.isfinite(dk).all() and torch.isfinite(dv).all() and torch.isfinite(dq).all()
    assert (dq[:, :, 2] == 0).all() and (out[:, :, 2] == 0).all()
    # and the course's attention, both paths, under autograd
    for fused in (False, True):
        qq, kk = q.clone().requires_grad_(), k.clone().requires_grad_()
        attend = _fused_attention if fused else (lambda *a, **kw: scaled_dot_product_attention(*a, **kw)[0])
        attend(qq, kk, v, mask=mask).mul(d_out).sum().backward()
        assert torch.isfinite(kk.grad).all() and torch.isfinite(qq.grad).all(), fused
