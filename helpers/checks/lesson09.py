"""Exercise checks of lesson 09 (each one prints a single line and returns True or False)."""

from __future__ import annotations

import torch

from helpers.attention import scaled_dot_product_attention
from helpers.checks._core import Bug, Case, CheckResult, check, check_prediction, first_output
from helpers.device import peak_memory
from helpers.masks import causal_mask, dilated_mask, sliding_window_mask

__all__ = ["check_kv_cache_bytes", "check_kept_pairs", "check_global_window_mask", "check_local_attention",
           "check_predict_memory_ratio"]


def _kv_cache_bytes(n_layers, B, H, L, D, bytes_per_element):
    return 2 * n_layers * B * H * L * D * bytes_per_element  # keys and values, every layer


def check_kv_cache_bytes(fn) -> CheckResult:
    """Check ``kv_cache_bytes(n_layers, B, H, L, D, bytes_per_element)`` (lesson 09)."""
    cases = [Case("2 layers, B=1, H=4, L=10, D=8, fp32", (2, 1, 4, 10, 8, 4)),
             Case("6 layers, B=8, H=8, L=512, D=64, bf16", (6, 8, 8, 512, 64, 2)),
             Case("32 layers, B=1, H=32, L=4096, D=128, fp16", (32, 1, 32, 4096, 128, 2))]
    bugs = [Bug("half the reference: a cache stores both the keys and the values",
             lambda n, B, H, L, D, b: n * B * H * L * D * b),
            Bug("the reference times n_layers: every layer caches its own keys and values",
             lambda n, B, H, L, D, b: 2 * B * H * L * D * b),
            Bug("that counts elements, not bytes: multiply by bytes_per_element",
             lambda n, B, H, L, D, b: 2 * n * B * H * L * D),
            Bug("the heads are missing: each of the H heads caches its own key and value vectors of D numbers",
                lambda n, B, H, L, D, b: 2 * n * B * L * D * b),
            Bug("that grows with L * L: the cache holds one key and one value per position, so it grows like L",
                lambda n, B, H, L, D, b: 2 * n * B * H * L * L * b)]
    return check("kv_cache_bytes", fn, _kv_cache_bytes, cases, bugs=bugs)


def _kept_pairs(T, window, dilation):
    return int(dilated_mask(T, window, dilation).sum())


