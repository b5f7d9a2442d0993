"""`make gpu-check` (benchmarks/gpu_check.py) and the benchmark modes it adds, on a machine without a GPU:
the refusal, the plan of steps, and bench_flash's forward + backward at tiny sizes on the CPU."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_flash  # noqa: E402
import gpu_check  # noqa: E402

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")


@no_cuda
def test_without_cuda_it_stops_at_once_with_a_clear_message_and_writes_nothing():
    before = {p: p.stat().st_mtime for p in (ROOT / "benchmarks" / "results").iterdir()}
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "benchmarks/gpu_check.py"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    seconds = time.perf_counter() - start
    assert done.returncode == 2, done
    assert "needs a CUDA GPU" in done.stderr and "finds no CUDA GPU" in done.stderr and "Nothing was run" in done.stderr
    assert "===" not in done.stdout  # no step began
    assert seconds < 60  # the time to import torch, not to run anything
    after = {p: p.stat().st_mtime for p in (ROOT / "benchmarks" / "results").iterdir()}
    assert after == before


def test_make_gpu_check_runs_the_script():
    made = subprocess.run(["make", "-n", "gpu-check"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    assert "benchmarks/gpu_check.py" in made.stdout
    assert "gpu-check" in (ROOT / "Makefile").read_text().split(".PHONY:")[1].split("\n")[0]


def test_the_plan_covers_tests_lessons_and_benchmarks(capsys):
    steps = {s["name"]: s for s in gpu_check.plan("python")}
    assert list(steps) == gpu_check.STEPS
    assert all(s["env"].get("COURSE_DEVICE") == "cuda" for s in (steps["tests"], steps["lessons"]))
    lessons = steps["lessons"]["command"]
    assert "--nbval-lax" in lessons and "notebooks/09_attention_at_scale.ipynb" in lessons
    assert "notebooks/10_flash_attention.ipynb" in lessons and "notebooks/12_gpt_from_scratch.ipynb" in lessons
    assert all(Path(ROOT / t).exists() for t in steps["tests"]["command"] if t.startswith("tests/"))
    assert "--headline-only" in steps["attention"]["command"]
    assert steps["flash_cs336"]["command"][-1] == "--cs336" and "--device" in steps["flash_cs336"]["command"]
    assert sum(s["timeout_s"] for s in steps.values()) >= 480  # each step's own limit; the budget caps the sum
    assert gpu_check.main(["--plan"]) == 0
    shown = capsys.readouterr().out
    assert all(name in shown for name in gpu_check.STEPS)


def test_lesson_13_is_included_once_it_exists(tmp_path):
    (tmp_path / "notebooks").mkdir()
    for name in ("09_attention_at_scale", "10_flash_attention", "12_gpt_from_scratch", "11_pretrained_model"):
        (tmp_path / "notebooks" / f"{name}.ipynb").write_text("{}")
    assert gpu_check.lesson_paths(tmp_path) == ["notebooks/09_attention_at_scale.ipynb",
                                                "notebooks/10_flash_attention.ipynb",
                                                "notebooks/12_gpt_from_scratch.ipynb"]
    (tmp_path / "notebooks" / "13_scaling_up.ipynb").write_text("{}")
    assert gpu_check.lesson_paths(tmp_path)[-1] == "notebooks/13_scaling_up.ipynb"


def test_a_step_past_its_limit_is_stopped_and_recorded(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "ROOT", tmp_path)
    step = dict(name="sleepy", what="sleeps", timeout_s=1, env={},
                command=[sys.executable, "-c", "import time; print('started', flush=True); time.sleep(30)"])
    start = time.perf_counter()
    record = gpu_check.run_step(step, 60, tmp_path / "sleepy.log", min_s=0.5)
    assert time.perf_counter() - start < 20
    assert record["status"].startswith("stopped after") and "started" in (tmp_path / "sleepy.log").read_text()
    late = gpu_check.run_step(step, 0.2, tmp_path / "late.log", min_s=0.5)  # the budget is spent
    assert late["status"].startswith("not run")
    ok = dict(step, command=[sys.executable, "-c", "print('fine')"], timeout_s=30)
    assert gpu_check.run_step(ok, 60, tmp_path / "ok.log")["status"] == "passed"
    bad = dict(ok, command=[sys.executable, "-c", "raise SystemExit(3)"])
    failed = gpu_check.run_step(bad, 60, tmp_path / "bad.log")
    assert (failed["status"], failed["rc"]) == ("failed", 3)


def test_the_cs336_preset_and_result_names():
    args = bench_flash.apply_preset(bench_flash.parse(["--device", "cpu", "--cs336", "--no-write"])[0])
    assert (args.sizes, args.batch, args.heads, args.head_dim, args.masks) == ([16384], 1, 16, 64, ["causal"])
    assert args.fwdbwd and args.no_tiled and bench_flash.result_name(args) == "flash_cs336"
    plain = bench_flash.parse(["--device", "cpu", "--no-write"])[0]
    assert bench_flash.result_name(bench_flash.apply_preset(plain)) == "flash"
    both = bench_flash.parse(["--device", "cpu", "--backward", "--fwdbwd"])[0]
    with pytest.raises(SystemExit, match="choose one"):
        bench_flash.apply_preset(both)


def test_forward_and_backward_benchmark_on_the_cpu(tmp_path, monkeypatch):
    out = bench_flash.main(["--device", "cpu", "--fwdbwd", "--sizes", "48", "--batch", "1", "--heads", "2",
                            "--head-dim", "16", "--masks", "none", "causal", "--tiled-block", "16", "--repeats", "1",
                            "--warmup", "0", "--no-write"])
    timed = {(r["mask"], r["contestant"]) for r in out["rows"] if "median_s" in r}
    assert {("none", "pytorch tiled (lesson 10)"), ("causal", "pytorch tiled (lesson 10)"),
            ("causal", "sdpa flash")} <= timed  # checked against SDPA's math kernel before timing
    skipped = {r["contestant"]: r["skipped"] for r in out["rows"] if "skipped" in r}
    assert "CUDA" in skipped["triton (lesson 10)"]
    assert out["benchmark"] == "flash_fwdbwd" and out["targets"] is None
    json.dumps(out, default=str)  # what write_results would write
