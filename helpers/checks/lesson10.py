"""Exercise checks of lesson 10 (each one prints a single line and returns True or False)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from helpers.checks._core import Bug, Case, CheckResult, Reject, check, torch_calls
from helpers.device import peak_memory
from helpers.flash import flash_attention_forward

__all__ = ["check_online_logsumexp", "check_skipped_blocks", "check_causal_flash_attention", "check_flash_dv",
           "check_flash_dq_dk"]

# float64 answers must agree to 1e-10 (the lesson's own tolerance), float32 ones to 1e-5; a known bug
# computed another way than the learner's answer agrees with it to (float32) rounding only
_TOLERANCES = {"atol": {torch.float64: 1e-10, torch.float32: 1e-5}, "rtol": 0.0, "bug_tolerance": (1e-4, 1e-4)}


def _rand(g, *shape):
    return torch.randn(*shape, generator=g, dtype=torch.float64)


def _guarded(step):
    """A ``then`` step that ends in a reason, never a traceback, whatever the learner's function does."""

    def run(fn):
        try:
            return step(fn)
        except Exception as err:  # the learner's function failed on the extra inputs of this step
            return False, f"the values are right, but then your function raised {type(err).__name__}: {err}"

    return run


def _output_only(got, expected):
    """Accept ``out`` or ``(out, lse)``; a Reject with the reason for an empty tuple, never an IndexError."""
    if isinstance(got, (tuple, list)):
        if len(got) == 0:
            return Reject(f"your function returned an empty {type(got).__name__}: "
                          "return the output tensor (B, H, T, D)")
        return got[0]
    return got


# --- exercise 1: the online log-sum-exp --------------------------------------------------------------

def _logsumexp_of_divisible_part(x, chunk):
    n = x.shape[-1] // chunk * chunk  # the bug: the last, shorter chunk is dropped
    return torch.logsumexp(x[..., :n], dim=-1)  # -inf when no whole chunk fits


def _logsumexp_nan_rows(x, chunk):
    m = x.amax(dim=-1, keepdim=True)  # the bug: -inf for an all -inf row, and -inf - (-inf) = NaN
    return (m + torch.log(torch.exp(x - m).sum(dim=-1, keepdim=True))).squeeze(-1)


def _logsumexp_without_max(x, chunk):
    return torch.log(torch.exp(x).sum(dim=-1))


def _finite_or_zero(m):
    return torch.where(torch.isfinite(m), m, torch.zeros_like(m))


def _online_variant(rescale=True, running_max=True, guard=True, final_where=False):
    """The online log-sum-exp with one of the likely mistakes switched on."""

    def logsumexp(x, chunk):
        m = torch.full(x.shape[:-1], float("-inf"), dtype=x.dtype)  # (...)
        total = torch.zeros(x.shape[:-1], dtype=x.dtype)  # (...)
        for part in x.split(chunk, dim=-1):
            own = part.amax(dim=-1)  # (...)
            m_new = torch.maximum(m, own)
            shift = m_new if running_max else own  # the bug: each chunk's own maximum
            shift = _finite_or_zero(shift) if guard else shift  # the bug: -inf - (-inf) = NaN
            kept = total * torch.exp(m - (_finite_or_zero(m_new) if guard else m_new)) if rescale else total
            total = kept + torch.exp(part - shift[..., None]).sum(dim=-1)
            m = m_new
        lse = m + torch.log(total)
        return torch.where(total > 0, lse, torch.full_like(lse, float("-inf"))) if final_where else lse

    return logsumexp