def check_kept_pairs(fn) -> CheckResult:
    """Check ``kept_pairs(T, window, dilation)``: how many (query, key) pairs a dilated mask keeps (lesson 09)."""
    cases = [Case("T=16, window=4, dilation=1 (sliding window)", (16, 4, 1)),
             Case("T=16, window=4, dilation=2", (16, 4, 2)),
             Case("T=100, window=8, dilation=3", (100, 8, 3)),
             Case("T=5, window=4, dilation=2 (shorter than the window's span)", (5, 4, 2)),
             Case("T=1, window=3, dilation=5", (1, 3, 5))]
    bugs = [Bug("that is window * T: the first queries have fewer than `window` earlier keys",
             lambda T, w, d: w * T),
            Bug("that is window * T - window * (window - 1) / 2, the sliding-window count: "
             "with dilation the first queries miss more keys", lambda T, w, d: w * T - w * (w - 1) // 2),
            Bug("the closed form w*T - d*w*(w-1)/2 assumes T >= (window-1)*dilation; for shorter T "
                "count each query's keys, min(window, t // dilation + 1)",
                lambda T, w, d: w * T - d * w * (w - 1) // 2),
            Bug("that is the sliding window's count: with dilation d, query t keeps min(window, t // d + 1) keys",
                lambda T, w, d: int(sliding_window_mask(T, w).sum())),
            Bug("off by one: query t keeps min(window, t // dilation + 1) keys, itself included",
                lambda T, w, d: sum(min(w, t // d) for t in range(T))),
            Bug("that is T * T, every pair: count only the pairs the dilated window keeps", lambda T, w, d: T * T)]

    def no_mask(fn, T=2048):  # "without building the mask": far less memory than one (T, T) bool mask
        used = peak_memory(fn, T, 8, 3, device="cpu")
        if used >= T * T // 8:
            return False, (f"the count is right, but at T={T} your function allocated {used:,} bytes, as much as "
                           "a (T, T) mask: count each query's keys, min(window, t // dilation + 1), without it")
        return True, ""

    return check("kept_pairs", fn, _kept_pairs, cases, bugs=bugs, then=no_mask)


def _global_window(T, window, n_global):
    s = torch.arange(T)
    return sliding_window_mask(T, window) | ((s[None, :] < n_global) & (s[None, :] <= s[:, None]))  # (T, T)


def check_global_window_mask(fn) -> CheckResult:
    """Check ``global_window_mask(T, window, n_global)``: sliding window plus global first tokens (lesson 09)."""
    cases = [Case("T=8, window=2, n_global=1", (8, 2, 1)),
             Case("T=12, window=3, n_global=2", (12, 3, 2)),
             Case("T=6, window=1, n_global=0 (only the diagonal)", (6, 1, 0)),
             Case("T=5, window=2, n_global=5 (everything causal)", (5, 2, 5))]
    bugs = [Bug("True and False are swapped: in the course True = may attend",
                lambda T, w, g: ~_global_window(T, w, g)),
            Bug("a query sees a later global token: keep the mask causal (key position <= query position)",
             lambda T, w, g: sliding_window_mask(T, w) | (torch.arange(T)[None, :] < g).expand(T, T)),
            Bug("the window is one too wide: each query sees itself and the window - 1 keys before it",
             lambda T, w, g: _global_window(T, w + 1, g)),
            Bug("the global tokens are rows (queries that see everything earlier); they must be columns: keys "
                "that every later query may see", lambda T, w, g: sliding_window_mask(T, w) | (
                 (torch.arange(T)[:, None] < g) & causal_mask(T))),
            Bug("the global tokens are missing: every query also sees the first n_global positions (none of them "
                "after itself)", lambda T, w, g: sliding_window_mask(T, w)),
            Bug("one global token too many: the global tokens are positions 0 .. n_global - 1",
                lambda T, w, g: _global_window(T, w, g + 1)),
            Bug("the sliding window is missing: besides the global tokens, each query sees its window",
             lambda T, w, g: (torch.arange(T)[None, :] < g) & causal_mask(T) | torch.eye(T, dtype=torch.bool))]
    return check("global_window_mask", fn, _global_window, cases, bugs=bugs)


def _local_reference(q, k, v, window):
    return scaled_dot_product_attention(q, k, v, mask=sliding_window_mask(q.shape[-2], window))[0]


def _blocks_without_mask(q, k, v, window):
    """The likely slip: blocks of `window` queries against the keys from window - 1 before the block, unmasked."""
    T, out = q.shape[2], torch.empty_like(q)
    for start in range(0, T, window):
        end, lo = min(start + window, T), max(0, start - window + 1)
        out[:, :, start:end] = scaled_dot_product_attention(q[:, :, start:end], k[:, :, lo:end], v[:, :, lo:end])[0]
    return out


def check_local_attention(fn) -> CheckResult:
    """Check ``local_attention(q, k, v, window)`` equals masked attention and never builds (T, T) scores (lesson 09)."""
    g = torch.Generator().manual_seed(9)

    def r(*shape):
        return torch.randn(*shape, generator=g)

    cases = [Case("B=1, H=2, T=18, D=8, window=4 (T not a multiple of the window)",
                  (r(1, 2, 18, 8), r(1, 2, 18, 8), r(1, 2, 18, 8), 4)),
             Case("B=2, H=1, T=32, D=4, window=8", (r(2, 1, 32, 4), r(2, 1, 32, 4), r(2, 1, 32, 4), 8)),
             Case("window=1: each query sees only itself", (r(1, 1, 6, 4), r(1, 1, 6, 4), r(1, 1, 6, 4), 1)),
             Case("window=T: plain causal attention", (r(1, 2, 8, 4), r(1, 2, 8, 4), r(1, 2, 8, 4), 8))]

    def small_memory(fn):
        T, window = 512, 16
        q, k, v = r(1, 1, T, 8), r(1, 1, T, 8), r(1, 1, T, 8)
        used = peak_memory(fn, q, k, v, window, device="cpu")
        full = T * T * q.element_size()  # one (T, T) score matrix
        if used >= full:
            return False, (f"the values are right, but at T={T}, window={window} it allocated {used:,} bytes, "
                           f"at least one full (T, T) score matrix ({full:,} bytes): compute each block of "
                           "queries against its nearby keys only")
        return True, (f", and at T={T}, window={window} it needed {used / full:.0%} of the memory of one "
                      "(T, T) score matrix")

    bugs = [Bug("each query must see itself and the window - 1 keys before it (window keys in all), "
                "not window keys before it plus itself",
                lambda q, k, v, w: _local_reference(q, k, v, w + 1)),
            Bug("the window is one too narrow: each query sees itself and the window - 1 keys before it",
                lambda q, k, v, w: _local_reference(q, k, v, max(w - 1, 1))),
            Bug("the mask is missing: this is full attention, where queries see the future",
                lambda q, k, v, w: scaled_dot_product_attention(q, k, v)[0]),
            Bug("inside a block of keys, each query must still be masked: it may see key s only if s <= t and "
                "t - s < window; here queries see later keys of their own block", _blocks_without_mask)]
    return check("local_attention", fn, _local_reference, cases, bugs=bugs, adapt=first_output,
                 then=small_memory)


def _memory_ratio() -> float:
    g = torch.Generator().manual_seed(0)

    def peak(T):
        q, k, v = (torch.randn(1, 1, T, 8, generator=g) for _ in range(3))
        return peak_memory(scaled_dot_product_attention, q, k, v, device="cpu")

    return peak(2048) / peak(512)


def check_predict_memory_ratio(predicted) -> CheckResult:
    """Predict then measure: peak memory of attention at T=2048 divided by that at T=512 (lesson 09)."""
    return check_prediction("predict_memory_ratio", predicted, _memory_ratio,
                            "peak-memory ratio", rel_tol=0.25)
