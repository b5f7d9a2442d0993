"""Lesson 10's FlashAttention forward or backward (Triton kernels and PyTorch tiles) against SDPA's, side by side.

Contestants, each checked against SDPA's math kernel before it is timed: the Triton kernel of
lesson 10 (helpers.flash.triton_flash_attention; CUDA only), the PyTorch tiled version
(helpers.flash.flash_attention) and every fused SDPA kernel that runs here (flash, efficient,
cudnn on CUDA; flash on CPU), selected explicitly with helpers.sdpa_kernels.sdpa_backend. No mask and
causal. TFLOP/s count 4 B H T^2 D FLOPs for no mask and half of that for causal. With --backward, each
contestant's backward alone is timed, from a forward run once before (autograd with retain_graph for the
PyTorch tiles and SDPA; the Triton backward kernels from the saved out and lse), its gradients checked
against SDPA's math kernel first; its TFLOP/s count 2.5 times the forward's FLOPs (five matrix products
per tile where the forward has two). With --fwdbwd, one forward and one backward per call (3.5 times the
forward's FLOPs); the Triton row is the forward kernel and the two backward kernels, from a log-sum-exp
computed once beforehand (the forward kernel does not write it). --cs336 is the configuration of Stanford
CS336's FlashAttention assignment: B=1, T=16384, 16 heads of 64, bf16, causal, forward + backward, the
Triton kernels against SDPA's fused kernels (no PyTorch tiles: they would take minutes there).

    python benchmarks/bench_flash.py                  # CUDA: B=4, H=16, D=128, T = 1024 ... 8192, bf16
    python benchmarks/bench_flash.py --quick          # small sizes, seconds
    python benchmarks/bench_flash.py --sizes 8192 --masks none
    python benchmarks/bench_flash.py --backward --quick  # the backward, written to results/flash_backward_*
    python benchmarks/bench_flash.py --cs336          # CUDA: forward + backward at B=1, T=16384, H=16, D=64, causal
"""

from __future__ import annotations

import argparse
import importlib.util
import sys

import torch
import torch.nn.functional as F
from common import (
    add_repeat_args,
    announce,
    command_line,
    dtype_supported,
    fmt_ms,
    markdown_table,
    save,
    time_side_by_side,
)

from helpers.device import attention_flops, peak_tflops
from helpers.flash import (
    flash_attention,
    flash_attention_forward,
    triton_block_sizes,
    triton_flash_attention,
    triton_flash_attention_backward,
)
from helpers.masks import causal_mask
from helpers.sdpa_kernels import sdpa_backend


def reference(q, k, v, causal: bool) -> torch.Tensor:
    """SDPA's math kernel in fp32, one head at a time: (B, H, T, D) fp32.

    The math kernel materialises the (T, S) scores and weights in fp32: for all heads at once, at
    B=4, H=16, T=8192, that is 16 GiB per matrix, more than most GPUs hold. The heads are
    independent, so computing them one by one gives the same output with one head's 256 MiB
    matrices in memory.
    """
    B, H, T, D = q.shape
    out = torch.empty(B, H, T, v.shape[-1], device=q.device, dtype=torch.float32)  # (B, H, T, D)
    with torch.no_grad(), sdpa_backend("math"):
        for b in range(B):
            for h in range(H):
                one = [x[b:b + 1, h:h + 1].float() for x in (q, k, v)]  # (1, 1, T, D) each
                out[b:b + 1, h:h + 1] = F.scaled_dot_product_attention(*one, is_causal=causal)
    return out


def contestants(q, k, v, causal: bool, tiled_block: int, device) -> tuple[dict, dict]:
    """({name: fn()} of everything that runs and matches SDPA's math kernel, {name: reason} of the rest)."""
    fns, skipped = {}, {}
    mask = causal_mask(q.shape[2], device=device) if causal else None

    def sdpa(name):
        def call():
            with torch.no_grad(), sdpa_backend(name):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return call

    if device.type == "cuda" and importlib.util.find_spec("triton") is not None:
        fns["triton (lesson 10)"] = lambda: triton_flash_attention(q, k, v, causal=causal)
    else:
        skipped["triton (lesson 10)"] = "needs a CUDA GPU and Triton"
    fns["pytorch tiled (lesson 10)"] = lambda: flash_attention(q, k, v, mask=mask, block_q=tiled_block,
                                                               block_k=tiled_block)
    for name in ("flash", "efficient", "cudnn"):
        fns[f"sdpa {name}"] = sdpa(name)
    expected = reference(q, k, v, causal)  # (B, H, T, D) fp32
    tolerance = 1e-4 if q.dtype == torch.float32 else 3e-2
    for name, fn in list(fns.items()):
        try:
            error = (fn().float() - expected).abs().max().item()
        except (RuntimeError, ValueError) as err:  # a kernel this device or torch cannot run
            skipped[name] = str(err).split("\n")[0][:200]
            del fns[name]
            continue
        if not error <= tolerance:
            raise SystemExit(f"{name} differs from SDPA's math kernel by {error:.3g} (tolerance {tolerance})")
    return fns, skipped


