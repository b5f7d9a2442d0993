"""Lesson 12's GPT: generation of 256 new tokens with and without the KV cache, on the course's sizes.

The model has the checkpoint's sizes (``GPTConfig.course``, C 128, 4 heads, 4 blocks) but a
context of 512 so that 256 new tokens fit after the prompt, and random weights: speed and the
equality of the two outputs do not depend on training. The prompt is the first 16 characters of
the held-out text. Greedy decoding (top_k=1); the ids of both are compared before anything is timed.

    python benchmarks/bench_gpt.py                 # 256 new tokens, batch 1 and 8
    python benchmarks/bench_gpt.py --quick         # 32 new tokens, batch 1, 2 runs
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from common import add_repeat_args, announce, command_line, fmt_ms, fmt_ratio, markdown_table, save, time_side_by_side

from helpers.data import Vocab, load_text
from helpers.gpt import GPT, GPTConfig

DATA = Path(__file__).resolve().parents[1] / "data"


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--batches", type=int, nargs="+", default=None, help="default: 1 and 8 (quick: 1)")
    add_repeat_args(p, "blocks of each decoder, interleaved (median)", warmup=1)
    p.add_argument("--seed", type=int, default=0)
    return command_line(p, argv, "32 new tokens, batch 1, 2 runs: a smoke test")


def compare(args, device, batch: int) -> dict:
    train_text = load_text("train", data_dir=DATA)
    vocab = Vocab(train_text)
    torch.manual_seed(args.seed)
    model = GPT(GPTConfig.course(len(vocab), max_len=512)).to(device).eval()
    prompt = torch.tensor([vocab.encode(load_text("valid", data_dir=DATA)[:16])] * batch, device=device)  # (B, 16)
    fns = {"uncached": lambda: model.generate(prompt, args.new_tokens, top_k=1, use_cache=False),
           "cached": lambda: model.generate(prompt, args.new_tokens, top_k=1, use_cache=True)}
    identical = bool(torch.equal(fns["uncached"](), fns["cached"]()))
    timings = time_side_by_side(fns, device, repeats=args.repeats or (2 if args.quick else 5), warmup=args.warmup)
    speedup = timings["uncached"]["median_s"] / timings["cached"]["median_s"]
    print(f"batch {batch}: identical {identical}, speed-up {speedup:.2f}x", flush=True)
    return dict(batch=batch, new_tokens=args.new_tokens, prompt_len=16, identical=identical, timings=timings,
                speedup=speedup, config=vars(model.config))


def markdown(results) -> str:
    lines = []
    for r in results:
        t = r["timings"]
        lines.append(f"## Greedy generation of {r['new_tokens']} new tokens after a 16-character prompt, "
                     f"batch {r['batch']}, fp32\n")
        lines.append("Model: `GPTConfig.course(70, max_len=512)` with random weights (C 128, 4 heads, 4 blocks, "
                     f"d_ff 512); outputs identical with and without the cache: **{r['identical']}**.\n")
        rows = [[name, fmt_ms(t[name]["median_s"]), fmt_ms(t[name]["min_s"]), fmt_ms(t[name]["max_s"]),
                 t[name]["blocks"], f"{r['batch'] * r['new_tokens'] / t[name]['median_s']:.0f}"]
                for name in ("uncached", "cached")]
        lines.append(markdown_table(["generate", "median ms", "min ms", "max ms", "runs", "tokens/s"], rows))
        lines.append(f"\nSpeed-up of the KV cache (median uncached / median cached): **{fmt_ratio(r['speedup'])}**.\n")
    return "\n".join(lines)


def main(argv=None) -> dict:
    args, device = parse(argv)
    if args.quick:
        args.new_tokens = min(args.new_tokens, 32)
    if not 1 <= args.new_tokens <= 512 - 16:
        raise SystemExit(f"--new-tokens must lie in [1, 496] (context 512, prompt 16), got {args.new_tokens}")
    args.batches = args.batches or ([1] if args.quick else [1, 8])
    env = announce("GPT generation benchmark", device)
    results = [compare(args, device, b) for b in args.batches]
    body = markdown(results)
    print(body)
    payload = dict(benchmark="gpt", environment=env, settings=vars(args), results=results)
    save("gpt", device, payload, body, args)
    return payload


if __name__ == "__main__":
    main(sys.argv[1:])
