"""helpers.flash against PyTorch's SDPA and the course's attention; its memory (lesson 10's checks: tests/checks/)."""

import importlib.util
import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from helpers.attention import scaled_dot_product_attention
from helpers.device import peak_memory
from helpers.flash import flash_attention, flash_attention_forward, triton_flash_attention
from helpers.masks import causal_mask


def tensor(seed, *shape, dtype=torch.float64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def random_mask(seed, shape, p):
    return torch.rand(*shape, generator=torch.Generator().manual_seed(seed)) < p  # True = may attend


def oracles(q, k, v, mask=None):
    """PyTorch's SDPA (NaN rows of fully masked queries set to 0, as the course defines them) and the course's."""
    torch_out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    if mask is not None:
        blocked = ~mask.expand(*q.shape[:3], k.shape[2]).any(dim=-1, keepdim=True)  # (B, H, T, 1)
        torch_out = torch_out.masked_fill(blocked, 0.0)
    return torch_out, scaled_dot_product_attention(q, k, v, mask=mask)[0]


mask_shapes = st.sampled_from(["none", "BHTS", "TS", "B11S", "1H1S", "causal"])


@given(B=st.integers(1, 2), H=st.integers(1, 3), T=st.integers(1, 40), S=st.integers(1, 40),
       D=st.integers(1, 9), Dv=st.integers(1, 9), block_q=st.integers(1, 17), block_k=st.integers(1, 17),
       kind=mask_shapes, p=st.sampled_from([0.1, 0.5, 0.9]), scale=st.sampled_from([1.0, 20.0]),
       seed=st.integers(0, 10_000))
def test_equals_sdpa_in_float64(B, H, T, S, D, Dv, block_q, block_k, kind, p, scale, seed):
    q, k, v = tensor(seed, B, H, T, D) * scale, tensor(seed + 1, B, H, S, D) * scale, tensor(seed + 2, B, H, S, Dv)
    shapes = {"BHTS": (B, H, T, S), "TS": (T, S), "B11S": (B, 1, 1, S), "1H1S": (1, H, 1, S)}
    if kind == "none":
        mask = None
    elif kind == "causal":
        mask = torch.ones(T, S, dtype=torch.bool).tril(diagonal=S - T)  # the last query sees every key
    else:
        mask = random_mask(seed + 3, shapes[kind], p)
    originals = [t.clone() for t in (q, k, v)] + ([] if mask is None else [mask.clone()])
    out = flash_attention(q, k, v, mask=mask, block_q=block_q, block_k=block_k)
    assert out.shape == (B, H, T, Dv) and out.dtype == torch.float64
    assert torch.isfinite(out).all()
    for expected in oracles(q, k, v, mask):
        assert (out - expected).abs().max().item() <= 1e-10
    for before, after in zip(originals, [q, k, v] + ([] if mask is None else [mask]), strict=True):
        assert torch.equal(before, after)  # inputs are never modified


@given(T=st.integers(1, 30), S=st.integers(1, 30), block_q=st.integers(1, 11), block_k=st.integers(1, 11),
       seed=st.integers(0, 10_000))
def test_log_sum_exp_and_fully_masked_rows(T, S, block_q, block_k, seed):
    q, k, v = tensor(seed, 1, 2, T, 5), tensor(seed + 1, 1, 2, S, 5), tensor(seed + 2, 1, 2, S, 5)
    mask = random_mask(seed + 3, (1, 2, T, S), 0.5)
    mask[0, 0, 0] = False  # query 0 of head 0 may attend to nothing
    out, lse = flash_attention_forward(q, k, v, mask=mask, block_q=block_q, block_k=block_k)
    scores = (q @ k.transpose(-2, -1) / math.sqrt(5)).masked_fill(~mask, float("-inf"))  # (1, 2, T, S)
    expected = torch.logsumexp(scores, dim=-1)  # (1, 2, T), -inf for a fully masked row
    assert torch.equal(torch.isinf(lse), torch.isinf(expected))
    finite = torch.isfinite(expected)
    assert torch.allclose(lse[finite], expected[finite], atol=1e-12, rtol=0)
    assert torch.equal(out[0, 0, 0], torch.zeros(5, dtype=torch.float64))
    assert torch.equal(out[~mask.any(-1)], torch.zeros_like(out[~mask.any(-1)]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_lower_precisions(dtype):
    q, k, v = (tensor(s, 2, 3, 70, 16) for s in (1, 2, 3))
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(70))
    out = flash_attention(q.to(dtype), k.to(dtype), v.to(dtype), mask=causal_mask(70), block_q=32, block_k=16)
    assert out.dtype == dtype
    tolerance = {torch.float32: 1e-6, torch.bfloat16: 2e-2, torch.float16: 3e-3}[dtype]
    assert (out.double() - expected).abs().max().item() < tolerance


def test_huge_scores_do_not_overflow():
    q, k, v = tensor(0, 1, 1, 50, 8) * 1e3, tensor(1, 1, 1, 50, 8) * 1e3, tensor(2, 1, 1, 50, 8)
    out = flash_attention(q.float(), k.float(), v.float(), block_q=16, block_k=16)
    assert torch.isfinite(out).all()
    assert torch.allclose(out.double(), F.scaled_dot_product_attention(q, k, v), atol=1e-5)


def test_peak_memory_grows_linearly_and_holds_no_score_matrix():
    B, H, D, bq, bk = 1, 2, 16, 64, 64
    peaks, sizes = [], (256, 512, 1024)
    for T in sizes:
        q, k, v = (tensor(s, B, H, T, D, dtype=torch.float32) for s in (1, 2, 3))
        for mask in (None, causal_mask(T)):
            peak = peak_memory(flash_attention, q, k, v, mask=mask, block_q=bq, block_k=bk, device="cpu")
            output = B * H * T * D * 4 + B * H * T * 4  # the output and the log-sum-exp
            tile = B * H * bq * bk * 4  # one (block_q, block_k) tile of scores
            assert peak < B * H * T * T * 4  # less than one (T, S) score matrix
            assert peak <= output + 6 * tile, (T, mask is not None, peak, output, tile)
        peaks.append(peak)
    # doubling T at most doubles the peak (plus the fixed tiles): linear, not quadratic
    for small, large in zip(peaks[:-1], peaks[1:], strict=True):
        assert large <= 2 * small + 6 * B * H * bq * bk * 4
    naive = peak_memory(lambda: scaled_dot_product_attention(q, k, v)[0], device="cpu")
    assert naive > 20 * peaks[-1]


def test_block_sizes_do_not_change_the_result():
    q, k, v = (tensor(s, 1, 2, 33, 4) for s in (1, 2, 3))
    reference = flash_attention(q, k, v, block_q=64, block_k=64)  # a single block each way
    for bq, bk in [(1, 1), (1, 33), (33, 1), (7, 5), (32, 32), (100, 3)]:
        assert torch.allclose(flash_attention(q, k, v, block_q=bq, block_k=bk), reference, atol=1e-13, rtol=0)


def test_bad_input_gets_a_clear_error():
    q, k, v = tensor(0, 1, 2, 5, 4), tensor(1, 1, 2, 6, 4), tensor(2, 1, 2, 6, 4)
    with pytest.raises(ValueError, match=r"q must have shape \(B, H, L, D\).*\(2, 5, 4\)"):
        flash_attention(q[0], k, v)
    with pytest.raises(ValueError, match=r"same width D.*D=4.*D=3"):
        flash_attention(q, k[..., :3], v)
    with pytest.raises(ValueError, match=r"same length S.*\(1, 2, 6, 4\).*\(1, 2, 5, 4\)"):
        flash_attention(q, k, v[:, :, :5])
    with pytest.raises(ValueError, match=r"agree on B and H"):
        flash_attention(q, k[:, :1], v[:, :1])
    with pytest.raises(ValueError, match=r"block_q must be a positive int, got 0"):
        flash_attention(q, k, v, block_q=0)
    with pytest.raises(ValueError, match=r"block_k must be a positive int, got 2.5"):
        flash_attention(q, k, v, block_k=2.5)
    with pytest.raises(ValueError, match=r"block_q must be a positive int, got True"):
        flash_attention(q, k, v, block_q=True)
    with pytest.raises(ValueError, match=r"mask of shape \(5, 5\) does not broadcast.*\(B, H, T, S\) = \(1, 2, 5, 6\)"):
        flash_attention(q, k, v, mask=torch.ones(5, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match=r"mask must be boolean.*torch.float32"):
        flash_attention(q, k, v, mask=torch.ones(5, 6))
    with pytest.raises(TypeError, match=r"share one dtype"):
        flash_attention(q.float(), k, v)
    with pytest.raises(TypeError, match=r"q must be a torch.Tensor, got ndarray"):
        flash_attention(q.numpy(), k, v)
    with pytest.raises(TypeError, match=r"floating-point"):
        flash_attention(q.long(), k.long(), v.long())
    with pytest.raises(ValueError, match=r"at least 1"):
        flash_attention(q, k[:, :, :0], v[:, :, :0])



# --- the Triton kernel: on a CUDA GPU, or in Triton's interpreter on CPU tensors ------------------

TRITON_CASES = """
import torch, torch.nn.functional as F
from helpers.flash import triton_flash_attention
on_gpu = torch.cuda.is_available()
device = "cuda" if on_gpu else "cpu"
if on_gpu:  # tl.dot on bf16 tiles compiles only from compute capability 8 (not on a T4 or V100)
    dtypes = [torch.float16] + ([torch.bfloat16] if torch.cuda.get_device_capability()[0] >= 8 else [])
else:  # Triton 3.9's interpreter multiplies bf16 tiles wrongly in tl.dot, so on the CPU: fp16 and fp32
    dtypes = [torch.float16, torch.float32]
print("dtypes", *dtypes)
g = torch.Generator().manual_seed(0)
for dtype in dtypes:
    for causal, T, S in [(False, 45, 45), (False, 100, 37), (True, 77, 77)]:
        q, k, v = (torch.randn(2, 2, L, 32, generator=g, dtype=torch.float64).to(device, dtype) for L in (T, S, S))
        out = triton_flash_attention(q, k, v, causal=causal, block_q=32, block_k=16)
        expected = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
        assert out.dtype == dtype and out.shape == (2, 2, T, 32)
        tolerance = {torch.float16: 3e-3, torch.bfloat16: 2e-2, torch.float32: 1e-5}[dtype]
        error = (out.double() - expected).abs().max().item()
        assert error < tolerance, (dtype, causal, T, S, error)
        print(dtype, causal, T, S, f"{error:.1e}")
"""


def test_triton_kernel_equals_sdpa():
    """Run in a fresh process: TRITON_INTERPRET must be set before Triton is first imported."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("Triton is not installed (it is not in requirements.txt: its wheel is 286 MB)")
    env = dict(os.environ, TRITON_INTERPRET="0" if torch.cuda.is_available() else "1")
    done = subprocess.run([sys.executable, "-c", TRITON_CASES], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    first, *cases = done.stdout.splitlines()
    assert first.split()[1:] == triton_dtypes(), first
    assert [line.split()[0] for line in cases] == [d for d in triton_dtypes() for _ in range(3)], done.stdout


def triton_dtypes() -> list[str]:
    """The dtypes TRITON_CASES tests here, three cases each: no bf16 before compute capability 8."""
    if not torch.cuda.is_available():
        return ["torch.float16", "torch.float32"]
    return ["torch.float16"] + (["torch.bfloat16"] if torch.cuda.get_device_capability()[0] >= 8 else [])


def test_triton_wrapper_rejects_what_the_kernel_cannot_do(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    q = tensor(0, 1, 1, 32, 16, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"D to be a power of two >= 16.*D=12"):
        triton_flash_attention(q[..., :12], q[..., :12], q[..., :12])
    with pytest.raises(ValueError, match=r"block_k must be a power of two >= 16.*got 24"):
        triton_flash_attention(q, q, q, block_k=24)
    with pytest.raises(ValueError, match=r"causal needs T == S.*T=32 and S=16"):
        triton_flash_attention(q, q[:, :, :16], q[:, :, :16], causal=True)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"Triton kernels run on CUDA tensors, got cpu.*TRITON_INTERPRET=1"):
            triton_flash_attention(q, q, q)

def test_the_lessons_triton_kernel_is_the_tested_one():
    """Lesson 10 writes the kernel that only a GPU runs; it must be the helper's kernel, comments aside."""
    import ast
    import json
    from pathlib import Path

    def kernel(tree):
        found = [node for node in ast.walk(tree)
                 if isinstance(node, ast.FunctionDef) and node.name == "flash_forward_kernel"]
        assert len(found) == 1
        return ast.dump(found[0])

    notebook = Path(__file__).resolve().parents[1] / "notebooks" / "10_flash_attention.ipynb"
    cells = [c["source"] for c in json.loads(notebook.read_text())["cells"] if c["cell_type"] == "code"]
    lesson = [c for c in cells if "def flash_forward_kernel" in c]
    assert len(lesson) == 1
    helper = Path(__file__).resolve().parents[1] / "helpers" / "_flash_triton.py"  # imports Triton: read, not import
    assert kernel(ast.parse(lesson[0])) == kernel(ast.parse(helper.read_text()))
