"""Small argument checks shared by the helpers, so bad input fails early with a clear message."""

from __future__ import annotations

import torch


def shape_str(shape) -> str:
    """Format a shape as ``(2, 3, 4)`` for error messages."""
    return "(" + ", ".join(str(int(s)) for s in shape) + ")"


def require_tensor(x, name: str, *, floating: bool = False, min_dim: int = 0) -> None:
    """Raise TypeError/ValueError unless ``x`` is a tensor of the required kind."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if floating and not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if x.dim() < min_dim:
        raise ValueError(
            f"{name} must have at least {min_dim} dimensions, got shape {shape_str(x.shape)}"
        )


def check_bool_mask(mask, target_shape, what: str = "(..., T, S)") -> None:
    """Check that ``mask`` is boolean and broadcasts to ``target_shape`` without growing it."""
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"mask must be a boolean torch.Tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(
            f"mask must be boolean with True = may attend, got dtype {mask.dtype}; "
            "convert an additive float mask with `mask == 0` or a 0/1 mask with `mask.bool()`"
        )
    target = torch.Size(target_shape)
    try:
        ok = torch.broadcast_shapes(mask.shape, target) == target
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(
            f"mask of shape {shape_str(mask.shape)} does not broadcast to the attention "
            f"scores' shape {what} = {shape_str(target)}"
        )
