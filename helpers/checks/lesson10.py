"""Exercise checks of lesson 10 (each one prints a single line and returns True or False)."""

from __future__ import annotations

import math
import numbers

import torch
import torch.nn.functional as F

from helpers.checks._core import Case, CheckResult
from helpers.device import peak_memory
from helpers.flash import flash_attention_forward

__all__ = ["check_online_logsumexp", "check_skipped_blocks", "check_causal_flash_attention", "check_flash_dv"]


def _fail(name: str, message: str) -> CheckResult:
    print(f"✗ {name}: {message}")
    return CheckResult(False)


def _tensors(args) -> list[tuple[int, torch.Tensor]]:
    return [(i, a) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]


def _run_strict(name, fn, reference, cases, atol, bugs=(), arg_names=()):
    """Run fn on every case and insist on a tensor of the reference's shape and dtype, inputs untouched.

    ``bugs`` are (description, buggy_fn): when fn's wrong answer equals a buggy function's answer,
    the line names that bug. Returns None when every case matches, else the printed CheckResult.
    """
    if not callable(fn):
        return _fail(name, f"expected a function, got {type(fn).__name__}")
    for case in cases:
        args = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in case.args)
        try:
            got = fn(*args)
        except NotImplementedError:
            got = None
        except Exception as err:  # the learner's bug is the message, not a crash of the check
            return _fail(name, f"on {case.name}, your function raised {type(err).__name__}: {err}")
        if got is None:
            print(f"… {name}: not implemented yet (your function returned None)")
            return CheckResult(False)
        for i, original in _tensors(case.args):
            if not torch.equal(args[i], original):
                arg = arg_names[i] if i < len(arg_names) else f"argument {i}"
                return _fail(name, f"on {case.name}, your function changed its input `{arg}` in place: "
                                   "work on new tensors and leave the inputs as they were")
        expected = reference(*case.args)
        if not isinstance(got, torch.Tensor):
            return _fail(name, f"on {case.name}, it returned a {type(got).__name__}, expected a torch.Tensor "
                               f"of shape {tuple(expected.shape)}")
        if got.dtype != expected.dtype:
            return _fail(name, f"on {case.name}, the result has dtype {got.dtype}, expected {expected.dtype} "
                               "(the inputs' dtype)")
        if tuple(got.shape) != tuple(expected.shape):
            return _fail(name, f"on {case.name}, the result has shape {tuple(got.shape)}, expected "
                               f"{tuple(expected.shape)}")
        same_inf = torch.equal(torch.isinf(got), torch.isinf(expected)) and torch.equal(
            got[torch.isinf(got)], expected[torch.isinf(expected)])
        finite = torch.isfinite(expected)
        tol = atol if expected.dtype == torch.float64 else max(atol, 1e-5)
        if same_inf and not torch.isnan(got).any() and torch.allclose(got[finite], expected[finite],
                                                                      atol=tol, rtol=0):
            continue
        for describe, buggy in bugs:
            wrong = buggy(*case.args)
            if wrong is not None and wrong.shape == got.shape and torch.allclose(
                    got.double(), wrong.double(), atol=1e-6, rtol=1e-6, equal_nan=True):
                return _fail(name, f"on {case.name}: {describe}")
        if torch.isnan(got).any():
            return _fail(name, f"on {case.name}, the result contains NaN where the reference has none "
                               "(an all -inf row? exp(-inf - (-inf)) is nan)")
        if not same_inf:
            return _fail(name, f"on {case.name}, the result has inf where the reference has a number or the "
                               "other way round (overflow? a fully masked row?)")
        diff = (got[finite] - expected[finite]).abs().max().item()
        return _fail(name, f"on {case.name}, values differ from the reference (largest difference {diff:.3g})")
    return None


def _rand(g, *shape):
    return torch.randn(*shape, generator=g, dtype=torch.float64)


# --- exercise 1: the online log-sum-exp --------------------------------------------------------------

def _logsumexp_of_divisible_part(x, chunk):
    n = x.shape[-1] // chunk * chunk  # the bug: the last, shorter chunk is dropped
    return torch.logsumexp(x[..., :n], dim=-1) if n else None


