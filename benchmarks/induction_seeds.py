"""The spread over seeds of lesson 13's claims: accuracy, phase change and ablations of attention-only models.

Lesson 13 trains three seeds of each depth; this script trains more, with the lesson's sizes and
steps (vocabulary 32, context 40, periods 5 to 20, C 32, 4 heads, AdamW 3e-3, batch 32, 700 steps),
and reports per seed: second-copy accuracy of the 1- and 2-layer models, the phase-change step, the
step where the in-context-learning score is halfway down, and second-copy accuracy with the induction
heads, the previous-token heads, or the least-scoring head ablated (heads picked by score > 0.2, as
in the lesson). It measures results, not time: it runs on one CPU thread.

    python benchmarks/induction_seeds.py               # seeds 0-9
    python benchmarks/induction_seeds.py --quick       # seeds 0-2, the lesson's own
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch
from common import command_line, environment, markdown_table, save

from helpers.heads import (
    AttentionOnlyConfig,
    copy_accuracy,
    induction_score,
    previous_token_score,
    probe_heads,
    repeated_tokens,
    train_copying,
)

V, T, PERIODS, STEPS, PROBE_PERIOD, THRESHOLD = 32, 40, (5, 20), 700, 10, 0.2


def first_step_over(history, key, level):
    return next((s for s, a in zip(history["step"], history[key], strict=True) if a > level), None)


def icl_half_step(history):
    half = (history["icl"][0] + history["icl"][-1]) / 2
    return next((s for s, v in zip(history["step"], history["icl"], strict=True) if v < half), None)


def ablations(model, test):
    probe, _ = repeated_tokens(64, T, V, PROBE_PERIOD, PROBE_PERIOD, generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), probe_heads(model) as weights:
        model(probe)
    prev = torch.stack([previous_token_score(w) for w in weights])  # (L, H)
    ind = torch.stack([induction_score(w, PROBE_PERIOD) for w in weights])
    H = prev.shape[1]
    sets = {"induction": [(1, h) for h in range(H) if ind[1, h] > THRESHOLD],
            "prev": [(0, h) for h in range(H) if prev[0, h] > THRESHOLD],
            "neither": [min(((layer, h) for layer in range(2) for h in range(H)),
                            key=lambda lh: max(prev[lh], ind[lh]))]}
    return {name: (heads, copy_accuracy(model, *test, ablate=heads)[1]) for name, heads in sets.items()}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=10, help="how many seeds, from 0 (default 10)")
    args, device = command_line(parser, argv, quick_help="seeds 0-2 only")
    seeds = range(3 if args.quick else args.seeds)
    test = repeated_tokens(512, T, V, *PERIODS, generator=torch.Generator().manual_seed(5))
    rows, records = [], []
    for seed in seeds:
        two, h2 = train_copying(AttentionOnlyConfig(V, 32, 4, 2, T), STEPS, lr=3e-3, periods=PERIODS, seed=seed,
                                progress=False)
        _, h1 = train_copying(AttentionOnlyConfig(V, 32, 4, 1, T), STEPS, lr=3e-3, periods=PERIODS, seed=seed,
                              progress=False)
        abl = ablations(two, test)
        rec = {"seed": seed, "two_layers": copy_accuracy(two, *test)[1], "one_layer": h1["second"][-1],
               "phase_step": first_step_over(h2, "second", 0.5), "icl_half_step": icl_half_step(h2),
               **{f"ablate_{k}": v[1] for k, v in abl.items()}, **{f"heads_{k}": v[0] for k, v in abl.items()}}
        records.append(rec)
        rows.append([seed, f"{rec['two_layers']:.2f}", f"{rec['one_layer']:.2f}", rec["phase_step"],
                     rec["icl_half_step"], f"{rec['ablate_induction']:.2f} ({len(abl['induction'][0])})",
                     f"{rec['ablate_prev']:.2f} ({len(abl['prev'][0])})", f"{rec['ablate_neither']:.2f}"])
        print(*rows[-1], flush=True)
    summary = {}
    for key in ("two_layers", "one_layer", "phase_step", "ablate_induction", "ablate_prev", "ablate_neither"):
        values = [r[key] for r in records if r[key] is not None]
        summary[key] = {"min": min(values), "median": statistics.median(values), "max": max(values)}
    header = ["seed", "2 layers", "1 layer", "phase step", "ICL half step", "ablate induction (n)",
              "ablate prev-token (n)", "ablate neither"]
    body = markdown_table(header, rows) + "\n\n" + markdown_table(
        ["quantity", "min", "median", "max"], [[k, *(f"{v[s]:.2f}" if isinstance(v[s], float) else v[s]
                                                      for s in ("min", "median", "max"))]
                                               for k, v in summary.items()])
    print(body)
    payload = {"environment": environment(device), "records": records, "summary": summary}
    save("induction_seeds", device, payload, body, args)
    return payload


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(sys.argv[1:])
