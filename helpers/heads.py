"""What attention heads learn: an attention-only model, head scores, weight capture and ablation (lesson 13).

``AttentionOnly`` is a transformer with no feed-forward nets, built from the course's
``MultiHeadAttention``: every path from input to output goes through attention heads (Elhage et al.
2021). ``previous_token_score`` and ``induction_score`` score each head's weights (Olsson et al. 2022).
``probe_heads`` is the one mechanism that reads every layer's weights and silences chosen heads in any
course model that uses ``MultiHeadAttention`` (this model, lesson 12's GPT, lesson 11's MiniLM): PyTorch
forward hooks on the existing modules, so the models themselves are unchanged.
"""

from __future__ import annotations

import math
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from helpers._validate import as_int, check_heads, check_ids, positive_ints, require_choice, require_real, shape_str
from helpers.attention import MultiHeadAttention
from helpers.masks import causal_mask
from helpers.positional import LearnedPositionalEmbedding

__all__ = ["AttentionOnlyConfig", "AttentionOnly", "repeated_tokens", "previous_token_score", "induction_score",
           "attention_modules", "probe_heads", "attention_weights", "copy_accuracy", "position_losses", "train_copying"]


# --- the model -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AttentionOnlyConfig:
    """Sizes of an attention-only transformer; validated on creation (lesson 13)."""

    vocab_size: int  # V: token ids 0..V-1
    d_model: int  # width C of the residual stream
    n_heads: int  # heads per layer; d_model / n_heads features each
    n_layers: int  # attention layers: 1 cannot form an induction head, 2 can
    max_len: int  # rows of the learned position table
    init_std: float | None = None  # None: PyTorch's defaults; 0.02: GPT-2's scale (Going deeper)

    def __post_init__(self):
        positive_ints(vocab_size=self.vocab_size, d_model=self.d_model, n_heads=self.n_heads,
                      n_layers=self.n_layers, max_len=self.max_len)
        check_heads(self.d_model, self.n_heads)
        if self.init_std is not None:
            require_real(self.init_std, "init_std", 0, math.inf, "(]", "None or a positive number")

    @classmethod
    def tiny(cls, vocab_size: int = 8, n_layers: int = 2) -> AttentionOnlyConfig:
        """A small preset for tests (lesson 13)."""
        return cls(vocab_size=vocab_size, d_model=16, n_heads=2, n_layers=n_layers, max_len=16)


