"""helpers.masks, helpers.positional (core), helpers.device, helpers.plot, helpers.checks."""

import math
import random
from types import SimpleNamespace

import matplotlib
import numpy as np
import pytest
import torch

from helpers.device import benchmark, get_device, seed_everything
from helpers.masks import causal_mask, padding_mask
from helpers.positional import sinusoidal_encoding

matplotlib.use("Agg")


def test_causal_mask_values():
    m = causal_mask(4)
    assert m.dtype == torch.bool and m.shape == (4, 4)
    assert m.tolist() == [[True, False, False, False], [True, True, False, False],
                          [True, True, True, False], [True, True, True, True]]


def test_padding_mask_values():
    m = padding_mask([3, 1, 0], 4)
    assert m.shape == (3, 1, 1, 4)
    assert m[:, 0, 0].tolist() == [[True, True, True, False], [True, False, False, False],
                                   [False, False, False, False]]


def test_mask_errors_name_the_values():
    with pytest.raises(ValueError, match=r"T must be a positive int, got 0"):
        causal_mask(0)
    with pytest.raises(ValueError, match=r"every length must lie in \[0, S=4\], got \[5\] at batch positions \[1\]"):
        padding_mask([2, 5], 4)
    with pytest.raises(ValueError, match=r"lengths must be a 1-D sequence of ints"):
        padding_mask(torch.tensor([1.5]), 4)


def test_sinusoidal_encoding_formula_and_interleaving():
    pe = sinusoidal_encoding(50, 16)
    assert pe.shape == (50, 16)
    pos, i = 7, 3
    angle = pos / 10000 ** (2 * i / 16)
    assert math.isclose(pe[pos, 2 * i].item(), math.sin(angle), abs_tol=1e-6)
    assert math.isclose(pe[pos, 2 * i + 1].item(), math.cos(angle), abs_tol=1e-6)
    assert torch.equal(pe[0, 0::2], torch.zeros(8)) and torch.equal(pe[0, 1::2], torch.ones(8))


def test_sinusoidal_encoding_rotation_identity():
    """PE(pos + k) is a fixed rotation of PE(pos) in each (sin, cos) pair."""
    d, k = 16, 5
    pe = sinusoidal_encoding(60, d).double()
    freqs = 1.0 / 10000 ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    c, s = torch.cos(k * freqs), torch.sin(k * freqs)
    sin_p, cos_p = pe[:-k, 0::2], pe[:-k, 1::2]
    assert torch.allclose(pe[k:, 0::2], sin_p * c + cos_p * s, atol=1e-5)
    assert torch.allclose(pe[k:, 1::2], cos_p * c - sin_p * s, atol=1e-5)


def test_sinusoidal_odd_width_and_errors():
    assert sinusoidal_encoding(3, 5).shape == (3, 5)
    with pytest.raises(ValueError, match=r"d_model must be a positive int, got 0"):
        sinusoidal_encoding(3, 0)


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


def test_plot_heatmap_and_grid():
    from helpers.plot import attention_heatmap, heads_grid

    ax = attention_heatmap(torch.rand(3, 4), ["a", "b", "c"], list("wxyz"))
    assert ax.get_title() == "attention weights" and ax.get_xlabel() and ax.get_ylabel()
    with pytest.raises(ValueError, match=r"key_labels has 2 labels but weights have 4"):
        attention_heatmap(torch.rand(3, 4), None, ["a", "b"])
    fig = heads_grid(torch.rand(3, 4, 4))
    assert len([a for a in fig.axes if a.get_title().startswith("head")]) == 3
    for bad in (0, -2, 1.5):
        with pytest.raises(ValueError, match=rf"ncols \(panels per row\) must be a positive int, got {bad}"):
            heads_grid(torch.rand(3, 4, 4), ncols=bad)
    with pytest.raises(ValueError, match=r"weights have no heads: shape \(0, 4, 4\)"):
        heads_grid(torch.rand(0, 4, 4))
    fig = heads_grid(torch.rand(3, 4, 4), ncols=2)  # 2 + 1 panels, the fourth slot left blank
    assert [a.get_title() for a in fig.axes if a.get_title().startswith("head")] == ["head 0", "head 1", "head 2"]
    assert fig.axes[0].get_subplotspec().get_gridspec().get_geometry() == (2, 2)
    matplotlib.pyplot.close("all")


def test_import_has_no_side_effects():
    """Every module of the package, found by walking it (so a new one is covered too)."""
    import importlib.util
    import pkgutil
    import subprocess
    import sys

    import helpers

    # A module that exists to hold code for an optional package is imported only where it is installed.
    needs = {"helpers._flash_triton": "triton"}
    modules = sorted(m.name for m in pkgutil.walk_packages(helpers.__path__, "helpers.")
                     if m.name not in needs or importlib.util.find_spec(needs[m.name]) is not None)
    assert {"helpers.rnn", "helpers.transformer", "helpers.sdpa_kernels", "helpers.checks"} <= set(modules)
    code = "import torch; s = torch.random.get_rng_state(); import helpers, " + ", ".join(modules) + \
           "; assert torch.equal(s, torch.random.get_rng_state())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and done.stderr == ""
