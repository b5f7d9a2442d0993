"""Lesson 09: the KV cache against uncached decoding, sparse masks, FLOPs, peak memory."""

import os
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from helpers.attention import scaled_dot_product_attention
from helpers.device import attention_flops, cpu_threads, loglog_slope, peak_memory, peak_tflops, peak_tflops_of
from helpers.sdpa_kernels import auto_sdpa_backend, sdpa_backend
from helpers.transformer import Transformer, TransformerConfig, greedy_decode, greedy_decode_cached

PAD, BOS, EOS = 0, 1, 2


def tiny_model(seed, src_v=9, tgt_v=7, dtype=torch.float64, **overrides):
    torch.manual_seed(seed)
    return Transformer(TransformerConfig.tiny(src_v, tgt_v, **overrides)).to(dtype).eval()


def source(seed, B, S, V, n_pad=0):
    src = torch.randint(3, V, (B, S), generator=torch.Generator().manual_seed(seed))  # (B, S)
    if n_pad:
        src[0, S - n_pad:] = PAD  # the first row is shorter: padded keys in the cross-attention
    return src


# --- cached decoding equals uncached decoding -------------------------------------------------------

@given(seed=st.integers(0, 10_000), norm_first=st.booleans(), n_heads=st.sampled_from([1, 2, 4]),
       layers=st.integers(1, 2), B=st.integers(1, 3), S=st.integers(1, 6), n_pad=st.integers(0, 2),
       tgt_v=st.integers(4, 9), max_len=st.integers(2, 14))
def test_cached_greedy_equals_uncached(seed, norm_first, n_heads, layers, B, S, n_pad, tgt_v, max_len):
    # small target vocabularies make the model emit eos and pad ids: rows stop at different steps
    model = tiny_model(seed, tgt_v=tgt_v, norm_first=norm_first, n_heads=n_heads,
                       n_encoder_layers=layers, n_decoder_layers=layers)
    src = source(seed, B, S, 9, n_pad=min(n_pad, S - 1))
    expected = greedy_decode(model, src, BOS, EOS, max_len)
    got = greedy_decode_cached(model, src, BOS, EOS, max_len)
    assert torch.equal(got, expected), f"\n{got}\n{expected}"


def test_cached_greedy_covers_early_stop_and_generated_pads():
    """The property test above must reach the interesting branches; this pins one case that does."""
    hits = {"stopped_early": False, "generated_pad": False}
    for seed in range(40):
        model = tiny_model(seed, tgt_v=4)
        src = source(seed, 3, 5, 9, n_pad=2)
        out = greedy_decode(model, src, BOS, EOS, 12)
        assert torch.equal(greedy_decode_cached(model, src, BOS, EOS, 12), out)
        hits["stopped_early"] |= out.shape[1] < 12
        body = out[:, 1:]
        before_eos = torch.cumsum(body == EOS, dim=1) == 0
        hits["generated_pad"] |= bool(((body == PAD) & before_eos).any())
        if all(hits.values()):
            break
    assert all(hits.values()), hits


@pytest.mark.parametrize("static", [False, True])
def test_cached_decode_logits_equal_full_decoder_at_every_step(static):
    model = tiny_model(3, norm_first=False)
    src = source(3, 2, 5, 9, n_pad=1)
    ys = torch.tensor([[BOS, 4, 5, 6, 3, 4], [BOS, 6, 6, 5, 4, 3]])  # (B, T): a fixed target prefix
    with torch.no_grad():
        memory, src_mask = model.encode(src)
        cache = model.new_decode_cache(memory, max_len=ys.shape[1], static=static)
        for t in range(ys.shape[1]):
            step = model.decode(ys[:, t:t + 1], None, src_mask, cache=cache)[:, -1]  # (B, V)
            full = model.decode(ys[:, :t + 1], memory, src_mask)[:, -1]  # (B, V)
            assert (step - full).abs().max().item() < 1e-12
        assert cache.length == ys.shape[1]
        with pytest.raises(ValueError, match=r"the cache holds max_len=6 positions and 6 are stored: 1 more"):
            model.decode(ys[:, :1], None, src_mask, cache=cache)


def test_cached_greedy_float32_lesson08_sizes_and_no_early_eos():
    torch.manual_seed(0)
    model = Transformer(TransformerConfig.dates(20, 14)).eval()
    assert model.config.max_len == 512
    with torch.no_grad():
        model.head.bias[EOS] = -1e4  # the trick the lesson and the benchmark use
    src = source(0, 2, 12, 20)
    out = greedy_decode_cached(model, src, BOS, EOS, 24)
    assert out.shape == (2, 24) and not (out == EOS).any()
    assert torch.equal(out, greedy_decode(model, src, BOS, EOS, 24))


