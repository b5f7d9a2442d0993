"""Train the course's GPT on data/shakespeare.txt and write data/gpt_shakespeare.pt (lesson 12).

Usage (from the repository root): python data/train_gpt.py   (or `make train-gpt`)
Deterministic for a given machine and torch build: the seed fixes the initial weights and every batch.
Prints the held-out bits per character and the sha256 that data/README.md lists.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from helpers.data import Vocab, load_text
from helpers.gpt import CHECKPOINT, GPT, GPTConfig, bits_per_char, random_windows, save_checkpoint
from helpers.train import train

SEED = 1234
STEPS = 1500  # about 5 passes over the training text at 32 x 128 characters a step
BATCH_SIZE = 32
LR, WARMUP = 3e-3, 100  # AdamW; linear warm-up, then cosine decay to LR / 10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / CHECKPOINT))
    args = parser.parse_args()

    train_text = load_text("train")
    vocab = Vocab(train_text)
    train_ids = torch.tensor(vocab.encode(train_text))
    valid_ids = torch.tensor(vocab.encode(load_text("valid")))
    torch.manual_seed(SEED)
    model = GPT(GPTConfig.course(len(vocab)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.99), weight_decay=0.01)

    def lr_factor(step):
        if step < WARMUP:
            return (step + 1) / WARMUP
        progress = (step - WARMUP) / max(1, args.steps - WARMUP)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    batches = torch.Generator().manual_seed(SEED)

    def get_batch(step):
        return random_windows(train_ids, model.config.max_len, BATCH_SIZE, batches)

    def loss_fn(batch):
        x, y = batch
        return F.cross_entropy(model(x).flatten(0, 1), y.flatten())  # (B*T, V) vs (B*T,)

    start = time.perf_counter()
    history = train(loss_fn, optimizer, get_batch, args.steps, desc="GPT", scheduler=scheduler,
                    log_every=50, threads=args.threads)
    seconds = time.perf_counter() - start
    torch.set_num_threads(args.threads)
    bpc = bits_per_char(model, valid_ids)
    sha = save_checkpoint(model, vocab, args.out)
    print(f"steps {args.steps}, {args.threads} threads: {seconds:.0f} s; last loss {history[-1]:.3f}")
    print(f"held-out (valid) bits per character: {bpc:.4f}")
    print(f"{args.out}: {Path(args.out).stat().st_size} bytes, sha256 {sha}")


if __name__ == "__main__":
    main()
