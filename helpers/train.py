"""A plain training loop with a progress bar, and the accuracies the lessons report (lesson 01 on)."""

from __future__ import annotations

import math
import os
from contextlib import nullcontext

import torch
import torch.nn.functional as F

from helpers._validate import positive_int, require_real, require_tensor
from helpers.device import SMALL_MODEL_THREADS, cpu_threads


def _progress(total: int, desc: str):
    # COURSE_PROGRESS=text (set by `make execute`) writes a plain text bar, which a committed
    # notebook can show; otherwise tqdm.auto picks a widget in Jupyter and text elsewhere.
    if os.environ.get("COURSE_PROGRESS", "").lower() == "text":
        from tqdm.std import tqdm

        return tqdm(total=total, desc=desc, mininterval=2.0, ascii=True)
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc)


def train(loss_fn, optimizer, get_batch, steps: int, desc: str = "training",
          clip_grad_norm: float | None = 1.0, scheduler=None, log_every: int = 1,
          threads: int | None = SMALL_MODEL_THREADS) -> list[float]:
    """Run ``steps`` optimiser steps of ``loss_fn(get_batch(step))``; return the loss history (lesson 01).

    ``loss_fn(batch)`` computes a scalar loss with the model in train mode (the caller's closure);
    ``get_batch(step)`` returns the batch for that step. Gradients are clipped to
    ``clip_grad_norm`` (None: no clipping). ``threads``: torch's CPU threads while training, restored
    afterwards; the default 1 is the course's policy for its small models (``helpers.device.cpu_threads``),
    None keeps torch's setting. Returns one float per step.
    """
    steps, log_every = positive_int(steps, "steps"), positive_int(log_every, "log_every")
    if clip_grad_norm is not None:
        require_real(clip_grad_norm, "clip_grad_norm", 0, math.inf, "(]", "None or a positive number")
    params = [p for group in optimizer.param_groups for p in group["params"]]
    history: list[float] = []
    with cpu_threads(threads) if threads is not None else nullcontext(), _progress(steps, desc) as bar:
        for step in range(steps):
            loss = loss_fn(get_batch(step))
            if not isinstance(loss, torch.Tensor) or loss.dim() != 0 or not loss.is_floating_point():
                got = f"a tensor of shape {tuple(loss.shape)} dtype {loss.dtype}" if isinstance(loss, torch.Tensor) \
                    else repr(loss)
                raise TypeError(f"loss_fn must return the loss as a 0-d floating tensor (to call .backward() on; "
                                f"average a per-item loss with .mean()), got {got} at step {step}")
            if not torch.isfinite(loss):
                raise FloatingPointError(f"loss became {loss.item()} at step {step}")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if clip_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(params, clip_grad_norm)
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            history.append(loss.item())
            bar.update(1)
            if step % log_every == 0 or step == steps - 1:
                bar.set_postfix(loss=f"{history[-1]:.4f}", refresh=False)
    return history


def sequence_loss(logits: torch.Tensor, targets: torch.Tensor, pad_id: int | None = None):
    """Mean cross-entropy of logits (B, T, V) against token ids (B, T), skipping ``pad_id`` (lesson 01)."""
    require_tensor(logits, "logits", floating=True)
    require_tensor(targets, "targets")
    if targets.is_floating_point() or targets.dtype == torch.bool:
        raise TypeError(f"targets must hold integer token ids, got dtype {targets.dtype}")
    if logits.dim() != 3 or targets.shape != logits.shape[:2]:
        raise ValueError(
            f"logits must be (B, T, V) and targets (B, T); got {tuple(logits.shape)} and "
            f"{tuple(targets.shape)}"
        )
    V = logits.shape[-1]
    ignore = -100 if pad_id is None else pad_id  # -100: F.cross_entropy's own "skip this position"
    counted = targets != ignore  # (B, T)
    if not counted.any():
        raise ValueError(f"every target is pad_id={ignore}: there is no token to compute a loss on "
                         "(is the batch empty, or is pad_id the id of a real token?)")
    bad = counted & ((targets < 0) | (targets >= V))  # (B, T)
    if bad.any():  # checked here: on CUDA an id out of range is a device-side assert, not an error message
        b, t = (int(i) for i in bad.nonzero()[0])
        raise ValueError(f"targets[{b}, {t}] = {int(targets[b, t])} is not a token id: logits have V={V} "
                         f"classes (ids 0..{V - 1})")
    # F.cross_entropy takes int64 class ids only: int32 (or narrower) ids are widened, not refused
    return F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1).long(), ignore_index=ignore)  # (B*T, V), (B*T,)


def _check_pair(pred, target):
    require_tensor(pred, "pred")
    require_tensor(target, "target")
    if pred.shape != target.shape:
        raise ValueError(f"pred and target must have the same shape, got {tuple(pred.shape)} "
                         f"and {tuple(target.shape)}")


def token_accuracy(pred: torch.Tensor, target: torch.Tensor, pad_id: int | None = None) -> float:
    """Fraction of non-pad target tokens predicted correctly; pred, target (B, T) ids (lesson 01).

    With no real token at all nothing is wrong: 1.0, as ``exact_match`` counts an all-pad row as right.
    """
    _check_pair(pred, target)
    keep = torch.ones_like(target, dtype=torch.bool) if pad_id is None else target != pad_id
    n = keep.sum().item()
    return ((pred == target) & keep).sum().item() / n if n else 1.0


def exact_match(pred: torch.Tensor, target: torch.Tensor, pad_id: int | None = None) -> float:
    """Fraction of sequences whose every non-pad token is right; pred, target (B, T) ids (lesson 01)."""
    _check_pair(pred, target)
    if target.dim() != 2 or target.shape[0] == 0:
        raise ValueError(f"pred and target must be (B, T) with B >= 1 sequences, got {tuple(target.shape)}")
    keep = torch.ones_like(target, dtype=torch.bool) if pad_id is None else target != pad_id
    return ((pred == target) | ~keep).all(dim=1).float().mean().item()
