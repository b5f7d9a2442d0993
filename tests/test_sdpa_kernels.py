"""helpers.sdpa_kernels (lesson 09): choosing PyTorch's attention kernel, and naming the one it picks."""

import sys

import pytest
import torch
import torch.nn.functional as F

from helpers.attention import scaled_dot_product_attention
from helpers.sdpa_kernels import auto_sdpa_backend, sdpa_backend


def test_sdpa_backends_on_cpu():
    q, k, v = (torch.randn(1, 2, 16, 8, generator=torch.Generator().manual_seed(i)) for i in range(3))
    ours, _ = scaled_dot_product_attention(q, k, v)
    for name in ("math", "flash"):
        with sdpa_backend(name):
            assert torch.allclose(F.scaled_dot_product_attention(q, k, v), ours, atol=1e-5)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError), sdpa_backend("efficient"):  # a CUDA kernel: no silent fallback
            F.scaled_dot_product_attention(q, k, v)
    with pytest.raises(ValueError, match=r"backend must be one of .* got 'fast'"):
        with sdpa_backend("fast"):
            pass


def test_auto_sdpa_backend_names_the_kernel_torch_picks(monkeypatch):
    q, k, v = (torch.randn(1, 2, 16, 8, generator=torch.Generator().manual_seed(i)) for i in range(3))
    assert auto_sdpa_backend(q, k, v) == "flash"  # on the CPU torch picks its blocked flash kernel ...
    with sdpa_backend("math"):
        assert auto_sdpa_backend(q, k, v) == "math"  # ... unless only the plain formula is allowed
    if torch.cuda.is_available():
        qc, kc, vc = (t.to("cuda", torch.float16) for t in (q, k, v))
        assert auto_sdpa_backend(qc, kc, vc) in ("flash", "efficient", "cudnn")  # a fused kernel on a GPU
        with sdpa_backend("math"):
            assert auto_sdpa_backend(qc, kc, vc) == "math"

    def gone(*args):
        raise RuntimeError("a private function that changed")

    monkeypatch.setattr(torch, "_fused_sdp_choice", gone)
    assert auto_sdpa_backend(q, k, v) == "unknown"
    monkeypatch.delattr(torch, "_fused_sdp_choice")
    assert auto_sdpa_backend(q, k, v) == "unknown"


def test_importing_sdpa_kernels_has_no_side_effects():
    import subprocess

    code = ("import torch; s = torch.random.get_rng_state(); import helpers.sdpa_kernels, helpers.checks.lesson09; "
            "assert torch.equal(s, torch.random.get_rng_state())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and done.stderr == ""
