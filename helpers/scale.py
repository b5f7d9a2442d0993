"""Attention at scale: FLOP counts, fused-kernel selection, a KV cache, sparse masks (lesson 09)."""

from __future__ import annotations

import math
import re
from contextlib import contextmanager

import numpy as np
import torch

from helpers._validate import positive_ints as _check_positive
from helpers.attention import scaled_dot_product_attention
from helpers.transformer import check_decode_args

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


# --- greedy decoding with a KV cache -----------------------------------------------------------------
#
# One decoding step must have the same shapes at every step, so that a GPU can replay it as a
# recorded CUDA graph (one launch for the step's few dozen kernels) and the host never has to
# wait for the device: the cache is preallocated at its full length, the position to write is a
# tensor on the device, and the new query attends to all max_len slots with a mask that keeps
# the slots filled so far. On the CPU the same step runs as plain Python.


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
    """Keys and values of every decoder layer, preallocated for max_len positions (lesson 09).

    Self-attention: ``k[i]``, ``v[i]`` of shape (B, H, max_len, D); ``keep`` (B, max_len) is True
    where a real (non-pad) token has been stored; ``position`` is a 0-d tensor on the device, the
    slot the next token goes to; ``length`` counts the stored positions on the host.
    Cross-attention: ``memory_k[i]``, ``memory_v[i]`` of shape (B, H, S, D), projected once from the
    encoder's memory, since the memory does not change while decoding.
    """

    def __init__(self, model, memory: torch.Tensor, max_len: int):
        B = memory.shape[0]
        self.layers = model.decoder.layers
        self.pad_id = model.config.pad_id
        H, D = self.layers[0].self_attn.n_heads, self.layers[0].self_attn.head_dim
        self.k = [memory.new_zeros(B, H, max_len, D) for _ in self.layers]  # (B, H, max_len, D) each
        self.v = [memory.new_zeros(B, H, max_len, D) for _ in self.layers]
        self.memory_k = [_split_heads(layer.cross_attn, layer.cross_attn.w_k(memory))  # (B, H, S, D)
                         for layer in self.layers]
        self.memory_v = [_split_heads(layer.cross_attn, layer.cross_attn.w_v(memory))  # (B, H, S, D)
                         for layer in self.layers]
        self.keep = torch.zeros(B, max_len, dtype=torch.bool, device=memory.device)  # (B, max_len)
        self.position = torch.zeros((), dtype=torch.long, device=memory.device)  # next slot, on the device
        self.length = 0  # positions stored so far, counted on the host (no device read needed)
        self.max_len = max_len

    def append(self, i: int, h: torch.Tensor):
        """Store the keys/values of the new position h (B, 1, C) in layer i; return all slots of that layer."""
        if self.length >= self.max_len:
            raise ValueError(f"the cache holds max_len={self.max_len} positions and is full")
        mha, slot = self.layers[i].self_attn, self.position.view(1)
        self.k[i].index_copy_(2, slot, _split_heads(mha, mha.w_k(h)))  # (B, 1, C) -> (B, H, 1, D) at the slot
        self.v[i].index_copy_(2, slot, _split_heads(mha, mha.w_v(h)))
        return self.k[i], self.v[i]  # (B, H, max_len, D) each; the mask hides the slots not filled yet


def _layer_step(layer, i: int, x, cache: KVCache, self_mask, memory_mask):
    """DecoderLayer.forward for the newest position x (B, 1, C) only; eval mode, so no dropout."""
    def self_block(h):
        k, v = cache.append(i, h)  # (B, H, max_len, D) each
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


def decode_step(model, cache: KVCache, token: torch.Tensor, memory_mask=None) -> torch.Tensor:
    """Logits (B, V) of the next token, given only the newest token (B, 1) and the cache (lesson 09).

    The token goes to slot ``cache.position``; its query attends to the slots filled so far that
    hold real tokens (``cache.keep``). ``memory_mask`` (B, 1, 1, S) says which source positions
    are real (None: all). Advances the cache by one position. Never reads a value back from the
    device, and every tensor has the same shape at every step (a CUDA graph can replay it).
    """
    decoder = model.decoder
    slot = cache.position.view(1)
    cache.keep.index_copy_(1, slot, token != cache.pad_id)  # (B, 1) into column `slot` of (B, max_len)
    self_mask = cache.keep[:, None, None, :]  # (B, 1, 1, max_len): filled slots holding real tokens
    # decoder.embed_tokens(token, offset=position), with the offset read on the device
    x = decoder.embed(token) * math.sqrt(model.config.d_model)  # (B, 1) -> (B, 1, C)
    x = x + decoder.pos.pe.index_select(0, slot).to(x.dtype)  # + PE[position] (1, C) -> (B, 1, C)
    for i, layer in enumerate(decoder.layers):
        x = _layer_step(layer, i, x, cache, self_mask, memory_mask)  # (B, 1, C)
    cache.position.add_(1)
    cache.length += 1
    return model.generator(decoder.norm(x))[:, -1]  # (B, 1, C) -> (B, V)


