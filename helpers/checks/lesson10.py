"""Exercise checks of lesson 10 (each one prints a single line and returns True or False)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from helpers.checks._core import Bug, Case, CheckResult, check, check_prediction, first_output, torch_calls
from helpers.device import peak_memory
from helpers.flash import flash_attention_forward
from helpers.masks import causal_mask

__all__ = ["check_online_logsumexp", "check_skipped_blocks", "check_causal_flash_attention", "check_flash_dv",
           "check_predict_skipped_tiles"]

# float64 answers must agree to 1e-10 (the lesson's own tolerance), float32 ones to 1e-5; a known bug
# computed another way than the learner's answer agrees with it to (float32) rounding only
_TOLERANCES = {"atol": {torch.float64: 1e-10, torch.float32: 1e-5}, "rtol": 0.0, "bug_tolerance": (1e-4, 1e-4)}


def _rand(g, *shape):
    return torch.randn(*shape, generator=g, dtype=torch.float64)


# --- exercise 1: the online log-sum-exp --------------------------------------------------------------

def _logsumexp_of_divisible_part(x, chunk):
    n = x.shape[-1] // chunk * chunk  # the bug: the last, shorter chunk is dropped
    return torch.logsumexp(x[..., :n], dim=-1)  # -inf when no whole chunk fits


def _logsumexp_without_max(x, chunk):
    return torch.log(torch.exp(x).sum(dim=-1))


class _WholeRowReductions(TorchFunctionMode):
    """Record the reductions (logsumexp, softmax, max, ...) called on tensors whose last dim is a whole row."""

    NAMES = {"logsumexp", "special_logsumexp", "logcumsumexp", "softmax", "log_softmax", "amax", "max"}

    def __init__(self, row_length: int):
        super().__init__()
        self.row_length, self.found = row_length, []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in self.NAMES and args and isinstance(args[0], torch.Tensor) and args[0].dim() > 0:
            x, rest = args[0], args[1:]
            dim = kwargs.get("dim", rest[0] if rest else None)
            if not isinstance(dim, torch.Tensor):  # torch.max(a, b) is elementwise, not a reduction
                dims = range(x.dim()) if dim is None or dim == () else [dim] if isinstance(dim, int) else dim
                try:
                    whole_row = x.shape[-1] == self.row_length and x.dim() - 1 in [d % x.dim() for d in dims]
                except TypeError:  # named dimensions: not ours to judge
                    whole_row = False
                if whole_row:
                    self.found.append(name)
        return func(*args, **kwargs)


def _reads_in_chunks(fn):
    """The values are right; now make sure that no reduction ran over a whole row at once."""
    g = torch.Generator().manual_seed(15)
    N, chunk = 10, 3  # ceil(10 / 3) = 4 chunks: a (..., N) tensor can only be a whole row
    with _WholeRowReductions(N) as recorder:
        fn(_rand(g, 3, N), chunk)
    if recorder.found:
        return False, (f"the values are right, but it called {recorder.found[0]} over whole rows of {N} entries "
                       f"(chunk={chunk}): read x {chunk} entries at a time, keeping a running maximum and a "
                       "running sum")
    return True, ", -inf entries and an all -inf row included"


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
    bugs = [Bug("the result is the log-sum-exp of the first chunks only: the last, shorter chunk is missing",
                _logsumexp_of_divisible_part),
            Bug("the result overflows: exp of large entries is inf unless the running maximum is subtracted "
                "first", _logsumexp_without_max)]
    return check("online_logsumexp", fn, lambda x, chunk: torch.logsumexp(x, dim=-1), cases, bugs=bugs,
                 **_TOLERANCES, matches="matches torch.logsumexp", then=_reads_in_chunks)


# --- exercise 2: counting the blocks a causal kernel skips -------------------------------------------

def _skipped_block_count(T: int, block_q: int, block_k: int) -> int:
    """Tiles (query block, key block) of causal self-attention over T positions lying wholly above the diagonal."""
    skipped = 0
    for i0 in range(0, T, block_q):
        last_query = min(i0 + block_q, T) - 1
        skipped += sum(1 for j0 in range(0, T, block_k) if j0 > last_query)  # every key is in the future
    return skipped


def _whole_blocks_only(T, bq, bk):
    return sum(1 for i in range(T // bq) for j in range(T // bk) if j * bk > (i + 1) * bq - 1)


def _diagonal_too(T, bq, bk):
    return sum(1 for i0 in range(0, T, bq) for j0 in range(0, T, bk) if j0 + bk - 1 > i0)


def _below_instead(T, bq, bk):
    return sum(1 for i0 in range(0, T, bq) for j0 in range(0, T, bk) if min(j0 + bk, T) - 1 <= i0)


def check_skipped_blocks(fn) -> CheckResult:
    """Check ``skipped_blocks(T, block_q, block_k)``: tiles a causal kernel never computes (lesson 10)."""
    sizes = [(256, 64, 64), (100, 32, 32), (8192, 128, 64), (1000, 64, 128), (5, 2, 3), (1, 64, 64),
             (50, 64, 64), (33, 1, 1)]
    cases = [Case(f"T={T}, block_q={bq}, block_k={bk}", (T, bq, bk)) for T, bq, bk in sizes]
    bugs = [Bug("that leaves out the last, shorter blocks (T // block blocks instead of ceil(T / block)): "
                "they count too", _whole_blocks_only),
            Bug("that also counts the tiles on the diagonal: a tile is skipped only if every key in it comes "
                "after every query in it", _diagonal_too),
            Bug("that counts the tiles wholly below the diagonal (the ones that are computed without a mask)",
                _below_instead)]
    T, bq, bk = 8192, 128, 64
    total = math.ceil(T / bq) * math.ceil(T / bk)
    summary = (f"; at T={T} with {bq}x{bk} tiles a causal kernel skips {_skipped_block_count(T, bq, bk)} of "
               f"{total} tiles")
    return check("skipped_blocks", fn, _skipped_block_count, cases, bugs=bugs, matches="right",
                 then=lambda fn: (True, summary))


def _fully_masked_tiles(T: int, block_q: int, block_k: int) -> int:
    """Count, on lesson 05's causal mask itself, the (block_q, block_k) tiles holding no allowed pair."""
    allowed = causal_mask(T).view(T // block_q, block_q, T // block_k, block_k)  # (nq, bq, nk, bk)
    return int((~allowed.any(dim=3).any(dim=1)).sum())


def check_predict_skipped_tiles(predicted) -> CheckResult:
    """Predict then count: 64 x 64 tiles of a causal mask at T = S = 1024 with no allowed pair (lesson 10)."""
    return check_prediction("predict_skipped_tiles", predicted, lambda: _fully_masked_tiles(1024, 64, 64),
                            "number of fully masked 64x64 tiles (of 256)")


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


def _attends_to_the_future(q, k, v, bq, bk):
    return F.scaled_dot_product_attention(q, k, v)


def _reversed_mask(q, k, v, bq, bk):
    T = q.shape[-2]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(T, T, dtype=torch.bool).triu())


