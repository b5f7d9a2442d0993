"""The GPU half of the course in one command (`make gpu-check`): GPU unit tests, lessons, benchmarks.

On a machine with a CUDA GPU it runs, one after the other, each step in its own process with a time limit:

1. the unit tests that use CUDA, with COURSE_DEVICE=cuda (pytest);
2. lessons 09, 10 and 12 (and 13 where it exists) with COURSE_DEVICE=cuda under lax nbval
   (every cell runs and every assert holds; stored outputs, recorded on a CPU, are not compared);
3. the GPU benchmarks: SDPA's kernels (bench_attention.py --headline-only), multi-head attention
   (bench_mha.py), the KV cache eager and with CUDA graphs (bench_kv_cache.py), and lesson 10's Triton
   forward and backward against SDPA's flash kernel at CS336's configuration (bench_flash.py --cs336).

Everything it writes goes to benchmarks/results/ under names that end in _cuda (see benchmarks/README.md):
each benchmark's <name>_cuda.json and .md, the output of each step in gpu_check_<step>_cuda.log, and a
summary of the steps (command, exit status, seconds) in gpu_check_cuda.md and .json. The whole run is held
to a budget (--budget, 480 s by default: 8 minutes on one H100); a step that the budget no longer allows is
recorded as not run. Without a CUDA GPU it stops at once, runs nothing and writes nothing.

    python benchmarks/gpu_check.py                # everything (what `make gpu-check` runs)
    python benchmarks/gpu_check.py --plan         # print the steps and their commands, run nothing (any machine)
    python benchmarks/gpu_check.py --only tests lessons
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
LESSONS = ["09_attention_at_scale", "10_flash_attention", "12_gpt_from_scratch", "13_*"]
# the unit tests that use CUDA where COURSE_DEVICE=cuda (the device helpers, the kernels, the KV cache)
GPU_TESTS = ["tests/test_flash.py", "tests/test_decoding.py", "tests/test_kv_cache.py", "tests/test_device.py",
             "tests/test_sdpa_kernels.py"]
STEPS = ["tests", "lessons", "attention", "mha", "kv_cache", "flash_cs336"]
NO_CUDA = ("make gpu-check needs a CUDA GPU, and {why}. Nothing was run and nothing was written. "
           "Run it on a machine with an NVIDIA GPU and a CUDA build of PyTorch (benchmarks/README.md, "
           "\"The GPU half in one command\").")


def lesson_paths(root: Path = ROOT) -> list[str]:
    """The lesson notebooks of step 2 that exist here (lesson 13 only once it is written)."""
    found = []
    for pattern in LESSONS:
        found += sorted(p.relative_to(root).as_posix() for p in (root / "notebooks").glob(pattern + ".ipynb"))
    return found


def plan(python: str = sys.executable, root: Path = ROOT) -> list[dict]:
    """The steps: {name, what, command (a list), timeout_s, env (additions)}. Runs nothing."""
    bench = f"{root.as_posix()}/benchmarks"
    cuda = {"COURSE_DEVICE": "cuda"}
    xdist = ["-n", "4"] if importlib.util.find_spec("xdist") is not None else []
    tests = [t for t in GPU_TESTS if (root / t).exists()]
    return [
        dict(name="tests", what="the unit tests that use CUDA (COURSE_DEVICE=cuda)", timeout_s=240, env=cuda,
             command=[python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *xdist, *tests]),
        dict(name="lessons", what="lessons 09, 10, 12 (13 once written) on the GPU, lax nbval", timeout_s=240,
             env=cuda, command=[python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax",
                                "--nbval-current-env", *xdist, *(["--dist", "loadscope"] if xdist else []),
                                *lesson_paths(root)]),  # loadscope: a notebook's cells stay in one kernel
        dict(name="attention", what="SDPA's kernels against the naive attention, bf16, T=8192 (headline)",
             timeout_s=120, env={}, command=[python, f"{bench}/bench_attention.py", "--device", "cuda",
                                             "--headline-only"]),
        dict(name="mha", what="the course's MultiHeadAttention against torch's, bf16 forward", timeout_s=90,
             env={}, command=[python, f"{bench}/bench_mha.py", "--device", "cuda", "--sizes", "1024", "4096",
                              "--dtypes", "bf16", "--modes", "fwd"]),
        dict(name="kv_cache", what="greedy decoding: no cache, KV cache eager, KV cache with CUDA graphs",
             timeout_s=120, env={}, command=[python, f"{bench}/bench_kv_cache.py", "--device", "cuda",
                                             "--batches", "1", "64", "--widths", "64", "256", "1024"]),
        dict(name="flash_cs336", what="lesson 10's Triton forward + backward against SDPA, CS336's configuration",
             timeout_s=150, env={}, command=[python, f"{bench}/bench_flash.py", "--device", "cuda", "--cs336"]),
    ]


def cuda_refusal() -> str | None:
    """Why this machine cannot run the GPU check, or None where a CUDA GPU is there."""
    try:
        import torch
    except ImportError:
        return NO_CUDA.format(why="PyTorch is not installed for this Python")
    if not torch.cuda.is_available():
        build = f"a CUDA {torch.version.cuda} build" if torch.version.cuda else "a build without CUDA"
        return NO_CUDA.format(why=f"PyTorch {torch.__version__} ({build}) finds no CUDA GPU here")
    return None


def run_step(step: dict, seconds_left: float, log_path: Path, min_s: float = 10.0) -> dict:
    """Run one step with its output both shown and kept in log_path; its record for the summary.

    A step with less than ``min_s`` seconds left (of its own limit and the budget) is not started.
    """
    limit = min(step["timeout_s"], seconds_left)
    env = {**os.environ, **step["env"], "PYTHONPATH": os.pathsep.join(
        [ROOT.as_posix()] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))}
    record = dict(name=step["name"], what=step["what"], command=" ".join(step["command"]), limit_s=round(limit),
                  log=log_path.relative_to(ROOT).as_posix())
    if limit < min_s:
        record.update(status="not run: the budget is spent", rc=None, seconds=0.0)
        return record
    print(f"\n=== {step['name']}: {step['what']} (at most {limit:.0f} s) ===\n$ {record['command']}", flush=True)
    start = time.perf_counter()
    stopped = threading.Event()

    def stop():  # the time limit: end the step, even one that prints nothing
        stopped.set()
        process.kill()

    with log_path.open("w") as log:
        process = subprocess.Popen(step["command"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, bufsize=1)
        timer = threading.Timer(limit, stop)
        timer.start()
        try:
            for line in process.stdout:  # shown as it comes, and kept
                sys.stdout.write(line)
                log.write(line)
            process.wait()
        finally:
            timer.cancel()
        rc = process.returncode
        status = f"stopped after {limit:.0f} s" if stopped.is_set() else "passed" if rc == 0 else "failed"
        if stopped.is_set():
            log.write(f"\n[gpu_check] {status}\n")
    record.update(status=status, rc=rc, seconds=round(time.perf_counter() - start, 1))
    print(f"=== {step['name']}: {status} in {record['seconds']} s ===", flush=True)
    return record


def summary_markdown(records: list[dict], device: dict, total_s: float, budget_s: float) -> str:
    lines = [f"# make gpu-check on {device['name']}", "",
             f"torch {device['torch']}, CUDA {device['cuda']}, Python {platform.python_version()}, "
             f"{device['date_utc']}; {total_s:.0f} s of a {budget_s:.0f} s budget.", "",
             "| step | what | status | seconds | output |", "|---|---|---|---|---|"]
    lines += [f"| {r['name']} | {r['what']} | {r['status']} | {r['seconds']} | `{r['log']}` |" for r in records]
    lines += ["", "Commands:", ""] + [f"- {r['name']}: `{r['command']}`" for r in records]
    return "\n".join(lines) + "\n"


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", nargs="+", choices=STEPS, default=STEPS, help="run these steps only")
    p.add_argument("--budget", type=float, default=480.0, help="seconds for all steps together (default 480)")
    p.add_argument("--plan", action="store_true", help="print the steps and their commands, run nothing")
    p.add_argument("--python", default=sys.executable, help="the Python that runs each step")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    steps = [s for s in plan(args.python) if s["name"] in args.only]
    if args.plan:
        for s in steps:
            env = " ".join(f"{k}={v}" for k, v in s["env"].items())
            print(f"{s['name']:12} (at most {s['timeout_s']} s) {s['what']}\n    {env + ' ' if env else ''}"
                  f"{' '.join(s['command'])}")
        return 0
    why = cuda_refusal()
    if why:
        print(why, file=sys.stderr)
        return 2
    import torch

    device = dict(name=torch.cuda.get_device_name(0), torch=torch.__version__, cuda=torch.version.cuda,
                  date_utc=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    missing = [m for m in ("nbval", "nbclient", "ipykernel") if importlib.util.find_spec(m) is None]
    RESULTS.mkdir(parents=True, exist_ok=True)
    start, records = time.perf_counter(), []
    for step in steps:
        if step["name"] == "lessons" and missing:
            records.append(dict(name="lessons", what=step["what"], command=" ".join(step["command"]), rc=None,
                                seconds=0.0, log="-", status=f"not run: {', '.join(missing)} not installed "
                                "(install their wheels first: benchmarks/README.md)"))
            print(f"\n=== lessons: not run, {', '.join(missing)} not installed ===", flush=True)
            continue
        left = args.budget - (time.perf_counter() - start)
        records.append(run_step(step, left, RESULTS / f"gpu_check_{step['name']}_cuda.log"))
    total = time.perf_counter() - start
    payload = dict(device=device, budget_s=args.budget, total_s=round(total, 1), steps=records)
    (RESULTS / "gpu_check_cuda.json").write_text(json.dumps(payload, indent=1) + "\n")
    (RESULTS / "gpu_check_cuda.md").write_text(summary_markdown(records, device, total, args.budget))
    print("\n" + summary_markdown(records, device, total, args.budget))
    return 0 if all(r["status"] == "passed" for r in records) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
