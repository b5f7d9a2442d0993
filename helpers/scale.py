"""Attention at scale: FLOP counts, peak throughput, cost slopes, fused-kernel selection (lesson 09).

The KV cache lives in the model (helpers.attention.KVCache, helpers.transformer.greedy_decode_cached);
the sparse masks in helpers.masks.
"""

from __future__ import annotations

import re
from contextlib import contextmanager

import numpy as np
import torch

# The sparse masks live in helpers.masks; helpers.checks.lesson09 still imports them from here.
from helpers.masks import dilated_mask, sliding_window_mask  # noqa: F401

# --- counting and measuring ----------------------------------------------------------------------


def attention_flops(B: int, H: int, T: int, S: int, D: int) -> int:
    """FLOPs of one attention forward: q k^T and weights @ v, 2*T*S*D each, per head (lesson 09)."""
    for name, n in (("B", B), ("H", H), ("T", T), ("S", S), ("D", D)):
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            raise ValueError(f"{name} must be a positive int, got {n!r}")
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
    if not isinstance(gpu_name, str):
        raise TypeError(f"gpu_name must be a str, got {type(gpu_name).__name__}")
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
    return float(np.polyfit(np.log(x), np.log(y), 1)[0])


# --- choosing a kernel of F.scaled_dot_product_attention -------------------------------------------

SDPA_BACKENDS = ("flash", "efficient", "cudnn", "math")


@contextmanager
def sdpa_backend(name: str):
    """Let F.scaled_dot_product_attention use only the named kernel inside the block (lesson 09).

    ``flash`` (FlashAttention-2 on CUDA, half precision only; a blocked kernel on CPU), ``efficient``
    (memory-efficient attention, CUDA), ``cudnn`` (CUDA, torch >= 2.5), ``math`` (the plain
    formula, which materialises the (T, S) scores). A kernel that cannot run the given inputs
    makes the call raise RuntimeError instead of silently falling back.
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel  # added in torch 2.3; the course needs 2.5

    names = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION",
             "math": "MATH"}
    if name not in names:
        raise ValueError(f"backend must be one of {SDPA_BACKENDS}, got {name!r}")
    backend = getattr(SDPBackend, names[name], None)
    if backend is None:
        raise ValueError(f"backend {name!r} needs a newer torch than {torch.__version__}")
    with sdpa_kernel(backend):
        yield


def auto_sdpa_backend(q, k, v, mask=None) -> str:
    """Name of the kernel F.scaled_dot_product_attention would pick for these inputs, or 'unknown' (lesson 09).

    Asks torch's own dispatcher (``torch._fused_sdp_choice``, a private function, hence the fallback).
    """
    from torch.nn.attention import SDPBackend

    try:
        choice = SDPBackend(torch._fused_sdp_choice(q, k, v, mask))
    except (AttributeError, RuntimeError, TypeError, ValueError):
        return "unknown"
    names = {"FLASH_ATTENTION": "flash", "EFFICIENT_ATTENTION": "efficient", "CUDNN_ATTENTION": "cudnn",
             "MATH": "math"}
    return names.get(choice.name, choice.name.lower())