def reference_grads(q, k, v, d_out, causal: bool) -> list[torch.Tensor]:
    """(dq, dk, dv) of SDPA's math kernel in fp32, one head at a time, as ``reference`` computes the output."""
    B, H = q.shape[:2]
    grads = [torch.empty(x.shape, device=x.device, dtype=torch.float32) for x in (q, k, v)]
    with sdpa_backend("math"):
        for b in range(B):
            for h in range(H):
                one = [x[b:b + 1, h:h + 1].float().requires_grad_() for x in (q, k, v)]  # (1, 1, L, D) each
                out = F.scaled_dot_product_attention(*one, is_causal=causal)
                for grad, g in zip(grads, torch.autograd.grad(out, one, d_out[b:b + 1, h:h + 1].float()),
                                   strict=True):
                    grad[b:b + 1, h:h + 1] = g
    return grads


def backward_contestants(q, k, v, causal: bool, tiled_block: int, device) -> tuple[dict, dict]:
    """({name: fn()} running one backward each, from a forward run once here; {name: reason} of the rest)."""
    fns, skipped = {}, {}
    mask = causal_mask(q.shape[2], device=device) if causal else None
    d_out = torch.randn(q.shape, generator=torch.Generator(device=device).manual_seed(1), device=device,
                        dtype=q.dtype)  # (B, H, T, D)

    def backward_of(forward):
        leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
        out = forward(*leaves)  # the graph is kept: each call below runs the backward alone
        return lambda: torch.autograd.grad(out, leaves, d_out, retain_graph=True)

    fns["pytorch tiled (lesson 10)"] = backward_of(
        lambda q, k, v: flash_attention(q, k, v, mask=mask, block_q=tiled_block, block_k=tiled_block))
    for name in ("flash", "efficient", "cudnn"):
        try:
            with sdpa_backend(name):
                fns[f"sdpa {name}"] = backward_of(lambda q, k, v: F.scaled_dot_product_attention(q, k, v,
                                                                                                 is_causal=causal))
        except (RuntimeError, ValueError) as err:  # a kernel this device or torch cannot run
            skipped[f"sdpa {name}"] = str(err).split("\n")[0][:200]
    if device.type == "cuda" and importlib.util.find_spec("triton") is not None:
        out, lse = flash_attention_forward(q, k, v, mask=mask, block_q=tiled_block, block_k=tiled_block)
        fns["triton (lesson 10)"] = lambda: triton_flash_attention_backward(q, k, v, out, lse, d_out, causal=causal)
    else:
        skipped["triton (lesson 10)"] = "needs a CUDA GPU and Triton"
    expected = reference_grads(q, k, v, d_out, causal)
    tolerance = 1e-3 if q.dtype == torch.float32 else 5e-2  # relative to the largest gradient entry
    for name, fn in list(fns.items()):
        try:
            error = max((g.float() - e).abs().max().item() / e.abs().max().item()
                        for g, e in zip(fn(), expected, strict=True))
        except (RuntimeError, ValueError) as err:
            skipped[name] = str(err).split("\n")[0][:200]
            del fns[name]
            continue
        if not error <= tolerance:
            raise SystemExit(f"{name}: gradients differ from SDPA's math kernel by {error:.3g} of the largest "
                             f"(tolerance {tolerance})")
    return fns, skipped