def _sees_only_the_past(first_row: float):
    """Causal attention where query t sees keys 0..t-1 only: row 0 sees nothing and becomes ``first_row``."""

    def attend(q, k, v, bq, bk):
        T = q.shape[-2]
        mask = torch.ones(T, T, dtype=torch.bool).tril(-1)  # the bug: j >= i masked, not j > i
        mask[0, 0] = True  # keeps SDPA finite; row 0 is replaced below
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        out[..., 0, :] = first_row  # NaN from 0 / 0, or 0 where the sum was clamped
        return out

    return attend


def _unscaled_causal(q, k, v, bq, bk):
    return F.scaled_dot_product_attention(q * math.sqrt(q.shape[-1]), k, v, is_causal=True)  # no 1/sqrt(D)


def _skips_tiles(fn):
    """The values are right; now count the FLOPs of fn's matrix products against skipping every tile it may."""
    g = torch.Generator().manual_seed(13)
    B, H, T, D, bq, bk = 1, 2, 128, 8, 16, 16
    q, k, v = (_rand(g, B, H, T, D) for _ in range(3))
    if "scaled_dot_product_attention" in torch_calls(fn, q, k, v, bq, bk):
        return False, ("the values are right, but compute the tiles yourself with @: "
                       "F.scaled_dot_product_attention does not show the tiling")
    used = _matmul_flops(fn, q, k, v, bq, bk)
    if used == 0:
        return False, ("the values are right, but no matrix product was counted: compute each tile with @ "
                       "(q_i @ k_j^T, then p @ v_j), so that the check can see which tiles you compute")
    needed = _causal_flops(B, H, T, D, bq, bk)
    full = 4 * B * H * T * T * D
    if used > needed:
        return False, (f"the values are right, but at T={T} with {bq}x{bk} tiles your matrix products cost "
                       f"{used:,} FLOPs, where skipping the tiles above the diagonal needs {needed:,} (all tiles: "
                       f"{full:,}): stop the loop over key blocks at the last query of the block")
    return True, (f", and at T={T} with {bq}x{bk} tiles it did {used / full:.0%} of the matrix-product FLOPs of "
                  "computing every tile")


