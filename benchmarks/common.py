"""What every benchmark script shares: the device, a side-by-side timer, facts about the machine, result files.

Timing. The scripts compare implementations on machines that may be busy with other work, so
they never time one implementation for a while and then the other: ``time_side_by_side`` runs
one block of each in turn, ``repeats`` times, and reports the median of each. A block is one
call, or several calls when one call is too short for the clock; the GPU is synchronised before
and after every block (CUDA kernels run asynchronously, so a timer that does not wait for them
measures only how long it took to queue them).
"""

from __future__ import annotations

import datetime
import gc
import json
import math
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from helpers.device import get_device, peak_memory, synchronize

RESULTS = Path(__file__).resolve().parent / "results"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def pick_device(name: str | None) -> torch.device:
    """The device named on the command line, else the course's default (COURSE_DEVICE, CUDA, MPS, CPU)."""
    device = torch.device(name) if name else get_device()
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device {name} asked for CUDA, but torch finds no CUDA GPU here")
    if device.type not in ("cpu", "cuda"):
        raise SystemExit(f"the benchmarks measure peak memory, which only CPU and CUDA report; got {device}")
    return device


def add_common_args(parser, quick_help: str = "small sizes and few repeats, for a smoke test") -> None:
    """Add the flags every benchmark takes: --device, --threads, --quick, --tag, --no-write."""
    parser.add_argument("--device", help="cpu or cuda (default: the course's get_device())")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--tag", default="", help="suffix of the result file names")
    parser.add_argument("--no-write", action="store_true", help="print only, write no result files")


def start(args) -> torch.device:
    """Pick the device and set the CPU thread count a benchmark runs with."""
    device = pick_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    return device


def dtype_supported(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether matrix products in ``dtype`` run natively on ``device`` (bf16 needs compute capability 8+)."""
    if device.type == "cuda" and dtype == torch.bfloat16:
        return torch.cuda.get_device_capability(device)[0] >= 8
    return True


def native_dtypes(names, device: torch.device) -> list[tuple[str, str | None]]:
    """[(dtype name to run, the name it stands in for, or None)]: fp16 in place of bf16 where bf16 is not native.

    GPUs before compute capability 8 (T4, V100) have no bf16 matrix units but do have fp16 ones, so
    the half-precision rows are run in fp16 there, as lesson 09 does, instead of being left out.
    Prints one line per substitution; a dtype asked for twice (fp16 and bf16 -> fp16) runs once.
    """
    chosen = []
    for name in names:
        run = name if dtype_supported(DTYPES[name], device) else "fp16"
        if run != name:
            print(f"{name} is not native on {device} (compute capability below 8): fp16 in its place", flush=True)
        if run not in [r for r, _ in chosen]:
            chosen.append((run, None if run == name else name))
    return chosen


def stand_in_note(rows) -> str:
    """A sentence for the result table when some rows ran fp16 in place of bf16 (rows carry ``in_place_of``)."""
    if not any(r.get("in_place_of") for r in rows):
        return ""
    return "fp16 rows stand in for bf16, which this GPU does not run natively (compute capability below 8)."


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(device: torch.device) -> dict:
    """Facts a reader needs to compare two result files: device, versions, date, threads."""
    env = {
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "platform": platform.platform(),
        "cpu_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(cuda=torch.version.cuda, capability=f"{props.major}.{props.minor}",
                   gpu_memory_gib=round(props.total_memory / 2**30, 1))
    if hasattr(os, "getloadavg"):
        env["load_average_1min_at_start"] = round(os.getloadavg()[0], 2)
    return env


def _calls_per_block(fn, device, min_block_s: float) -> int:
    """Enough calls that one block lasts about ``min_block_s`` (one call if a single call is that slow)."""
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    once = time.perf_counter() - start
    return max(1, min(1000, int(min_block_s / max(once, 1e-7))))


def time_side_by_side(fns: dict, device: torch.device, repeats: int = 7, warmup: int = 2,
                      min_block_s: float = 0.02) -> dict:
    """Median seconds per call of each function in ``fns`` {name: fn()}, the blocks interleaved.

    Returns {name: {"median_s", "min_s", "max_s", "calls", "blocks"}}.
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got {repeats} and {warmup}")
    for fn in fns.values():  # warm-up: allocation, kernel choice, caches, lazy initialisation
        for _ in range(warmup):
            fn()
    number = {name: _calls_per_block(fn, device, min_block_s) for name, fn in fns.items()}
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            synchronize(device)
            start = time.perf_counter()
            for _ in range(number[name]):
                fn()
            synchronize(device)
            times[name].append((time.perf_counter() - start) / number[name])
    return {name: {"median_s": statistics.median(t), "min_s": min(t), "max_s": max(t),
                   "calls": number[name], "blocks": repeats} for name, t in times.items()}


def fmt_ms(seconds) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f}"


