"""Positional information for attention, which on its own ignores order (lesson 06)."""

from __future__ import annotations

import math
import numbers

import torch
from torch import nn

from helpers._validate import (
    as_int,
    positive_int,
    positive_ints,
    probability,
    require_real,
    require_tensor,
    shape_str,
)


def sinusoidal_encoding(length: int, d_model: int) -> torch.Tensor:
    """(length, d_model) sinusoidal encoding, Vaswani et al. 2017 section 3.5 (lesson 06).

    PE[pos, 2i] = sin(pos / 10000^(2i/d_model)) and PE[pos, 2i+1] = cos(pos / 10000^(2i/d_model)).
    """
    length, d_model = positive_int(length, "length"), positive_int(d_model, "d_model")
    pos = torch.arange(length, dtype=torch.float64)[:, None]  # (length, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (ceil(d_model / 2),)
    angle = pos / 10000.0 ** (two_i / d_model)  # (length, ceil(d_model / 2))
    pe = torch.zeros(length, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return pe.to(torch.get_default_dtype())


def wavelengths(d_model: int) -> torch.Tensor:
    """Wavelength 2*pi*10000^(2i/d_model) of each sin/cos pair of the encoding (lesson 06)."""
    d_model = positive_int(d_model, "d_model")
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)
    return 2 * math.pi * 10000.0 ** (two_i / d_model)


def _check_offset(offset, T: int, max_len: int, table: str) -> int:
    """``offset`` as an int >= 0 such that positions offset .. offset + T - 1 have rows in a max_len-row ``table``."""
    offset = as_int(offset, "offset", minimum=0)
    if offset + T > max_len:
        raise ValueError(f"positions {offset}..{offset + T - 1} exceed max_len={max_len}: {table} has no row "
                         f"for a position >= {max_len}; build it with a larger max_len")
    return offset


class PositionalEncoding(nn.Module):
    """Adds the sinusoidal encoding to token embeddings (B, T, C), then dropout (lesson 06)."""

    def __init__(self, d_model: int, max_len: int = 512, dropout: float = 0.0):
        super().__init__()
        d_model, max_len = positive_ints(d_model=d_model, max_len=max_len)
        self.max_len = max_len
        self.dropout = nn.Dropout(probability(dropout, "dropout"))
        # a buffer, not a parameter: it moves with .to(device) but is never trained
        self.register_buffer("pe", sinusoidal_encoding(max_len, d_model), persistent=False)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """x (B, T, C) -> x + PE[offset : offset + T]; ``offset`` serves step-by-step decoding.

        ``offset`` is an int, or an integer tensor of one element on x's device, read there (no
        value comes back to the host, so no range check: lesson 09's fixed-shape decoding step).
        """
        require_tensor(x, "x", floating=True, dim=3, last=self.pe.shape[1], what=f"(B, T, d_model={self.pe.shape[1]})")
        T = x.shape[1]
        if isinstance(offset, torch.Tensor) and offset.numel() == 1 and offset.device == x.device \
                and offset.dtype in (torch.int64, torch.int32):
            rows = self.pe.index_select(0, offset.reshape(()) + torch.arange(T, device=x.device))  # (T, C)
            return self.dropout(x + rows.to(x.dtype))  # (B, T, C)
        offset = _check_offset(offset, T, self.max_len, "the sinusoidal table")
        return self.dropout(x + self.pe[offset:offset + T].to(x.dtype))  # (B, T, C)


class LearnedPositionalEmbedding(nn.Module):
    """Adds a trained (max_len, d_model) table of position vectors to embeddings (B, T, C) (lesson 06).

    Row ``p`` of ``self.table`` (an ``nn.Embedding``, initialised N(0, 1)) is the vector of
    position ``p``; there is no row for a position >= max_len.
    """

    def __init__(self, max_len: int, d_model: int):
        super().__init__()
        max_len, d_model = positive_int(max_len, "max_len"), positive_int(d_model, "d_model")
        self.max_len, self.d_model = max_len, d_model
        self.table = nn.Embedding(max_len, d_model)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """x (B, T, C) -> x + table[offset : offset + T]; ``offset`` serves step-by-step decoding."""
        require_tensor(x, "x", floating=True, dim=3, last=self.d_model, what=f"(B, T, d_model={self.d_model})")
        T = x.shape[1]
        offset = _check_offset(offset, T, self.max_len, "a learned table")
        positions = torch.arange(offset, offset + T, device=x.device)  # (T,)
        return x + self.table(positions).to(x.dtype)  # (B, T, C) + (T, C) -> (B, T, C)


