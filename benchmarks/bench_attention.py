"""Naive attention vs F.scaled_dot_product_attention: time and peak memory against sequence length.

"Naive" is the course's own helpers.attention.scaled_dot_product_attention (lesson 02), which
materialises the (T, S) scores and weights; "SDPA" is torch.nn.functional.scaled_dot_product_attention
with the kernel torch picks (recorded per row). Both run forward, and forward + backward, in fp32
and bf16 (fp16 on GPUs without bf16). On CUDA a headline run follows: bf16, T = 8192, D = 128, no
mask, each fused kernel selected explicitly with sdpa_kernel, against the naive attention.

    python benchmarks/bench_attention.py                    # default sizes for the device
    python benchmarks/bench_attention.py --quick            # small sizes, seconds
    python benchmarks/bench_attention.py --sizes 512 1024 --dtypes fp32 --modes fwd
    python benchmarks/bench_attention.py --headline-only    # only the T = 8192 headline (CUDA)
"""

from __future__ import annotations

import argparse
import math
import sys

import torch
import torch.nn.functional as F
from common import (
    DTYPES,
    add_repeat_args,
    affordable,
    announce,
    command_line,
    dtype_supported,
    fit_peak,
    fmt_mib,
    fmt_ms,
    fmt_ratio,
    is_out_of_memory,
    markdown_table,
    measure_contestants,
    memory_budget,
    native_dtypes,
    predict_peak,
    save,
    stand_in_note,
)

from helpers.attention import scaled_dot_product_attention as course_attention
from helpers.device import attention_flops, loglog_slope, peak_memory, peak_tflops
from helpers.sdpa_kernels import auto_sdpa_backend, sdpa_backend

BACKWARD_FLOP_FACTOR = 2.5  # backward = 5 matrix products vs the forward's 2 (the FlashAttention-2 paper's count)


def naive(q, k, v):
    return course_attention(q, k, v)[0]  # (B, H, T, D); materialises (B, H, T, S) scores


def sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v)  # (B, H, T, D)


def make_call(attn, q, k, v, mode):
    """A no-argument function running one forward (mode 'fwd') or forward + backward ('fwdbwd')."""
    if mode == "fwd":
        def forward():
            with torch.no_grad():
                return attn(q, k, v)
        return forward
    grad_out = torch.randn_like(q)

    def forward_backward():
        out = attn(q, k, v)
        return torch.autograd.grad(out, (q, k, v), grad_out)  # grads (B, H, T, D) x 3, no accumulation
    return forward_backward


CALIBRATION_SIZES = (64, 128, 256)
CONTESTANTS = {"sdpa": sdpa, "naive": naive}


def calibrate(attn, B, H, D, dtype, device, mode) -> tuple[float, float]:
    """Peak-memory fit (c1, c2) of one contestant, measured here at small T for this dtype and pass."""
    peaks = []
    try:
        for T in CALIBRATION_SIZES:
            q, k, v = inputs(B, H, T, D, dtype, device, mode)
            peaks.append(peak_memory(make_call(attn, q, k, v, mode), device=device))
    except Exception as err:  # noqa: BLE001  (out of memory even at small sizes: never affordable)
        if not is_out_of_memory(err):
            raise
        return math.inf, math.inf
    return fit_peak(CALIBRATION_SIZES, peaks)


