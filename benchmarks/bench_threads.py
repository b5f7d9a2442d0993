"""Training steps per second of the lesson-08 model on the CPU with 1 and with 2 torch threads, idle and loaded.

One training step as lesson 08 takes it (batch 128 dates, teacher forcing, AdamW), with
``TransformerConfig.dates`` sizes. The thread counts are timed side by side in interleaved blocks.
"Loaded" runs the same comparison while a second process keeps one core busy (a Python loop),
as another notebook or another user would. This measures the policy of
``helpers.device.cpu_threads``.

    python benchmarks/bench_threads.py                 # idle and loaded, threads 1 and 2
    python benchmarks/bench_threads.py --quick         # fewer repeats
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import torch
from common import add_common_args, environment, markdown_table, save, time_side_by_side

from helpers.data import char_vocabs, load_dates
from helpers.device import cpu_threads
from helpers.train import sequence_loss
from helpers.transformer import Transformer, TransformerConfig

DATA = Path(__file__).resolve().parents[1] / "data"


def training_step(batch: int, seed: int = 0):
    """A function running one lesson-08 training step (forward, backward, AdamW) on the CPU."""
    pairs = load_dates("train", data_dir=DATA)
    src_vocab, tgt_vocab = char_vocabs(pairs)
    torch.manual_seed(seed)
    model = Transformer(TransformerConfig.dates(len(src_vocab), len(tgt_vocab))).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    src = src_vocab.batch([s for s, _ in pairs[:batch]])  # (B, S)
    tgt = tgt_vocab.batch([t for _, t in pairs[:batch]], bos=True, eos=True)  # (B, T + 1) framed by <s> ... </s>

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = sequence_loss(model(src, tgt[:, :-1]), tgt[:, 1:], pad_id=tgt_vocab.pad_id)
        loss.backward()
        optimizer.step()
    return step


def compare(step, threads, repeats) -> dict:
    def with_threads(n):
        def run():
            with cpu_threads(n):
                step()
        return run
    t = time_side_by_side({f"threads_{n}": with_threads(n) for n in threads}, torch.device("cpu"),
                          repeats=repeats, warmup=2, min_block_s=0.2)
    for r in t.values():
        r["steps_per_s"] = 1.0 / r["median_s"]
    return t


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--threads-list", type=int, nargs="+", default=[1, 2])
    p.add_argument("--repeats", type=int, default=None)
    add_common_args(p, "3 repeats")
    args = p.parse_args(argv)
    args.repeats = args.repeats or (3 if args.quick else 9)
    env = environment(torch.device("cpu"))
    print(f"thread benchmark on {env['device_name']}, {os.cpu_count()} cores, torch {env['torch']}", flush=True)
    step = training_step(args.batch)
    load = {"as_found": os.getloadavg()[0]}
    results = {"as_found": compare(step, args.threads_list, args.repeats)}
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # one core kept busy
    try:
        load["plus_busy_process"] = os.getloadavg()[0]
        results["plus_busy_process"] = compare(step, args.threads_list, args.repeats)
    finally:
        busy.kill()
        busy.wait()
    rows = [[f"{state} (load {load[state]:.1f})", n.removeprefix("threads_"), f"{r['median_s'] * 1e3:.1f}",
             f"{r['min_s'] * 1e3:.1f}", f"{r['max_s'] * 1e3:.1f}", f"{r['steps_per_s']:.2f}"]
            for state, t in results.items() for n, r in t.items()]
    body = (f"## One lesson-08 training step (batch {args.batch}, forward + backward + AdamW), CPU\n\n"
            "`as_found`: the machine as it was (its other users' work included; the 1-minute load "
            "average at the start of each phase in brackets); `plus_busy_process`: the same while a "
            "second process of this script keeps one more core busy. Medians of "
            f"{args.repeats} interleaved blocks per thread count.\n\n"
            + markdown_table(["machine state", "torch threads", "median ms/step", "min ms", "max ms", "steps/s"], rows))
    print(body)
    payload = dict(benchmark="threads", environment=env, settings=vars(args), load_average=load, results=results)
    save("threads", torch.device("cpu"), payload, body, args)
    return payload


if __name__ == "__main__":
    main(sys.argv[1:])