def rotary_angles(positions, dim: int, base: float = 10000.0) -> torch.Tensor:
    """Rotation angles positions * base^(-2i/dim), float64 of shape (*positions.shape, dim/2) (lesson 06).

    ``positions`` is an int (meaning 0..positions-1) or a tensor/sequence of positions.
    """
    if positive_int(dim, "dim") % 2:
        raise ValueError(f"dim must be a positive even int (features rotate in pairs), got {dim!r}")
    require_real(base, "base", 0, math.inf, "(]", "a positive number")
    if isinstance(positions, numbers.Integral) and not isinstance(positions, bool):
        positions = torch.arange(positive_int(positions, "positions (a count)"))
    pos = torch.as_tensor(positions)
    if pos.is_complex() or pos.dtype == torch.bool:
        raise TypeError(f"positions must be integer or real, got dtype {pos.dtype}")
    pos = pos.to(torch.float64)
    two_i = torch.arange(0, dim, 2, dtype=torch.float64, device=pos.device)  # (dim/2,)
    theta = float(base) ** (-two_i / dim)  # (dim/2,) one frequency per pair, as in the sinusoidal encoding
    return pos[..., None] * theta  # (..., T, 1) * (dim/2,) -> (..., T, dim/2)


def _check_positions(x, positions) -> torch.Tensor:
    """Check x (..., T, D) with D even and return ``positions`` (default 0..T-1) as a tensor that has
    one position per row of x and broadcasts to x.shape[:-1] (for rotary embeddings)."""
    require_tensor(x, "x", floating=True, min_dim=2)
    T, D = x.shape[-2], x.shape[-1]
    if D % 2:
        raise ValueError(
            f"rotary embeddings rotate pairs of features, so the last dimension D of x must be even; "
            f"got x of shape {shape_str(x.shape)} (D={D})"
        )
    pos = torch.arange(T, device=x.device) if positions is None else torch.as_tensor(positions, device=x.device)
    if pos.dim() == 0 or pos.shape[-1] != T:
        raise ValueError(
            f"positions must hold one position per row of x: x is {shape_str(x.shape)} (T={T}), "
            f"positions is {shape_str(pos.shape)}"
        )
    try:
        fits = torch.broadcast_shapes(pos.shape, x.shape[:-1]) == x.shape[:-1]
    except RuntimeError:
        fits = False
    if not fits:
        raise ValueError(
            f"positions of shape {shape_str(pos.shape)} do not broadcast to x.shape[:-1] = "
            f"{shape_str(x.shape[:-1])}"
        )
    return pos


def apply_rotary(x: torch.Tensor, positions=None, base: float = 10000.0) -> torch.Tensor:
    """Rotary position embedding (RoPE, Su et al. 2021) of x (..., T, D), D even (lesson 06).

    Feature pair (2i, 2i+1) at position p is rotated by the angle p * base^(-2i/D); ``positions``
    (default 0..T-1) is a sequence of T positions or a tensor broadcastable to x.shape[:-1].
    """
    pos = _check_positions(x, positions)  # (..., T), broadcastable to x.shape[:-1]
    D = x.shape[-1]
    angles = rotary_angles(pos, D, base)  # (..., T, D/2), float64 so that large positions stay exact
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)  # (..., T, D/2)
    x_even, x_odd = x[..., 0::2], x[..., 1::2]  # (..., T, D/2) each: the two members of every pair
    rotated = torch.stack((x_even * cos - x_odd * sin, x_even * sin + x_odd * cos), dim=-1)  # (..., T, D/2, 2)
    return rotated.flatten(-2)  # (..., T, D/2, 2) -> (..., T, D)