class _SlicesOfX(TorchFunctionMode):
    """Count the entries of x read through views of at most ``chunk`` entries along the last dim, cut from x itself.

    Views cut from such a chunk (``part[..., None]``) are not counted again: only a second pass over x is.
    """

    def __init__(self, x, chunk):
        super().__init__()
        self.storage, self.numel, self.chunk, self.read = x.untyped_storage().data_ptr(), x.numel(), chunk, 0

    def _whole_x(self, value):
        return isinstance(value, torch.Tensor) and value.numel() == self.numel \
            and value.untyped_storage().data_ptr() == self.storage

    def _count(self, out):
        if isinstance(out, (tuple, list)):
            for item in out:
                self._count(item)
        elif isinstance(out, torch.Tensor) and out.dim() > 0 and 0 < out.shape[-1] <= self.chunk \
                and out.untyped_storage().data_ptr() == self.storage:
            self.read += out.numel()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if any(self._whole_x(a) for a in args):
            self._count(out)
        return out


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
    """The values are right; now make sure that x is read once, in chunks, with no whole-row reduction."""
    g = torch.Generator().manual_seed(15)
    N, chunk = 10, 3  # ceil(10 / 3) = 4 chunks: a (..., N) tensor can only be a whole row
    x = _rand(g, 3, N)
    with _WholeRowReductions(N) as recorder:
        fn(x.clone(), chunk)
    if recorder.found:
        return False, (f"the values are right, but it called {recorder.found[0]} over whole rows of {N} entries "
                       f"(chunk={chunk}): read x {chunk} entries at a time, keeping a running maximum and a "
                       "running sum")
    with _SlicesOfX(x, chunk) as slices:
        fn(x, chunk)
    if slices.read > 1.5 * x.numel():
        return False, (f"the values are right, but it read the entries of x {slices.read / x.numel():.0f} times "
                       "(a pass for the maximum, a pass for the sum): keep one running sum, multiplied by "
                       "e^(m - m') whenever the maximum grows, so that one pass suffices")
    return True, ", -inf entries, left padding and an all -inf row included"