def fwdbwd_contestants(q, k, v, causal: bool, tiled_block: int | None, device) -> tuple[dict, dict]:
    """({name: fn()} each running one forward and one backward, checked first; {name: reason} of the rest).

    ``tiled_block`` None leaves out the PyTorch tiles.
    """
    fns, skipped = {}, {}
    mask = causal_mask(q.shape[2], device=device) if causal else None
    d_out = torch.randn(q.shape, generator=torch.Generator(device=device).manual_seed(2), device=device,
                        dtype=q.dtype)  # (B, H, T, D)
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]

    def through_autograd(forward):
        def call():
            out = forward(*leaves)
            return (out, *torch.autograd.grad(out, leaves, d_out))
        return call

    def sdpa(name):
        def forward(q, k, v):
            with sdpa_backend(name):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return forward

    if tiled_block is not None:
        fns["pytorch tiled (lesson 10)"] = through_autograd(
            lambda q, k, v: flash_attention(q, k, v, mask=mask, block_q=tiled_block, block_k=tiled_block))
    else:
        skipped["pytorch tiled (lesson 10)"] = "left out (--no-tiled)"
    for name in ("flash", "efficient", "cudnn"):
        fns[f"sdpa {name}"] = through_autograd(sdpa(name))
    if device.type == "cuda" and importlib.util.find_spec("triton") is not None:
        _, lse = flash_attention_forward(q, k, v, mask=mask, block_q=256, block_k=256)  # the saved statistics

        def triton_call():
            out = triton_flash_attention(q, k, v, causal=causal)
            return (out, *triton_flash_attention_backward(q, k, v, out, lse, d_out, causal=causal))
        fns["triton (lesson 10)"] = triton_call
    else:
        skipped["triton (lesson 10)"] = "needs a CUDA GPU and Triton"
    expected = [reference(q, k, v, causal), *reference_grads(q, k, v, d_out, causal)]
    tolerance = 1e-3 if q.dtype == torch.float32 else 5e-2  # relative to the largest entry of each
    for name, fn in list(fns.items()):
        try:
            error = max((g.float() - e).abs().max().item() / e.abs().max().item()
                        for g, e in zip(fn(), expected, strict=True))
        except (RuntimeError, ValueError) as err:  # a kernel this device or torch cannot run
            skipped[name] = str(err).split("\n")[0][:200]
            del fns[name]
            continue
        if not error <= tolerance:
            raise SystemExit(f"{name}: output or gradients differ from SDPA's math kernel by {error:.3g} of the "
                             f"largest (tolerance {tolerance})")
    return fns, skipped


def run(args, device) -> list[dict]:
    dtype = torch.float32 if device.type == "cpu" else (
        torch.bfloat16 if dtype_supported(torch.bfloat16, device) else torch.float16)
    peak = peak_tflops(device)
    rows, said = [], set()
    for T in args.sizes:
        g = torch.Generator(device=device).manual_seed(T)
        q, k, v = (torch.randn(args.batch, args.heads, T, args.head_dim, generator=g, device=device, dtype=dtype)
                   for _ in range(3))  # (B, H, T, D) each
        for mask in args.masks:
            causal = mask == "causal"
            if args.fwdbwd:
                fns, skipped = fwdbwd_contestants(q, k, v, causal, None if args.no_tiled else args.tiled_block,
                                                  device)
            else:
                pick = backward_contestants if args.backward else contestants
                fns, skipped = pick(q, k, v, causal, args.tiled_block, device)
            times = time_side_by_side(fns, device, repeats=args.repeats, warmup=args.warmup)
            flops = attention_flops(args.batch, args.heads, T, T, args.head_dim) / (2 if causal else 1)
            flops *= 3.5 if args.fwdbwd else 2.5 if args.backward else 1.0  # 5 matrix products per tile to 2
            for name in fns:
                seconds = times[name]["median_s"]
                row = dict(T=T, mask=mask, dtype=str(dtype).removeprefix("torch."), contestant=name,
                           median_s=seconds, timing=times[name], tflops=flops / seconds / 1e12)
                if peak:
                    row["fraction_of_peak"] = row["tflops"] / peak
                rows.append(row)
                share = f" ({row['fraction_of_peak']:.1%} of peak)" if peak else ""
                print(f"T={T:5} {mask:6} {name:26} {fmt_ms(seconds):>10} ms {row['tflops']:8.3g} TFLOP/s{share}",
                      flush=True)
            for name, reason in skipped.items():
                rows.append(dict(T=T, mask=mask, contestant=name, skipped=reason))
                if (name, reason) not in said:  # each reason once, not at every size
                    said.add((name, reason))
                    print(f"{name} skipped: {reason}", flush=True)
    return rows


