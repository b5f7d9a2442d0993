"""Positional information for attention, which on its own ignores order (lesson 06)."""

from __future__ import annotations

import math

import torch
from torch import nn


def sinusoidal_encoding(length: int, d_model: int) -> torch.Tensor:
    """(length, d_model) sinusoidal encoding, Vaswani et al. 2017 section 3.5 (lesson 06).

    PE[pos, 2i] = sin(pos / 10000^(2i/d_model)) and PE[pos, 2i+1] = cos(pos / 10000^(2i/d_model)).
    """
    for name, n in (("length", length), ("d_model", d_model)):
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            raise ValueError(f"{name} must be a positive int, got {n!r}")
    pos = torch.arange(length, dtype=torch.float64)[:, None]  # (length, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (ceil(d_model / 2),)
    angle = pos / 10000.0 ** (two_i / d_model)  # (length, ceil(d_model / 2))
    pe = torch.zeros(length, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return pe.to(torch.get_default_dtype())


def wavelengths(d_model: int) -> torch.Tensor:
    """Wavelength 2*pi*10000^(2i/d_model) of each sin/cos pair of the encoding (lesson 06)."""
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)
    return 2 * math.pi * 10000.0 ** (two_i / d_model)


class PositionalEncoding(nn.Module):
    """Adds the sinusoidal encoding to token embeddings (B, T, C), then dropout (lesson 06)."""

    def __init__(self, d_model: int, max_len: int = 512, dropout: float = 0.0):
        super().__init__()
        self.max_len = max_len
        self.dropout = nn.Dropout(dropout)
        # a buffer, not a parameter: it moves with .to(device) but is never trained
        self.register_buffer("pe", sinusoidal_encoding(max_len, d_model), persistent=False)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """x (B, T, C) -> x + PE[offset : offset + T]; ``offset`` serves step-by-step decoding."""
        if x.dim() != 3 or x.shape[-1] != self.pe.shape[1]:
            raise ValueError(f"x must have shape (B, T, d_model={self.pe.shape[1]}), got {tuple(x.shape)}")
        T = x.shape[1]
        if offset + T > self.max_len:
            raise ValueError(f"positions {offset}..{offset + T - 1} exceed max_len={self.max_len}; "
                             "build the model with a larger max_len")
        return self.dropout(x + self.pe[offset:offset + T].to(x.dtype))  # (B, T, C)