def check_online_logsumexp(fn) -> CheckResult:
    """Check ``online_logsumexp(x, chunk)``: log(sum(exp(x))) over the last dim, by chunks (lesson 10)."""
    g = torch.Generator().manual_seed(10)
    x = _rand(g, 4, 12) * 3
    x_masked = x.clone()
    x_masked[0, ::2] = float("-inf")  # masked entries
    x_masked[1] = float("-inf")  # a fully masked row
    x_masked[2, :6] = float("-inf")  # left padding: the first chunk is all -inf, later ones are not
    x_masked[3, 7:] = float("-inf")  # right padding
    cases = [Case("x of shape (4, 12), chunk=4 (divides the row)", (x, 4)),
             Case("x of shape (4, 12), chunk=5 (the last chunk is shorter)", (x, 5)),
             Case("x of shape (3, 7), chunk=1", (_rand(g, 3, 7), 1)),
             Case("x of shape (2, 5), chunk=8 (longer than the row)", (_rand(g, 2, 5), 8)),
             Case("x with -inf entries, left padding and an all -inf row, chunk=5", (x_masked, 5)),
             Case("x whose maximum grows in every chunk, chunk=2", (torch.arange(12.0, dtype=torch.float64) * 30, 2)),
             Case("x of shape (2, 3, 9) times 1000 (huge values), chunk=4", (_rand(g, 2, 3, 9) * 1000, 4)),
             Case("float32 x of shape (5, 10), chunk=3", (_rand(g, 5, 10).float(), 3))]
    bugs = [Bug("the result is the log-sum-exp of the first chunks only: the last, shorter chunk is missing",
                _logsumexp_of_divisible_part),
            Bug("the result overflows: exp of large entries is inf unless the running maximum is subtracted "
                "first", _logsumexp_without_max),
            Bug("the running sum is not rescaled when the maximum grows: multiply it by e^(m - m') before adding "
                "the new chunk's terms", _online_variant(rescale=False)),
            *(Bug("each chunk is shifted by its own maximum, but the sum needs one common shift: subtract the "
                  "running maximum m' from every term (and rescale the old sum by e^(m - m'))",
                  _online_variant(running_max=False, rescale=r)) for r in (False, True)),
            *(Bug("a first chunk that is all -inf gives -inf - (-inf) = NaN in the shift: shift such rows by 0 "
                  "until a finite maximum appears (left padding)", _online_variant(guard=False, final_where=w))
              for w in (False, True)),
            Bug("a row that is all -inf gives -inf - (-inf) = NaN: shift such a row by 0 instead; its "
                "log-sum-exp is -inf", _logsumexp_nan_rows),
            Bug("the running sum starts at 1 (an extra e^0 term): start it at 0, with the maximum at -inf",
                lambda x, chunk: torch.logaddexp(torch.logsumexp(x, dim=-1), torch.zeros((), dtype=x.dtype))),
            Bug("that is right to float32 rounding only: compute, and return, in the dtype of x (float64 here), "
                "not in float32",
                lambda x, chunk: torch.logsumexp(x.float(), dim=-1).to(x.dtype))]
    return check("online_logsumexp", fn, lambda x, chunk: torch.logsumexp(x, dim=-1), cases, bugs=bugs,
                 **_TOLERANCES, matches="matches torch.logsumexp", then=_guarded(_reads_in_chunks))


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
                _below_instead),
            Bug("that is n (n - 1) / 2, which holds only for square tiles with T a multiple of the block: count the "
                "tiles one by one (a tile is skipped when its first key comes after its last query)",
                lambda T, bq, bk: (T // bq) * (T // bq - 1) // 2),
            Bug("off by one: a key block that starts right after the block's last query, at j0 = i0 + block_q, is "
                "already in the future (skip it when j0 > the last query, min(i0 + block_q, T) - 1)",
                lambda T, bq, bk: sum(1 for i0 in range(0, T, bq) for j0 in range(0, T, bk) if j0 > i0 + bq))]
    T, bq, bk = 8192, 128, 64
    total = math.ceil(T / bq) * math.ceil(T / bk)
    summary = (f"; at T={T} with {bq}x{bk} tiles a causal kernel skips {_skipped_block_count(T, bq, bk)} of "
               f"{total} tiles")
    return check("skipped_blocks", fn, _skipped_block_count, cases, bugs=bugs, matches="right",
                 then=lambda fn: (True, summary))


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
        if first_row == "itself":  # the first query kept its own key, so that its row is not empty
            out[..., 0, :] = v[..., 0, :]
        else:
            out[..., 0, :] = first_row  # NaN from 0 / 0, or 0 where the sum was clamped
        return out

    return attend


def _whole_query_blocks_only(q, k, v, bq, bk):
    T = q.shape[-2] // bq * bq
    out = torch.zeros_like(q)  # the bug: rows past the last whole block stay 0
    out[..., :T, :] = F.scaled_dot_product_attention(q[..., :T, :], k[..., :T, :], v[..., :T, :], is_causal=True)
    return out


def _unscaled_causal(q, k, v, bq, bk):
    return F.scaled_dot_product_attention(q * math.sqrt(q.shape[-1]), k, v, is_causal=True)  # no 1/sqrt(D)


def _accumulator_not_rescaled(q, k, v, block_q, block_k):
    """Tiled causal attention whose running sum is rescaled when the maximum grows, but not its accumulator."""
    B, H, T, D = q.shape
    out = torch.empty_like(q)  # (B, H, T, D)
    for i0 in range(0, T, block_q):
        i1 = min(i0 + block_q, T)
        m = q.new_full((B, H, i1 - i0, 1), float("-inf"))
        total, acc = q.new_zeros(B, H, i1 - i0, 1), q.new_zeros(B, H, i1 - i0, D)
        for j0 in range(0, i1, block_k):
            j1 = min(j0 + block_k, T)
            s = q[:, :, i0:i1] @ k[:, :, j0:j1].transpose(-2, -1) / math.sqrt(D)  # (B, H, bq, bk)
            s = s.masked_fill(torch.arange(j0, j1)[None, :] > torch.arange(i0, i1)[:, None], float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
            p = torch.exp(s - m_new)
            total = total * torch.exp(m - m_new) + p.sum(dim=-1, keepdim=True)
            acc = acc + p @ v[:, :, j0:j1]  # the bug: acc * exp(m - m_new) is missing
            m = m_new
        out[:, :, i0:i1] = acc / total
    return out


def _tile_local_softmax(averaged: bool, nan_rows: bool):
    """Skipping tiles, but each tile softmaxed on its own and the tiles' outputs added (or averaged).

    ``nan_rows``: a query row that sees no key of a diagonal tile gives NaN (torch.softmax of all -inf), as a
    learner's code would; otherwise such rows add 0.
    """

    def attend(q, k, v, block_q, block_k):
        B, H, T, D = q.shape
        out = torch.zeros_like(q)
        for i0 in range(0, T, block_q):
            i1 = min(i0 + block_q, T)
            acc, tiles = torch.zeros_like(q[:, :, i0:i1]), 0
            for j0 in range(0, i1, block_k):
                j1 = min(j0 + block_k, T)
                s = q[:, :, i0:i1] @ k[:, :, j0:j1].transpose(-2, -1) / math.sqrt(D)  # (B, H, bq, bk)
                s = s.masked_fill(torch.arange(j0, j1)[None, :] > torch.arange(i0, i1)[:, None], float("-inf"))
                p = torch.softmax(s, dim=-1)  # the bug: normalised over this tile's keys only
                acc = acc + (p if nan_rows else p.nan_to_num(0.0)) @ v[:, :, j0:j1]
                tiles += 1
            out[:, :, i0:i1] = acc / tiles if averaged else acc
        return out

    return attend


def _diagonal_tiles_unmasked(q, k, v, block_q, block_k):
    """Skipping the tiles above the diagonal, right online softmax, but no mask on the tiles the diagonal crosses."""
    B, H, T, D = q.shape
    out = torch.empty_like(q)
    for i0 in range(0, T, block_q):
        i1 = min(i0 + block_q, T)
        m = torch.full((B, H, i1 - i0, 1), float("-inf"), dtype=q.dtype)
        total, acc = torch.zeros_like(m), torch.zeros_like(q[:, :, i0:i1])
        for j0 in range(0, i1, block_k):
            j1 = min(j0 + block_k, T)
            s = q[:, :, i0:i1] @ k[:, :, j0:j1].transpose(-2, -1) / math.sqrt(D)  # the bug: no mask at all
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
            p = torch.exp(s - m_new)
            total = total * torch.exp(m - m_new) + p.sum(dim=-1, keepdim=True)
            acc = acc * torch.exp(m - m_new) + p @ v[:, :, j0:j1]
            m = m_new
        out[:, :, i0:i1] = acc / total
    return out


def _holds_tiles_only(fn, args, output_bytes, what):
    """A reason if fn(*args) holds a (block_q, S) strip or more beyond its output, else None."""
    q, k = args[0], args[1]
    T, S, block_q = q.shape[-2], k.shape[-2], args[-2]
    strip = q.shape[0] * q.shape[1] * block_q * S * q.element_size()  # one (block_q, S) strip of scores
    extra = peak_memory(fn, *args, device="cpu") - output_bytes
    if extra >= strip:
        return (f"the values are right, but at T=S={T} with {block_q}x{args[-1]} tiles it held {extra:,} bytes "
                f"beyond its output, at least one ({block_q}, S) strip of scores ({strip:,} bytes): {what} one "
                f"({block_q}, {args[-1]}) tile at a time, never all the keys of a query block at once")
    return None


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
    big = tuple(_rand(g, 1, 2, 512, 8).float() for _ in range(3)) + (32, 32)  # float32, T = 512 in 32 x 32 tiles
    reason = _holds_tiles_only(fn, big, 1 * 2 * 512 * 8 * 4, "compute")
    if reason:
        return False, reason
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
                  _sees_only_the_past(first_row)) for first_row in (float("nan"), 0.0, "itself")),
            Bug("the last, shorter query block is missing: when T is not a multiple of block_q, the last block "
                "has T % block_q queries, and it must be computed too", _whole_query_blocks_only),
            Bug("the scale is missing: the scores are q k^T / sqrt(D)", _unscaled_causal),
            Bug("the accumulator is not rescaled: when the maximum grows, multiply acc by e^(m - m') as well as "
                "the running sum, before adding p @ v_j", _accumulator_not_rescaled),
            Bug("the tiles on the diagonal are not masked: there a query still sees the later keys of its own tile; "
                "mask key j from query i when j > i in every tile the diagonal crosses", _diagonal_tiles_unmasked),
            *(Bug("each tile is softmaxed on its own, so a row's weights do not add up to 1 over all its keys: keep "
                  "a running maximum m and sum l across the key blocks, rescale acc and l by e^(m - m') when m "
                  "grows, and divide by l once, at the end", _tile_local_softmax(averaged, nan_rows))
              for averaged in (False, True) for nan_rows in (True, False))]
    # (out, lse), as tiled_attention returns, is accepted: the check compares out
    return check("causal_flash_attention", fn, _causal_reference, cases, bugs=bugs, **_TOLERANCES,
                 adapt=_output_only, matches="matches causal SDPA", then=_guarded(_skips_tiles))


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