def _greedy_step(model, cache: KVCache, ys, token, done, memory_mask, eos_id: int):
    """The whole one-token step of greedy decoding as a function of preallocated tensors only.

    Reads the newest token from ``token`` (B, 1), writes the next one into ``token`` and into
    column ``cache.position`` of ``ys`` (B, max_len), and updates ``done`` (B,): all in place, so
    that a CUDA graph recorded from one call replays every later step.
    """
    pad_id = model.config.pad_id

    def step():
        next_id = decode_step(model, cache, token, memory_mask).argmax(dim=-1)  # (B, V) -> (B,)
        next_id = next_id.masked_fill(done, pad_id)  # finished rows get pad, as in greedy_decode
        ys.index_copy_(1, cache.position.view(1), next_id[:, None])  # position has advanced: column t + 1
        done.logical_or_(next_id == eos_id)
        token.copy_(next_id[:, None])
    return step


def _graphed(step, device, warmup: int = 2):
    """(first, then): ``first`` runs ``warmup`` steps eagerly, ``then`` replays one step as a CUDA graph.

    Eager warm-up steps on a side stream come first, as the CUDA graph documentation asks
    (libraries allocate their workspaces there, not inside the capture); they are real steps.
    Capturing only records the kernels: the recorded step runs at the first replay.
    """
    graph = torch.cuda.CUDAGraph()

    def first(n: int) -> int:
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            for _ in range(min(n, warmup)):
                step()
        torch.cuda.current_stream(device).wait_stream(stream)
        with torch.cuda.graph(graph):
            step()
        return min(n, warmup)

    return first, graph.replay


@torch.no_grad()
def greedy_decode_cached(model, src: torch.Tensor, bos_id: int, eos_id: int, max_len: int,
                         cuda_graph: bool | None = None, check_every: int = 16) -> torch.Tensor:
    """helpers.transformer.greedy_decode with a KV cache: the same ids, one new position per step (lesson 09).

    Each step runs the decoder on the newest token only; keys and values of the earlier positions
    come from the cache, and the cross-attention's keys and values of the memory are projected
    once. The arguments are checked once; the step never waits for the device; whether every row
    has finished is read every ``check_every`` steps, and the steps after that only write pads,
    which are cut off. On CUDA (``cuda_graph`` None or True) the step is recorded once as a CUDA
    graph and replayed; elsewhere the same step runs eagerly. Returns (B, L) ids laid out
    exactly as greedy_decode's.
    """
    check_decode_args(model, src, bos_id, eos_id, max_len)
    if isinstance(check_every, bool) or not isinstance(check_every, int) or check_every <= 0:
        raise ValueError(f"check_every must be a positive int, got {check_every!r}")
    device = src.device
    if cuda_graph is None:
        cuda_graph = device.type == "cuda"
    if cuda_graph and device.type != "cuda":
        raise ValueError(f"cuda_graph=True needs a CUDA device, got src on {device}")
    pad_id = model.config.pad_id
    was_training = model.training
    model.eval()
    try:
        memory, src_mask = model.encode(src)  # (B, S, C), (B, 1, 1, S)
        B = src.shape[0]
        cache = KVCache(model, memory, max_len)
        # A mask that keeps everything changes nothing but costs time at every step: drop it.
        memory_mask = None if bool(src_mask.all()) else src_mask  # (B, 1, 1, S) or None; read once
        ys = torch.full((B, max_len), pad_id, dtype=torch.long, device=device)  # (B, max_len)
        ys[:, 0] = bos_id
        token = ys[:, :1].clone()  # (B, 1): the newest token, an input buffer of the step
        done = torch.zeros(B, dtype=torch.bool, device=device)  # (B,)
        step = _greedy_step(model, cache, ys, token, done, memory_mask, eos_id)
        n_steps, ran = max_len - 1, 0
        if cuda_graph and n_steps > 2:  # two eager warm-up steps, then the graph
            first, step = _graphed(step, device, warmup=2)
            ran = first(n_steps)
        while ran < n_steps:
            step()
            ran += 1
            if ran % check_every == 0 and bool(done.all()):  # the only read from the device in the loop
                break
        # greedy_decode stops after the step at which the last row finished: cut there
        body = ys[:, 1:ran + 1]  # (B, ran)
        finished = (body == eos_id).any(dim=1)  # (B,)
        first_eos = (body == eos_id).int().argmax(dim=1)  # (B,): column of the first eos (0 if none)
        L = 1 + int(torch.where(finished, first_eos + 1, torch.full_like(first_eos, ran)).max())
        return ys[:, :L]
    finally:
        model.train(was_training)
