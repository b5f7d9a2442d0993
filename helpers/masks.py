"""Boolean attention masks (lesson 05). Polarity everywhere in the course: True = may attend."""

from __future__ import annotations

import torch

from helpers._validate import positive_int


def causal_mask(T: int, device=None) -> torch.Tensor:
    """(T, T) boolean mask, True on and below the diagonal: position t sees positions <= t (lesson 05)."""
    T = positive_int(T, "T")
    return torch.ones(T, T, dtype=torch.bool, device=device).tril()  # (T, T)


def padding_mask(lengths, S: int) -> torch.Tensor:
    """(B, 1, 1, S) boolean mask, True for the first lengths[b] key positions of item b (lesson 05)."""
    S = positive_int(S, "S")
    given = lengths
    lengths = torch.as_tensor(lengths)
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