def _dv_whole_query_blocks_only(q, k, d_out, lse, block_q, block_k):
    T = q.shape[2] // block_q * block_q  # the bug: the last, shorter query block is never visited
    return _dv_reference(q[:, :, :T], k, d_out[:, :, :T], lse[:, :, :T], block_q, block_k)


def _dv_untransposed(q, k, d_out, lse, block_q, block_k):
    p = torch.exp(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) - lse[..., None])  # (B, H, T, S)
    return p @ d_out  # the bug: P dO, which runs only where T == S; dV = P^T dO


def _dv_untransposed_tiles(q, k, d_out, lse, block_q, block_k):
    """dV_j += P_ij dO_i tile by tile: the shapes fit only where block_q == block_k."""
    B, H, T, D = q.shape
    S = k.shape[2]
    d_v = torch.zeros(B, H, S, d_out.shape[-1], dtype=q.dtype)
    for j0 in range(0, S, block_k):
        for i0 in range(0, T, block_q):
            s = q[:, :, i0:i0 + block_q] @ k[:, :, j0:j0 + block_k].transpose(-2, -1) / math.sqrt(D)
            p = torch.exp(s - lse[:, :, i0:i0 + block_q, None])  # (B, H, bq, bk)
            d_v[:, :, j0:j0 + block_k] += p @ d_out[:, :, i0:i0 + block_q]  # the bug: P, not P^T
    return d_v


