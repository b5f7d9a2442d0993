"""Offline tasks for the lessons: a character vocabulary and deterministic data generators.

Nothing here downloads anything: every data set is generated from a seed or read from ``data/``.
"""

from __future__ import annotations

import random

import torch

PAD, BOS, EOS = "<pad>", "<s>", "</s>"


class Vocab:
    """Character vocabulary with <pad>=0, <s>=1, </s>=2, then the given symbols (lesson 01)."""

    def __init__(self, symbols):
        symbols = sorted(set(symbols))
        clash = [s for s in symbols if s in (PAD, BOS, EOS)]
        if clash:
            raise ValueError(f"symbols may not contain the special tokens {clash}")
        self.itos = [PAD, BOS, EOS, *symbols]
        self.stoi = {s: i for i, s in enumerate(self.itos)}
        self.pad_id, self.bos_id, self.eos_id = 0, 1, 2

    def __len__(self) -> int:
        return len(self.itos)

    def __repr__(self) -> str:
        return f"Vocab({len(self)} tokens: {''.join(self.itos[3:])!r} + <pad> <s> </s>)"

    def encode(self, text: str, bos: bool = False, eos: bool = False) -> list[int]:
        """Token ids of ``text``, one per character, optionally framed by <s> and </s>."""
        ids = []
        for i, ch in enumerate(text):
            if ch not in self.stoi:
                raise ValueError(f"character {ch!r} at position {i} of {text!r} is not in the "
                                 f"vocabulary {''.join(self.itos[3:])!r}")
            ids.append(self.stoi[ch])
        return [self.bos_id] * bos + ids + [self.eos_id] * eos

    def decode(self, ids) -> str:
        """Text of ``ids``, stopping at the first </s> and skipping <pad> and <s>."""
        out = []
        for i in (ids.tolist() if isinstance(ids, torch.Tensor) else ids):
            if i == self.eos_id:
                break
            if i not in (self.pad_id, self.bos_id):
                out.append(self.itos[i])
        return "".join(out)

    def batch(self, texts, bos: bool = False, eos: bool = False) -> torch.Tensor:
        """Encode several texts into one (B, L) LongTensor, right-padded with <pad>."""
        rows = [self.encode(t, bos=bos, eos=eos) for t in texts]
        width = max(len(r) for r in rows)
        return torch.tensor([r + [self.pad_id] * (width - len(r)) for r in rows], dtype=torch.long)


DIGITS = Vocab("0123456789")


def digit_pairs(n: int, min_len: int, max_len: int, seed: int, task: str = "reverse"):
    """``n`` (source, target) digit strings with lengths uniform in [min_len, max_len] (lesson 01).

    task "reverse": target is the source reversed; task "copy": target equals the source.
    The same seed always gives the same pairs.
    """
    if task not in ("reverse", "copy"):
        raise ValueError(f"task must be 'reverse' or 'copy', got {task!r}")
    if not 1 <= min_len <= max_len:
        raise ValueError(f"need 1 <= min_len <= max_len, got min_len={min_len}, max_len={max_len}")
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        src = "".join(rng.choice("0123456789") for _ in range(rng.randint(min_len, max_len)))
        pairs.append((src, src[::-1] if task == "reverse" else src))
    return pairs