def inputs(B, H, T, D, dtype, device, mode, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    return [torch.randn(B, H, T, D, generator=g, device=device, dtype=dtype, requires_grad=(mode != "fwd"))
            for _ in range(3)]  # q, k, v: (B, H, T, D)


def sweep(args, device) -> list[dict]:
    rows = []
    B, H, D = args.batch, args.heads, args.head_dim
    for dtype_name, in_place_of in native_dtypes(args.dtypes, device):  # fp16 for bf16 on a T4 or V100
        dtype = DTYPES[dtype_name]
        for mode in args.modes:
            fits = {name: calibrate(fn, B, H, D, dtype, device, mode) for name, fn in CONTESTANTS.items()}
            for T in args.sizes:
                q, k, v = inputs(B, H, T, D, dtype, device, mode)
                fns = {name: make_call(fn, q, k, v, mode) for name, fn in CONTESTANTS.items()}
                fns, estimates, skipped = affordable(fns, fits, T, memory_budget(device))
                t, mem, oom = measure_contestants(fns, device, repeats=args.repeats, warmup=args.warmup)
                skipped.update(oom)
                for name, why in skipped.items():
                    print(f"skip {name} at T={T} {dtype_name} {mode}: {why}", flush=True)
                flops = attention_flops(B, H, T, T, D) * (1 if mode == "fwd" else 1 + BACKWARD_FLOP_FACTOR)
                row = dict(dtype=dtype_name, mode=mode, B=B, H=H, T=T, D=D, flops=flops,
                           sdpa_backend=auto_sdpa_backend(q, k, v), timings=t, skipped=skipped,
                           estimated_bytes=estimates, in_place_of=in_place_of)
                for name in CONTESTANTS:
                    row[f"{name}_s"] = t[name]["median_s"] if name in t else None
                    row[f"{name}_bytes"] = mem.get(name) if name in t else None
                row["speedup"] = row["naive_s"] / row["sdpa_s"] if row["naive_s"] and row["sdpa_s"] else None
                row["memory_ratio"] = row["naive_bytes"] / row["sdpa_bytes"] \
                    if row["naive_bytes"] and row["sdpa_bytes"] else None
                row["sdpa_tflops"] = flops / row["sdpa_s"] / 1e12 if row["sdpa_s"] else None
                rows.append(row)
                print(f"{dtype_name} {mode:6} T={T:6}: naive {fmt_ms(row['naive_s'])} ms, "
                      f"sdpa[{row['sdpa_backend']}] {fmt_ms(row['sdpa_s'])} ms, speed-up "
                      f"{fmt_ratio(row['speedup'])}, memory {fmt_mib(row['naive_bytes'])} vs "
                      f"{fmt_mib(row['sdpa_bytes'])} MiB", flush=True)
                del q, k, v, fns
    return rows


def slopes(rows) -> list[dict]:
    """Log-log slope of time and peak memory against T, per (dtype, mode, implementation)."""
    out = []
    for dtype_name in dict.fromkeys(r["dtype"] for r in rows):
        for mode in dict.fromkeys(r["mode"] for r in rows):
            group = [r for r in rows if r["dtype"] == dtype_name and r["mode"] == mode]
            for impl in ("naive", "sdpa"):
                pts = [r for r in group if r[f"{impl}_s"] is not None]
                if len(pts) >= 2:
                    sizes = [r["T"] for r in pts]
                    out.append(dict(dtype=dtype_name, mode=mode, impl=impl, sizes=sizes,
                                    time_slope=loglog_slope(sizes, [r[f"{impl}_s"] for r in pts]),
                                    memory_slope=loglog_slope(sizes, [r[f"{impl}_bytes"] for r in pts])))
    return out


def headline(args, device) -> dict:
    """bf16 SDPA at T=8192, D=128, no mask, each fused kernel chosen explicitly, against naive."""
    B, H, T, D = args.headline_batch, args.headline_heads, args.headline_seq, 128
    dtype = torch.bfloat16 if dtype_supported(torch.bfloat16, device) else torch.float16
    naive_fit = calibrate(naive, 1, H, D, dtype, device, "fwd")  # per source: peak grows linearly in B
    if B is None:  # the largest of 4, 2, 1 whose naive run fits, so that the GPU has enough work
        B = next((b for b in (4, 2, 1) if b * predict_peak(naive_fit, T) <= memory_budget(device)), 1)
    q, k, v = inputs(B, H, T, D, dtype, device, "fwd")
    flops = attention_flops(B, H, T, T, D)
    result = dict(B=B, H=H, T=T, D=D, dtype=str(dtype).removeprefix("torch."), mask=None, flops=flops,
                  auto_backend=auto_sdpa_backend(q, k, v), backends={}, peak_tflops=peak_tflops(device))
    fns = {}
    for name in ("flash", "cudnn", "efficient"):
        def call(name=name):
            with torch.no_grad(), sdpa_backend(name):  # this kernel only: an error if it cannot run
                return F.scaled_dot_product_attention(q, k, v)
        try:
            call()
        except (RuntimeError, ValueError) as err:
            result["backends"][name] = {"available": False, "reason": str(err).split("\n")[0][:200]}
            continue
        fns[name] = call
    need = B * predict_peak(naive_fit, T)
    if need <= memory_budget(device):
        fns["naive"] = make_call(naive, q, k, v, "fwd")
    else:
        result["naive_skipped"] = f"needs ~{need / 2**30:.1f} GiB"
    t, mem, oom = measure_contestants(fns, device, repeats=args.repeats, warmup=args.warmup)
    if "naive" in oom:
        result["naive_skipped"] = oom.pop("naive")
    for name, why in oom.items():
        result["backends"][name] = {"available": False, "reason": why}
    for name in t:
        entry = dict(available=True, median_s=t[name]["median_s"], timing=t[name], peak_bytes=mem[name],
                     tflops=flops / t[name]["median_s"] / 1e12)
        if result["peak_tflops"]:
            entry["fraction_of_peak"] = entry["tflops"] / result["peak_tflops"]
        if name == "naive":
            result["naive"] = entry
        else:
            result["backends"][name] = entry
    ran = {n: e for n, e in result["backends"].items() if e["available"]}
    if ran:
        best = min(ran, key=lambda n: ran[n]["median_s"])
        result["best_backend"] = best
        if "naive" in result:
            result["speedup_vs_naive"] = result["naive"]["median_s"] / ran[best]["median_s"]
            result["memory_ratio_vs_naive"] = result["naive"]["peak_bytes"] / ran[best]["peak_bytes"]
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else ""
        if any(gpu in name for gpu in ("H100", "H200")) and T == 8192:
            result["targets"] = {
                "sdpa_tflops_ge_300": ran[best]["tflops"] >= 300,
                "speedup_vs_naive_ge_5": result.get("speedup_vs_naive", 0) >= 5,
                "memory_ratio_vs_naive_ge_10": result.get("memory_ratio_vs_naive", 0) >= 10,
            }
    return result


def markdown(rows, slope_rows, head) -> str:
    parts = []
    if rows:
        b = rows[0]
        parts.append(f"## Sweep over sequence length T (B={b['B']}, H={b['H']}, D={b['D']}, self-attention, "
                     "no mask)\n\nspeed-up = naive time / SDPA time; memory ratio = naive peak / SDPA peak. "
                     "TFLOP/s counts 4*B*H*T*T*D for the forward and 3.5 times that for forward + backward.\n")
        parts.append(markdown_table(
            ["dtype", "pass", "T", "naive ms", "SDPA ms", "speed-up", "naive MiB", "SDPA MiB", "memory ratio",
             "SDPA kernel", "SDPA TFLOP/s"],
            [[r["dtype"], r["mode"], r["T"], fmt_ms(r["naive_s"]), fmt_ms(r["sdpa_s"]), fmt_ratio(r["speedup"]),
              fmt_mib(r["naive_bytes"]), fmt_mib(r["sdpa_bytes"]), fmt_ratio(r["memory_ratio"]),
              r["sdpa_backend"], "-" if r["sdpa_tflops"] is None else f"{r['sdpa_tflops']:.3f}"] for r in rows]))
        if stand_in_note(rows):
            parts.append("\n" + stand_in_note(rows))
        skips = [f"- {r['dtype']} {r['mode']} T={r['T']}: {name} skipped ({why})"
                 for r in rows for name, why in r.get("skipped", {}).items()]
        if skips:
            parts.append("\nSkipped (estimated from peaks measured at T = "
                         f"{', '.join(map(str, CALIBRATION_SIZES))}, or out of memory):\n\n" + "\n".join(skips))
    if slope_rows:
        parts.append("\n## Log-log slopes against T (2 = quadratic, 1 = linear)\n")
        parts.append(markdown_table(
            ["dtype", "pass", "implementation", "T range", "time slope", "memory slope"],
            [[s["dtype"], s["mode"], s["impl"], f"{s['sizes'][0]}-{s['sizes'][-1]}", f"{s['time_slope']:.2f}",
              f"{s['memory_slope']:.2f}"] for s in slope_rows]))
    if head:
        parts.append(f"\n## Headline: {head['dtype']} forward, B={head['B']}, H={head['H']}, T={head['T']}, "
                     f"D={head['D']}, no mask\n\nEach fused kernel is selected explicitly with "
                     f"torch.nn.attention.sdpa_kernel; torch's own choice would be `{head['auto_backend']}`. "
                     f"Known peak of this device: {head['peak_tflops'] or 'unknown'} TFLOP/s.\n")
        table = []
        for name, e in list(head["backends"].items()) + ([("naive", head["naive"])] if "naive" in head else []):
            if e["available"]:
                frac = f"{e['fraction_of_peak']:.1%}" if "fraction_of_peak" in e else "-"
                table.append([name, fmt_ms(e["median_s"]), f"{e['tflops']:.3g}", frac, fmt_mib(e["peak_bytes"])])
            else:
                table.append([name, "not available: " + e["reason"], "-", "-", "-"])
        parts.append(markdown_table(["kernel", "ms", "TFLOP/s", "of peak", "peak MiB"], table))
        if "best_backend" in head:
            parts.append(f"\nBest kernel: `{head['best_backend']}`; against naive: "
                         f"{fmt_ratio(head.get('speedup_vs_naive'))} faster, "
                         f"{fmt_ratio(head.get('memory_ratio_vs_naive'))} less peak memory"
                         + (f" (naive skipped: {head['naive_skipped']})" if "naive_skipped" in head else "") + ".")
        if "targets" in head:
            parts.append("\nTargets (H100/H200): " + ", ".join(
                f"{k}: {'met' if ok else 'NOT met'}" for k, ok in head["targets"].items()))
    return "\n".join(parts)


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", help="sequence lengths T")
    p.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES), default=["fp32", "bf16"])
    p.add_argument("--modes", nargs="+", choices=["fwd", "fwdbwd"], default=["fwd", "fwdbwd"])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=None, help="H (default 8 on CPU, 16 on CUDA)")
    p.add_argument("--head-dim", type=int, default=64)
    add_repeat_args(p, "blocks per implementation (median)")
    p.add_argument("--headline", action=argparse.BooleanOptionalAction, default=None,
                   help="run the bf16 T=8192 D=128 headline (default: on CUDA only)")
    p.add_argument("--headline-only", action="store_true", help="skip the sweep")
    p.add_argument("--headline-seq", type=int, default=8192)
    p.add_argument("--headline-heads", type=int, default=16)
    p.add_argument("--headline-batch", type=int, default=None, help="default: 4, 2 or 1, what fits")
    return command_line(p, argv)


def main(argv=None) -> dict:
    args, device = parse(argv)
    cuda = device.type == "cuda"
    if args.sizes is None:
        args.sizes = [128, 256, 512] if args.quick else (
            [512, 1024, 2048, 4096, 8192, 16384] if cuda else [256, 512, 1024, 2048])
    args.heads = args.heads or (16 if cuda else 8)
    args.repeats = args.repeats or (3 if args.quick else (10 if cuda else 5))
    if args.quick and args.headline is None:
        args.headline_seq = min(args.headline_seq, 2048)
    run_headline = args.headline if args.headline is not None else cuda
    if args.headline_only:
        run_headline = True
    torch.manual_seed(0)
    env = announce("attention benchmark", device)
    rows = [] if args.headline_only else sweep(args, device)
    slope_rows = slopes(rows)
    head = headline(args, device) if run_headline else None
    if head:
        print(markdown([], [], head))
    payload = dict(benchmark="attention", environment=env, settings=vars(args), sweep=rows, slopes=slope_rows,
                   headline=head)
    save("attention", device, payload, markdown(rows, slope_rows, head), args)
    return payload


if __name__ == "__main__":
    main(sys.argv[1:])