def _logsumexp_without_max(x, chunk):
    return torch.log(torch.exp(x).sum(dim=-1))


def check_online_logsumexp(fn) -> CheckResult:
    """Check ``online_logsumexp(x, chunk)``: log(sum(exp(x))) over the last dim, by chunks (lesson 10)."""
    g = torch.Generator().manual_seed(10)
    x = _rand(g, 4, 12) * 3
    x_masked = x.clone()
    x_masked[0, ::2] = float("-inf")  # masked entries
    x_masked[1] = float("-inf")  # a fully masked row
    cases = [Case("x of shape (4, 12), chunk=4 (divides the row)", (x, 4)),
             Case("x of shape (4, 12), chunk=5 (the last chunk is shorter)", (x, 5)),
             Case("x of shape (3, 7), chunk=1", (_rand(g, 3, 7), 1)),
             Case("x of shape (2, 5), chunk=8 (longer than the row)", (_rand(g, 2, 5), 8)),
             Case("x with -inf entries and an all -inf row, chunk=5", (x_masked, 5)),
             Case("x of shape (2, 3, 9) times 1000 (huge values), chunk=4", (_rand(g, 2, 3, 9) * 1000, 4)),
             Case("float32 x of shape (5, 10), chunk=3", (_rand(g, 5, 10).float(), 3))]
    bugs = [("the result is the log-sum-exp of the first chunks only: the last, shorter chunk is missing",
             _logsumexp_of_divisible_part),
            ("the result overflows: exp of large entries is inf unless the running maximum is subtracted first",
             _logsumexp_without_max)]
    failed = _run_strict("online_logsumexp", fn, lambda x, chunk: torch.logsumexp(x, dim=-1), cases,
                         atol=1e-10, bugs=bugs, arg_names=("x",))
    if failed is not None:
        return failed
    print(f"✓ online_logsumexp: matches torch.logsumexp on all {len(cases)} cases, -inf entries and an all -inf "
          "row included")
    return CheckResult(True)


# --- exercise 2: counting the blocks a causal kernel skips -------------------------------------------

def _skipped_block_count(T: int, block_q: int, block_k: int) -> int:
    """Tiles (query block, key block) of causal self-attention over T positions lying wholly above the diagonal."""
    skipped = 0
    for i0 in range(0, T, block_q):
        last_query = min(i0 + block_q, T) - 1
        skipped += sum(1 for j0 in range(0, T, block_k) if j0 > last_query)  # every key is in the future
    return skipped