def test_cached_greedy_restores_training_mode_and_checks_arguments():
    model = tiny_model(1).train()
    greedy_decode_cached(model, source(1, 1, 4, 9), BOS, EOS, 5)
    assert model.training
    with pytest.raises(ValueError, match=r"bos_id \(a target token id\) must be an int in \[0, 6\], got 99"):
        greedy_decode_cached(model, source(1, 1, 4, 9), 99, EOS, 5)
    with pytest.raises(ValueError, match=r"max_len .* got 1000"):
        greedy_decode_cached(model, source(1, 1, 4, 9), BOS, EOS, 1000)


def test_decode_cache_shapes():
    model = tiny_model(2, n_decoder_layers=3)
    memory = torch.zeros(2, 5, 32, dtype=torch.float64)
    cache = model.new_decode_cache(memory, max_len=10)
    assert len(cache.self_attn) == len(cache.cross_attn) == 3
    assert cache.self_attn[0].k.shape == (2, 4, 10, 8) and cache.cross_attn[2].v.shape == (2, 4, 5, 8)
    assert cache.length == 0 and cache.cross_attn[0].length == 5 and cache.keep.shape == (2, 10)


# --- counting, peaks, slopes, kernels -------------------------------------------------------------

def test_attention_flops():
    assert attention_flops(1, 1, 1, 1, 1) == 4
    assert attention_flops(2, 16, 8192, 8192, 128) == 4 * 2 * 16 * 8192 * 8192 * 128
    with pytest.raises(ValueError, match=r"S must be a positive int, got 2.5"):
        attention_flops(1, 1, 1, 2.5, 1)


def test_peak_tflops_by_name():
    assert peak_tflops_of("Tesla T4") == 65.0
    assert peak_tflops_of("NVIDIA A100-SXM4-40GB") == 312.0
    assert peak_tflops_of("NVIDIA H100 80GB HBM3") == 989.0
    assert peak_tflops_of("NVIDIA H100 PCIe") == 756.0
    assert peak_tflops_of("NVIDIA H200") == 989.0
    assert peak_tflops_of("NVIDIA L4") == 121.0
    assert peak_tflops_of("NVIDIA L40S") is None  # "L4" must not match inside "L40S"
    assert peak_tflops_of("NVIDIA GeForce RTX 4090") is None
    assert peak_tflops("cpu") is None
    with pytest.raises(TypeError, match=r"gpu_name must be a str, got int"):
        peak_tflops_of(4)


def test_loglog_slope():
    sizes = [64, 128, 256, 512]
    assert abs(loglog_slope(sizes, [3 * n**2 for n in sizes]) - 2.0) < 1e-12
    assert abs(loglog_slope(sizes, [5 * n for n in sizes]) - 1.0) < 1e-12
    with pytest.raises(ValueError, match=r"must be positive"):
        loglog_slope([1, 2], [0, 1])
    with pytest.raises(ValueError, match=r"equal length >= 2"):
        loglog_slope([1, 2, 3], [1, 2])


def test_sdpa_backends_on_cpu():
    q, k, v = (torch.randn(1, 2, 16, 8, generator=torch.Generator().manual_seed(i)) for i in range(3))
    ours, _ = scaled_dot_product_attention(q, k, v)
    for name in ("math", "flash"):
        with sdpa_backend(name):
            assert torch.allclose(F.scaled_dot_product_attention(q, k, v), ours, atol=1e-5)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError), sdpa_backend("efficient"):  # a CUDA kernel: no silent fallback
            F.scaled_dot_product_attention(q, k, v)
    with pytest.raises(ValueError, match=r"backend must be one of .* got 'fast'"):
        with sdpa_backend("fast"):
            pass