def fmt_mib(nbytes) -> str:
    return "-" if nbytes is None else f"{nbytes / 2**20:.1f}"


def fmt_ratio(x) -> str:
    return "-" if x is None else f"{x:.2f}x"


def markdown_table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_results(name: str, device: torch.device, payload: dict, markdown_body: str, tag: str = "") -> list[Path]:
    """Write results/<name>_<cpu|cuda>[_<tag>].json and .md; return the two paths."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = f"{name}_{device.type}" + (f"_{tag}" if tag else "")
    env = payload["environment"]
    head = (f"# {name} on {env['device_name']} ({env['device']})\n\n"
            f"torch {env['torch']}, Python {env['python']}, {env['date_utc']}, "
            f"{env['cpu_threads']} CPU threads"
            + (f", CUDA {env['cuda']}, compute capability {env['capability']}" if "cuda" in env else "")
            + (f", 1-minute load average at start {env['load_average_1min_at_start']}"
               if "load_average_1min_at_start" in env else "")
            + ".\n\nTimes are medians of blocks run side by side (see benchmarks/README.md).\n\n")
    json_path, md_path = RESULTS / f"{stem}.json", RESULTS / f"{stem}.md"
    json_path.write_text(json.dumps(payload, indent=1, sort_keys=True) + "\n")
    md_path.write_text(head + markdown_body.rstrip() + "\n")
    return [json_path, md_path]


# --- memory: estimates, budgets, and out-of-memory errors that skip instead of crashing -------------------


def is_out_of_memory(err: BaseException) -> bool:
    """Whether ``err`` says that an allocation failed (CUDA's OutOfMemoryError, or the CPU allocator's)."""
    if isinstance(err, (torch.cuda.OutOfMemoryError, MemoryError)):
        return True
    text = str(err).lower()
    return isinstance(err, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


def release_memory(device: torch.device) -> None:
    """Free what Python no longer uses and, on CUDA, the blocks the caching allocator keeps."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def memory_budget(device: torch.device) -> int:
    """Bytes one contestant may use now: 90% of the free GPU memory, or 40% of RAM capped by what is available."""
    release_memory(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(0.9 * free)
    page = os.sysconf("SC_PAGE_SIZE")
    total, available = page * os.sysconf("SC_PHYS_PAGES"), page * os.sysconf("SC_AVPHYS_PAGES")
    return int(min(0.4 * total, 0.8 * available))


def fit_peak(sizes, peaks) -> tuple[float, float]:
    """(c1, c2) >= 0 such that c1 * T + c2 * T**2 fits the measured peak bytes at sizes T (least squares).

    Attention's peak memory grows like T (inputs, outputs, fused kernels) plus T**2 (materialised
    scores); the fit is measured on the machine, for the dtype and pass at hand, so that it is right
    wherever the allocator or the kernels differ (bf16 or fp32, forward or forward + backward).
    """
    T = np.asarray(sizes, dtype=float)
    y = np.asarray(peaks, dtype=float)
    if T.shape != y.shape or len(T) < 2:
        raise ValueError(f"need at least two sizes with one peak each, got {sizes} and {peaks}")
    c1, c2 = np.linalg.lstsq(np.stack([T, T**2], axis=1), y, rcond=None)[0]
    if c2 < 0:  # no quadratic part: fit a line through the origin
        c1, c2 = float((T @ y) / (T @ T)), 0.0
    elif c1 < 0:  # no linear part
        c1, c2 = 0.0, float((T**2 @ y) / (T**2 @ T**2))
    return float(c1), float(c2)


def predict_peak(fit: tuple[float, float], T: int, margin: float = 1.15) -> int | float:
    """Estimated peak bytes at size T from ``fit_peak``'s coefficients, with a safety margin.

    A fit of infinities (out of memory already at the calibration sizes) gives math.inf, never affordable.
    """
    c1, c2 = fit
    estimate = margin * (c1 * T + c2 * T * T)
    return int(estimate) if math.isfinite(estimate) else math.inf


def affordable(fns: dict, fits: dict, T: int, budget: int) -> tuple[dict, dict, dict]:
    """(the contestants whose estimated peak at size T fits ``budget`` bytes, {name: estimate}, {name: skip reason})."""
    keep, estimates, skipped = {}, {}, {}
    for name, fn in fns.items():
        estimates[name] = predict_peak(fits[name], T)
        if estimates[name] <= budget:
            keep[name] = fn
        else:
            skipped[name] = (f"estimated peak {estimates[name] / 2**30:.1f} GiB > {budget / 2**30:.1f} GiB "
                             "free for it")
    return keep, estimates, skipped


def measure_contestants(fns: dict, device: torch.device, repeats: int, warmup: int,
                        min_block_s: float = 0.02) -> tuple[dict, dict, dict]:
    """Peak memory of each contestant alone, then their times side by side; out of memory means skipped.

    Returns (timings, peak_bytes, skipped) with skipped = {name: reason}. Each contestant first runs
    once alone (its peak-memory measurement); one that runs out of memory is recorded as skipped and
    the others go on. If memory still runs out while timing, the contestant with the largest peak
    is dropped and the timing starts again.
    """
    fns, peaks, skipped = dict(fns), {}, {}
    for name in list(fns):
        try:
            peaks[name] = peak_memory(fns[name], device=device)
        except Exception as err:  # noqa: BLE001  (only out-of-memory errors are caught; the rest re-raised)
            if not is_out_of_memory(err):
                raise
            skipped[name] = "out of memory: " + str(err).split("\n")[0][:160]
            del fns[name]
        release_memory(device)
    while fns:
        try:
            return time_side_by_side(fns, device, repeats=repeats, warmup=warmup, min_block_s=min_block_s), \
                peaks, skipped
        except Exception as err:  # noqa: BLE001
            if not is_out_of_memory(err):
                raise
            worst = max(fns, key=lambda n: peaks[n])
            skipped[worst] = "out of memory while timing: " + str(err).split("\n")[0][:160]
            del fns[worst], peaks[worst]
            release_memory(device)
    return {}, peaks, skipped


# --- the steps every benchmark's command line and main() take ---------------------------------------------


def add_repeat_args(parser, repeats_help: str | None = None, warmup: int = 2) -> None:
    """Add --repeats (blocks per contestant; None: the benchmark's default) and --warmup (calls before timing)."""
    parser.add_argument("--repeats", type=int, default=None, help=repeats_help)
    parser.add_argument("--warmup", type=int, default=warmup)


def announce(what: str, device: torch.device) -> dict:
    """Print the line that opens a benchmark's output (what, on which device, which torch); return environment()."""
    env = environment(device)
    print(f"{what} on {env['device_name']} ({device}), torch {env['torch']}", flush=True)
    return env


def save(name: str, device: torch.device, payload: dict, markdown_body: str, args) -> None:
    """Write the result files (unless --no-write) under --tag, printing each path written."""
    if not args.no_write:
        for path in write_results(name, device, payload, markdown_body, args.tag):
            print("wrote", path)


def command_line(parser, argv, quick_help: str | None = None) -> tuple:
    """Add the common flags to ``parser``, parse ``argv`` and start: (args, the device to run on)."""
    add_common_args(parser, *([quick_help] if quick_help else []))
    args = parser.parse_args(argv)
    return args, start(args)
