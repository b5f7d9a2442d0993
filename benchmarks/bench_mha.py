"""The course's MultiHeadAttention against torch.nn.MultiheadAttention with the same weights.

Three contestants on the same self-attention input (B, T, C): the course's module (lesson 04),
which always returns the (B, H, T, S) weights; nn.MultiheadAttention asked for its weights
(``need_weights=True``, the same work); and nn.MultiheadAttention without them
(``need_weights=False``), which lets torch use its fused kernels. The outputs are checked to be
equal, on the first sequence of the batch, before anything is timed. As in bench_attention.py,
each contestant's peak memory is measured at small T and extrapolated; one whose estimate exceeds
the free memory is skipped, and so is a size whose check itself runs out of memory. On GPUs
without bf16 (T4, V100) fp16 runs in its place.

    python benchmarks/bench_mha.py            # default sizes for the device
    python benchmarks/bench_mha.py --quick    # small sizes, seconds
    python benchmarks/bench_mha.py --sizes 256 1024 --modes fwd
"""

from __future__ import annotations

import argparse
import inspect
import math
import sys

import common  # the benchmarks' shared measuring and reporting (benchmarks/common.py)
import torch

from helpers.attention import MultiHeadAttention, to_torch_mha
from helpers.device import peak_memory

TARGET = 1.3  # the course's fused path within 1.3x of nn.MultiheadAttention(need_weights=False)


def course_has_fused_path() -> bool:
    """Whether helpers.attention.MultiHeadAttention.forward takes need_weights (its fused SDPA path)."""
    return "need_weights" in inspect.signature(MultiHeadAttention.forward).parameters


def twins(d_model: int, n_heads: int, device, dtype):
    """A course MultiHeadAttention and an nn.MultiheadAttention holding the same weights, in eval mode."""
    ours = MultiHeadAttention(d_model, n_heads)
    theirs = to_torch_mha(ours)  # built in fp32 on the CPU, then moved: the random stream is the same everywhere
    return ours.to(device, dtype).eval(), theirs.to(device, dtype).eval()


def make_call(fn, x, mode):
    if mode == "fwd":
        def forward():
            with torch.no_grad():
                return fn(x)
        return forward
    grad_out = torch.randn_like(x)

    def forward_backward():
        out = fn(x)
        return torch.autograd.grad(out, [x], grad_out)
    return forward_backward


CALIBRATION_SIZES = (64, 128, 256)


def inputs(args, T, device, dtype, mode):
    return torch.randn(args.batch, T, args.d_model, device=device, dtype=dtype,
                       requires_grad=(mode != "fwd"))  # (B, T, C)


def calibrate(contestants, args, device, dtype, mode) -> dict:
    """{name: peak-memory fit (c1, c2)} of each contestant at the run's B, C, H, measured at small T."""
    fits = {}
    for name, fn in contestants.items():
        try:
            peaks = [peak_memory(make_call(fn, inputs(args, T, device, dtype, mode), mode), device=device)
                     for T in CALIBRATION_SIZES]
        except Exception as err:  # noqa: BLE001  (out of memory even at small sizes: never common.affordable)
            if not common.is_out_of_memory(err):
                raise
            fits[name] = (math.inf, math.inf)
            continue
        fits[name] = common.fit_peak(CALIBRATION_SIZES, peaks)
    return fits


def check_outputs(contestants, x) -> tuple[dict, float]:
    """({name: largest |difference| from torch_fused}, largest |output|) on the first sequence of the batch.

    The sequences of a batch are independent, so one shows whether the modules agree, at 1/B of the
    memory: this check runs before the out-of-memory handling of the timing, and the weights path of
    the whole batch can need more memory than the GPU has.
    """
    one = x[:1].detach()  # (1, T, C)
    with torch.no_grad():
        ref = contestants["torch_fused"](one).float()
        return {n: (fn(one).float() - ref).abs().max().item() for n, fn in contestants.items()}, \
            ref.abs().max().item()