def _tile_memory(fn):
    """The values are right; now measure that fn holds no more than a few tiles beyond its output."""
    g = torch.Generator().manual_seed(14)
    T, D = 512, 8
    q, k, d_out = (_rand(g, 1, 2, T, D).float() for _ in range(3))
    _, lse = flash_attention_forward(q, k, k)
    reason = _holds_tiles_only(fn, (q, k, d_out, lse, 32, 32), 2 * T * D * 4, "recompute")
    if reason:
        return False, reason
    return True, f", and at T=S={T} it held less than one (block_q, S) strip of weights beyond dV"


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
            Bug("the weights are not normalised: subtract the saved log-sum-exp before exp", _dv_unnormalised),
            Bug("the last, shorter query block is left out: when T is not a multiple of block_q, its queries add "
                "to dV too", _dv_whole_query_blocks_only),
            *(Bug("that is P @ dO; the gradient of the values is P^T @ dO (P is (T, S), so P^T dO is (S, D), one "
                  "row per key): transpose the tile of weights, p.transpose(-2, -1) @ d_out_i", bug)
              for bug in (_dv_untransposed, _dv_untransposed_tiles))]
    return check("flash_dv", fn, _dv_reference, cases, bugs=bugs, **_TOLERANCES, matches="matches autograd",
                 then=_guarded(_tile_memory))


