"""Greedy decoding with and without a KV cache: the lesson-08 model, 256 generated tokens, batch 1 and 64.

The model has lesson 08's sizes (``TransformerConfig.dates``, max_len 512) and the date task's
vocabularies, but random weights: speed and equality of the outputs do not depend on training.
So that every run produces exactly the requested number of tokens, the bias of the
end-of-sequence logit is set to -1e4 (it can never be the argmax). The decoders run on the same
source, and their ids are compared before anything is timed: where they differ (a near-tie
between two logits can fall either way on a GPU), the first difference is recorded and the timing
goes on. On CUDA the cached decoder runs twice: replaying its step as a CUDA graph (the default
there) and without the graph.

A second table times one cached step at batch 1 against the model width d_model: while the
matrices are small, the time per step hardly depends on the width (the step is bound by the
fixed cost of launching a few dozen small operations), until the arithmetic takes over.

    python benchmarks/bench_kv_cache.py                  # 256 tokens, batch 1 and 64, width sweep
    python benchmarks/bench_kv_cache.py --quick          # 32 tokens, batch 1 and 4
    python benchmarks/bench_kv_cache.py --new-tokens 128 --batches 8 --dtype bf16
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from common import (
    DTYPES,
    add_repeat_args,
    announce,
    command_line,
    fmt_ms,
    fmt_ratio,
    markdown_table,
    measure_contestants,
    save,
)

from helpers.data import char_vocabs, load_dates
from helpers.transformer import Transformer, TransformerConfig, greedy_decode, greedy_decode_cached

DATA = Path(__file__).resolve().parents[1] / "data"


def build(args, device, batch, **sizes):
    """The random-weight lesson-08 model (sizes overridable), a batch of real date strings, the special ids."""
    pairs = load_dates("train", data_dir=DATA)
    src_vocab, tgt_vocab = char_vocabs(pairs)
    torch.manual_seed(args.seed)
    config = TransformerConfig.dates(len(src_vocab), len(tgt_vocab), **sizes)
    model = Transformer(config)
    with torch.no_grad():
        model.head.bias[tgt_vocab.eos_id] = -1e4  # never stop early: exactly new_tokens tokens
    model = model.to(device=device, dtype=DTYPES[args.dtype]).eval()
    test = [source for source, _ in load_dates("test", data_dir=DATA)]
    texts = [test[i % len(test)] for i in range(batch)]
    src = src_vocab.batch(texts).to(device)  # (B, S)
    return model, src, tgt_vocab.bos_id, tgt_vocab.eos_id, config


def decoders(model, src, bos, eos, max_len, device) -> dict:
    fns = {"uncached": lambda: greedy_decode(model, src, bos, eos, max_len),
           "cached": lambda: greedy_decode_cached(model, src, bos, eos, max_len)}
    if device.type == "cuda":
        fns["cached_no_graph"] = lambda: greedy_decode_cached(model, src, bos, eos, max_len, cuda_graph=False)
    return fns


def first_divergence(ids, reference) -> dict | None:
    """Where ``ids`` first differ from ``reference`` (both (B, max_len)); None where they are equal.

    {row, position}: the earliest position in any row, then the lowest row; ``rows_differing`` counts
    the rows that differ anywhere.
    """
    if ids.shape != reference.shape:
        return {"shape": list(ids.shape), "expected_shape": list(reference.shape)}
    differs = ids != reference  # (B, max_len)
    if not differs.any():
        return None
    row, position = min(differs.nonzero().tolist(), key=lambda rp: (rp[1], rp[0]))
    return {"row": row, "position": position, "rows_differing": int(differs.any(dim=1).sum())}


def compare(args, device, batch) -> dict:
    model, src, bos, eos, config = build(args, device, batch)
    max_len = args.new_tokens + 1  # BOS + the generated tokens
    fns = decoders(model, src, bos, eos, max_len, device)
    outputs = {name: fn() for name, fn in fns.items()}
    if outputs["uncached"].shape != (batch, max_len):
        raise AssertionError(f"expected {max_len} ids per row, got shape {tuple(outputs['uncached'].shape)}")
    # Equal ids are asserted on the CPU by tests/test_decoding.py and tests/test_kv_cache.py. Here, on a GPU, a
    # near-tie between two logits can fall the other way when the cached and uncached steps reduce in
    # different orders, and one different token changes the rest of its row: report where, and go on timing.
    divergence = {name: d for name, out in outputs.items() if (d := first_divergence(out, outputs["uncached"]))}
    for name, d in divergence.items():
        print(f"batch {batch}: {name}'s ids differ from greedy_decode's, first at {d}", flush=True)
    del outputs
    repeats = args.repeats or (3 if args.quick or batch > 8 else 5)
    t, mem, skipped = measure_contestants(fns, device, repeats=repeats, warmup=args.warmup, min_block_s=0.0)
    r = dict(config={k: getattr(config, k) for k in config.__dataclass_fields__}, batch=batch,
             src_len=src.shape[1], new_tokens=args.new_tokens, dtype=args.dtype,
             identical_outputs=not divergence, divergence=divergence, timings=t, peak_bytes=mem, skipped=skipped)
    r["tokens_per_s"] = {n: batch * args.new_tokens / t[n]["median_s"] for n in t}
    r["speedup"] = t["uncached"]["median_s"] / t["cached"]["median_s"] if {"uncached", "cached"} <= set(t) else None
    return r


def outputs_sentence(r) -> str:
    """'outputs identical.', or where each decoder's ids first differ from greedy_decode's."""
    if r["identical_outputs"]:
        return "outputs identical."
    where = "; ".join(f"{name} from row {d['row']}, position {d['position']} ({d['rows_differing']} rows differ)"
                      if "row" in d else f"{name} has shape {d['shape']}, not {d['expected_shape']}"
                      for name, d in r["divergence"].items())
    return (f"**outputs differ** from greedy_decode's: {where} (a near-tie between two logits, decided "
            "differently by a different order of summation, changes the rest of its row).")


def width_sweep(args, device) -> list[dict]:
    """Median seconds per cached step at batch 1 against d_model (4 heads, d_ff = 2 * d_model)."""
    rows = []
    steps = min(args.new_tokens, 64)
    for width in args.widths:
        model, src, bos, eos, config = build(args, device, 1, d_model=width, d_ff=2 * width)
        fns = {"cached": lambda m=model, s=src, b=bos, e=eos: greedy_decode_cached(m, s, b, e, steps + 1)}
        t, _, skipped = measure_contestants(fns, device, repeats=args.repeats or 5, warmup=1, min_block_s=0.0)
        if "cached" not in t:
            rows.append(dict(d_model=width, skipped=skipped))
            continue
        per_step = t["cached"]["median_s"] / steps
        # multiply-adds of one step: every decoder weight once (the memory's keys/values are precomputed)
        # plus attention over the cache and the source; 2 FLOPs each
        dec_params = sum(p.numel() for p in model.decoder.layers.parameters()) + model.head.weight.numel()
        flops = 2 * dec_params
        rows.append(dict(d_model=width, step_s=per_step, steps=steps, flops_per_step=flops,
                         gflops=flops / per_step / 1e9, timing=t["cached"]))
        print(f"d_model {width:5}: {per_step * 1e6:9.1f} us per step, {flops / 1e6:8.2f} MFLOP, "
              f"{flops / per_step / 1e9:7.2f} GFLOP/s", flush=True)
    return rows


def markdown(results, widths) -> str:
    parts = []
    for r in results:
        c = r["config"]
        parts.append(
            f"## Greedy decoding of {r['new_tokens']} tokens, batch {r['batch']}, source length {r['src_len']}, "
            f"{r['dtype']}\n\nModel: lesson-08 sizes with random weights (d_model {c['d_model']}, "
            f"{c['n_heads']} heads, d_ff {c['d_ff']}, {c['n_encoder_layers']}+{c['n_decoder_layers']} layers, "
            f"max_len {c['max_len']}); end-of-sequence disabled so that all produce exactly {r['new_tokens']} "
            "tokens; " + outputs_sentence(r) + "\n")
        parts.append(markdown_table(
            ["decoder", "median s", "min s", "max s", "runs", "tokens/s", "peak MiB"],
            [[name, f"{tm['median_s']:.3f}", f"{tm['min_s']:.3f}", f"{tm['max_s']:.3f}", tm["blocks"],
              f"{r['tokens_per_s'][name]:.1f}", f"{r['peak_bytes'][name] / 2**20:.1f}"]
             for name, tm in r["timings"].items()]))
        if r["speedup"]:
            parts.append(f"\nSpeed-up of the KV cache (median uncached / median cached): "
                         f"**{fmt_ratio(r['speedup'])}** ({fmt_ms(r['timings']['uncached']['median_s'])} ms vs "
                         f"{fmt_ms(r['timings']['cached']['median_s'])} ms).\n")
        for name, why in r["skipped"].items():
            parts.append(f"\n{name} skipped: {why}\n")
    if widths:
        parts.append("## Time per cached step against the model width, batch 1\n\nd_model varies (4 heads, "
                     "d_ff = 2 d_model, 2+2 layers); MFLOP counts 2 per weight of the decoder layers and the "
                     "output layer (what one step multiplies by).\n")
        parts.append(markdown_table(
            ["d_model", "us per step", "MFLOP per step", "GFLOP/s"],
            [[w["d_model"], f"{w['step_s'] * 1e6:.1f}", f"{w['flops_per_step'] / 1e6:.2f}", f"{w['gflops']:.2f}"]
             if "step_s" in w else [w["d_model"], "skipped", "-", "-"] for w in widths]))
    return "\n".join(parts)


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--batches", type=int, nargs="+", default=None, help="default: 1 and 64 (quick: 1 and 4)")
    p.add_argument("--widths", type=int, nargs="*", default=None,
                   help="d_model values of the per-step sweep (default 32 ... 1024; none to skip)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    add_repeat_args(p, "runs of each decoder, interleaved (median)", warmup=1)
    p.add_argument("--seed", type=int, default=0)
    return command_line(p, argv, "32 tokens, batches 1 and 4, 3 runs: a smoke test")


def main(argv=None) -> dict:
    args, device = parse(argv)
    if args.quick:
        args.new_tokens = min(args.new_tokens, 32)
    if not 1 <= args.new_tokens <= 511:
        raise SystemExit(f"--new-tokens must lie in [1, 511] (max_len 512 holds BOS too), got {args.new_tokens}")
    args.batches = args.batches or ([1, 4] if args.quick else [1, 64])
    if args.widths is None:
        args.widths = [32, 64, 128] if args.quick else [32, 64, 128, 256, 512, 1024]
    env = announce("KV-cache benchmark", device)
    results = [compare(args, device, b) for b in args.batches]
    print(markdown(results, []), flush=True)
    widths = width_sweep(args, device) if args.widths else []
    body = markdown(results, widths)
    print(body)
    payload = dict(benchmark="kv_cache", environment=env, settings=vars(args), results=results, widths=widths)
    save("kv_cache", device, payload, body, args)
    return payload


if __name__ == "__main__":
    main(sys.argv[1:])
