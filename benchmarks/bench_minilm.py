"""Lesson 11's all-MiniLM-L6-v2 on the course's modules: sentence embeddings per second, and where the time goes.

For each batch size, three contestants timed side by side on the same sentences: the tokenizer
alone (``WordPieceTokenizer.__call__``, plain Python on the CPU), the model alone on the
already-tokenized batch (``MiniLM.forward`` on the device), and the whole of
``sentence_embeddings`` (tokenize, run the model, mean-pool, normalise) with the batch as one
call. The model's output is first checked against the float32 embeddings of the same sentences on
the CPU. Sentences per second = batch size / median seconds of one call.

    python benchmarks/bench_minilm.py              # CPU: batch 1, 16, 64 in fp32; CUDA: 1 ... 1024, fp32 and bf16
                                                   # (fp16 in place of bf16 on a GPU without it: T4, V100)
    python benchmarks/bench_minilm.py --quick      # batch 1 and 8, few repeats
    python benchmarks/bench_minilm.py --batches 32 --dtypes bf16
"""

from __future__ import annotations

import argparse
import sys

import torch
from common import (
    DTYPES,
    add_repeat_args,
    announce,
    command_line,
    fmt_ms,
    markdown_table,
    measure_contestants,
    native_dtypes,
    save,
    stand_in_note,
)

from helpers.pretrained import load_minilm, sentence_embeddings

# Sentences of everyday lengths, repeated to fill a batch (their token counts are measured and recorded).
SENTENCES = [
    "The train to the coast leaves at nine.",
    "She fixed the bicycle with a borrowed spanner and a lot of patience.",
    "Prices rose again last month.",
    "A heron stood in the shallow water, waiting for a fish to come close enough.",
    "Our team meets on Tuesdays.",
    "The museum reopened after two years of repairs to its glass roof.",
    "Can you recommend a good book about the history of mathematics?",
    "Rain is expected in the north by the afternoon, spreading south overnight.",
    "He forgot his umbrella.",
    "The recipe needs three eggs, a cup of flour and a pinch of salt.",
    "Volunteers planted four hundred trees along the river last weekend.",
    "Where is the nearest pharmacy?",
    "The orchestra tuned their instruments while the audience found their seats.",
    "Solar panels on the school roof now supply most of its electricity.",
    "My phone battery dies before lunch.",
    "After the storm, the fishermen checked every net and mended the torn ones before dawn.",
]


def texts(n: int) -> list[str]:
    return [SENTENCES[i % len(SENTENCES)] for i in range(n)]


def contestants(model, tokenizer, embed, batch_texts: list[str], device) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """({name: fn()} of the three contestants on ``batch_texts``, the tokenized ids (B, L), the mask (B, L))."""
    ids, mask = tokenizer(batch_texts)  # (B, L), padded to the longest sentence
    ids_d, mask_d = ids.to(device), mask.to(device)

    def model_only():
        with torch.no_grad():
            return model(ids_d, mask_d)

    def end_to_end():
        with torch.no_grad():
            return embed(model, tokenizer, batch_texts, batch_size=len(batch_texts))

    return {"tokenize": lambda: tokenizer(batch_texts), "model": model_only, "end_to_end": end_to_end}, ids, mask


