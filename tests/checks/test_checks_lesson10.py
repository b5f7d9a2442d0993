"""Lesson 10's checks: right answers pass with the stored line, stubs say so, plausible wrong answers are named.

Every line is checked to be the only one printed (the `verdict` fixture of conftest.py).
"""

import math

import torch
import torch.nn.functional as F

from helpers.checks import (
    check_causal_flash_attention,
    check_flash_dq_dk,
    check_flash_dv,
    check_online_logsumexp,
    check_skipped_blocks,
)


def online_logsumexp(x, chunk):
    m = torch.full(x.shape[:-1], float("-inf"), dtype=x.dtype)  # running max
    total = torch.zeros(x.shape[:-1], dtype=x.dtype)  # running sum of exp(x - m)
    for j0 in range(0, x.shape[-1], chunk):
        part = x[..., j0:j0 + chunk]
        m_new = torch.maximum(m, part.amax(dim=-1))
        shift = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
        total = total * torch.exp(m - shift) + torch.exp(part - shift[..., None]).sum(dim=-1)
        m = m_new
    return torch.where(total > 0, m + torch.log(total), torch.full_like(total, float("-inf")))


def skipped_blocks(T, block_q, block_k):
    return sum(1 for i0 in range(0, T, block_q) for j0 in range(0, T, block_k) if j0 > min(i0 + block_q, T) - 1)


def causal_flash_attention(q, k, v, block_q, block_k, skip=True, see_self=True, scaled=True, clamp=False):
    T = q.shape[-2]
    scale = 1 / math.sqrt(q.shape[-1]) if scaled else 1.0
    out = torch.empty_like(q)
    for i0 in range(0, T, block_q):
        i1 = min(i0 + block_q, T)
        stop = i1 if skip else T
        rows = torch.arange(i0, i1)[:, None]
        m = torch.full((*q.shape[:2], i1 - i0, 1), float("-inf"), dtype=q.dtype)
        total = torch.zeros_like(m)
        acc = torch.zeros(*q.shape[:2], i1 - i0, v.shape[-1], dtype=q.dtype)
        for j0 in range(0, stop, block_k):
            j1 = min(j0 + block_k, T)
            s = q[:, :, i0:i1] @ k[:, :, j0:j1].transpose(-2, -1) * scale
            future = torch.arange(j0, j1)[None, :] > rows if see_self else torch.arange(j0, j1)[None, :] >= rows
            s = s.masked_fill(future, float("-inf"))
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            shift = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
            p = torch.exp(s - shift)
            total = total * torch.exp(m - shift) + p.sum(-1, keepdim=True)
            acc = acc * torch.exp(m - shift) + p @ v[:, :, j0:j1]
            m = m_new
        out[:, :, i0:i1] = acc / (total.clamp_min(torch.finfo(q.dtype).tiny) if clamp else total)
    return out


def flash_dv(q, k, d_out, lse, block_q, block_k):
    T, S, D = q.shape[-2], k.shape[-2], q.shape[-1]
    d_v = torch.zeros(*k.shape[:3], d_out.shape[-1], dtype=q.dtype)
    for j0 in range(0, S, block_k):
        for i0 in range(0, T, block_q):
            s = q[:, :, i0:i0 + block_q] @ k[:, :, j0:j0 + block_k].transpose(-2, -1) / math.sqrt(D)
            p = torch.exp(s - lse[:, :, i0:i0 + block_q, None])
            d_v[:, :, j0:j0 + block_k] += p.transpose(-2, -1) @ d_out[:, :, i0:i0 + block_q]
    return d_v


