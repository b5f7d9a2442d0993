"""data/train_gpt.py: one process and two DistributedDataParallel processes (gloo, CPU) follow one recipe."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "data" / "train_gpt.py"
TINY = ["--d-model", "16", "--n-heads", "2", "--n-layers", "2", "--d-ff", "32", "--max-len", "32",
        "--steps", "6", "--warmup", "1", "--lr", "0.01", "--log-every", "3", "--log-windows", "8", "--no-test",
        "--quiet", "--threads", "1",
        "--dropout", "0.0"]  # dropout draws masks per process: only without it can the weights match exactly


def _run(tmp_path, name, processes, *extra):
    out = tmp_path / f"{name}.pt"
    log = tmp_path / f"{name}.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    if processes == 1:
        cmd = [sys.executable, str(SCRIPT)]
    else:  # torchrun's own module; --standalone picks a free port on this machine
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}",
               str(SCRIPT)]
    done = subprocess.run(cmd + TINY + ["--out", str(out), "--log-file", str(log), *extra], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.load(out, weights_only=True)["state_dict"], json.loads(log.read_text())


def _initial_weights():
    from helpers.data import Vocab, load_text
    from helpers.gpt import GPT, GPTConfig

    torch.manual_seed(1234)
    config = GPTConfig(len(Vocab(load_text("train"))), d_model=16, n_heads=2, n_layers=2, d_ff=32, max_len=32)
    return GPT(config).state_dict()


def _largest_difference(a, b):
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def test_two_ddp_processes_give_the_weights_of_one_process(tmp_path):
    one, log_one = _run(tmp_path, "one", 1, "--batch-size", "8")
    two, log_two = _run(tmp_path, "two", 2, "--batch-size", "8")
    moved = _largest_difference(one, _initial_weights())
    assert moved > 1e-2  # six steps at lr 0.01 move the weights well beyond the tolerance below
    assert _largest_difference(one, two) < 1e-5
    assert log_two["processes"] == 2 and log_one["processes"] == 1
    steps = [e["step"] for e in log_one["log"]]
    assert steps == [0, 3, 6] == [e["step"] for e in log_two["log"]]
    for a, b in zip(log_one["log"], log_two["log"], strict=True):
        assert a["valid_bits"] == pytest.approx(b["valid_bits"], abs=1e-4)
    # the same two processes on a different global batch are a different run: the test can tell
    other, _ = _run(tmp_path, "other", 2, "--batch-size", "4")
    assert _largest_difference(one, other) > 100 * _largest_difference(one, two)


def test_the_log_holds_the_recipe_and_falling_curves(tmp_path):
    _, log = _run(tmp_path, "log", 1, "--batch-size", "4")
    assert log["recipe"]["seed"] == 1234 and log["recipe"]["steps"] == 6 and log["recipe"]["batch_size"] == 4
    assert log["config"]["d_model"] == 16 and log["parameters"] > 0
    first, last = log["log"][0], log["log"][-1]
    assert "train_loss_bits" not in first and last["train_loss_bits"] > 0
    assert last["valid_bits"] < first["valid_bits"] and last["train_bits"] < first["train_bits"]
    assert log["final"] == {}  # --no-test: the whole splits are not scored


def test_batch_that_does_not_split_over_processes_is_refused(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(SCRIPT), *TINY, "--batch-size", "3", "--out", str(tmp_path / "x.pt")], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode != 0
    assert "batch_size=3 must split evenly over world_size=2" in done.stdout + done.stderr


def test_a_run_stopped_and_resumed_gives_the_weights_of_one_sitting(tmp_path):
    whole, _ = _run(tmp_path, "whole", 1, "--batch-size", "4")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out, log = tmp_path / "split.pt", tmp_path / "split.json"
    first = subprocess.run([sys.executable, str(SCRIPT), *TINY, "--batch-size", "4", "--out", str(out),
                            "--log-file", str(log), "--stop-after", "4"], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=240)
    assert first.returncode == 0 and not out.exists() and (tmp_path / "split.pt.resume").exists(), first.stderr
    split, split_log = _run(tmp_path, "split", 1, "--batch-size", "4", "--resume")
    assert _largest_difference(whole, split) == 0.0  # bit for bit: weights, optimizer, schedule and batches
    assert [e["step"] for e in split_log["log"]] == [0, 3, 4, 6]
    assert not (tmp_path / "split.pt.resume").exists()  # a finished run leaves nothing to resume
