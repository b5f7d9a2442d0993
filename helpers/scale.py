"""Attention at scale: FLOP counts, fused-kernel selection, a KV cache, sparse masks (lesson 09)."""

from __future__ import annotations

import re
from contextlib import contextmanager

import numpy as np
import torch

from helpers._validate import positive_ints as _check_positive
from helpers.attention import scaled_dot_product_attention
from helpers.transformer import TransformerConfig, _check_decode_args

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
    from torch.nn.attention import SDPBackend, sdpa_kernel  # torch >= 2.3, as the course requires

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


# --- sparse attention patterns ----------------------------------------------------------------------


def sliding_window_mask(T: int, window: int, device=None) -> torch.Tensor:
    """(T, T) causal local mask: query t may attend to keys t-window+1 .. t, True = may attend (lesson 09)."""
    _check_positive(T=T, window=window)
    t = torch.arange(T, device=device)
    distance = t[:, None] - t[None, :]  # (T, 1) - (1, T) -> (T, T): how far back key s lies
    return (distance >= 0) & (distance < window)  # (T, T)


def dilated_mask(T: int, window: int, dilation: int, device=None) -> torch.Tensor:
    """(T, T) causal mask keeping keys t, t-d, ..., t-(window-1)d for query t, d = dilation (lesson 09)."""
    _check_positive(T=T, window=window, dilation=dilation)
    t = torch.arange(T, device=device)
    distance = t[:, None] - t[None, :]  # (T, T)
    return (distance >= 0) & (distance % dilation == 0) & (distance < window * dilation)  # (T, T)


# The sizes lesson 08 trains its date translator with (its section 5). Lesson 09 and benchmarks/
# time decoding at these sizes with random weights: the speed of a forward pass does not depend on
# the weights. Keep the two in step when lesson 08 changes.
LESSON08_SIZES = dict(d_model=64, n_heads=4, d_ff=128, n_encoder_layers=2, n_decoder_layers=2, dropout=0.0,
                      norm_first=True)


def lesson08_config(src_vocab_size: int, tgt_vocab_size: int, max_len: int = 512) -> TransformerConfig:
    """TransformerConfig with lesson 08's sizes and a longer max_len, for long generations (lesson 09)."""
    return TransformerConfig(src_vocab_size, tgt_vocab_size, max_len=max_len, **LESSON08_SIZES)


# --- greedy decoding with a KV cache -----------------------------------------------------------------


def _split_heads(mha, x: torch.Tensor) -> torch.Tensor:
    B, L, _ = x.shape
    return x.view(B, L, mha.n_heads, mha.head_dim).transpose(1, 2)  # (B, L, C) -> (B, H, L, D)


def _attend(mha, x, k, v, mask):
    """Queries from x (B, T, C) against ready-made keys/values (B, H, L, D) of one MultiHeadAttention."""
    B, T, C = x.shape
    q = _split_heads(mha, mha.w_q(x))  # (B, H, T, D)
    out, _ = scaled_dot_product_attention(q, k, v, mask=mask)  # (B, H, T, D)
    return mha.w_o(out.transpose(1, 2).reshape(B, T, C))  # (B, H, T, D) -> (B, T, C)


class KVCache:
    """Keys and values of every decoder layer, grown by one position per decoding step (lesson 09).

    Self-attention: ``k[i]``, ``v[i]`` of shape (B, H, max_len, D), filled up to ``length``.
    Cross-attention: ``memory_k[i]``, ``memory_v[i]`` of shape (B, H, S, D), projected once from the
    encoder's memory, since the memory does not change while decoding.
    """

    def __init__(self, model, memory: torch.Tensor, max_len: int):
        B = memory.shape[0]
        self.layers = model.decoder.layers
        H, D = self.layers[0].self_attn.n_heads, self.layers[0].self_attn.head_dim
        self.k = [memory.new_zeros(B, H, max_len, D) for _ in self.layers]  # (B, H, max_len, D) each
        self.v = [memory.new_zeros(B, H, max_len, D) for _ in self.layers]
        self.memory_k = [_split_heads(layer.cross_attn, layer.cross_attn.w_k(memory))  # (B, H, S, D)
                         for layer in self.layers]
        self.memory_v = [_split_heads(layer.cross_attn, layer.cross_attn.w_v(memory))  # (B, H, S, D)
                         for layer in self.layers]
        self.length = 0  # positions stored so far
        self.max_len = max_len

    def append(self, i: int, h: torch.Tensor):
        """Store the keys/values of the new position h (B, 1, C) in layer i; return those of every position."""
        if self.length >= self.max_len:
            raise ValueError(f"the cache holds max_len={self.max_len} positions and is full")
        mha, t = self.layers[i].self_attn, self.length
        self.k[i][:, :, t:t + 1] = _split_heads(mha, mha.w_k(h))  # (B, 1, C) -> (B, H, 1, D)
        self.v[i][:, :, t:t + 1] = _split_heads(mha, mha.w_v(h))  # (B, H, 1, D)
        return self.k[i][:, :, :t + 1], self.v[i][:, :, :t + 1]  # (B, H, t + 1, D) each


