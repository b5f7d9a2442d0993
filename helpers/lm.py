"""Scoring and training a character language model: bits per character, count baselines (lesson 12).

Every score here is a mean over *every* predicted character of the ids it is given, so a figure
computed on a whole split (``helpers.data.load_text("valid")``) is a figure for that split, not for
an easy slice of it. The training loop ``train_lm`` is the one ``data/train_gpt.py`` runs and the one
lesson 12 runs live, so both follow the same recipe step for step.
"""

from __future__ import annotations

import json
import math
import time

import torch
import torch.nn.functional as F

from helpers._validate import as_int, check_id_stream, positive_int, require_real

LOG_FILE = "gpt_shakespeare_log.json"  # the training log of the course's checkpoint, in data/


def parameter_count(config) -> int:
    """The number of trainable parameters of ``GPT(config)``, by formula (lesson 12)."""
    C, V, F_, L = config.d_model, config.vocab_size, config.d_ff, config.n_layers
    kv = (config.n_kv_heads or config.n_heads) * config.head_dim
    attn = (C * C + C) * 2 + (C * kv + kv) * 2  # w_q, w_o; w_k, w_v
    ff = (C * F_ + F_) + (F_ * C + C)
    per_block = attn + ff + 2 * 2 * C  # two LayerNorms of weight + bias
    head = 0 if config.tie_weights else V * C
    return V * C + config.max_len * C + L * per_block + 2 * C + head


def random_windows(ids: torch.Tensor, block: int, batch_size: int, generator=None):
    """(x, y) of shape (batch_size, block): random windows of ids and the same shifted by one (lesson 12)."""
    block, batch_size = positive_int(block, "block"), positive_int(batch_size, "batch_size")
    check_id_stream(ids, "ids", min_len=block + 1)
    starts = torch.randint(0, ids.numel() - block, (batch_size,), generator=generator)  # (B,)
    offsets = starts[:, None] + torch.arange(block)  # (B, block)
    return ids[offsets], ids[offsets + 1]  # (B, block), (B, block)


def spaced_windows(ids: torch.Tensor, block: int, n: int):
    """(x, y) of shape (n, block): n windows with evenly spaced starts over all of ids (lesson 12).

    A fixed sample of a split for a training log: cheap to score every few steps, and spread over
    the whole split rather than taken from its start.
    """
    block, n = positive_int(block, "block"), positive_int(n, "n")
    check_id_stream(ids, "ids", min_len=block + 1)
    starts = torch.linspace(0, ids.numel() - block - 1, n).round().long()  # (n,)
    offsets = starts[:, None] + torch.arange(block)  # (n, block)
    return ids[offsets], ids[offsets + 1]


@torch.no_grad()
def window_bits(model, x: torch.Tensor, y: torch.Tensor, batch_size: int = 64) -> float:
    """Mean -log2 p(y | x) of a model on windows x, y (N, T) in eval mode (lesson 12)."""
    batch_size = positive_int(batch_size, "batch_size")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    total = 0.0
    try:
        for i in range(0, x.shape[0], batch_size):
            logits = model(x[i:i + batch_size].to(device))  # (b, T, V)
            total += F.cross_entropy(logits.flatten(0, 1).double(), y[i:i + batch_size].flatten().to(device),
                                     reduction="sum").item()
    finally:
        model.train(was_training)
    return total / y.numel() / math.log(2)


@torch.no_grad()
def bits_per_char(model, ids: torch.Tensor, block: int | None = None, batch_size: int = 32) -> float:
    """Mean -log2 p(next token) over every position of 1-D ``ids`` after the first (lesson 12).

    ``ids`` are cut into consecutive windows of ``block`` tokens (the model's context by default)
    and a last, shorter window for the rest, so every token but the first is predicted once, from
    the tokens before it in its own window.
    """
    V, max_len = model.config.vocab_size, model.config.max_len
    block = max_len if block is None else block
    block = as_int(block, f"block (at most the model's context max_len={max_len})", 1, max_len)
    check_id_stream(ids, "ids", V)  # window_bits checks batch_size
    n = (ids.numel() - 1) // block * block  # tokens predicted by whole windows
    total, count = 0.0, 0
    if n:
        x, y = ids[:n].view(-1, block), ids[1:n + 1].view(-1, block)  # (N, block) each
        total += window_bits(model, x, y, batch_size) * y.numel()
        count += y.numel()
    if n < ids.numel() - 1:  # the rest, as one shorter window
        x, y = ids[n:-1][None], ids[n + 1:][None]  # (1, rest)
        total += window_bits(model, x, y, batch_size) * y.numel()
        count += y.numel()
    return total / count