def targets(rows, device) -> dict | None:
    """The lesson's H100/H200 targets at T=8192, no mask: Triton >= 65% of the best SDPA kernel, > SDPA flash."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else ""
    at = {r["contestant"]: r for r in rows if r["T"] == 8192 and r["mask"] == "none" and "tflops" in r}
    sdpa = {n: r["tflops"] for n, r in at.items() if n.startswith("sdpa")}
    if not any(gpu in name for gpu in ("H100", "H200")) or "triton (lesson 10)" not in at or not sdpa:
        return None
    triton = at["triton (lesson 10)"]["tflops"]
    return {"triton_ge_65pct_of_best_sdpa": triton >= 0.65 * max(sdpa.values()),
            "triton_faster_than_sdpa_flash": triton > sdpa.get("sdpa flash", float("inf")),
            "triton_over_best_sdpa": triton / max(sdpa.values())}


def markdown(rows, args, goals) -> str:
    what = "Forward + backward" if args.fwdbwd else "Backward alone" if args.backward else "Forward"
    body = [f"{what}. "
            f"B={args.batch}, H={args.heads}, D={args.head_dim}; PyTorch tiles {args.tiled_block} x "
            f"{args.tiled_block}; Triton tiles (block_q, block_k, warps) = {args.triton_blocks}. TFLOP/s count "
            f"{'14' if args.fwdbwd else '10' if args.backward else '4'} B H T^2 D FLOPs, half for causal.\n"]
    table = [[r["T"], r["mask"], r.get("dtype", "-"), r["contestant"],
              fmt_ms(r.get("median_s")), f"{r['tflops']:.3g}" if "tflops" in r else "-",
              f"{r['fraction_of_peak']:.1%}" if "fraction_of_peak" in r else "-", r.get("skipped", "")]
             for r in rows]
    body.append(markdown_table(["T", "mask", "dtype", "contestant", "ms", "TFLOP/s", "of peak", "skipped"], table))
    if goals:
        body.append("\nTargets (T=8192, no mask): " + ", ".join(f"{k}: {v}" for k, v in goals.items()))
    return "\n".join(body)


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", help="sequence lengths T (= S)")
    p.add_argument("--masks", nargs="+", choices=["none", "causal"], default=["none", "causal"])
    p.add_argument("--batch", type=int, default=None, help="B (default 4 on CUDA, 1 on CPU)")
    p.add_argument("--heads", type=int, default=None, help="H (default 16 on CUDA, 4 on CPU)")
    p.add_argument("--head-dim", type=int, default=None, help="D (default 128 on CUDA, 64 on CPU)")
    p.add_argument("--tiled-block", type=int, default=None, help="tiles of the PyTorch version (256 CUDA, 64 CPU)")
    p.add_argument("--backward", action="store_true", help="time the backward alone (results: flash_backward_*)")
    p.add_argument("--fwdbwd", action="store_true", help="time forward + backward (results: flash_fwdbwd_*)")
    p.add_argument("--no-tiled", action="store_true", help="leave out the PyTorch tiles (with --fwdbwd)")
    p.add_argument("--cs336", action="store_true",
                   help="CS336's configuration: B=1, T=16384, H=16, D=64, bf16, causal, forward + backward, no "
                        "PyTorch tiles (results: flash_cs336_*)")
    add_repeat_args(p, "blocks per contestant (median)")
    return command_line(p, argv)


CS336 = {"sizes": [16384], "batch": 1, "heads": 16, "head_dim": 64, "masks": ["causal"], "fwdbwd": True,
         "no_tiled": True, "backward": False}


def apply_preset(args):
    """With --cs336, set CS336's configuration (the sizes, one causal mask, forward + backward); return args."""
    if args.cs336:
        for key, value in CS336.items():
            setattr(args, key, value)
    if args.backward and args.fwdbwd:
        raise SystemExit("--backward times the backward alone, --fwdbwd forward + backward: choose one")
    return args


def result_name(args) -> str:
    """The stem of the result files: flash, flash_backward, flash_fwdbwd or flash_cs336 (then _cpu or _cuda)."""
    return ("flash_cs336" if args.cs336 else "flash_fwdbwd" if args.fwdbwd else
            "flash_backward" if args.backward else "flash")


def main(argv=None) -> dict:
    args, device = parse(argv)
    apply_preset(args)
    cuda = device.type == "cuda"
    if args.sizes is None:
        args.sizes = ([256, 512] if not cuda else [512, 1024]) if args.quick else (
            [1024, 2048, 4096, 8192] if cuda else [256, 512, 1024])
    args.batch = args.batch or (4 if cuda else 1)
    args.heads = args.heads or (16 if cuda else 4)
    args.head_dim = args.head_dim or (128 if cuda else 64)
    args.tiled_block = args.tiled_block or (256 if cuda else 64)
    args.repeats = args.repeats or (3 if args.quick else (10 if cuda else 5))
    args.triton_blocks = triton_block_sizes(device) if cuda else None
    env = announce("flash benchmark", device)
    rows = run(args, device)
    goals = None if args.backward or args.fwdbwd else targets(rows, device)  # the lesson's targets: the forward's
    name = result_name(args)
    payload = dict(benchmark=name, environment=env, settings=vars(args), rows=rows, targets=goals)
    save(name, device, payload, markdown(rows, args, goals), args)
    return payload


if __name__ == "__main__":
    main(sys.argv[1:])
