"""benchmarks/: each script runs at tiny sizes with nothing written, its memory estimates hold, and it records
what does not fit or does not match instead of stopping."""

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from helpers.attention import scaled_dot_product_attention
from helpers.decoding import greedy_decode_cached
from helpers.device import cpu_threads, peak_memory
from helpers.sdpa_kernels import sdpa_backend

# --- the benchmarks run (tiny sizes, nothing written) ---------------------------------------------

def _bench(name):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import importlib
    return importlib.import_module(name)


def test_benchmarks_smoke():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import bench_attention
    import bench_mha

    out = bench_attention.main(["--device", "cpu", "--sizes", "32", "64", "--dtypes", "fp32", "--modes", "fwd",
                                "--repeats", "1", "--warmup", "0", "--heads", "2", "--no-write"])
    assert [r["T"] for r in out["sweep"]] == [32, 64] and out["headline"] is None
    assert out["sweep"][1]["naive_bytes"] >= 3 * 2 * 64 * 64 * 4  # three (T, S) matrices per head
    out = bench_mha.main(["--device", "cpu", "--sizes", "16", "--modes", "fwd", "--repeats", "1", "--warmup", "0",
                          "--no-write"])
    assert out["rows"][0]["max_abs_diff"] < 1e-4


def test_minilm_benchmark_smoke():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import bench_minilm

    out = bench_minilm.main(["--device", "cpu", "--batches", "1", "3", "--repeats", "1", "--warmup", "0",
                             "--no-write"])
    assert out["not_run"] is None and [r["batch"] for r in out["rows"]] == [1, 3]
    three = out["rows"][1]
    assert three["max_abs_diff"] < 1e-4
    assert three["tokens"] <= 3 * three["padded_length"] and three["sentences_per_s"] > 0
    assert three["sentence_tokens"][0] <= three["padded_length"] <= three["sentence_tokens"][1]


def test_kv_cache_benchmark_smoke():
    bench = _bench("bench_kv_cache")
    out = bench.main(["--device", "cpu", "--new-tokens", "4", "--batches", "1", "3", "--widths", "32",
                      "--repeats", "1", "--no-write"])
    assert [r["batch"] for r in out["results"]] == [1, 3]
    assert all(r["identical_outputs"] and r["speedup"] > 0 for r in out["results"])
    assert out["widths"][0]["d_model"] == 32 and out["widths"][0]["step_s"] > 0


def test_flash_benchmark_reference_head_by_head_equals_all_heads_at_once():
    bench = _bench("bench_flash")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 40, 16, generator=g, dtype=torch.bfloat16) for _ in range(3))  # (B, H, T, D)
    for causal in (False, True):
        with torch.no_grad(), sdpa_backend("math"):
            all_heads = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
        assert torch.equal(bench.reference(q, k, v, causal), all_heads)


# --- the benchmarks' memory estimates and out-of-memory handling ----------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", ["fwd", "fwdbwd"])
def test_calibrated_peak_estimate_matches_the_measurement(dtype, mode):
    """The estimate the benchmark skips by is fitted at T = 64..256 and must hold at T = 512."""
    bench = _bench("bench_attention")
    common = _bench("common")
    cpu = torch.device("cpu")
    with cpu_threads(1):
        for name, attn in bench.CONTESTANTS.items():
            fit = bench.calibrate(attn, 1, 2, 16, dtype, cpu, mode)
            q, k, v = bench.inputs(1, 2, 512, 16, dtype, cpu, mode)
            measured = peak_memory(bench.make_call(attn, q, k, v, mode), device=cpu)
            estimate = common.predict_peak(fit, 512, margin=1.0)
            if name == "naive":  # the (T, T) matrices dominate: the fit must be close
                assert abs(estimate - measured) <= 0.1 * measured, (name, estimate, measured)
            assert common.predict_peak(fit, 512) >= 0.9 * measured, (name, estimate, measured)


def test_fit_peak_recovers_known_coefficients():
    common = _bench("common")
    sizes = [64, 128, 256]
    assert common.fit_peak(sizes, [3 * T + 5 * T * T for T in sizes]) == pytest.approx((3, 5))
    assert common.fit_peak(sizes, [7 * T for T in sizes]) == pytest.approx((7, 0), abs=1e-6)
    with pytest.raises(ValueError, match="at least two sizes"):
        common.fit_peak([64], [1])