def ngram_bits_per_char(train_ids: torch.Tensor, eval_ids: torch.Tensor, vocab_size: int, order: int,
                        k: float = 1.0) -> float:
    """Bits per character of ``eval_ids`` under an add-k smoothed n-gram count model, n = ``order`` (lesson 12).

    p(c | the order-1 characters before it) = (count of the n-gram + k) / (count of its context + k V),
    counted on ``train_ids``. Every position of ``eval_ids`` after the first is scored (the positions
    a GPT predicts); the first order-2 of them, which lack a full context, use the shorter context
    they have (the first position scored uses the character before it).
    """
    V = positive_int(vocab_size, "vocab_size")
    order = as_int(order, "order (1 unigram, 2 bigram, 3 trigram)", 1, 3)
    k = require_real(k, "k", 0, math.inf, "()", "a positive finite number", " (add-k smoothing)")
    check_id_stream(train_ids, "train_ids", V)
    check_id_stream(eval_ids, "eval_ids", V)
    bits = torch.empty(eval_ids.numel() - 1, dtype=torch.float64)  # one per predicted position 1..N-1
    N = eval_ids.numel()
    for n in range(1, order + 1):  # position i is predicted from its min(order - 1, i) characters before it
        c = n - 1  # context length
        if n < order:
            pos = torch.arange(c, c + 1) if c >= 1 else torch.arange(0)  # only position c has this short a context
        else:
            pos = torch.arange(max(c, 1), N)  # every other position
        if pos.numel() == 0:
            continue
        grams = train_ids.unfold(0, n, 1)  # (N_train - n + 1, n)
        code = (grams * V ** torch.arange(n - 1, -1, -1)).sum(dim=1)  # one id per n-gram, first char most significant
        counts = torch.bincount(code, minlength=V ** n).double().view(-1, V) + k  # (V^(n-1) contexts, V)
        logp = (counts / counts.sum(dim=1, keepdim=True)).log2()
        ctx = torch.zeros_like(pos)
        for j in range(c, 0, -1):  # the characters i - c .. i - 1, first one most significant
            ctx = ctx * V + eval_ids[pos - j]
        bits[pos - 1] = -logp[ctx, eval_ids[pos]]
    return bits.mean().item()


def best_k(train_ids: torch.Tensor, valid_ids: torch.Tensor, vocab_size: int, order: int,
           ks=(0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0)) -> tuple[float, float]:
    """(k, bits) of the add-k n-gram with the fewest bits per character on ``valid_ids`` among ``ks`` (lesson 12)."""
    scores = [(ngram_bits_per_char(train_ids, valid_ids, vocab_size, order, k), k) for k in ks]
    bits, k = min(scores)
    return k, bits


def cosine_factor(step: int, steps: int, warmup: int, floor: float = 0.1) -> float:
    """Learning-rate multiplier: linear warm-up over ``warmup`` steps, then cosine decay to ``floor`` (lesson 12)."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


def train_lm(model, optimizer, scheduler, train_ids: torch.Tensor, steps: int, batch_size: int, generator,
             log_every: int = 0, evaluate=None, rank: int = 0, world_size: int = 1, clip: float = 1.0,
             desc: str = "GPT", progress: bool = True, start_step: int = 0, log=None, on_log=None,
             seconds_offset: float = 0.0) -> list[dict]:
    """Train a language model on random windows of ``train_ids``; return the log (lesson 12).

    Each step draws ``batch_size`` windows of the model's context from ``generator`` (the whole
    batch, on every process, so the batches do not depend on how many processes share them), takes
    this process's share (``rank`` of ``world_size``), and runs one AdamW step on the mean
    cross-entropy, gradients clipped to norm ``clip``. With ``log_every`` > 0, ``evaluate(model)``
    (a dict of figures) is logged before steps 0, log_every, 2 log_every, ... and after the last
    step, with the mean training loss in bits of the steps since the last entry. ``model`` may be
    wrapped in ``DistributedDataParallel``, which averages the gradients over the processes.

    To resume a run, pass its ``start_step``, its ``log`` so far (extended in place) and the state of
    the model, optimizer, scheduler and generator at that step; ``on_log(step, log)`` is called after
    each entry, the moment to save that state.
    """
    from helpers.train import _progress

    steps, batch_size = positive_int(steps, "steps"), positive_int(batch_size, "batch_size")
    if batch_size % world_size:
        raise ValueError(f"batch_size={batch_size} must split evenly over world_size={world_size} processes")
    inner = getattr(model, "module", model)
    block, device = inner.config.max_len, next(inner.parameters()).device
    local = slice(rank * batch_size // world_size, (rank + 1) * batch_size // world_size)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    log = [] if log is None else log
    losses, start = [], time.perf_counter()

    def record(step):
        entry = {"step": step, "seconds": round(seconds_offset + time.perf_counter() - start, 2)}
        if losses:
            entry["train_loss_bits"] = sum(losses) / len(losses) / math.log(2)
            losses.clear()
        entry.update(evaluate(inner) if evaluate is not None else {})
        log.append(entry)
        if on_log is not None:
            on_log(step, log)

    model.train()
    bar = _progress(steps, desc) if progress else None
    if bar is not None and start_step:
        bar.update(start_step)
    try:
        for step in range(start_step, steps):
            if log_every and step % log_every == 0 and not (log and log[-1]["step"] == step):
                record(step)
            x, y = random_windows(train_ids, block, batch_size, generator)  # (B, T) each, the global batch
            x, y = x[local].to(device), y[local].to(device)  # this process's share
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())  # (b*T, V) vs (b*T,)
            if not torch.isfinite(loss):
                raise FloatingPointError(f"loss became {loss.item()} at step {step}")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, clip)
            optimizer.step()
            scheduler.step()
            losses.append(loss.item())
            if bar is not None:
                bar.update(1)
                if step % 10 == 0 or step == steps - 1:
                    bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
    finally:
        if bar is not None:
            bar.close()
    if log_every:
        record(steps)
    return log


def load_training_log(data_dir=None) -> dict:
    """The training log of the course's checkpoint, data/gpt_shakespeare_log.json (sha256 checked) (lesson 12)."""
    from pathlib import Path

    from helpers.data import check_sha256, find_data_dir

    path = (find_data_dir() if data_dir is None else Path(data_dir)) / LOG_FILE
    check_sha256(path)  # the file is there and is the committed one
    return json.loads(path.read_text("utf-8"))