def test_auto_sdpa_backend_names_the_kernel_torch_picks(monkeypatch):
    q, k, v = (torch.randn(1, 2, 16, 8, generator=torch.Generator().manual_seed(i)) for i in range(3))
    assert auto_sdpa_backend(q, k, v) == "flash"  # on the CPU torch picks its blocked flash kernel ...
    with sdpa_backend("math"):
        assert auto_sdpa_backend(q, k, v) == "math"  # ... unless only the plain formula is allowed
    if torch.cuda.is_available():
        qc, kc, vc = (t.to("cuda", torch.float16) for t in (q, k, v))
        assert auto_sdpa_backend(qc, kc, vc) in ("flash", "efficient", "cudnn")  # a fused kernel on a GPU
        with sdpa_backend("math"):
            assert auto_sdpa_backend(qc, kc, vc) == "math"

    def gone(*args):
        raise RuntimeError("a private function that changed")

    monkeypatch.setattr(torch, "_fused_sdp_choice", gone)
    assert auto_sdpa_backend(q, k, v) == "unknown"
    monkeypatch.delattr(torch, "_fused_sdp_choice")
    assert auto_sdpa_backend(q, k, v) == "unknown"


# --- peak_memory on the CPU ------------------------------------------------------------------------

def test_peak_memory_counts_allocations_exactly():
    assert peak_memory(lambda: torch.ones(1000, 1000), device="cpu") == 4_000_000

    def two_alive_then_one():
        a = torch.ones(1000, 1000)  # 4 MB
        b = a * 2  # 8 MB alive
        del a
        return b + 1  # b and the result: 8 MB again, never 12
    assert 8_000_000 <= peak_memory(two_alive_then_one, device="cpu") < 8_000_100  # + the wrapped scalars
    assert peak_memory(lambda: None, device="cpu") == 0


def test_peak_memory_of_naive_attention_is_three_score_matrices():
    B, H, T, D = 1, 2, 256, 16
    q, k, v = (torch.randn(B, H, T, D) for _ in range(3))
    scores = B * H * T * T * 4
    peak = peak_memory(lambda: scaled_dot_product_attention(q, k, v)[0], device="cpu")
    assert 3 * scores <= peak < 3 * scores + 4 * B * H * T * D * 4
    with cpu_threads(1):  # the blocked CPU kernel keeps one buffer per thread: 16 threads hold more than 1 matrix
        fused = peak_memory(F.scaled_dot_product_attention, q, k, v, device="cpu")
    assert fused < scores  # the blocked CPU kernel never holds the whole (T, S) matrix


def test_peak_memory_silences_only_the_profiler(capfd):
    def talks():
        os.write(2, b"said inside\n")  # what fn itself writes must still be seen
        return torch.ones(10)
    peak_memory(talks, device="cpu")
    os.write(2, b"still here\n")
    err = capfd.readouterr().err
    assert "said inside" in err and "still here" in err
    assert "profiler" not in err  # torch's start/stop log lines


def test_peak_memory_rejects_mps():
    with pytest.raises(ValueError, match=r"peak_memory measures 'cpu' and 'cuda' devices, got 'mps'"):
        peak_memory(lambda: None, device="mps")


# --- the benchmarks run (tiny sizes, nothing written) --------------------------------------------------

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


def test_importing_scale_has_no_side_effects():
    import subprocess

    code = ("import torch; s = torch.random.get_rng_state(); import helpers.sdpa_kernels, helpers.checks.lesson09; "
            "assert torch.equal(s, torch.random.get_rng_state())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and done.stderr == ""


def test_cpu_threads_sets_and_restores_the_thread_count():
    before = torch.get_num_threads()
    with cpu_threads(1) as previous:
        assert torch.get_num_threads() == 1 and previous == before
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError, match="boom"), cpu_threads(1):
        raise RuntimeError("boom")
    assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match=r"n \(CPU threads\) must be a positive int, got 0"):
        with cpu_threads(0):
            pass


# --- the benchmarks' memory estimates and out-of-memory handling ------------------------------------------

def _bench(name):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import importlib
    return importlib.import_module(name)


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


def test_kv_cache_benchmark_smoke():
    bench = _bench("bench_kv_cache")
    out = bench.main(["--device", "cpu", "--new-tokens", "4", "--batches", "1", "3", "--widths", "32",
                      "--repeats", "1", "--no-write"])
    assert [r["batch"] for r in out["results"]] == [1, 3]
    assert all(r["identical_outputs"] and r["speedup"] > 0 for r in out["results"])
    assert out["widths"][0]["d_model"] == 32 and out["widths"][0]["step_s"] > 0


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


def test_flash_benchmark_reference_head_by_head_equals_all_heads_at_once():
    bench = _bench("bench_flash")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 40, 16, generator=g, dtype=torch.bfloat16) for _ in range(3))  # (B, H, T, D)
    for causal in (False, True):
        with torch.no_grad(), sdpa_backend("math"):
            all_heads = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
        assert torch.equal(bench.reference(q, k, v, causal), all_heads)