def check_skipped_blocks(fn) -> CheckResult:
    """Check ``skipped_blocks(T, block_q, block_k)``: tiles a causal kernel never computes (lesson 10)."""
    name = "skipped_blocks"
    cases = [(256, 64, 64), (100, 32, 32), (8192, 128, 64), (1000, 64, 128), (5, 2, 3), (1, 64, 64),
             (50, 64, 64), (33, 1, 1)]
    bugs = [("that leaves out the last, shorter blocks (T // block blocks instead of ceil(T / block)): "
             "they count too", lambda T, bq, bk: sum(1 for i in range(T // bq) for j in range(T // bk)
                                                     if j * bk > (i + 1) * bq - 1)),
            ("that also counts the tiles on the diagonal: a tile is skipped only if every key in it comes "
             "after every query in it", lambda T, bq, bk: sum(1 for i0 in range(0, T, bq) for j0 in range(0, T, bk)
                                                               if j0 + bk - 1 > i0)),
            ("that counts the tiles wholly below the diagonal (the ones that are computed without a mask)",
             lambda T, bq, bk: sum(1 for i0 in range(0, T, bq) for j0 in range(0, T, bk)
                                   if min(j0 + bk, T) - 1 <= i0))]
    if not callable(fn):
        return _fail(name, f"expected a function, got {type(fn).__name__}")
    for T, bq, bk in cases:
        where = f"T={T}, block_q={bq}, block_k={bk}"
        try:
            got = fn(T, bq, bk)
        except NotImplementedError:
            got = None
        except Exception as err:
            return _fail(name, f"on {where}, your function raised {type(err).__name__}: {err}")
        if got is None:
            print(f"… {name}: not implemented yet (your function returned None)")
            return CheckResult(False)
        if isinstance(got, bool) or not isinstance(got, numbers.Integral):
            return _fail(name, f"on {where}, it returned {got!r} of type {type(got).__name__}: expected an int")
        expected = _skipped_block_count(T, bq, bk)
        if got == expected:
            continue
        for describe, buggy in bugs:
            if got == buggy(T, bq, bk) and buggy(T, bq, bk) != expected:
                return _fail(name, f"on {where}, got {got}: {describe}")
        return _fail(name, f"on {where}, got {got}, expected {expected}")
    T, bq, bk = 8192, 128, 64
    total = math.ceil(T / bq) * math.ceil(T / bk)
    print(f"✓ {name}: right on all {len(cases)} cases; at T={T} with {bq}x{bk} tiles a causal kernel skips "
          f"{_skipped_block_count(T, bq, bk)} of {total} tiles")
    return CheckResult(True)


# --- exercise 3: causal attention that skips the tiles above the diagonal ----------------------------

def _causal_reference(q, k, v, block_q, block_k):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _causal_flops(B, H, T, D, block_q, block_k):
    """Matmul FLOPs of a tiled causal forward that computes only the tiles on or below the diagonal."""
    flops = 0
    for i0 in range(0, T, block_q):
        i1 = min(i0 + block_q, T)
        for j0 in range(0, i1, block_k):  # key blocks that start at or before the last query
            j1 = min(j0 + block_k, T)
            flops += 2 * 2 * (i1 - i0) * (j1 - j0) * D  # q k^T and p @ v
    return B * H * flops


def _matmul_flops(fn, *args):
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn(*args)
    return counter.get_total_flops()


def check_causal_flash_attention(fn) -> CheckResult:
    """Check ``causal_flash_attention(q, k, v, block_q, block_k)``: causal, skipping tiles (lesson 10)."""
    name = "causal_flash_attention"
    g = torch.Generator().manual_seed(11)
    cases = [Case("B=1, H=2, T=32, D=8, blocks 8x8", (_rand(g, 1, 2, 32, 8), _rand(g, 1, 2, 32, 8),
                                                     _rand(g, 1, 2, 32, 8), 8, 8)),
             Case("B=2, H=1, T=37, D=4, blocks 16x5 (T not a multiple)", (_rand(g, 2, 1, 37, 4),
                                                                         _rand(g, 2, 1, 37, 4),
                                                                         _rand(g, 2, 1, 37, 4), 16, 5)),
             Case("B=1, H=1, T=10, D=3, blocks 64x64 (one tile)", (_rand(g, 1, 1, 10, 3), _rand(g, 1, 1, 10, 3),
                                                                    _rand(g, 1, 1, 10, 3), 64, 64)),
             Case("float32, B=1, H=3, T=50, D=8, blocks 7x9", tuple(_rand(g, 1, 3, 50, 8).float() for _ in range(3))
                  + (7, 9))]

    def attends_to_the_future(q, k, v, bq, bk):
        return F.scaled_dot_product_attention(q, k, v)

    def reversed_mask(q, k, v, bq, bk):
        T = q.shape[-2]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(T, T, dtype=torch.bool).triu())
        return out

    bugs = [("it attends to future keys: query t may see keys 0..t only", attends_to_the_future),
            ("the mask points the wrong way: query t sees keys t..T-1 instead of 0..t", reversed_mask)]
    failed = _run_strict(name, fn, _causal_reference, cases, atol=1e-10, bugs=bugs,
                         arg_names=("q", "k", "v"))
    if failed is not None:
        return failed
    B, H, T, D, bq, bk = 1, 2, 128, 8, 16, 16
    q, k, v = (_rand(g, B, H, T, D) for _ in range(3))
    used = _matmul_flops(fn, q, k, v, bq, bk)
    needed = _causal_flops(B, H, T, D, bq, bk)
    full = 4 * B * H * T * T * D
    if used > needed:
        return _fail(name, f"the values are right, but at T={T} with {bq}x{bk} tiles your matrix products cost "
                           f"{used:,} FLOPs, where skipping the tiles above the diagonal needs {needed:,} (all tiles: "
                           f"{full:,}): stop the loop over key blocks at the last query of the block")
    print(f"✓ {name}: matches causal SDPA on all {len(cases)} cases, and at T={T} with {bq}x{bk} tiles it did "
          f"{used / full:.0%} of the matrix-product FLOPs of computing every tile")
    return CheckResult(True)


