"""Every boolean attention mask of the course (lessons 05 and 09). Polarity everywhere: True = may attend.

Shapes follow PyTorch's rule: a 2-D mask is (T, S), shared by every batch item and head; padding
comes as (B, 1, 1, S), with all four axes of the (B, H, T, S) scores.
"""

from __future__ import annotations

import torch

from helpers._validate import as_int, positive_int, positive_ints, require_tensor


def causal_mask(T: int, device=None) -> torch.Tensor:
    """(T, T) boolean mask, True on and below the diagonal: position t sees positions <= t (lesson 05)."""
    T = positive_int(T, "T")
    return torch.ones(T, T, dtype=torch.bool, device=device).tril()  # (T, T)


def cached_causal_mask(start, T_new: int, S: int, device=None) -> torch.Tensor:
    """(T_new, S) causal mask for T_new new queries after ``start`` cached positions (lesson 09).

    Query j sits at slot start + j and sees slots 0 .. start + j. ``start`` is an int or a 0-d
    integer tensor on ``device`` (read there: a fixed-shape decoding step never asks the host).
    With start = 0 and S = T_new it is ``causal_mask(T_new)``.
    """
    T_new, S = positive_ints(T_new=T_new, S=S)
    rows = start + torch.arange(T_new, device=device)  # (T_new,): the slots of the new queries
    return torch.arange(S, device=device)[None, :] <= rows[:, None]  # (1, S) vs (T_new, 1) -> (T_new, S)


def padding_mask(lengths, S: int) -> torch.Tensor:
    """(B, 1, 1, S) boolean mask, True for the first lengths[b] key positions of item b (lesson 05)."""
    S = positive_int(S, "S")
    given = lengths
    try:
        lengths = torch.as_tensor(lengths)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"lengths must be a list or 1-D tensor of ints (one per batch item), got "
                        f"{type(given).__name__} {given!r}") from None
    if lengths.numel() == 0:
        raise ValueError(f"lengths must hold one length per batch item, got an empty {type(given).__name__}")
    if lengths.dim() != 1 or lengths.is_floating_point() or lengths.is_complex() or lengths.dtype == torch.bool:
        raise ValueError(f"lengths must be a 1-D sequence of ints (one per batch item), got {given!r} "
                         f"(shape {tuple(lengths.shape)}, dtype {lengths.dtype})")
    bad = (lengths < 0) | (lengths > S)
    if bad.any():
        raise ValueError(
            f"every length must lie in [0, S={S}], got {lengths[bad].tolist()} "
            f"at batch positions {bad.nonzero().flatten().tolist()}"
        )
    keep = torch.arange(S, device=lengths.device) < lengths[:, None]  # (B, S)
    return keep[:, None, None, :]  # (B, 1, 1, S)


def padding_mask_from_ids(ids: torch.Tensor, pad_id: int) -> torch.Tensor:
    """(B, S) token ids -> (B, 1, 1, S) boolean mask, True where the key is a real token, not pad_id (lesson 05)."""
    require_tensor(ids, "ids", dim=2, what="(B, S)")
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise TypeError(f"ids must hold integer token ids, got dtype {ids.dtype}")
    pad_id = as_int(pad_id, "pad_id", minimum=0)
    return (ids != pad_id)[:, None, None, :]  # (B, S) -> (B, 1, 1, S)


def sliding_window_mask(T: int, window: int, device=None) -> torch.Tensor:
    """(T, T) causal local mask: query t may attend to keys t-window+1 .. t, True = may attend (lesson 09)."""
    T, window = positive_ints(T=T, window=window)
    t = torch.arange(T, device=device)
    distance = t[:, None] - t[None, :]  # (T, 1) - (1, T) -> (T, T): how far back key s lies
    return (distance >= 0) & (distance < window)  # (T, T)


def dilated_mask(T: int, window: int, dilation: int, device=None) -> torch.Tensor:
    """(T, T) causal mask keeping keys t, t-d, ..., t-(window-1)d for query t, d = dilation (lesson 09)."""
    T, window, dilation = positive_ints(T=T, window=window, dilation=dilation)
    t = torch.arange(T, device=device)
    distance = t[:, None] - t[None, :]  # (T, T)
    return (distance >= 0) & (distance % dilation == 0) & (distance < window * dilation)  # (T, T)
