"""Choosing the kernel of F.scaled_dot_product_attention (lesson 09).

Lesson 09's other pieces have their homes elsewhere: measuring (time, peak memory, FLOPs, peak
throughput, cost slopes, CPU threads) in helpers.device, the KV cache in the model
(helpers.attention.KVCache, helpers.decoding.greedy_decode_cached), sparse masks in helpers.masks.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from helpers._validate import require_choice

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
    require_choice(name, "backend", SDPA_BACKENDS)
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
