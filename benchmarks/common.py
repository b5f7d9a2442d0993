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
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from helpers.device import get_device, synchronize

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