# --- exercise 4: the gradient of v from the saved log-sum-exp ----------------------------------------

def _dv_reference(q, k, d_out, lse, block_q, block_k):
    v = torch.zeros(*k.shape[:3], d_out.shape[-1], dtype=q.dtype, requires_grad=True)
    with torch.enable_grad():
        out = F.scaled_dot_product_attention(q, k, v)  # the output is linear in v
        (d_v,) = torch.autograd.grad(out, v, d_out)
    return d_v


def _dv_unscaled(q, k, d_out, lse, block_q, block_k):
    p = torch.exp(q @ k.transpose(-2, -1) - lse[..., None])  # (B, H, T, S), the bug: no 1/sqrt(D)
    return p.transpose(-2, -1) @ d_out


def _dv_unnormalised(q, k, d_out, lse, block_q, block_k):
    p = torch.exp(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]))  # the bug: lse not subtracted
    return p.transpose(-2, -1) @ d_out


def check_flash_dv(fn) -> CheckResult:
    """Check ``flash_dv(q, k, d_out, lse, block_q, block_k)``: dL/dv from the saved log-sum-exp (lesson 10)."""
    name = "flash_dv"
    g = torch.Generator().manual_seed(12)

    def case(title, B, H, T, S, D, bq, bk, dtype=torch.float64):
        q, k, v = _rand(g, B, H, T, D).to(dtype), _rand(g, B, H, S, D).to(dtype), _rand(g, B, H, S, D).to(dtype)
        _, lse = flash_attention_forward(q, k, v)
        return Case(title, (q, k, _rand(g, B, H, T, D).to(dtype), lse.to(dtype), bq, bk))

    cases = [case("B=1, H=2, T=16, S=16, D=4, blocks 4x4", 1, 2, 16, 16, 4, 4, 4),
             case("B=2, H=1, T=13, S=29, D=8, blocks 5x6 (neither a multiple)", 2, 1, 13, 29, 8, 5, 6),
             case("B=1, H=1, T=40, S=9, D=3, blocks 64x64 (one tile)", 1, 1, 40, 9, 3, 64, 64),
             case("float32, B=1, H=2, T=21, S=21, D=8, blocks 8x8", 1, 2, 21, 21, 8, 8, 8, torch.float32)]
    bugs = [("the scale is missing: the weights are exp(q k^T / sqrt(D) - lse)", _dv_unscaled),
            ("the weights are not normalised: subtract the saved log-sum-exp before exp", _dv_unnormalised)]
    failed = _run_strict(name, fn, _dv_reference, cases, atol=1e-10, bugs=bugs,
                         arg_names=("q", "k", "d_out", "lse"))
    if failed is not None:
        return failed
    T, D = 512, 8
    q, k, d_out = (_rand(g, 1, 1, T, D).float() for _ in range(3))
    _, lse = flash_attention_forward(q, k, k)
    used = peak_memory(fn, q, k, d_out, lse, 64, 64, device="cpu")
    full = T * T * 4  # one (T, S) matrix in float32
    if used >= full:
        return _fail(name, f"the values are right, but at T=S={T} it allocated {used:,} bytes, at least one whole "
                           f"(T, S) matrix ({full:,} bytes): recompute one (block_q, block_k) tile of weights at a "
                           "time")
    print(f"✓ {name}: matches autograd on all {len(cases)} cases, and at T=S={T} it needed {used / full:.0%} of the "
          "memory of one (T, S) matrix")
    return CheckResult(True)