def run(args, device) -> tuple[list[dict], str | None]:
    try:
        reference_model, tokenizer = load_minilm(torch.float32, device="cpu")
    except (ImportError, FileNotFoundError, ValueError) as err:  # the model package is missing, or its sha256 differs
        return [], f"{type(err).__name__}: {str(err).splitlines()[0]}"
    with torch.no_grad():
        reference = sentence_embeddings(reference_model, tokenizer, SENTENCES)  # (16, 384), fp32 on the CPU
    lengths = tokenizer(SENTENCES)[1].sum(dim=1)  # tokens per sentence, [CLS] and [SEP] included
    rows = []
    for dtype_name, in_place_of in native_dtypes(args.dtypes, device):  # fp16 for bf16 on a T4 or V100
        dtype = DTYPES[dtype_name]
        model, _ = load_minilm(dtype, device=device)
        with torch.no_grad():
            got = sentence_embeddings(model, tokenizer, SENTENCES).float().cpu()
        diff = (got - reference).abs().max().item()
        tol = 1e-4 if dtype == torch.float32 else 3e-2  # unit vectors: half precision keeps 2-3 digits
        if diff > tol:
            raise AssertionError(f"{dtype_name} embeddings on {device} differ from fp32 on the CPU by {diff:.2g} "
                                 f"> {tol}")
        for batch in args.batches:
            batch_texts = texts(batch)
            fns, ids, mask = contestants(model, tokenizer, sentence_embeddings, batch_texts, device)
            t, mem, skipped = measure_contestants(fns, device, repeats=args.repeats, warmup=args.warmup)
            for name, why in skipped.items():
                print(f"skip {name} at batch {batch} {dtype_name}: {why}", flush=True)
            med = {n: (t[n]["median_s"] if n in t else None) for n in fns}
            row = dict(dtype=dtype_name, in_place_of=in_place_of, batch=batch, tokens=int(mask.sum()),
                       padded_length=ids.shape[1],
                       sentence_tokens=(int(lengths.min()), int(lengths.max())),
                       max_abs_diff=diff, timings=t, peak_bytes=mem, skipped=skipped,
                       **{f"{n}_s": s for n, s in med.items()},
                       sentences_per_s=(batch / med["end_to_end"]) if med["end_to_end"] else None,
                       tokenize_share=(med["tokenize"] / med["end_to_end"])
                       if med["end_to_end"] and med["tokenize"] else None)
            rows.append(row)
            print(f"{dtype_name} batch {batch:5}: tokenize {fmt_ms(med['tokenize'])} ms, model "
                  f"{fmt_ms(med['model'])} ms, end to end {fmt_ms(med['end_to_end'])} ms = "
                  f"{fmt_rate(row['sentences_per_s'])} sentences/s", flush=True)
    return rows, None


def fmt_rate(x) -> str:
    return "-" if x is None else f"{x:,.0f}"


def markdown(rows, missing: str | None) -> str:
    if missing:
        return f"Not run: the model could not be loaded ({missing})."
    if not rows:
        return "No rows."
    head = ("## all-MiniLM-L6-v2 on the course's modules: sentence embeddings per second\n\n"
            "`tokenize` = the WordPiece tokenizer on the batch (Python, CPU); `model` = MiniLM.forward on the "
            "tokenized batch; `end to end` = sentence_embeddings with the whole batch in one call. "
            f"Sentences of {rows[0]['sentence_tokens'][0]}-{rows[0]['sentence_tokens'][1]} tokens "
            f"({len(SENTENCES)} distinct, repeated); |diff| is the largest difference "
            "of the embeddings from fp32 on the CPU.\n\n")
    table = markdown_table(
        ["dtype", "batch", "real tokens", "padded length", "tokenize ms", "model ms", "end to end ms",
         "sentences/s", "tokenize share", "max abs diff"],
        [[r["dtype"], r["batch"], r["tokens"], r["padded_length"], fmt_ms(r["tokenize_s"]), fmt_ms(r["model_s"]),
          fmt_ms(r["end_to_end_s"]), fmt_rate(r["sentences_per_s"]),
          "-" if r["tokenize_share"] is None else f"{r['tokenize_share']:.0%}", f"{r['max_abs_diff']:.1e}"]
         for r in rows])
    return head + table + ("\n\n" + stand_in_note(rows) if stand_in_note(rows) else "")


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batches", type=int, nargs="+", help="batch sizes (sentences per call)")
    p.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES), default=None,
                   help="default: fp32 on CPU, fp32 and bf16 on CUDA")
    add_repeat_args(p, warmup=1)
    return command_line(p, argv)


def main(argv=None) -> dict:
    args, device = parse(argv)
    cuda = device.type == "cuda"
    if args.batches is None:
        args.batches = [1, 8] if args.quick else ([1, 64, 256, 1024] if cuda else [1, 16, 64])
    if any(b < 1 for b in args.batches):
        raise SystemExit(f"--batches must be positive, got {args.batches}")
    args.dtypes = args.dtypes or (["fp32", "bf16"] if cuda else ["fp32"])
    args.repeats = args.repeats or (3 if args.quick else 7)
    env = announce("MiniLM sentence-embedding benchmark", device)
    rows, missing = run(args, device)
    if missing:
        print(f"not run: {missing}", flush=True)
    payload = dict(benchmark="minilm", environment=env, settings=vars(args), rows=rows, not_run=missing)
    save("minilm", device, payload, markdown(rows, missing), args)
    return payload


if __name__ == "__main__":
    main(sys.argv[1:])