def test_out_of_memory_is_recorded_as_a_skip_and_the_run_goes_on(monkeypatch):
    common = _bench("common")
    bench = _bench("bench_attention")

    def too_big(q, k, v):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 32.00 GiB")

    t, mem, skipped = common.measure_contestants({"big": lambda: too_big(0, 0, 0), "small": lambda: torch.ones(3)},
                                                 torch.device("cpu"), repeats=1, warmup=0)
    assert set(t) == set(mem) == {"small"} and "32.00 GiB" in skipped["big"]
    with pytest.raises(ValueError, match="not memory"):  # other errors are not swallowed
        common.measure_contestants({"bad": lambda: (_ for _ in ()).throw(ValueError("not memory"))},
                                   torch.device("cpu"), repeats=1, warmup=0)
    assert common.is_out_of_memory(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried ..."))
    assert not common.is_out_of_memory(RuntimeError("shape mismatch"))
    # the sweep: naive runs out of memory above the calibration sizes; the row is kept with SDPA alone
    monkeypatch.setitem(bench.CONTESTANTS, "naive", lambda q, k, v: too_big(q, k, v) if q.shape[-2] > 256
                        else scaled_dot_product_attention(q, k, v)[0])
    out = bench.main(["--device", "cpu", "--sizes", "320", "--dtypes", "fp32", "--modes", "fwd",
                      "--repeats", "1", "--warmup", "0", "--heads", "2", "--no-write"])
    row = out["sweep"][0]
    assert row["naive_s"] is None and row["sdpa_s"] > 0 and "out of memory" in row["skipped"]["naive"]
    assert "naive skipped" in bench.markdown(out["sweep"], [], None)


def test_estimated_oversize_is_skipped_before_running(monkeypatch):
    bench = _bench("bench_attention")
    monkeypatch.setattr(bench, "memory_budget", lambda device: 10_000)  # 10 kB free: naive at T=64 needs more
    out = bench.main(["--device", "cpu", "--sizes", "64", "--dtypes", "fp32", "--modes", "fwd",
                      "--repeats", "1", "--warmup", "0", "--heads", "2", "--no-write"])
    row = out["sweep"][0]
    assert row["naive_s"] is None and row["skipped"]["naive"].startswith("estimated peak")


def test_kv_cache_benchmark_reports_where_ids_differ_and_goes_on(monkeypatch):
    """A near-tie on a GPU can change one token and the rest of its row: recorded, not a crash."""
    bench = _bench("bench_kv_cache")
    ids = torch.arange(12).reshape(3, 4)
    other = ids.clone()
    other[2, 1], other[1, 3] = -1, -1
    assert bench.first_divergence(ids, ids.clone()) is None
    assert bench.first_divergence(other, ids) == {"row": 2, "position": 1, "rows_differing": 2}
    assert "shape" in bench.first_divergence(ids[:, :3], ids)

    def cached_with_one_flipped_token(*args, **kwargs):
        out = greedy_decode_cached(*args, **kwargs).clone()
        if out.shape[0] == 3:
            out[1, 3] = (out[1, 3] + 1) % 5  # a different token at step 3 of row 1
        return out

    monkeypatch.setattr(bench, "greedy_decode_cached", cached_with_one_flipped_token)
    out = bench.main(["--device", "cpu", "--new-tokens", "4", "--batches", "3", "--widths",
                      "--repeats", "1", "--no-write"])
    r = out["results"][0]
    assert not r["identical_outputs"] and r["divergence"] == {"cached": {"row": 1, "position": 3,
                                                                         "rows_differing": 1}}
    assert r["speedup"] > 0  # timed all the same
    assert "outputs differ" in bench.markdown(out["results"], []) and "row 1, position 3" in \
        bench.markdown(out["results"], [])


def test_fp16_stands_in_for_bf16_where_bf16_is_not_native(monkeypatch):
    """As on a T4 or V100 (compute capability 7): the half-precision rows run in fp16, and say so."""
    common = _bench("common")
    bench = _bench("bench_mha")
    cpu = torch.device("cpu")
    assert common.native_dtypes(["fp32", "bf16"], cpu) == [("fp32", None), ("bf16", None)]
    monkeypatch.setattr(common, "dtype_supported", lambda dtype, device: dtype != torch.bfloat16)
    assert common.native_dtypes(["fp32", "bf16"], cpu) == [("fp32", None), ("fp16", "bf16")]
    assert common.native_dtypes(["fp16", "bf16"], cpu) == [("fp16", None)]  # not twice
    out = bench.main(["--device", "cpu", "--sizes", "16", "--modes", "fwd", "--dtypes", "bf16", "--batch", "2",
                      "--d-model", "32", "--heads", "2", "--repeats", "1", "--warmup", "0", "--no-write"])
    row = out["rows"][0]
    assert row["dtype"] == "fp16" and row["in_place_of"] == "bf16" and row["course_s"] > 0
    assert "fp16 rows stand in for bf16" in bench.markdown(out["rows"])


def test_mha_benchmark_skips_what_does_not_fit_and_goes_on(monkeypatch):
    bench = _bench("bench_mha")
    args = ["--device", "cpu", "--sizes", "16", "32", "--modes", "fwd", "--batch", "2", "--d-model", "32",
            "--heads", "2", "--repeats", "1", "--warmup", "0", "--no-write"]
    real_check = bench.check_outputs

    def check_out_of_memory_above_16(contestants, x):
        if x.shape[1] > 16:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 24.00 GiB")
        return real_check(contestants, x)

    monkeypatch.setattr(bench, "check_outputs", check_out_of_memory_above_16)
    small, big = bench.main(args)["rows"]
    assert small["course_s"] > 0 and small["max_abs_diff"] < 1e-4
    assert big["max_abs_diff"] is None and big["course_s"] is None and big["torch_fused_s"] is None
    assert all("out of memory in the output check" in why for why in big["skipped"].values())
    assert "24.00 GiB" in bench.markdown([small, big])
    monkeypatch.setattr(bench, "check_outputs", real_check)
    monkeypatch.setattr(bench.common, "memory_budget", lambda device: 10_000)  # 10 kB free: nothing fits
    row = bench.main(args)["rows"][0]
    assert row["course_s"] is None and row["max_abs_diff"] < 1e-4  # checked on one sequence, not timed
    assert all(why.startswith("estimated peak") for why in row["skipped"].values())
