"""helpers.device: FLOP counts, peak throughput by GPU name, log-log slopes, CPU threads, peak memory,
choosing the device, seeding and timing."""

import os
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from helpers.attention import scaled_dot_product_attention
from helpers.device import (
    attention_flops,
    benchmark,
    cpu_threads,
    get_device,
    loglog_slope,
    peak_memory,
    peak_tflops,
    peak_tflops_of,
    seed_everything,
)

# --- counting, peaks, slopes, threads -------------------------------------------------------------

def test_attention_flops():
    assert attention_flops(1, 1, 1, 1, 1) == 4
    assert attention_flops(2, 16, 8192, 8192, 128) == 4 * 2 * 16 * 8192 * 8192 * 128
    with pytest.raises(ValueError, match=r"S must be a positive int, got 2.5"):
        attention_flops(1, 1, 1, 2.5, 1)


def test_peak_tflops_by_name():
    assert peak_tflops_of("Tesla T4") == 65.0
    assert peak_tflops_of("NVIDIA A100-SXM4-40GB") == 312.0
    assert peak_tflops_of("NVIDIA H100 80GB HBM3") == 989.0
    assert peak_tflops_of("NVIDIA H100 PCIe") == 756.0
    assert peak_tflops_of("NVIDIA H200") == 989.0
    assert peak_tflops_of("NVIDIA L4") == 121.0
    assert peak_tflops_of("NVIDIA L40S") is None  # "L4" must not match inside "L40S"
    assert peak_tflops_of("NVIDIA GeForce RTX 4090") is None
    assert peak_tflops("cpu") is None
    with pytest.raises(TypeError, match=r"gpu_name must be a str, got int"):
        peak_tflops_of(4)


def test_loglog_slope():
    sizes = [64, 128, 256, 512]
    assert abs(loglog_slope(sizes, [3 * n**2 for n in sizes]) - 2.0) < 1e-12
    assert abs(loglog_slope(sizes, [5 * n for n in sizes]) - 1.0) < 1e-12
    with pytest.raises(ValueError, match=r"must be positive"):
        loglog_slope([1, 2], [0, 1])
    with pytest.raises(ValueError, match=r"equal length >= 2"):
        loglog_slope([1, 2, 3], [1, 2])


def test_cpu_threads_sets_and_restores_the_thread_count():
    before = torch.get_num_threads()
    with cpu_threads(1) as previous:
        assert torch.get_num_threads() == 1 and previous == before
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError, match="boom"), cpu_threads(1):
        raise RuntimeError("boom")
    assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match=r"n \(CPU threads\) must be a positive int, got 0"):
        with cpu_threads(0):
            pass


# --- peak_memory on the CPU -----------------------------------------------------------------------

def test_peak_memory_counts_allocations_exactly():
    assert peak_memory(lambda: torch.ones(1000, 1000), device="cpu") == 4_000_000

    def two_alive_then_one():
        a = torch.ones(1000, 1000)  # 4 MB
        b = a * 2  # 8 MB alive
        del a
        return b + 1  # b and the result: 8 MB again, never 12
    assert 8_000_000 <= peak_memory(two_alive_then_one, device="cpu") < 8_000_100  # + the wrapped scalars
    assert peak_memory(lambda: None, device="cpu") == 0


def test_peak_memory_of_naive_attention_is_three_score_matrices():
    B, H, T, D = 1, 2, 256, 16
    q, k, v = (torch.randn(B, H, T, D) for _ in range(3))
    scores = B * H * T * T * 4
    peak = peak_memory(lambda: scaled_dot_product_attention(q, k, v)[0], device="cpu")
    assert 3 * scores <= peak < 3 * scores + 4 * B * H * T * D * 4
    with cpu_threads(1):  # the blocked CPU kernel keeps one buffer per thread: 16 threads hold more than 1 matrix
        fused = peak_memory(F.scaled_dot_product_attention, q, k, v, device="cpu")
    assert fused < scores  # the blocked CPU kernel never holds the whole (T, S) matrix


def test_peak_memory_silences_only_the_profiler(capfd):
    def talks():
        os.write(2, b"said inside\n")  # what fn itself writes must still be seen
        return torch.ones(10)
    peak_memory(talks, device="cpu")
    os.write(2, b"still here\n")
    err = capfd.readouterr().err
    assert "said inside" in err and "still here" in err
    assert "profiler" not in err  # torch's start/stop log lines


def test_peak_memory_rejects_mps():
    with pytest.raises(ValueError, match=r"peak_memory measures 'cpu' and 'cuda' devices, got 'mps'"):
        peak_memory(lambda: None, device="mps")


# --- choosing the device, seeding, timing ---------------------------------------------------------

def test_get_device_override(monkeypatch):
    monkeypatch.setenv("COURSE_DEVICE", "cpu")
    assert get_device() == torch.device("cpu")
    monkeypatch.setenv("COURSE_DEVICE", "tpu")
    with pytest.raises(ValueError, match=r"COURSE_DEVICE='tpu'"):
        get_device()
    if not torch.cuda.is_available():
        monkeypatch.setenv("COURSE_DEVICE", "cuda")
        with pytest.raises(RuntimeError, match=r"no CUDA GPU"):
            get_device()


def test_get_device_prefers_cuda_then_mps_then_cpu(monkeypatch):
    monkeypatch.delenv("COURSE_DEVICE", raising=False)
    mps = getattr(torch.backends, "mps", None)
    for cuda, has_mps, expected in [(True, True, "cuda"), (False, True, "mps"), (False, False, "cpu")]:
        monkeypatch.setattr(torch.cuda, "is_available", lambda cuda=cuda: cuda)
        if mps is not None:
            monkeypatch.setattr(mps, "is_available", lambda has_mps=has_mps: has_mps)
        elif has_mps:
            continue  # a torch without the MPS backend cannot claim it
        assert get_device() == torch.device(expected), (cuda, has_mps)


def test_seed_everything_repeats():
    def draw():
        return random.random(), np.random.rand(3).tolist(), torch.randn(4).tolist()

    seed_everything(3)
    first = draw()
    seed_everything(3)
    assert draw() == first  # Python's random, numpy and torch all repeat
    seed_everything(4)
    assert all(a != b for a, b in zip(draw(), first, strict=True))  # and each follows the seed


def test_benchmark_warms_up_then_times(monkeypatch):
    from torch.utils import benchmark as tbench

    calls, warm_calls = [], []

    class FakeTimer:  # stands in for torch's timer, to see what happened before the timing began
        def __init__(self, stmt, globals):
            self.call = globals["call"]

        def blocked_autorange(self, min_run_time):
            warm_calls.append(len(calls))
            for _ in range(5):
                self.call()
            return SimpleNamespace(median=2e-3, iqr=1e-4, times=[2e-3] * 5)

    monkeypatch.setattr(tbench, "Timer", FakeTimer)
    t = benchmark(lambda: calls.append(1), warmup=2, min_run_time=0.01, device="cpu")
    assert warm_calls == [2] and len(calls) == 2 + 5  # exactly `warmup` calls before the timer starts
    assert (t.median_s, t.iqr_s, t.runs) == (2e-3, 1e-4, 5)
    benchmark(lambda: calls.append(1), warmup=0, min_run_time=0.01, device="cpu")
    assert warm_calls == [2, 7]


def test_benchmark_counts_runs():
    calls = []
    t = benchmark(lambda: calls.append(1), warmup=2, min_run_time=0.01, device="cpu")
    assert t.runs >= 1 and t.median_s >= 0 and len(calls) >= 2 + t.runs
