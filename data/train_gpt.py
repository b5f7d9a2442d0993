"""Train the course's GPT on data/shakespeare.txt; write data/gpt_shakespeare.pt and its training log (lesson 12).

The one home of the recipe: every number below is the default of a command-line option, and the log
(data/gpt_shakespeare_log.json) records the values a run used, so lesson 12 can train with them.

One process (from the repository root):      python data/train_gpt.py            (or `make train-gpt`)
N processes on one machine, one per GPU or on CPU cores:
                                             torchrun --nproc_per_node=N data/train_gpt.py
Several machines: the same command on each, with torchrun's --nnodes, --node_rank and --rdzv_endpoint.

With N processes each step's global batch (--batch-size windows) is drawn exactly as one process draws
it and split N ways; DistributedDataParallel averages the N gradients, so the run follows the same
recipe as one process (gloo on CPU, NCCL on CUDA GPUs). Without dropout the N processes reach one
process's weights, to float rounding; with dropout each process draws its own masks, so the two runs
agree in distribution, not bit for bit. Deterministic for a given machine, torch build and process
count: the seed fixes the initial weights, every batch and every dropout mask. The log holds train and valid
bits per character every --log-every steps (on fixed, evenly spaced windows of each split), then the
final figures on the whole valid split and, once, on the whole test split.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from dataclasses import asdict
from pathlib import Path

import torch

from helpers.data import Vocab, load_text
from helpers.gpt import CHECKPOINT, GPT, GPTConfig, save_checkpoint
from helpers.lm import LOG_FILE, bits_per_char, cosine_factor, parameter_count, spaced_windows, train_lm, window_bits

# The recipe of the committed checkpoint. Model: GPTConfig.course's shape (C 128, 4 heads, 4 blocks, d_ff 512,
# context 128), about 0.8M parameters, dropout 0.1 on the embeddings and on each residual branch. 6,000 steps of
# 32 x 128 characters are about 20 passes over the training text. Two CPU threads, the 2-core machine's both
# cores: 1,549 s of training there (about 0.26 s a step), 2.195 bits per character on the whole valid split and
# 2.243 on test.
#
# Tried on the way (the same machine, 2 threads):
# - no dropout, 6,400 steps (1,427 s): whole valid 2.239, test 2.281. Its valid windows stopped improving after
#   step ~4,800 (2.17) while its train windows fell on to 1.63: it memorised.
# - dropout 0.1 also on the attention weights and inside the feed-forward, 4,300 steps (1,592 s; each step about
#   1.5 times as slow as without dropout): whole valid 2.271, test 2.302. Dropout on the attention weights takes
#   PyTorch's CPU attention off its fused kernel, and the feed-forward's hidden layer is 4 times as wide as the
#   stream, so those two cost most of the time; the GPT now drops out only where nanoGPT does.
RECIPE = dict(
    seed=1234,  # initial weights and every batch
    d_model=128, n_heads=4, n_layers=4, d_ff=512, max_len=128, dropout=0.1,
    steps=6000,  # about 20 passes over the training text at 32 x 128 characters a step
    batch_size=32,  # windows of max_len characters per step, over all processes together
    lr=3e-3, warmup=100, lr_floor=0.1,  # AdamW; linear warm-up, then cosine decay to lr * lr_floor
    weight_decay=0.1, beta2=0.99,
    clip=1.0,  # gradient norm
    log_every=50,  # steps between log entries: lesson 12's live run, a few hundred steps, meets several
    log_windows=64,  # evenly spaced windows of each split scored for the log (8,192 characters each)
)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in RECIPE.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default)
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads per process (2: the course "
                        "machine's cores; the thread count changes the rounding, so the checkpoint's sha256 "
                        "holds for the count it was made with)")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda under torchrun with GPUs, "
                                                       "else cpu)")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / CHECKPOINT))
    parser.add_argument("--log-file", default=None, help=f"training log (default: {LOG_FILE} beside --out)")
    parser.add_argument("--no-test", action="store_true", help="skip the final scores on the whole valid and "
                                                              "test splits (for quick trial runs)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--stop-after", type=int, default=None, help="stop after this many steps of the recipe, "
                        "leaving OUT.resume to go on from (a trial run, or a run split over several sittings)")
    parser.add_argument("--resume", action="store_true", help="go on from the state saved at the last log entry "
                        "(OUT.resume, written by a run that was stopped); the same recipe options are needed")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    recipe = {name: getattr(args, name) for name in RECIPE}
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = args.device == "cuda" or (args.device is None and world_size > 1 and torch.cuda.is_available())
    device = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")
    torch.set_num_threads(args.threads)
    if world_size > 1:
        import torch.distributed as dist

        if use_cuda:
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if use_cuda else "gloo")

    train_text = load_text("train")
    vocab = Vocab(train_text)
    train_ids = torch.tensor(vocab.encode(train_text))
    valid_ids = torch.tensor(vocab.encode(load_text("valid")))
    torch.manual_seed(args.seed)  # the same initial weights on every process
    config = GPTConfig(len(vocab), d_model=args.d_model, n_heads=args.n_heads, n_layers=args.n_layers,
                       d_ff=args.d_ff, max_len=args.max_len, dropout=args.dropout)
    model = GPT(config).to(device)
    if world_size > 1:  # dropout's masks: each process its own stream (one stream would repeat a mask N times)
        torch.manual_seed(args.seed + 1 + rank)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, args.beta2),
                                  weight_decay=args.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: cosine_factor(step, args.steps, args.warmup, args.lr_floor))
    batches = torch.Generator().manual_seed(args.seed)
    log_sets = {split: spaced_windows(ids, args.max_len, args.log_windows)
                for split, ids in (("train", train_ids), ("valid", valid_ids))}

    def evaluate(m):
        if rank != 0:
            return {}
        return {f"{split}_bits": window_bits(m, x, y) for split, (x, y) in log_sets.items()}

    out = Path(args.out)
    state_path = out.with_name(out.name + ".resume")
    start_step, log, seconds_before = 0, [], 0.0
    if args.resume:
        state = torch.load(state_path, map_location=device, weights_only=False)
        if state["recipe"] != recipe or state["processes"] != world_size:
            raise SystemExit(f"{state_path} was saved by another recipe or process count: {state['recipe']}, "
                             f"{state['processes']} process(es)")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        batches.set_state(state["batches"])
        torch.set_rng_state(state["torch_rng"])
        start_step, log, seconds_before = state["step"], state["log"], state["seconds"]
        print(f"resuming {state_path} at step {start_step}", flush=True)

    def save_state(step, log_so_far):
        if rank != 0:
            return
        entry = log_so_far[-1]
        print(f"\nstep {step}: train windows {entry['train_bits']:.3f}, valid windows {entry['valid_bits']:.3f} "
              f"bits per character, {entry['seconds']:.0f} s", flush=True)
        torch.save({"recipe": recipe, "processes": world_size, "step": step, "log": log_so_far,
                    "seconds": entry["seconds"], "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(), "batches": batches.get_state(),
                    "torch_rng": torch.get_rng_state()}, state_path)

    net = model
    if world_size > 1:
        from torch.nn.parallel import DistributedDataParallel

        net = DistributedDataParallel(model, device_ids=[local_rank] if use_cuda else None)
    start = time.perf_counter()
    end = args.steps if args.stop_after is None else min(args.stop_after, args.steps)
    log = train_lm(net, optimizer, scheduler, train_ids, end, args.batch_size, batches,
                   log_every=args.log_every, evaluate=evaluate, rank=rank, world_size=world_size, clip=args.clip,
                   progress=rank == 0 and not args.quiet, start_step=start_step, log=log, on_log=save_state,
                   seconds_offset=seconds_before)
    seconds = seconds_before + time.perf_counter() - start
    if world_size > 1:
        torch.distributed.destroy_process_group()
    if rank != 0:
        return
    if end < args.steps:
        print(f"stopped after step {end} of {args.steps}: go on with the same options and --resume ({state_path})")
        return

    sha = save_checkpoint(model, vocab, out)
    final = {}
    if not args.no_test:
        final["valid_bits"] = bits_per_char(model, valid_ids)  # the whole valid split
        final["test_bits"] = bits_per_char(model, torch.tensor(vocab.encode(load_text("test"))))  # once, at the end
    record = {
        "recipe": recipe,
        "config": asdict(config),
        "parameters": parameter_count(config),
        "processes": world_size, "threads_per_process": args.threads, "device": str(device.type),
        "torch": torch.__version__, "machine": platform.machine(),
        "train_seconds": round(seconds, 1),
        "log_windows": {"count": args.log_windows, "length": args.max_len,
                        "rule": "helpers.lm.spaced_windows of the train and valid splits"},
        "log": log,
        "final": final,
        "checkpoint_sha256": sha,
    }
    log_path = Path(args.log_file) if args.log_file else out.with_name(LOG_FILE)
    log_path.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    state_path.unlink(missing_ok=True)  # the run is complete: nothing to resume
    print(f"{args.steps} steps, {world_size} process(es) x {args.threads} thread(s) on {device.type}: "
          f"{seconds:.0f} s of training")
    for name, value in final.items():
        print(f"whole {name.split('_')[0]} split: {value:.4f} bits per character")
    print(f"{out}: {out.stat().st_size} bytes, sha256 {sha}")
    print(f"{log_path}: {log_path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