def test_online_logsumexp(accepts, rejects):
    accepts(check_online_logsumexp, online_logsumexp,
            "✓ online_logsumexp: matches torch.logsumexp on all 8 cases, -inf entries, left padding and an all -inf "
            "row included")
    rejects(check_online_logsumexp, lambda x, chunk: None, "not implemented yet")

    def divisible(x, chunk):  # only-divisible lengths: the last, shorter chunk is never read
        return online_logsumexp(x[..., : x.shape[-1] // chunk * chunk], chunk)
    rejects(check_online_logsumexp, divisible, "last, shorter chunk is missing")
    rejects(check_online_logsumexp, lambda x, chunk: torch.log(torch.exp(x).sum(-1)), "running maximum")
    rejects(check_online_logsumexp, lambda x, chunk: online_logsumexp(x, chunk).numpy(),
            "return a torch.Tensor (dtype torch.float64), got ndarray")
    rejects(check_online_logsumexp, lambda x, chunk: online_logsumexp(x, chunk).float(),
            "compute, and return, in the dtype of x (float64 here)")

    def in_place(x, chunk):
        x[x == float("-inf")] = -1e30  # "fixes" the masked entries of the caller's tensor
        return online_logsumexp(x, chunk)
    rejects(check_online_logsumexp, in_place, "modified its input (argument 1) in place")

    def nan_for_masked_rows(x, chunk):
        m = x.amax(-1, keepdim=True)
        return (m + torch.log(torch.exp(x - m).sum(-1, keepdim=True))).squeeze(-1)
    rejects(check_online_logsumexp, nan_for_masked_rows, "a row that is all -inf gives -inf - (-inf) = NaN")

    def off_by_one(x, chunk):  # the running sum starts at 1 instead of 0
        return online_logsumexp(torch.cat((x, torch.zeros_like(x[..., :1])), dim=-1), chunk)
    rejects(check_online_logsumexp, off_by_one, "the running sum starts at 1")

    def float32_inside(x, chunk):  # right to float32 rounding only: the float64 cases need 1e-10
        return online_logsumexp(x.float(), chunk).to(x.dtype)
    rejects(check_online_logsumexp, float32_inside, "right to float32 rounding only")

    # right values, but the whole row is read at once
    rejects(check_online_logsumexp, lambda x, chunk: torch.logsumexp(x, dim=-1),
            "called logsumexp over whole rows of 10 entries (chunk=3)")
    rejects(check_online_logsumexp, lambda x, chunk: x.logsumexp(-1), "called logsumexp over whole rows")

    def two_passes(x, chunk):  # the maximum of the whole row first: no running maximum
        m = x.amax(dim=-1, keepdim=True)
        shift = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        return (shift + torch.log(sum(torch.exp(part - shift).sum(-1, keepdim=True)
                                      for part in x.split(chunk, dim=-1)))).squeeze(-1)
    rejects(check_online_logsumexp, two_passes, "called amax over whole rows")

    # torch.logsumexp of each chunk is fine
    def running_logaddexp(x, chunk):
        lse = torch.full(x.shape[:-1], float("-inf"), dtype=x.dtype)
        for part in x.split(chunk, dim=-1):
            lse = torch.logaddexp(lse, torch.logsumexp(part, dim=-1))
        return lse
    accepts(check_online_logsumexp, running_logaddexp)

    def logsumexp_of_chunk_results(x, chunk):  # one number per chunk, combined at the end
        return torch.logsumexp(torch.stack([part.logsumexp(-1) for part in x.split(chunk, dim=-1)], -1), -1)
    accepts(check_online_logsumexp, logsumexp_of_chunk_results)


def online_variant(x, chunk, rescale=True, running_max=True, guard=True, final_where=False):
    """Written apart from the check's own bugs: a running max and sum, one likely mistake switched on."""
    m = torch.full(x.shape[:-1], float("-inf"), dtype=x.dtype)
    total = torch.zeros(x.shape[:-1], dtype=x.dtype)
    for j0 in range(0, x.shape[-1], chunk):
        part = x[..., j0:j0 + chunk]
        m_new = torch.maximum(m, part.amax(-1))
        shift = m_new if running_max else part.amax(-1)
        if guard:
            shift = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))
        old = total * torch.exp(m - shift) if rescale and running_max else total
        total = old + torch.exp(part - shift[..., None]).sum(-1)
        m = m_new
    lse = m + torch.log(total)
    return torch.where(total > 0, lse, torch.full_like(lse, float("-inf"))) if final_where else lse