# --- exercise 5: dQ and dK of one tile from the saved log-sum-exp ------------------------------------

def _tile_grads(scale_scores=True, subtract_lse=True, delta=True, scale_grads=True, transpose="none",
                swapped=False):
    """One tile's (dQ_i, dK_j) contributions, with one of the likely mistakes switched on."""

    def tile(q_i, k_j, v_j, d_out_i, out_i, lse_i):
        scale = 1.0 / math.sqrt(q_i.shape[-1])
        s = q_i @ k_j.transpose(-2, -1) * (scale if scale_scores else 1.0)  # (B, H, bq, bk)
        p = torch.exp(s - lse_i[..., None]) if subtract_lse else torch.exp(s)  # the forward's weights
        d_p = d_out_i @ v_j.transpose(-2, -1)  # (B, H, bq, bk)
        row = {True: (d_out_i * out_i).sum(dim=-1, keepdim=True), False: 0.0,  # D_i, or the bug: none
               "tile": (p * d_p).sum(dim=-1, keepdim=True)}[delta]  # the bug: this tile's keys only
        d_s = p * (d_p - row)
        g = scale if scale_grads else 1.0
        if transpose == "both":  # dS^T where dS belongs, and dS where dS^T belongs
            return d_s.transpose(-2, -1) @ k_j * g, d_s @ q_i * g
        if transpose == "dk":
            return d_s @ k_j * g, d_s @ q_i * g
        d_q, d_k = d_s @ k_j * g, d_s.transpose(-2, -1) @ q_i * g  # (B, H, bq, D), (B, H, bk, D)
        return (d_k, d_q) if swapped else (d_q, d_k)

    return tile


_TILE_BUGS = [
    ("the scale is missing from dQ and dK: both are multiplied by 1/sqrt(D), because s = q k^T / sqrt(D)",
     _tile_grads(scale_grads=False)),
    ("the scores are not scaled: recompute s = q_i k_j^T / sqrt(D) before exp(s - lse)",
     _tile_grads(scale_scores=False)),
    ("D_i is left out: dS = P * (dP - D_i), with D_i = rowsum(dO_i * O_i), one number per query row",
     _tile_grads(delta=False)),
    ("D_i is summed over this tile's keys only: D_i = rowsum(P * dP) runs over the whole row, which is why it is "
     "computed as rowsum(dO_i * O_i)", _tile_grads(delta="tile")),
    ("the weights are not normalised: P = exp(s - lse), subtract the saved log-sum-exp",
     _tile_grads(subtract_lse=False)),
    ("dS is transposed: dQ_i = dS K_j / sqrt(D) and dK_j = dS^T Q_i / sqrt(D), where dS is (block_q, block_k)",
     _tile_grads(transpose="both")),
    ("dS is not transposed in dK: dK_j = dS^T Q_i / sqrt(D), where dS is (block_q, block_k)",
     _tile_grads(transpose="dk")),
    ("dQ and dK are swapped: return (dQ_i, dK_j), in that order", _tile_grads(swapped=True)),
]


def _tile_inputs(g, B, H, bq, bk, D, dtype=torch.float64):
    """One tile's inputs, cut from a real attention call of T = 2 bq queries and S = 2 bk keys (tile (1, 0))."""
    q, k, v = _rand(g, B, H, 2 * bq, D), _rand(g, B, H, 2 * bk, D), _rand(g, B, H, 2 * bk, D)
    d_out = _rand(g, B, H, 2 * bq, D)
    out, lse = flash_attention_forward(q, k, v)
    i, j = slice(bq, 2 * bq), slice(0, bk)
    return tuple(t.to(dtype) for t in (q[:, :, i], k[:, :, j], v[:, :, j], d_out[:, :, i], out[:, :, i], lse[:, :, i]))