def _layer_step(layer, i: int, x, cache: KVCache, self_mask, memory_mask):
    """DecoderLayer.forward for the newest position x (B, 1, C) only; eval mode, so no dropout."""
    def self_block(h):
        k, v = cache.append(i, h)  # (B, H, t + 1, D) each
        return _attend(layer.self_attn, h, k, v, self_mask)  # (B, 1, C)

    def cross_block(h):
        return _attend(layer.cross_attn, h, cache.memory_k[i], cache.memory_v[i], memory_mask)  # (B, 1, C)

    if layer.norm_first:  # Pre-LN
        x = x + self_block(layer.norm1(x))  # (B, 1, C)
        x = x + cross_block(layer.norm2(x))  # (B, 1, C)
        return x + layer.ff(layer.norm3(x))  # (B, 1, C)
    x = layer.norm1(x + self_block(x))  # Post-LN: (B, 1, C)
    x = layer.norm2(x + cross_block(x))  # (B, 1, C)
    return layer.norm3(x + layer.ff(x))  # (B, 1, C)


def decode_step(model, cache: KVCache, token: torch.Tensor, self_mask, memory_mask) -> torch.Tensor:
    """Logits (B, V) of the next token, given only the newest token (B, 1) and the cache (lesson 09).

    ``self_mask`` (B, 1, 1, t + 1) says which of the t + 1 positions so far are real tokens and
    ``memory_mask`` (B, 1, 1, S) which source positions are (None: all). Advances ``cache.length``.
    """
    decoder = model.decoder
    x = decoder.embed_tokens(token, offset=cache.length)  # (B, 1) -> (B, 1, C)
    for i, layer in enumerate(decoder.layers):
        x = _layer_step(layer, i, x, cache, self_mask, memory_mask)  # (B, 1, C)
    cache.length += 1
    return model.generator(decoder.norm(x))[:, -1]  # (B, 1, C) -> (B, V)


@torch.no_grad()
def greedy_decode_cached(model, src: torch.Tensor, bos_id: int, eos_id: int, max_len: int) -> torch.Tensor:
    """helpers.transformer.greedy_decode with a KV cache: the same ids, one new position per step (lesson 09).

    Each step runs the decoder on the newest token only; keys and values of the earlier positions
    come from the cache and the cross-attention's keys and values of the memory are projected
    once. Returns (B, L) ids laid out exactly as greedy_decode's.
    """
    _check_decode_args(model, src, bos_id, eos_id, max_len)
    pad_id = model.config.pad_id
    was_training = model.training
    model.eval()
    try:
        memory, src_mask = model.encode(src)  # (B, S, C), (B, 1, 1, S)
        B = src.shape[0]
        cache = KVCache(model, memory, max_len)
        # A mask that keeps everything changes nothing but costs time at every step: drop it.
        memory_mask = None if bool(src_mask.all()) else src_mask  # (B, 1, 1, S) or None
        ys = torch.full((B, 1), bos_id, dtype=torch.long, device=src.device)  # (B, 1)
        done = torch.zeros(B, dtype=torch.bool, device=src.device)  # (B,)
        has_pad = False  # greedy_decode hides target pads from self-attention, so must we
        for _ in range(max_len - 1):
            self_mask = (ys != pad_id)[:, None, None, :] if has_pad else None  # (B, t) -> (B, 1, 1, t)
            logits = decode_step(model, cache, ys[:, -1:], self_mask, memory_mask)  # (B, V)
            next_id = logits.argmax(dim=-1)  # (B,)
            next_id = torch.where(done, torch.full_like(next_id, pad_id), next_id)  # (B,)
            ys = torch.cat([ys, next_id[:, None]], dim=1)  # (B, t) -> (B, t + 1)
            has_pad = has_pad or bool((next_id == pad_id).any())
            done |= next_id == eos_id
            if done.all():
                break
        return ys
    finally:
        model.train(was_training)