def test_online_logsumexp_names_the_likely_mistakes(accepts, rejects):
    rejects(check_online_logsumexp, lambda x, c: online_variant(x, c, rescale=False),
            "the running sum is not rescaled when the maximum grows")
    rejects(check_online_logsumexp, lambda x, c: online_variant(x, c, running_max=False),
            "shifted by its own maximum")
    for final_where in (False, True):  # NaN, or NaN turned into -inf at the end: both wrong for left padding
        rejects(check_online_logsumexp, lambda x, c, w=final_where: online_variant(x, c, guard=False, final_where=w),
                "-inf - (-inf) = NaN in the shift")

    def two_chunked_passes(x, chunk):  # the maximum chunk by chunk first, then the sum: no running sum
        m = torch.full(x.shape[:-1], float("-inf"), dtype=x.dtype)
        for j0 in range(0, x.shape[-1], chunk):
            m = torch.maximum(m, x[..., j0:j0 + chunk].amax(-1))
        shift = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        total = sum(torch.exp(x[..., j0:j0 + chunk] - shift[..., None]).sum(-1) for j0 in range(0, x.shape[-1], chunk))
        return shift + torch.log(total)
    rejects(check_online_logsumexp, two_chunked_passes, "read the entries of x 2 times")

    def views_of_each_chunk(x, chunk):  # one pass; a chunk's own views are no second reading of x
        m = torch.full(x.shape[:-1], float("-inf"), dtype=x.dtype)
        total = torch.zeros(x.shape[:-1], dtype=x.dtype)
        for part in torch.split(x, chunk, dim=-1):
            column = part.unsqueeze(-1)[..., 0]  # (..., <= chunk), a view of the chunk
            m_new = torch.maximum(m, column.amax(-1))
            shift = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
            total = total * torch.exp(m - shift) + torch.exp(part[..., :] - shift[..., None]).sum(-1)
            m = m_new
        return m + torch.log(total)
    accepts(check_online_logsumexp, views_of_each_chunk)


def test_online_logsumexp_never_lets_a_traceback_out(rejects):
    for odd in ((), ["a", "b"], "42", torch.tensor(1.0, dtype=torch.bfloat16), torch.empty(3, device="meta")):
        rejects(check_online_logsumexp, lambda x, chunk, odd=odd: odd, "✗ online_logsumexp: on ")

    def fails_on_new_sizes(x, chunk):  # right on the cases, raises on the shape of the extra step
        if tuple(x.shape) == (3, 10):
            raise RuntimeError("no")
        return online_logsumexp(x, chunk)
    rejects(check_online_logsumexp, fails_on_new_sizes, "then your function raised RuntimeError: no")