def make_row(args, dtype_name, in_place_of, mode, T, contestants, diff, t, mem, skipped) -> dict:
    row = dict(dtype=dtype_name, in_place_of=in_place_of, mode=mode, B=args.batch, T=T, C=args.d_model,
               H=args.heads, max_abs_diff=max(diff.values()) if diff else None, diff=diff, timings=t,
               peak_bytes=mem, skipped=skipped,
               **{f"{n}_s": (t[n]["median_s"] if n in t else None) for n in contestants})
    row["course_fused_s"] = row.get("course_fused_s")
    row["course_vs_torch_weights"] = ratio(row["course_s"], row["torch_weights_s"])
    row["course_vs_torch_fused"] = ratio(row["course_s"], row["torch_fused_s"])
    row["course_fused_vs_torch_fused"] = ratio(row["course_fused_s"], row["torch_fused_s"])
    if row["course_fused_vs_torch_fused"] is not None:
        row["target_met"] = row["course_fused_vs_torch_fused"] <= TARGET
    return row


def run(args, device) -> list[dict]:
    rows = []
    for dtype_name, in_place_of in common.native_dtypes(args.dtypes, device):  # fp16 for bf16 on a T4 or V100
        dtype = common.DTYPES[dtype_name]
        torch.manual_seed(0)
        ours, theirs = twins(args.d_model, args.heads, device, dtype)
        contestants = {
            "course": lambda x, m=ours: m(x, x, x)[0],
            "torch_weights": lambda x, m=theirs: m(x, x, x, need_weights=True)[0],
            "torch_fused": lambda x, m=theirs: m(x, x, x, need_weights=False)[0],
        }
        if course_has_fused_path():
            contestants["course_fused"] = lambda x, m=ours: m(x, x, x, need_weights=False)[0]
        else:
            print("course_fused not run: helpers.attention.MultiHeadAttention.forward has no need_weights "
                  "argument yet (the fused path of issue 11); only the weights path is compared", flush=True)
        for mode in args.modes:
            fits = calibrate(contestants, args, device, dtype, mode)
            for T in args.sizes:
                x = inputs(args, T, device, dtype, mode)
                try:
                    diff, scale = check_outputs(contestants, x)
                except Exception as err:  # noqa: BLE001  (only out-of-memory errors are caught)
                    if not common.is_out_of_memory(err):
                        raise
                    why = "out of memory in the output check: " + str(err).split("\n")[0][:160]
                    print(f"skip T={T} {dtype_name} {mode}: {why}", flush=True)
                    rows.append(make_row(args, dtype_name, in_place_of, mode, T, contestants, {}, {}, {},
                                         dict.fromkeys(contestants, why)))
                    common.release_memory(device)
                    continue
                # relative to the size of the outputs; half precision keeps 2-3 significant digits
                tol = (1e-4 if dtype == torch.float32 else 3e-2) * max(1.0, scale)
                if max(diff.values()) > tol:
                    raise AssertionError(f"outputs differ by {diff} > {tol} at T={T} {dtype_name}")
                fns = {name: make_call(fn, x, mode) for name, fn in contestants.items()}
                fns, _, skipped = common.affordable(fns, fits, T, common.memory_budget(device))
                t, mem, oom = common.measure_contestants(fns, device, repeats=args.repeats, warmup=args.warmup)
                skipped.update(oom)
                for name, why in skipped.items():
                    print(f"skip {name} at T={T} {dtype_name} {mode}: {why}", flush=True)
                row = make_row(args, dtype_name, in_place_of, mode, T, contestants, diff, t, mem, skipped)
                rows.append(row)
                ms = {k: common.fmt_ms(row[k]) for k in ("course_s", "course_fused_s", "torch_weights_s",
                                                            "torch_fused_s")}
                print(f"{dtype_name} {mode:6} T={T:5}: course {ms['course_s']} ms, course(fused) "
                      f"{ms['course_fused_s']} ms, torch(weights) {ms['torch_weights_s']} ms, "
                      f"torch(fused) {ms['torch_fused_s']} ms, max |diff| {row['max_abs_diff']:.2g}", flush=True)
                del x, fns
    return rows


def ratio(a, b):
    return a / b if a is not None and b else None


