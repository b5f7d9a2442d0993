"""Where the course runs, and every measurement it makes (lessons 00 and 09).

Time (``benchmark``), peak memory (``peak_memory``), FLOP counts and peak throughput
(``attention_flops``, ``peak_tflops``), growth slopes (``loglog_slope``) and the CPU thread policy
(``cpu_threads``) live here, in one place.
"""

from __future__ import annotations

import os
import random
import re
import sys
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from helpers._validate import as_int, positive_int, positive_ints, require_type


def get_device() -> torch.device:
    """CUDA if available, then Apple MPS, then CPU; COURSE_DEVICE=cpu|cuda|mps overrides (lesson 00)."""
    wanted = os.environ.get("COURSE_DEVICE", "").strip().lower()
    if wanted:
        kind = wanted.split(":")[0]
        if kind not in ("cpu", "cuda", "mps"):
            raise ValueError(f"COURSE_DEVICE={wanted!r} is not one of 'cpu', 'cuda', 'cuda:N', 'mps'")
        if kind == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(f"COURSE_DEVICE={wanted!r} but torch finds no CUDA GPU here")
        if kind == "mps" and not _mps_available():
            raise RuntimeError(f"COURSE_DEVICE={wanted!r} but Apple MPS is not available here")
        return torch.device(wanted)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if _mps_available():
        return torch.device("mps")
    return torch.device("cpu")


def _mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def seed_everything(seed: int) -> None:
    """Seed Python, numpy and torch (every device) so a lesson reruns identically (lesson 00)."""
    seed = as_int(seed, "seed", minimum=0)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA and MPS device


def synchronize(device=None) -> None:
    """Wait until queued GPU work is finished, so a timer sees it (lesson 09)."""
    device = torch.device(device) if device is not None else get_device()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


@dataclass(frozen=True)
class Timing:
    """Result of `benchmark`: the median and interquartile range of one call, in seconds."""

    median_s: float
    iqr_s: float
    runs: int

    def __str__(self) -> str:
        return f"{self.median_s * 1e3:.3f} ms (IQR {self.iqr_s * 1e3:.3f} ms, {self.runs} runs)"


def benchmark(fn, *args, warmup: int = 3, min_run_time: float = 0.2, device=None, **kwargs) -> Timing:
    """Time fn(*args, **kwargs) after warm-up calls, synchronising the GPU around each block (lesson 09)."""
    from torch.utils import benchmark as tbench

    if warmup < 0 or min_run_time <= 0:
        raise ValueError(f"warmup must be >= 0 and min_run_time > 0, got {warmup}, {min_run_time}")
    device = torch.device(device) if device is not None else get_device()
    for _ in range(warmup):  # first calls pay for allocation, kernel selection, caches
        fn(*args, **kwargs)
    synchronize(device)

    def call():
        fn(*args, **kwargs)
        if device.type == "mps":  # torch.utils.benchmark synchronises CUDA itself, not MPS
            torch.mps.synchronize()

    m = tbench.Timer(stmt="call()", globals={"call": call}).blocked_autorange(min_run_time=min_run_time)
    return Timing(median_s=m.median, iqr_s=m.iqr, runs=len(m.times))


def peak_memory(fn, *args, device=None, **kwargs) -> int:
    """Peak bytes that fn(*args, **kwargs) allocates above what was allocated before it (lesson 09).

    CUDA: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``, minus the
    baseline. CPU, which keeps no such counter: ``torch.profiler`` with ``profile_memory=True``
    records every allocation (+bytes) and free (-bytes) in order; the answer is the largest
    running sum. Both count the returned tensors, which are still alive when fn returns.
    """
    device = torch.device(device) if device is not None else get_device()
    if device.type == "cuda":
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        baseline = torch.cuda.memory_allocated(device)
        out = fn(*args, **kwargs)
        synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - baseline
        del out
        return int(peak)
    if device.type != "cpu":
        raise ValueError(f"peak_memory measures 'cpu' and 'cuda' devices, got {str(device)!r}; "
                         "MPS reports no peak (use COURSE_DEVICE=cpu)")
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with _quiet_stderr():  # the profiler logs its start and stop, with timestamps, to the C++ stderr
        prof.start()
    try:
        out = fn(*args, **kwargs)
        del out
    finally:
        with _quiet_stderr():
            prof.stop()
    # "[memory]" events carry +nbytes for an allocation and -nbytes for a free, in time order
    events = [e for e in prof.profiler.kineto_results.events()
              if e.name() == "[memory]" and e.device_type() == DeviceType.CPU]
    events.sort(key=lambda e: e.start_ns() if hasattr(e, "start_ns") else e.start_us())
    running = peak = 0
    for e in events:
        running += e.nbytes()
        peak = max(peak, running)
    return int(peak)