def check_causal_flash_attention(fn) -> CheckResult:
    """Check ``causal_flash_attention(q, k, v, block_q, block_k)``: causal, skipping tiles (lesson 10)."""
    g = torch.Generator().manual_seed(11)

    def qkv(*shape, dtype=torch.float64):
        return tuple(_rand(g, *shape).to(dtype) for _ in range(3))

    cases = [Case("B=1, H=2, T=32, D=8, blocks 8x8", qkv(1, 2, 32, 8) + (8, 8)),
             Case("B=2, H=1, T=37, D=4, blocks 16x5 (T not a multiple)", qkv(2, 1, 37, 4) + (16, 5)),
             Case("B=1, H=1, T=10, D=3, blocks 64x64 (one tile)", qkv(1, 1, 10, 3) + (64, 64)),
             Case("float32, B=1, H=3, T=50, D=8, blocks 7x9", qkv(1, 3, 50, 8, dtype=torch.float32) + (7, 9))]
    bugs = [Bug("it attends to future keys: query t may see keys 0..t only", _attends_to_the_future),
            Bug("the mask points the wrong way: query t sees keys t..T-1 instead of 0..t", _reversed_mask),
            *(Bug("a query must see itself: mask key j from query i only when j > i, not when j >= i",
                  _sees_only_the_past(first_row)) for first_row in (float("nan"), 0.0)),
            Bug("the scale is missing: the scores are q k^T / sqrt(D)", _unscaled_causal)]
    # (out, lse), as tiled_attention returns, is accepted: the check compares out
    return check("causal_flash_attention", fn, _causal_reference, cases, bugs=bugs, **_TOLERANCES,
                 adapt=first_output, matches="matches causal SDPA", then=_skips_tiles)


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


def _tile_memory(fn):
    """The values are right; now measure that fn never holds a whole (T, S) matrix."""
    g = torch.Generator().manual_seed(14)
    T, D = 512, 8
    q, k, d_out = (_rand(g, 1, 1, T, D).float() for _ in range(3))
    _, lse = flash_attention_forward(q, k, k)
    used = peak_memory(fn, q, k, d_out, lse, 64, 64, device="cpu")
    full = T * T * 4  # one (T, S) matrix in float32
    if used >= full:
        return False, (f"the values are right, but at T=S={T} it allocated {used:,} bytes, at least one whole "
                       f"(T, S) matrix ({full:,} bytes): recompute one (block_q, block_k) tile of weights at a time")
    return True, f", and at T=S={T} it needed {used / full:.0%} of the memory of one (T, S) matrix"


def check_flash_dv(fn) -> CheckResult:
    """Check ``flash_dv(q, k, d_out, lse, block_q, block_k)``: dL/dv from the saved log-sum-exp (lesson 10)."""
    g = torch.Generator().manual_seed(12)

    def case(title, B, H, T, S, D, bq, bk, dtype=torch.float64):
        q, k, v = _rand(g, B, H, T, D).to(dtype), _rand(g, B, H, S, D).to(dtype), _rand(g, B, H, S, D).to(dtype)
        _, lse = flash_attention_forward(q, k, v)
        return Case(title, (q, k, _rand(g, B, H, T, D).to(dtype), lse.to(dtype), bq, bk))

    cases = [case("B=1, H=2, T=16, S=16, D=4, blocks 4x4", 1, 2, 16, 16, 4, 4, 4),
             case("B=2, H=1, T=13, S=29, D=8, blocks 5x6 (neither a multiple)", 2, 1, 13, 29, 8, 5, 6),
             case("B=1, H=1, T=40, S=9, D=3, blocks 64x64 (one tile)", 1, 1, 40, 9, 3, 64, 64),
             case("float32, B=1, H=2, T=21, S=21, D=8, blocks 8x8", 1, 2, 21, 21, 8, 8, 8, torch.float32)]
    bugs = [Bug("the scale is missing: the weights are exp(q k^T / sqrt(D) - lse)", _dv_unscaled),
            Bug("the weights are not normalised: subtract the saved log-sum-exp before exp", _dv_unnormalised)]
    return check("flash_dv", fn, _dv_reference, cases, bugs=bugs, **_TOLERANCES, matches="matches autograd",
                 then=_tile_memory)