def test_skipped_blocks(accepts, rejects):
    accepts(check_skipped_blocks, skipped_blocks,
            "✓ skipped_blocks: right on all 8 cases; at T=8192 with 128x64 tiles a causal kernel skips 4032 of "
            "8192 tiles")
    def by_key_blocks(T, block_q, block_k):  # the other way round: per key block, the query blocks before it
        return sum(sum(1 for i0 in range(0, T, block_q) if min(i0 + block_q, T) <= j0) for j0 in range(0, T, block_k))
    accepts(check_skipped_blocks, by_key_blocks)
    for odd in ((), ["a", "b"], "42", torch.tensor(1.0, dtype=torch.bfloat16), 4.5):
        rejects(check_skipped_blocks, lambda T, bq, bk, odd=odd: odd, "✗ skipped_blocks: on ")
    rejects(check_skipped_blocks, lambda T, bq, bk: None, "not implemented yet")
    rejects(check_skipped_blocks, lambda T, bq, bk: torch.tensor(skipped_blocks(T, bq, bk)),
            "return an int, got Tensor")
    rejects(check_skipped_blocks, lambda T, bq, bk: float(skipped_blocks(T, bq, bk)), "return an int, got float")
    rejects(check_skipped_blocks,
            lambda T, bq, bk: sum(1 for i in range(T // bq) for j in range(T // bk) if j * bk > (i + 1) * bq - 1),
            "last, shorter blocks")
    rejects(check_skipped_blocks,
            lambda T, bq, bk: sum(1 for i0 in range(0, T, bq) for j0 in range(0, T, bk) if j0 + bk - 1 > i0),
            "also counts the tiles on the diagonal")
    rejects(check_skipped_blocks,
            lambda T, bq, bk: sum(1 for i0 in range(0, T, bq) for j0 in range(0, T, bk) if min(j0 + bk, T) - 1 <= i0),
            "wholly below the diagonal")
    rejects(check_skipped_blocks, lambda T, bq, bk: (T // bq) * (T // bq - 1) // 2,  # square tiles, T a multiple
            "which holds only for square tiles with T a multiple of the block")
    rejects(check_skipped_blocks,
            lambda T, bq, bk: sum(1 for i0 in range(0, T, bq) for j0 in range(0, T, bk) if j0 > i0 + bq),
            "off by one")  # j0 >= i0 + bq is already in the future


def only_divisible(q, k, v, bq, bk):  # the last, shorter query block is left at zero
    T = q.shape[-2] // bq * bq
    out = torch.zeros_like(q)
    out[:, :, :T] = causal_flash_attention(q[:, :, :T], k[:, :, :T], v[:, :, :T], bq, bk)
    return out


def test_causal_flash_attention(accepts, rejects):
    line = ("✓ causal_flash_attention: matches causal SDPA on all 4 cases, and at T=128 with 16x16 tiles it did 56% "
            "of the matrix-product FLOPs of computing every tile")
    accepts(check_causal_flash_attention, causal_flash_attention, line)

    def with_lse(q, k, v, bq, bk):  # (out, lse), as tiled_attention returns
        return causal_flash_attention(q, k, v, bq, bk), torch.zeros(q.shape[:-1], dtype=q.dtype)
    accepts(check_causal_flash_attention, with_lse, line)

    def causal_by_fold(q, k, v, block_q, block_k):  # written another way: einsum, a clamped sum, a where mask
        T, D = q.shape[-2], q.shape[-1]
        blocks = []
        for i0 in range(0, T, block_q):
            i1 = min(i0 + block_q, T)
            m = q.new_full((*q.shape[:2], i1 - i0, 1), -math.inf)
            total, acc = torch.zeros_like(m), q.new_zeros(*q.shape[:2], i1 - i0, D)
            for j0 in range(0, i1, block_k):
                j1 = min(j0 + block_k, T)
                s = torch.einsum("bhqd,bhkd->bhqk", q[:, :, i0:i1], k[:, :, j0:j1]) * D ** -0.5
                s = torch.where(torch.arange(j0, j1) <= torch.arange(i0, i1)[:, None], s, -math.inf)
                m_new = torch.maximum(m, s.amax(-1, keepdim=True))
                total = total * (m - m_new).exp() + (s - m_new).exp().sum(-1, keepdim=True)
                acc = acc * (m - m_new).exp() + (s - m_new).exp() @ v[:, :, j0:j1]
                m = m_new
            blocks.append(acc / total.clamp_min(1e-30))
        return torch.cat(blocks, dim=2)
    accepts(check_causal_flash_attention, causal_by_fold, line)
    rejects(check_causal_flash_attention,
            lambda q, k, v, bq, bk: F.scaled_dot_product_attention(q, k, v, is_causal=True),
            "compute the tiles yourself with @: F.scaled_dot_product_attention does not show the tiling")

    def without_matmul(q, k, v, bq, bk):  # right values from broadcast products: no tile to count
        T = q.shape[-2]
        s = (q[..., :, None, :] * k[..., None, :, :]).sum(-1) / math.sqrt(q.shape[-1])  # (B, H, T, T)
        p = torch.softmax(s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")), dim=-1)
        return (p[..., None] * v[..., None, :, :]).sum(-2)
    rejects(check_causal_flash_attention, without_matmul, "no matrix product was counted")
    for clamp in (False, True):  # row 0 sees nothing: NaN from 0 / 0, or 0 with a clamped sum
        rejects(check_causal_flash_attention,
                lambda q, k, v, bq, bk, clamp=clamp: causal_flash_attention(q, k, v, bq, bk, see_self=False,
                                                                           clamp=clamp),
                "a query must see itself: mask key j from query i only when j > i, not when j >= i")
    rejects(check_causal_flash_attention,
            lambda q, k, v, bq, bk: causal_flash_attention(q, k, v, bq, bk, scaled=False), "the scale is missing")
    rejects(check_causal_flash_attention, lambda q, k, v, bq, bk: None, "not implemented yet")
    rejects(check_causal_flash_attention, lambda q, k, v, bq, bk: causal_flash_attention(q, k, v, bq, bk, skip=False),
            "the values are right, but")
    rejects(check_causal_flash_attention, lambda q, k, v, bq, bk: F.scaled_dot_product_attention(q, k, v),
            "attends to future keys")
    T_mask = lambda q: torch.ones(q.shape[-2], q.shape[-2], dtype=torch.bool).triu()  # noqa: E731
    rejects(check_causal_flash_attention,
            lambda q, k, v, bq, bk: F.scaled_dot_product_attention(q, k, v, attn_mask=T_mask(q)),
            "the mask points the wrong way")
    rejects(check_causal_flash_attention, only_divisible, "the last, shorter query block is missing")

    def scales_q_in_place(q, k, v, bq, bk):
        q /= 1.0 + 1e-3
        return causal_flash_attention(q * (1.0 + 1e-3), k, v, bq, bk)
    rejects(check_causal_flash_attention, scales_q_in_place, "modified its input (argument 1) in place")
    rejects(check_causal_flash_attention, lambda q, k, v, bq, bk: causal_flash_attention(q, k, v, bq, bk).double(),
            "return dtype torch.float32, got torch.float64")
    rejects(check_causal_flash_attention, lambda q, k, v, bq, bk: causal_flash_attention(q, k, v, bq, bk).numpy(),
            "got ndarray")

    def strict_past(q, k, v, bq, bk):  # off by one: query t may not see itself
        T = q.shape[-2]
        mask = torch.ones(T, T, dtype=torch.bool).tril(-1)
        mask[0, 0] = True
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    rejects(check_causal_flash_attention, strict_past, "a query must see itself")

    def strip_of_keys(q, k, v, bq, bk):  # skips the future, but holds all earlier keys of a block at once
        T, out = q.shape[-2], torch.empty_like(q)
        for i0 in range(0, T, bq):
            i1 = min(i0 + bq, T)
            s = q[:, :, i0:i1] @ k[:, :, :i1].transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, bq, i1)
            s = s.masked_fill(torch.arange(i1)[None, :] > torch.arange(i0, i1)[:, None], float("-inf"))
            out[:, :, i0:i1] = torch.softmax(s, dim=-1) @ v[:, :, :i1]
        return out
    rejects(check_causal_flash_attention, strip_of_keys, "at least one (32, S) strip of scores")

    def accumulator_kept(q, k, v, bq, bk):  # the running sum is rescaled, the accumulator is not
        T, D = q.shape[-2], q.shape[-1]
        out = torch.empty_like(q)
        for i0 in range(0, T, bq):
            i1 = min(i0 + bq, T)
            m = torch.full((*q.shape[:2], i1 - i0, 1), float("-inf"), dtype=q.dtype)
            total, acc = torch.zeros_like(m), torch.zeros(*q.shape[:2], i1 - i0, D, dtype=q.dtype)
            for j0 in range(0, i1, bk):
                s = torch.einsum("bhqd,bhkd->bhqk", q[:, :, i0:i1], k[:, :, j0:j0 + bk]) / math.sqrt(D)
                s = s.masked_fill(torch.arange(j0, min(j0 + bk, T))[None, :] > torch.arange(i0, i1)[:, None],
                                  float("-inf"))
                m_new = torch.maximum(m, s.amax(-1, keepdim=True))
                p = torch.exp(s - m_new)
                total = total * torch.exp(m - m_new) + p.sum(-1, keepdim=True)
                acc += p @ v[:, :, j0:j0 + bk]
                m = m_new
            out[:, :, i0:i1] = acc / total
        return out
    rejects(check_causal_flash_attention, accumulator_kept, "the accumulator is not rescaled")
    for odd in ((), [], "42", torch.tensor(1.0, dtype=torch.bfloat16)):
        rejects(check_causal_flash_attention, lambda q, k, v, bq, bk, odd=odd: odd, "✗ causal_flash_attention: on ")
    rejects(check_causal_flash_attention, lambda q, k, v, bq, bk: (), "returned an empty tuple")

    def view_of_q(q, k, v, bq, bk):  # assumes a contiguous layout of q
        return causal_flash_attention(q.view(q.shape), k, v, bq, bk).view(-1).view(q.shape)
    rejects(check_causal_flash_attention, view_of_q, "non-contiguous")


def flash_dv_by_query_blocks(q, k, d_out, lse, block_q, block_k):
    """The loops the other way round: query blocks outside, each tile's share added to its key block."""
    d_v = torch.zeros(*k.shape[:3], d_out.shape[-1], dtype=q.dtype)
    for i0 in range(0, q.shape[2], block_q):
        q_i, lse_i, do_i = q[:, :, i0:i0 + block_q], lse[:, :, i0:i0 + block_q], d_out[:, :, i0:i0 + block_q]
        for j0 in range(0, k.shape[2], block_k):
            s = torch.einsum("bhtd,bhsd->bhts", q_i, k[:, :, j0:j0 + block_k]) / q.shape[-1] ** 0.5
            d_v[:, :, j0:j0 + block_k] += torch.einsum("bhts,bhtd->bhsd", torch.exp(s - lse_i[..., None]), do_i)
    return d_v


def test_flash_dv(accepts, rejects):
    line = accepts(check_flash_dv, flash_dv)
    assert line.startswith("✓ flash_dv: matches autograd on all 4 cases, and at T=S=512 ")
    assert line.endswith("it held less than one (block_q, S) strip of weights beyond dV")
    accepts(check_flash_dv, lambda q, k, d_out, lse, bq, bk: flash_dv_by_query_blocks(q, k, d_out, lse, bq, bk))
    rejects(check_flash_dv, lambda *args: None, "not implemented yet")

    def unscaled(q, k, d_out, lse, bq, bk):
        return flash_dv(q * math.sqrt(q.shape[-1]), k, d_out, lse, bq, bk)
    rejects(check_flash_dv, unscaled, "scale is missing")

    def unnormalised(q, k, d_out, lse, bq, bk):
        return flash_dv(q, k, d_out, torch.zeros_like(lse), bq, bk)
    rejects(check_flash_dv, unnormalised, "not normalised")

    def whole_matrix(q, k, d_out, lse, bq, bk):
        p = torch.exp(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) - lse[..., None])  # (B, H, T, S)
        return p.transpose(-2, -1) @ d_out
    rejects(check_flash_dv, whole_matrix, "at least one (32, S) strip of scores")

    def strip_per_query_block(q, k, d_out, lse, bq, bk):  # tiles over queries only: all keys of a block at once
        d_v = torch.zeros(*k.shape[:3], d_out.shape[-1], dtype=q.dtype)
        for i0 in range(0, q.shape[2], bq):
            s = q[:, :, i0:i0 + bq] @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, bq, S)
            p = torch.exp(s - lse[:, :, i0:i0 + bq, None])
            d_v += p.transpose(-2, -1) @ d_out[:, :, i0:i0 + bq]
        return d_v
    rejects(check_flash_dv, strip_per_query_block, "at least one (32, S) strip of scores")

    def only_whole_blocks(q, k, d_out, lse, bq, bk):
        T = q.shape[2] // bq * bq
        return flash_dv(q[:, :, :T], k, d_out[:, :, :T], lse, bq, bk)
    rejects(check_flash_dv, only_whole_blocks, "the last, shorter query block is left out")

    def zeroes_d_out_in_place(q, k, d_out, lse, bq, bk):
        d_v = flash_dv(q, k, d_out, lse, bq, bk)
        d_out.zero_()  # frees "memory" by clearing the caller's gradient
        return d_v
    rejects(check_flash_dv, zeroes_d_out_in_place, "modified its input (argument 3) in place")
    rejects(check_flash_dv, lambda q, k, d_out, lse, bq, bk: flash_dv(q, k, d_out, lse, bq, bk).tolist(), "got list")
    for odd in ((), ["a", "b"], "42", torch.tensor(1.0, dtype=torch.bfloat16), torch.empty(3, device="meta")):
        rejects(check_flash_dv, lambda *args, odd=odd: odd, "✗ flash_dv: on ")
    rejects(check_flash_dv, lambda q, k, d_out, lse, bq, bk: flash_dv(q, k, d_out, lse, bq, bk).float(),
            "return dtype torch.float64, got torch.float32")


def flash_dq_dk(q_i, k_j, v_j, d_out_i, out_i, lse_i):
    scale = 1 / math.sqrt(q_i.shape[-1])
    p = torch.exp(q_i @ k_j.transpose(-2, -1) * scale - lse_i[..., None])  # (B, H, bq, bk)
    d_s = p * (d_out_i @ v_j.transpose(-2, -1) - (d_out_i * out_i).sum(-1, keepdim=True))  # (B, H, bq, bk)
    return d_s @ k_j * scale, d_s.transpose(-2, -1) @ q_i * scale


def flash_dq_dk_by_autograd(q_i, k_j, v_j, d_out_i, out_i, lse_i):
    """Another right answer: dS is the gradient of sum(P * (dP - D_i)) with the bracket held fixed."""
    q_i, k_j = q_i.detach().clone().requires_grad_(), k_j.detach().clone().requires_grad_()
    with torch.enable_grad():
        p = torch.exp(torch.einsum("bhqd,bhkd->bhqk", q_i, k_j) / q_i.shape[-1] ** 0.5 - lse_i[..., None])
        weight = d_out_i @ v_j.transpose(-2, -1) - (d_out_i * out_i).sum(-1, keepdim=True)
        d_q, d_k = torch.autograd.grad((p * weight).sum(), (q_i, k_j))
    return d_q, d_k


def test_flash_dq_dk(accepts, rejects):
    line = ("✓ flash_dq_dk: matches the tile's share of dQ and dK on all 4 cases; added over 12 tiles they give "
            "autograd's dQ and dK (T=23, S=17) to 1e-10")
    accepts(check_flash_dq_dk, flash_dq_dk, line)
    accepts(check_flash_dq_dk, flash_dq_dk_by_autograd, line)
    rejects(check_flash_dq_dk, lambda *args: None, "not implemented yet")

    def variant(scale_scores=True, lse=True, delta="full", scale=True, transpose="none"):
        def tile(q_i, k_j, v_j, d_out_i, out_i, lse_i):
            root = math.sqrt(q_i.shape[-1])
            s = q_i @ k_j.mT / (root if scale_scores else 1)
            p = (s - lse_i.unsqueeze(-1)).exp() if lse else s.exp()
            d_p = d_out_i @ v_j.mT
            d_i = {"full": (d_out_i * out_i).sum(-1, keepdim=True), "none": 0, "tile": (p * d_p).sum(-1, keepdim=True)}
            d_s = p * (d_p - d_i[delta])
            c = 1 / root if scale else 1
            if transpose == "both":
                return c * (d_s.mT @ k_j), c * (d_s @ q_i)
            if transpose == "dk":
                return c * (d_s @ k_j), c * (d_s @ q_i)
            return c * (d_s @ k_j), c * (d_s.mT @ q_i)
        return tile

    assert check_flash_dq_dk(variant())  # the helper of this test is right when nothing is switched on
    rejects(check_flash_dq_dk, variant(scale=False), "the scale is missing from dQ and dK")
    rejects(check_flash_dq_dk, variant(scale_scores=False), "the scores are not scaled")
    rejects(check_flash_dq_dk, variant(delta="none"), "D_i is left out")
    rejects(check_flash_dq_dk, variant(delta="tile"), "D_i is summed over this tile's keys only")
    rejects(check_flash_dq_dk, variant(lse=False), "the weights are not normalised")
    rejects(check_flash_dq_dk, variant(transpose="both"), "dS is transposed")
    rejects(check_flash_dq_dk, variant(transpose="dk"), "dS is not transposed in dK")
    rejects(check_flash_dq_dk, lambda *args: flash_dq_dk(*args)[0], "expected a tuple of 2 results")
    rejects(check_flash_dq_dk, lambda *args: tuple(t.float() for t in flash_dq_dk(*args)),
            "return dtype torch.float64, got torch.float32")
    rejects(check_flash_dq_dk, lambda *args: flash_dq_dk(*args)[::-1], "dQ and dK are swapped")
    for odd in ((), ["a", "b"], "42", torch.tensor(1.0, dtype=torch.bfloat16)):
        rejects(check_flash_dq_dk, lambda *args, odd=odd: odd, "✗ flash_dq_dk: on ")

    def zeroes_d_out(q_i, k_j, v_j, d_out_i, out_i, lse_i):
        grads = flash_dq_dk(q_i, k_j, v_j, d_out_i, out_i, lse_i)
        d_out_i.zero_()
        return grads
    rejects(check_flash_dq_dk, zeroes_d_out, "modified its input (argument 4) in place")

    def right_on_one_tile_only(q_i, k_j, v_j, d_out_i, out_i, lse_i):  # the last, shorter tiles get nothing
        if q_i.shape[-2] != 8 or k_j.shape[-2] != 5:
            return flash_dq_dk(q_i, k_j, v_j, d_out_i, out_i, lse_i)
        return tuple(torch.zeros_like(t) for t in (q_i, k_j))
    rejects(check_flash_dq_dk, right_on_one_tile_only, "differ from autograd's dQ and dK")


def test_causal_flash_attention_names_the_tiling_mistakes(rejects):
    """Written apart from the check's own bugs: a softmax per tile, and diagonal tiles left unmasked."""

    def softmax_per_tile(q, k, v, bq, bk, average=False):
        T, D = q.shape[-2], q.shape[-1]
        out = torch.zeros_like(q)
        for i0 in range(0, T, bq):
            i1, n = min(i0 + bq, T), 0
            for j0 in range(0, i1, bk):
                j1 = min(j0 + bk, T)
                s = torch.einsum("bhqd,bhkd->bhqk", q[:, :, i0:i1], k[:, :, j0:j1]) / math.sqrt(D)
                s = torch.where(torch.arange(j0, j1) <= torch.arange(i0, i1)[:, None], s, -math.inf)
                out[:, :, i0:i1] += torch.softmax(s, dim=-1) @ v[:, :, j0:j1]
                n += 1
            if average:
                out[:, :, i0:i1] /= n
        return out
    for average in (False, True):
        rejects(check_causal_flash_attention,
                lambda q, k, v, bq, bk, average=average: softmax_per_tile(q, k, v, bq, bk, average),
                "each tile is softmaxed on its own")

    def no_mask_on_the_diagonal(q, k, v, bq, bk):  # skips the tiles above, masks nothing
        T, D = q.shape[-2], q.shape[-1]
        out = torch.empty_like(q)
        for i0 in range(0, T, bq):
            i1 = min(i0 + bq, T)
            s = torch.cat([q[:, :, i0:i1] @ k[:, :, j0:min(j0 + bk, T)].transpose(-2, -1)
                           for j0 in range(0, i1, bk)], dim=-1) / math.sqrt(D)  # (B, H, bq, keys up to the tile)
            out[:, :, i0:i1] = torch.softmax(s, dim=-1) @ v[:, :, :s.shape[-1]]
        return out
    rejects(check_causal_flash_attention, no_mask_on_the_diagonal, "the tiles on the diagonal are not masked")


def test_flash_dv_names_p_instead_of_its_transpose(rejects):
    def p_times_d_out(q, k, d_out, lse, bq, bk):  # tile by tile, P_ij dO_i where P_ij^T dO_i belongs
        d_v = torch.zeros(*k.shape[:3], d_out.shape[-1], dtype=q.dtype)
        for j0 in range(0, k.shape[2], bk):
            for i0 in range(0, q.shape[2], bq):
                s = torch.einsum("bhtd,bhsd->bhts", q[:, :, i0:i0 + bq], k[:, :, j0:j0 + bk]) / q.shape[-1] ** 0.5
                d_v[:, :, j0:j0 + bk] += torch.exp(s - lse[:, :, i0:i0 + bq, None]) @ d_out[:, :, i0:i0 + bq]
        return d_v
    rejects(check_flash_dv, p_times_d_out, "that is P @ dO; the gradient of the values is P^T @ dO")

    def whole_p_times_d_out(q, k, d_out, lse, bq, bk):
        return torch.exp(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) - lse[..., None]) @ d_out
    rejects(check_flash_dv, whole_p_times_d_out, "that is P @ dO")
