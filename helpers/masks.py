"""Boolean attention masks (lesson 05). Polarity everywhere in the course: True = may attend."""

from __future__ import annotations

import torch


def causal_mask(T: int, device=None) -> torch.Tensor:
    """(T, T) boolean mask, True on and below the diagonal: position t sees positions <= t (lesson 05)."""
    if isinstance(T, bool) or not isinstance(T, int) or T <= 0:
        raise ValueError(f"T must be a positive int, got {T!r}")
    return torch.ones(T, T, dtype=torch.bool, device=device).tril()  # (T, T)


def padding_mask(lengths, S: int) -> torch.Tensor:
    """(B, 1, 1, S) boolean mask, True for the first lengths[b] key positions of item b (lesson 05)."""
    lengths = torch.as_tensor(lengths)
    if lengths.dim() != 1 or lengths.is_floating_point() or lengths.dtype == torch.bool:
        raise ValueError(
            f"lengths must be a 1-D sequence of ints (one per batch item), got "
            f"shape {tuple(lengths.shape)} dtype {lengths.dtype}"
        )
    if isinstance(S, bool) or not isinstance(S, int) or S <= 0:
        raise ValueError(f"S must be a positive int, got {S!r}")
    bad = (lengths < 0) | (lengths > S)
    if bad.any():
        raise ValueError(
            f"every length must lie in [0, S={S}], got {lengths[bad].tolist()} "
            f"at batch positions {bad.nonzero().flatten().tolist()}"
        )
    keep = torch.arange(S, device=lengths.device) < lengths[:, None]  # (B, S)
    return keep[:, None, None, :]  # (B, 1, 1, S)