def markdown(rows) -> str:
    if not rows:
        return "No rows."
    r0 = rows[0]
    head = (f"## Self-attention, B={r0['B']}, C={r0['C']}, H={r0['H']}\n\n`course` = "
            "helpers.attention.MultiHeadAttention; `torch (weights)` = nn.MultiheadAttention(need_weights=True); "
            "`torch (fused)` = need_weights=False. Ratios are the course's time divided by torch's "
            "(above 1: the course module is slower); `course (fused)` = the course's module with "
            "need_weights=False (F.scaled_dot_product_attention inside). |diff| is the largest output "
            "difference from torch (fused) on the first sequence of the batch, checked before timing.\n\n")
    mib = lambda r, n: common.fmt_mib(r["peak_bytes"].get(n))  # noqa: E731
    table = common.markdown_table(
        ["dtype", "pass", "T", "course ms", "course (fused) ms", "torch (weights) ms", "torch (fused) ms",
         "course / weights", "course / fused", "course (fused) / torch (fused)", "course MiB",
         "torch (fused) MiB", "max abs diff"],
        [[r["dtype"], r["mode"], r["T"]]
         + [common.fmt_ms(r[k]) for k in ("course_s", "course_fused_s", "torch_weights_s", "torch_fused_s")]
         + [common.fmt_ratio(r[k]) for k in ("course_vs_torch_weights", "course_vs_torch_fused",
                                             "course_fused_vs_torch_fused")]
         + [mib(r, "course"), mib(r, "torch_fused"), "-" if r["max_abs_diff"] is None else f"{r['max_abs_diff']:.1e}"]
         for r in rows])
    if common.stand_in_note(rows):
        table += "\n\n" + common.stand_in_note(rows)
    skips = [f"- {r['dtype']} {r['mode']} T={r['T']}: {name} skipped ({why})"
             for r in rows for name, why in r["skipped"].items()]
    if skips:
        table += ("\n\nSkipped (estimated from peaks measured at T = "
                  f"{', '.join(map(str, CALIBRATION_SIZES))}, or out of memory):\n\n" + "\n".join(skips))
    if rows[0]["course_fused_s"] is None:
        table += ("\n\n`course (fused)` = MultiHeadAttention(need_weights=False) was not run: this version of "
                  "helpers.attention has no need_weights argument yet.")
    else:
        judged = [r for r in rows if "target_met" in r]  # both fused paths ran
        table += (f"\n\nTarget: course (fused) within {TARGET}x of torch (fused) (fp32 on the CPU, bf16 on a "
                  f"GPU): met in {sum(r['target_met'] for r in judged)} of {len(judged)} rows.")
    return head + table


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", help="sequence lengths T")
    p.add_argument("--dtypes", nargs="+", choices=sorted(common.DTYPES), default=None,
                   help="default: fp32 on CPU, fp32 and bf16 on CUDA")
    p.add_argument("--modes", nargs="+", choices=["fwd", "fwdbwd"], default=["fwd", "fwdbwd"])
    p.add_argument("--batch", type=int, default=None, help="B (default 4 on CPU, 8 on CUDA)")
    p.add_argument("--d-model", type=int, default=None, help="C (default 256 on CPU, 1024 on CUDA)")
    p.add_argument("--heads", type=int, default=None, help="H (default 8 on CPU, 16 on CUDA)")
    common.add_repeat_args(p)
    return common.command_line(p, argv)


def main(argv=None) -> dict:
    args, device = parse(argv)
    cuda = device.type == "cuda"
    if args.sizes is None:
        args.sizes = [32, 64, 128] if args.quick else ([256, 512, 1024, 2048, 4096] if cuda else [64, 128, 256, 512])
    args.dtypes = args.dtypes or (["fp32", "bf16"] if cuda else ["fp32"])
    args.batch = args.batch or (8 if cuda else 4)
    args.d_model = args.d_model or (1024 if cuda else 256)
    args.heads = args.heads or (16 if cuda else 8)
    args.repeats = args.repeats or (3 if args.quick else (10 if cuda else 7))
    env = common.announce("multi-head attention benchmark", device)
    rows = run(args, device)
    payload = dict(benchmark="mha", environment=env, settings=vars(args), rows=rows)
    common.save("mha", device, payload, markdown(rows), args)
    return payload


if __name__ == "__main__":
    main(sys.argv[1:])