def _named_tile_mistake(fn) -> str | None:
    """On one square tile, where every mistake above runs: the message of the one fn reproduces, if any."""
    args = _tile_inputs(torch.Generator().manual_seed(17), 1, 2, 6, 6, 5)
    try:
        got = fn(*(t.clone() for t in args))
        right = _tile_grads()(*args)
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            return None
        got = tuple(torch.as_tensor(x, dtype=torch.float64) for x in got)
        if all(x.shape == r.shape and torch.allclose(x, r, atol=1e-8, rtol=0) for x, r in zip(got, right, strict=True)):
            return None
        for message, bug in _TILE_BUGS:
            wrong = bug(*args)
            if all(x.shape == w.shape and torch.allclose(x, w, atol=1e-8, rtol=0)
                   for x, w in zip(got, wrong, strict=True)):
                return message
    except Exception:  # an answer that fails here is judged by the cases below
        return None
    return None


def _sums_to_autograd(fn):
    """The tiles are right; now add up every tile of a whole attention call and compare with autograd's dQ, dK."""
    g = torch.Generator().manual_seed(18)
    B, H, T, S, D, bq, bk = 1, 2, 23, 17, 4, 8, 5
    q, k, v, d_out = _rand(g, B, H, T, D), _rand(g, B, H, S, D), _rand(g, B, H, S, D), _rand(g, B, H, T, D)
    out, lse = flash_attention_forward(q, k, v)
    dq, dk = torch.zeros_like(q), torch.zeros_like(k)
    for i0 in range(0, T, bq):
        for j0 in range(0, S, bk):
            i, j = slice(i0, i0 + bq), slice(j0, j0 + bk)
            dq_i, dk_j = fn(q[:, :, i], k[:, :, j], v[:, :, j], d_out[:, :, i], out[:, :, i], lse[:, :, i])
            dq[:, :, i] += dq_i
            dk[:, :, j] += dk_j
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    with torch.enable_grad():
        expected = torch.autograd.grad(F.scaled_dot_product_attention(*leaves), leaves[:2], d_out)
    diff = max((dq - expected[0]).abs().max().item(), (dk - expected[1]).abs().max().item())
    if diff > 1e-10:
        return False, (f"every tile matches, but added over the tiles of T={T}, S={S} in {bq}x{bk} tiles they "
                       f"differ from autograd's dQ and dK by {diff:.2g}")
    n_tiles = math.ceil(T / bq) * math.ceil(S / bk)
    return True, f"; added over {n_tiles} tiles they give autograd's dQ and dK (T={T}, S={S}) to 1e-10"


def check_flash_dq_dk(fn) -> CheckResult:
    """Check ``flash_dq_dk(q_i, k_j, v_j, d_out_i, out_i, lse_i)``: one tile's share of dQ and dK (lesson 10)."""
    named = _named_tile_mistake(fn)
    if named is not None:
        print(f"✗ flash_dq_dk: {named}")
        return CheckResult(False)
    g = torch.Generator().manual_seed(16)
    cases = [Case("a 4x4 tile, B=1, H=2, D=3", _tile_inputs(g, 1, 2, 4, 4, 3)),
             Case("a 5x3 tile (block_q != block_k), B=2, H=1, D=8", _tile_inputs(g, 2, 1, 5, 3, 8)),
             Case("a 1x7 tile (one query row), B=1, H=1, D=4", _tile_inputs(g, 1, 1, 1, 7, 4)),
             Case("a float32 6x6 tile, B=1, H=3, D=16", _tile_inputs(g, 1, 3, 6, 6, 16, torch.float32))]
    bugs = [Bug(message, bug) for message, bug in _TILE_BUGS]
    return check("flash_dq_dk", fn, _tile_grads(), cases, bugs=bugs, **_TOLERANCES,
                 matches="matches the tile's share of dQ and dK", then=_guarded(_sums_to_autograd))
