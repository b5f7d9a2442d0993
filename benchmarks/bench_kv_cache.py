"""Greedy decoding with and without a KV cache: the lesson-08 model, 256 generated tokens.

The model has the lesson-08 sizes (helpers.scale.lesson08_config, max_len 512) and the date
task's vocabularies, but random weights: speed and equality of the outputs do not depend on
training. So that every run produces exactly the requested number of tokens, the bias of the
end-of-sequence logit is set to -1e4 (it can never be the argmax). Both decoders run on the same
source and must return identical ids before anything is timed.

    python benchmarks/bench_kv_cache.py                  # 256 tokens, batch 1
    python benchmarks/bench_kv_cache.py --quick          # 32 tokens
    python benchmarks/bench_kv_cache.py --new-tokens 128 --batch 8 --dtype bf16
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from common import (
    DTYPES,
    add_common_args,
    environment,
    fmt_ms,
    fmt_ratio,
    markdown_table,
    start,
    time_side_by_side,
    write_results,
)

from helpers.data import char_vocabs, load_dates
from helpers.device import peak_memory
from helpers.scale import greedy_decode_cached, lesson08_config
from helpers.transformer import Transformer, greedy_decode

DATA = Path(__file__).resolve().parents[1] / "data"


def build(args, device):
    """The random-weight lesson-08 model, a batch of real date strings, and the special ids."""
    pairs = load_dates("train", data_dir=DATA)
    src_vocab, tgt_vocab = char_vocabs(pairs)
    torch.manual_seed(args.seed)
    config = lesson08_config(len(src_vocab), len(tgt_vocab), max_len=512)
    model = Transformer(config)
    with torch.no_grad():
        model.generator.bias[tgt_vocab.eos_id] = -1e4  # never stop early: exactly new_tokens tokens
    model = model.to(device=device, dtype=DTYPES[args.dtype]).eval()
    texts = [source for source, _ in load_dates("test", data_dir=DATA)[: args.batch]]
    src = src_vocab.batch(texts).to(device)  # (B, S)
    return model, src, tgt_vocab.bos_id, tgt_vocab.eos_id, config


def run(args, device) -> dict:
    model, src, bos, eos, config = build(args, device)
    max_len = args.new_tokens + 1  # BOS + the generated tokens
    fns = {"uncached": lambda: greedy_decode(model, src, bos, eos, max_len),
           "cached": lambda: greedy_decode_cached(model, src, bos, eos, max_len)}
    outputs = {name: fn() for name, fn in fns.items()}
    if outputs["uncached"].shape != (src.shape[0], max_len):
        raise AssertionError(f"expected {max_len} ids per row, got shape {tuple(outputs['uncached'].shape)}")
    if not torch.equal(outputs["uncached"], outputs["cached"]):
        raise AssertionError("the cached decoder's ids differ from greedy_decode's")
    t = time_side_by_side(fns, device, repeats=args.repeats, warmup=args.warmup, min_block_s=0.0)
    mem = {name: peak_memory(fn, device=device) for name, fn in fns.items()}
    result = dict(config={k: getattr(config, k) for k in config.__dataclass_fields__}, batch=src.shape[0],
                  src_len=src.shape[1], new_tokens=args.new_tokens, dtype=args.dtype, identical_outputs=True,
                  timings=t, peak_bytes=mem,
                  uncached_s=t["uncached"]["median_s"], cached_s=t["cached"]["median_s"])
    result["speedup"] = result["uncached_s"] / result["cached_s"]
    result["tokens_per_s"] = {n: src.shape[0] * args.new_tokens / t[n]["median_s"] for n in fns}
    return result


def markdown(r) -> str:
    c = r["config"]
    head = (f"## Greedy decoding of {r['new_tokens']} tokens, batch {r['batch']}, source length {r['src_len']}, "
            f"{r['dtype']}\n\nModel: lesson-08 sizes with random weights (d_model {c['d_model']}, {c['n_heads']} "
            f"heads, d_ff {c['d_ff']}, {c['n_encoder_layers']}+{c['n_decoder_layers']} layers, max_len "
            f"{c['max_len']}); end-of-sequence disabled so that both produce exactly {r['new_tokens']} tokens; "
            "outputs identical.\n\n")
    table = markdown_table(
        ["decoder", "median s", "min s", "max s", "runs", "tokens/s", "peak MiB"],
        [[name, f"{r['timings'][name]['median_s']:.3f}", f"{r['timings'][name]['min_s']:.3f}",
          f"{r['timings'][name]['max_s']:.3f}", r["timings"][name]["blocks"], f"{r['tokens_per_s'][name]:.1f}",
          f"{r['peak_bytes'][name] / 2**20:.1f}"] for name in ("uncached", "cached")])
    return (head + table + f"\n\nSpeed-up of the KV cache (median uncached / median cached): "
            f"**{fmt_ratio(r['speedup'])}** ({fmt_ms(r['uncached_s'])} ms vs {fmt_ms(r['cached_s'])} ms).")


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    p.add_argument("--repeats", type=int, default=None, help="runs of each decoder, interleaved (median)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    add_common_args(p, "32 tokens, 3 runs: a smoke test")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse(argv)
    device = start(args)
    if args.quick:
        args.new_tokens = min(args.new_tokens, 32)
    if not 1 <= args.new_tokens <= 511:
        raise SystemExit(f"--new-tokens must lie in [1, 511] (max_len 512 holds BOS too), got {args.new_tokens}")
    args.repeats = args.repeats or (3 if args.quick else 5)
    env = environment(device)
    print(f"KV-cache benchmark on {env['device_name']} ({device}), torch {env['torch']}", flush=True)
    result = run(args, device)
    print(markdown(result))
    payload = dict(benchmark="kv_cache", environment=env, settings=vars(args), result=result)
    if not args.no_write:
        for path in write_results("kv_cache", device, payload, markdown(result), args.tag):
            print("wrote", path)
    return payload


if __name__ == "__main__":
    main(sys.argv[1:])