class AttentionOnly(nn.Module):
    """Embeddings + positions, then ``n_layers`` of x = x + attn(norm(x)), a final norm and the unembedding (lesson 13).

    No feed-forward nets: each layer only moves information between positions. ``forward(ids (B, T))``
    returns logits (B, T, V); position t predicts token t + 1.
    """

    def __init__(self, config: AttentionOnlyConfig):
        super().__init__()
        self.config = config
        C = config.d_model
        self.embed = nn.Embedding(config.vocab_size, C)
        self.pos = LearnedPositionalEmbedding(config.max_len, C)
        self.norms = nn.ModuleList(nn.LayerNorm(C) for _ in range(config.n_layers))
        self.attns = nn.ModuleList(MultiHeadAttention(C, config.n_heads) for _ in range(config.n_layers))
        self.norm = nn.LayerNorm(C)
        self.unembed = nn.Linear(C, config.vocab_size, bias=False)
        if config.init_std is not None:
            for p in self.parameters():
                if p.dim() == 2:  # every matrix; biases and norms keep their defaults
                    nn.init.normal_(p, std=config.init_std)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids (B, T) -> logits (B, T, V) (lesson 13)."""
        check_ids(ids, "ids", self.config.vocab_size, self.config.max_len, self.embed.weight.device)
        B, T = ids.shape
        mask = causal_mask(T, device=ids.device)  # (T, T), True = may attend
        x = self.pos(self.embed(ids))  # (B, T, C)
        for norm, attn in zip(self.norms, self.attns, strict=True):
            h = norm(x)
            x = x + attn(h, h, h, mask=mask, need_weights=False)[0]  # (B, T, C)
        return self.unembed(self.norm(x))  # (B, T, V)


def repeated_tokens(batch: int, length: int, vocab_size: int, min_period: int, max_period: int,
                    generator: torch.Generator | None = None):
    """``batch`` sequences of ``length`` tokens repeating a random block: (ids (B, T), periods (B,)) (lesson 13).

    Each sequence draws a period p in [min_period, max_period] and p distinct tokens, then repeats
    them: ids[b, t] = ids[b, t - p]. Only copying from context predicts a token at position >= p.
    """
    batch, length, vocab_size = positive_ints(batch=batch, length=length, vocab_size=vocab_size)
    min_period = as_int(min_period, "min_period", minimum=1)
    max_period = as_int(max_period, f"max_period (at most vocab_size={vocab_size}: distinct tokens; below "
                                    f"length={length}: the block repeats)", min_period, min(vocab_size, length - 1))
    periods = torch.randint(min_period, max_period + 1, (batch,), generator=generator)  # (B,)
    blocks = torch.rand(batch, vocab_size, generator=generator).argsort(dim=-1)  # (B, V): random orders
    t = torch.arange(length)  # (T,)
    ids = blocks.gather(1, t[None, :] % periods[:, None])  # (B, T): token t is token t mod p of the block
    return ids, periods


# --- head scores (Olsson et al. 2022) --------------------------------------------------------------


def _as_bhtt(weights, name: str) -> torch.Tensor:
    if not isinstance(weights, torch.Tensor) or weights.dim() not in (3, 4):
        got = shape_str(weights.shape) if isinstance(weights, torch.Tensor) else type(weights).__name__
        raise ValueError(f"{name}: weights must be (B, H, T, T) or (H, T, T), got {got}")
    w = weights if weights.dim() == 4 else weights[None]  # (H, T, T) -> (1, H, T, T)
    if w.shape[-1] != w.shape[-2]:
        raise ValueError(f"{name}: weights must be square in the last two axes (self-attention, T queries and "
                         f"T keys), got {shape_str(weights.shape)}")
    if not w.is_floating_point():
        raise TypeError(f"{name}: weights must be floating point, got dtype {w.dtype}")
    return w


def previous_token_score(weights: torch.Tensor) -> torch.Tensor:
    """(B, H, T, T) or (H, T, T) weights -> (H,): mean weight query i gives key i - 1, i = 1..T-1 (lesson 13)."""
    w = _as_bhtt(weights, "previous_token_score")
    if w.shape[-1] < 2:
        raise ValueError(f"previous_token_score needs T >= 2 positions, got weights {shape_str(weights.shape)}")
    return w.diagonal(offset=-1, dim1=-2, dim2=-1).mean(dim=(0, 2))  # (B, H, T-1) -> (H,)


def induction_score(weights: torch.Tensor, period: int) -> torch.Tensor:
    """(B, H, T, T) or (H, T, T) weights of a sequence repeating with ``period`` -> (H,) (lesson 13).

    The mean over the batch and query positions i = period..T-1 of the weight that query i gives key
    i - period + 1: the token after the previous occurrence of the current token.
    """
    w = _as_bhtt(weights, "induction_score")
    T = w.shape[-1]
    period = as_int(period, f"period (below T={T}, so that a query repeats)", 1, T - 1)
    # key i - period + 1 for query i: the diagonal period - 1 below the main one, from query `period` on
    return w.diagonal(offset=-(period - 1), dim1=-2, dim2=-1)[..., 1:].mean(dim=(0, 2))  # (H,)


# --- one mechanism for every model: read weights, silence heads ------------------------------------


def attention_modules(model: nn.Module) -> list[MultiHeadAttention]:
    """Every ``MultiHeadAttention`` inside ``model``, in the order the model registers them (lesson 13)."""
    found = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    if not found:
        raise ValueError(f"{type(model).__name__} holds no helpers.attention.MultiHeadAttention module")
    return found


def _check_heads(heads, modules) -> dict[int, list[int]]:
    chosen: dict[int, list[int]] = {}
    for pair in heads:
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise ValueError(f"heads must be (layer, head) pairs, got {pair!r}")
        layer = as_int(pair[0], "layer", minimum=0, maximum=len(modules) - 1)
        head = as_int(pair[1], "head", minimum=0, maximum=modules[layer].n_heads - 1)
        chosen.setdefault(layer, []).append(head)
    return chosen


@contextmanager
def probe_heads(model: nn.Module, ablate=(), mode: str = "zero"):
    """Within the block, every forward of ``model`` records each layer's weights and silences ``ablate`` (lesson 13).

    Yields a list; each forward appends one (B, H, T, S) weight tensor per ``MultiHeadAttention``, in
    the order they run. ``ablate``: (layer, head) pairs, layers counted in ``attention_modules``
    order. A silenced head's output (its D columns of the input to W_O) is replaced by zeros
    (``mode="zero"``) or by its mean over the batch and positions (``mode="mean"``).
    """
    require_choice(mode, "mode", ("zero", "mean"))
    modules = attention_modules(model)
    chosen = _check_heads(ablate, modules)
    records: list[torch.Tensor] = []
    handles = []

    def ask_for_weights(module, args, kwargs):
        if len(args) > 4:  # need_weights given by position
            args = (*args[:4], True, *args[5:])
        else:
            kwargs = {**kwargs, "need_weights": True}
        return args, kwargs

    def record(module, args, output):
        records.append(output[1].detach())  # (B, H, T, S)

    def silencer(heads, D):
        def silence(linear, args):
            (x,) = args  # (B, T, H*D): the heads' outputs, side by side, before W_O
            x = x.clone()
            for h in heads:
                part = x[..., h * D:(h + 1) * D]  # (B, T, D)
                x[..., h * D:(h + 1) * D] = 0.0 if mode == "zero" else part.mean(dim=(0, 1), keepdim=True)
            return (x,)
        return silence

    try:
        for i, mha in enumerate(modules):
            handles.append(mha.register_forward_pre_hook(ask_for_weights, with_kwargs=True))
            handles.append(mha.register_forward_hook(record))
            if i in chosen:
                handles.append(mha.w_o.register_forward_pre_hook(silencer(chosen[i], mha.head_dim)))
        yield records
    finally:
        for handle in handles:
            handle.remove()


def attention_weights(model: nn.Module, *inputs, **kwargs) -> list[torch.Tensor]:
    """Run ``model(*inputs, **kwargs)`` without gradients; every layer's (B, H, T, S) weights, in order (lesson 13)."""
    with torch.no_grad(), probe_heads(model) as weights:
        model(*inputs, **kwargs)
    return weights


