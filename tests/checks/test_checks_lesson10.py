"""Lesson 10's checks: right answers pass with the stored line, stubs say so, plausible wrong answers are named.

Every line is checked to be the only one printed (the `verdict` fixture of conftest.py).
"""

import math

import torch
import torch.nn.functional as F

from helpers.checks import (
    check_causal_flash_attention,
    check_flash_dv,
    check_online_logsumexp,
    check_predict_skipped_tiles,
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
            "✓ online_logsumexp: matches torch.logsumexp on all 7 cases, -inf entries and an all -inf row included")
    rejects(check_online_logsumexp, lambda x, chunk: None, "not implemented yet")

    def divisible(x, chunk):  # only-divisible lengths: the last, shorter chunk is never read
        return online_logsumexp(x[..., : x.shape[-1] // chunk * chunk], chunk)
    rejects(check_online_logsumexp, divisible, "last, shorter chunk is missing")
    rejects(check_online_logsumexp, lambda x, chunk: torch.log(torch.exp(x).sum(-1)), "running maximum")
    rejects(check_online_logsumexp, lambda x, chunk: online_logsumexp(x, chunk).numpy(),
            "return a torch.Tensor (dtype torch.float64), got ndarray")
    rejects(check_online_logsumexp, lambda x, chunk: online_logsumexp(x, chunk).float(),
            "return dtype torch.float64, got torch.float32")

    def in_place(x, chunk):
        x[x == float("-inf")] = -1e30  # "fixes" the masked entries of the caller's tensor
        return online_logsumexp(x, chunk)
    rejects(check_online_logsumexp, in_place, "modified its input (argument 1) in place")

    def nan_for_masked_rows(x, chunk):
        m = x.amax(-1, keepdim=True)
        return (m + torch.log(torch.exp(x - m).sum(-1, keepdim=True))).squeeze(-1)
    rejects(check_online_logsumexp, nan_for_masked_rows, "NaN")

    def off_by_one(x, chunk):  # the running sum starts at 1 instead of 0
        return online_logsumexp(torch.cat((x, torch.zeros_like(x[..., :1])), dim=-1), chunk)
    rejects(check_online_logsumexp, off_by_one, "values differ from the reference")

    def float32_inside(x, chunk):  # right to float32 rounding only: the float64 cases need 1e-10
        return online_logsumexp(x.float(), chunk).to(x.dtype)
    rejects(check_online_logsumexp, float32_inside, "values differ from the reference")

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


def test_skipped_blocks(accepts, rejects):
    accepts(check_skipped_blocks, skipped_blocks,
            "✓ skipped_blocks: right on all 8 cases; at T=8192 with 128x64 tiles a causal kernel skips 4032 of "
            "8192 tiles")
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
            "✗ skipped_blocks: on T=100, block_q=32, block_k=32")
    rejects(check_skipped_blocks,
            lambda T, bq, bk: sum(1 for i0 in range(0, T, bq) for j0 in range(0, T, bk) if j0 > i0 + bq),
            "✗ skipped_blocks: on T=256")  # off by one: j0 >= i0 + bq is already in the future


def test_predict_skipped_tiles(verdict):
    assert not verdict(check_predict_skipped_tiles, None)[0]
    ok, line = verdict(check_predict_skipped_tiles, 16 * 15 // 2)
    assert ok and line.startswith("✓ predict_skipped_tiles: you predicted 120; the measured number")
    assert not verdict(check_predict_skipped_tiles, 128)[0]  # "half of the 256 tiles": the diagonal ones are computed
    assert not verdict(check_predict_skipped_tiles, 136)[0]  # diagonal tiles counted as skipped
    assert not verdict(check_predict_skipped_tiles, "120")[0]  # not a number


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
    rejects(check_causal_flash_attention, only_divisible, "on B=2, H=1, T=37, D=4, blocks 16x5 (T not a multiple)")

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
    rejects(check_causal_flash_attention, strict_past, "values differ from the reference")

    def view_of_q(q, k, v, bq, bk):  # assumes a contiguous layout of q
        return causal_flash_attention(q.view(q.shape), k, v, bq, bk).view(-1).view(q.shape)
    rejects(check_causal_flash_attention, view_of_q, "non-contiguous")


def test_flash_dv(accepts, rejects):
    line = accepts(check_flash_dv, flash_dv)
    assert line.startswith("✓ flash_dv: matches autograd on all 4 cases, and at T=S=512 it needed ")
    assert line.endswith("% of the memory of one (T, S) matrix")
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
    rejects(check_flash_dv, whole_matrix, "at least one whole (T, S) matrix")

    def only_whole_blocks(q, k, d_out, lse, bq, bk):
        T = q.shape[2] // bq * bq
        return flash_dv(q[:, :, :T], k, d_out[:, :, :T], lse, bq, bk)
    rejects(check_flash_dv, only_whole_blocks, "on B=2, H=1, T=13, S=29, D=8, blocks 5x6 (neither a multiple)")

    def zeroes_d_out_in_place(q, k, d_out, lse, bq, bk):
        d_v = flash_dv(q, k, d_out, lse, bq, bk)
        d_out.zero_()  # frees "memory" by clearing the caller's gradient
        return d_v
    rejects(check_flash_dv, zeroes_d_out_in_place, "modified its input (argument 3) in place")
    rejects(check_flash_dv, lambda q, k, d_out, lse, bq, bk: flash_dv(q, k, d_out, lse, bq, bk).tolist(), "got list")
    rejects(check_flash_dv, lambda q, k, d_out, lse, bq, bk: flash_dv(q, k, d_out, lse, bq, bk).float(),
            "return dtype torch.float64, got torch.float32")