@contextmanager
def _quiet_stderr():
    """Silence writes to file descriptor 2 for a moment (what torch's C++ code logs goes there)."""
    fd = 2  # the process's own stderr, which Jupyter forwards into the notebook
    sys.stderr.flush()
    saved = os.dup(fd)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), fd)
        yield
    finally:
        os.dup2(saved, fd)
        os.close(saved)


# How many threads the lessons' small models train with on the CPU. Measured on a 2-core machine
# (benchmarks/results/threads_cpu*.md): a lesson-08-sized training step is 1.4x faster with 2 threads
# than with 1 when the machine is idle, but 2.6x slower as soon as one other process keeps a core busy
# (another notebook, the second nbval worker) and 10x slower on a busy shared machine, because each of
# the model's many small operations waits for the thread that the scheduler parked. One thread gives
# up a little on an idle machine to avoid a large loss on a shared one.
SMALL_MODEL_THREADS = 1


@contextmanager
def cpu_threads(n: int = SMALL_MODEL_THREADS):
    """Run the block with torch using n CPU threads (default 1, for small models), then restore (lesson 00).

    Small models (lessons 02-08) spend their time in many small operations, where a second thread
    gains little on an idle machine and loses much on a busy one; a large matrix product is where
    more threads pay. GPU work is
    unaffected. Usage: ``with cpu_threads(): train(...)``.
    """
    n = positive_int(n, "n (CPU threads)")
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield before
    finally:
        torch.set_num_threads(before)


# --- counting and measuring ----------------------------------------------------------------------


def attention_flops(B: int, H: int, T: int, S: int, D: int) -> int:
    """FLOPs of one attention forward: q k^T and weights @ v, 2*T*S*D each, per head (lesson 09)."""
    B, H, T, S, D = positive_ints(B=B, H=H, T=T, S=S, D=D)
    return 4 * B * H * T * S * D  # a multiply-add counts as 2 FLOPs; the softmax is left out


# Dense (no structured sparsity) half-precision tensor-core peaks from NVIDIA's data sheets, in
# TFLOP/s: BF16 where the GPU has it, FP16 otherwise (T4, V100). Rows are (GPU, regular expression
# matched against torch.cuda.get_device_name, peak), checked in order: the first match wins.
PEAK_TFLOPS = (
    ("H200 NVL", r"H200 NVL", 835.0),
    ("H200", r"H200", 989.0),
    ("H100 NVL", r"H100 NVL", 835.0),
    ("H100 PCIe", r"H100 PCIe", 756.0),
    ("H100 SXM", r"H100", 989.0),  # named e.g. "NVIDIA H100 80GB HBM3"
    ("A100", r"A100", 312.0),
    ("L4", r"\bL4\b", 121.0),  # not L40 or L40S
    ("V100 PCIe", r"V100-PCIE", 112.0),
    ("V100 SXM", r"V100", 125.0),
    ("T4", r"\bT4\b", 65.0),
)


def peak_tflops(device=None) -> float | None:
    """Known half-precision tensor-core peak of a CUDA device in TFLOP/s; None for others (lesson 09)."""
    device = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available()
                                                                          else "cpu")
    if device.type != "cuda":
        return None
    return peak_tflops_of(torch.cuda.get_device_name(device))


def peak_tflops_of(gpu_name: str) -> float | None:
    """The entry of PEAK_TFLOPS that matches a GPU name such as 'NVIDIA H100 80GB HBM3' (lesson 09)."""
    require_type(gpu_name, "gpu_name", str, "a str")
    for _, pattern, tflops in PEAK_TFLOPS:
        if re.search(pattern, gpu_name, flags=re.IGNORECASE):
            return tflops
    return None


def loglog_slope(sizes, values) -> float:
    """Least-squares slope of log(values) against log(sizes): 2 means cost grows like size^2 (lesson 09)."""
    x, y = np.asarray(sizes, dtype=float), np.asarray(values, dtype=float)
    if x.shape != y.shape or x.ndim != 1 or len(x) < 2:
        raise ValueError(f"need two 1-D sequences of equal length >= 2, got shapes {x.shape} and {y.shape}")
    if not ((x > 0).all() and (y > 0).all() and np.isfinite(x).all() and np.isfinite(y).all()):
        raise ValueError(f"sizes and values must be positive and finite, got {x.tolist()} and {y.tolist()}")
    if (x == x[0]).all():
        raise ValueError(f"sizes must not all be equal (no slope against a constant), got {x.tolist()}")
    return float(np.polyfit(np.log(x), np.log(y), 1)[0])