def _split_copies(right: torch.Tensor, periods: torch.Tensor):
    """Mean of ``right`` (B, T-1) over the first copy (queries i < p - 1) and the second (i >= p)."""
    i = torch.arange(right.shape[1], device=right.device)  # (T-1,): query positions
    first = i[None, :] < periods[:, None] - 1  # (B, T-1)
    second = i[None, :] >= periods[:, None]
    return right[first].float().mean().item(), right[second].float().mean().item()


def copy_accuracy(model: nn.Module, ids: torch.Tensor, periods: torch.Tensor, ablate=(), mode: str = "zero"):
    """Accuracy on the first and the second copy (queries i < p - 1, and i >= p) of ``repeated_tokens`` (lesson 13)."""
    with torch.no_grad():
        if ablate:
            with probe_heads(model, ablate, mode):
                logits = model(ids[:, :-1])  # (B, T-1, V)
        else:
            logits = model(ids[:, :-1])
    return _split_copies(logits.argmax(-1) == ids[:, 1:], periods)  # position i predicts token i + 1


def position_losses(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy (nats) at each query position of ``ids`` (B, T): (T - 1,) (lesson 13)."""
    with torch.no_grad():
        logits = model(ids[:, :-1])  # (B, T-1, V)
    return F.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none").mean(0)  # (B, T-1) -> (T-1,)


def train_copying(config: AttentionOnlyConfig, steps: int, *, batch: int = 32, lr: float = 1e-3,
                  periods: tuple[int, int] = (4, 16), eval_every: int = 25, eval_ids=None, seed: int = 0,
                  progress: bool = True):
    """Train an ``AttentionOnly`` on ``repeated_tokens`` with AdamW; returns (model, history) (lesson 13).

    Every ``eval_every`` steps ``history`` records the step, the training loss, the accuracy on the
    first and second copies of ``eval_ids`` ((ids, periods), drawn once when None) and the
    in-context-learning score: the mean loss at the last quarter of positions minus the first quarter.
    """
    from helpers.device import cpu_threads
    from helpers.train import _progress

    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    T = config.max_len
    if eval_ids is None:
        eval_ids = repeated_tokens(128, T, config.vocab_size, *periods, generator=torch.Generator().manual_seed(10_000))
    model = AttentionOnly(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    history = {"step": [], "loss": [], "first": [], "second": [], "icl": []}
    bar = _progress(steps, f"{config.n_layers} layer{'s' if config.n_layers > 1 else ''}, seed {seed}") \
        if progress else nullcontext()
    with cpu_threads(), bar:
        for step in range(steps + 1):
            if step % eval_every == 0 or step == steps:
                model.eval()
                with torch.no_grad():
                    logits = model(eval_ids[0][:, :-1])  # (B, T-1, V)
                first, second = _split_copies(logits.argmax(-1) == eval_ids[0][:, 1:], eval_ids[1])
                losses = F.cross_entropy(logits.transpose(1, 2), eval_ids[0][:, 1:], reduction="none").mean(0)
                q = losses.shape[0] // 4
                history["step"].append(step)
                history["first"].append(first)
                history["second"].append(second)
                history["icl"].append((losses[-q:].mean() - losses[:q].mean()).item())
                model.train()
            if step == steps:
                break
            ids, _ = repeated_tokens(batch, T, config.vocab_size, *periods, generator=g)  # (B, T)
            loss = F.cross_entropy(model(ids[:, :-1]).transpose(1, 2), ids[:, 1:])  # (B, V, T-1) vs (B, T-1)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step % eval_every == 0:
                history["loss"].append(loss.item())
            if progress:
                bar.update(1)
    model.eval()
    return model, history
