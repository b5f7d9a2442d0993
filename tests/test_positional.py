"""helpers.positional (lesson 06): learned and rotary embeddings against oracles, plus properties.

Oracles: a complex-number RoPE (pair i of x read as x[2i] + i x[2i+1], multiplied by
e^(i m theta_i)), an explicit (d_model, d_model) shift matrix for the sinusoidal encoding, and
the definition of a learned table (row p of an nn.Embedding). All in float64.
"""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from helpers.checks.lesson06 import _alibi, _distance_scores, _rotate_half, _shift_matrix
from helpers.positional import (
    LearnedPositionalEmbedding,
    PositionalEncoding,
    apply_rotary,
    rotary_angles,
    sinusoidal_encoding,
    wavelengths,
)

seeds = st.integers(0, 10_000)
half_dims = st.integers(1, 8)  # D = 2 * half_dim


def randn(seed, *shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def rope_complex(x, positions, base=10000.0):
    """Oracle: RoPE as complex multiplication, written independently of the helper."""
    D = x.shape[-1]
    pos = torch.as_tensor(positions, dtype=torch.float64)
    freqs = torch.tensor([base ** (-2 * i / D) for i in range(D // 2)], dtype=torch.float64)
    rotor = torch.polar(torch.ones(*pos.shape, D // 2, dtype=torch.float64), pos[..., None] * freqs)
    z = torch.view_as_complex(x.double().reshape(*x.shape[:-1], D // 2, 2).contiguous())
    return torch.view_as_real(z * rotor).reshape(x.shape)


def shift_oracle(k, d_model):
    """Oracle: the block-diagonal (d_model, d_model) rotation with PE[pos + k] = M @ PE[pos]."""
    m = torch.zeros(d_model, d_model, dtype=torch.float64)
    for i in range(d_model // 2):
        b = k / 10000 ** (2 * i / d_model)
        m[2 * i, 2 * i], m[2 * i, 2 * i + 1] = math.cos(b), math.sin(b)
        m[2 * i + 1, 2 * i], m[2 * i + 1, 2 * i + 1] = -math.sin(b), math.cos(b)
    return m


# ----------------------------------------------------------------------------- rotary: oracle

@given(half=half_dims, T=st.integers(1, 12), lead=st.sampled_from([(), (3,), (2, 3)]), seed=seeds,
       base=st.sampled_from([10000.0, 500.0, 10.0]))
def test_apply_rotary_equals_complex_oracle(half, T, lead, seed, base):
    x = randn(seed, *lead, T, 2 * half)
    assert torch.allclose(apply_rotary(x, base=base), rope_complex(x, torch.arange(T), base), atol=1e-12)


@given(half=half_dims, seed=seeds, positions=st.lists(st.integers(-5000, 5000), min_size=1, max_size=8))
def test_apply_rotary_explicit_positions_equal_oracle(half, seed, positions):
    x = randn(seed, 2, len(positions), 2 * half)
    assert torch.allclose(apply_rotary(x, positions=positions), rope_complex(x, positions), atol=1e-9)


def test_apply_rotary_values_by_hand():
    # D = 2, theta_0 = 1: position 1 turns (1, 0) by one radian, position 2 turns (0, 1) by two
    x = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    out = apply_rotary(x)
    expected = torch.tensor([[1.0, 0.0], [math.cos(1), math.sin(1)], [-math.sin(2), math.cos(2)]],
                            dtype=torch.float64)
    assert torch.allclose(out, expected, atol=1e-15)


def test_apply_rotary_per_batch_positions_broadcast_over_heads():
    x = randn(1, 2, 3, 4, 6)  # (B, H, T, D)
    positions = torch.tensor([[0, 1, 2, 3], [10, 11, 12, 13]])[:, None, :]  # (B, 1, T)
    out = apply_rotary(x, positions=positions)
    assert torch.allclose(out[0], apply_rotary(x[0]), atol=1e-12)
    assert torch.allclose(out[1], rope_complex(x[1], torch.arange(10, 14)), atol=1e-12)


def test_apply_rotary_keeps_dtype_and_float32_is_accurate_far_out():
    x = randn(2, 5, 16)
    far = torch.arange(100_000, 100_005)
    out32 = apply_rotary(x.float(), positions=far)
    assert out32.dtype == torch.float32
    assert torch.allclose(out32.double(), rope_complex(x, far), atol=1e-5)  # angles are float64 inside
    assert apply_rotary(x.to(torch.bfloat16)).dtype == torch.bfloat16


def test_rotary_on_unit_pairs_gives_the_sinusoidal_angles():
    """RoPE and the sinusoidal encoding share their angles: R_p (1, 0) = (cos, sin) of PE's angle."""
    T, d = 30, 16
    ones = torch.zeros(T, d, dtype=torch.float64)
    ones[:, 0::2] = 1.0
    rotated = apply_rotary(ones)
    pe = sinusoidal_encoding(T, d).double()
    assert torch.allclose(rotated[:, 0::2], pe[:, 1::2], atol=1e-6)  # cos
    assert torch.allclose(rotated[:, 1::2], pe[:, 0::2], atol=1e-6)  # sin


def test_rotary_angles_values_and_int_argument():
    a = rotary_angles(5, 8, base=100.0)
    assert a.shape == (5, 4) and a.dtype == torch.float64
    for p in range(5):
        for i in range(4):
            assert math.isclose(a[p, i].item(), p * 100.0 ** (-2 * i / 8), rel_tol=1e-12, abs_tol=1e-15)
    assert rotary_angles(torch.tensor([[0, 1], [2, 3]]), 4).shape == (2, 2, 2)


# ------------------------------------------------------------------------- rotary: properties

@given(half=half_dims, m=st.integers(0, 500), n=st.integers(0, 500), shift=st.integers(-300, 3000), seed=seeds)
def test_rotary_score_depends_only_on_offset(half, m, n, shift, seed):
    q, k = randn(seed, 1, 2 * half), randn(seed + 1, 1, 2 * half)
    score = (apply_rotary(q, positions=[m]) @ apply_rotary(k, positions=[n]).T).item()
    shifted = (apply_rotary(q, positions=[m + shift]) @ apply_rotary(k, positions=[n + shift]).T).item()
    relative = (q @ apply_rotary(k, positions=[n - m]).T).item()  # q . R_(n-m) k
    assert math.isclose(score, shifted, rel_tol=1e-9, abs_tol=1e-9)
    assert math.isclose(score, relative, rel_tol=1e-9, abs_tol=1e-9)


@given(half=half_dims, T=st.integers(1, 10), seed=seeds, start=st.integers(-10_000, 10_000))
def test_rotary_preserves_norms(half, T, seed, start):
    x = randn(seed, 3, T, 2 * half)
    out = apply_rotary(x, positions=torch.arange(start, start + T))
    assert torch.allclose(out.norm(dim=-1), x.norm(dim=-1), atol=1e-10)


@given(half=half_dims, T=st.integers(1, 10), seed=seeds)
def test_rotary_position_zero_is_identity_and_inverse_is_negative_position(half, T, seed):
    x = randn(seed, T, 2 * half)
    assert torch.allclose(apply_rotary(x, positions=torch.zeros(T)), x, atol=0)
    pos = torch.arange(T) * 7
    assert torch.allclose(apply_rotary(apply_rotary(x, positions=pos), positions=-pos), x, atol=1e-10)


# ------------------------------------------------------------------------- rotary: bad input

def test_apply_rotary_errors_name_the_problem():
    with pytest.raises(ValueError, match=r"the last dimension D of x must be even; got x of shape \(2, 5, 7\) \(D=7\)"):
        apply_rotary(torch.randn(2, 5, 7))
    with pytest.raises(ValueError, match=r"x is \(2, 5, 8\) \(T=5\), positions is \(4\)"):
        apply_rotary(torch.randn(2, 5, 8), positions=[0, 1, 2, 3])
    with pytest.raises(ValueError, match=r"positions of shape \(3, 5\) do not broadcast to x.shape\[:-1\] = \(2, 5\)"):
        apply_rotary(torch.randn(2, 5, 8), positions=torch.zeros(3, 5))
    with pytest.raises(ValueError, match=r"do not broadcast to x.shape\[:-1\] = \(5\)"):
        apply_rotary(torch.randn(5, 8), positions=torch.zeros(2, 5))  # would grow the output
    with pytest.raises(TypeError, match=r"x must be a floating-point tensor, got dtype torch.int64"):
        apply_rotary(torch.ones(3, 4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"x must have at least 2 dimensions, got shape \(8\)"):
        apply_rotary(torch.randn(8))
    with pytest.raises(TypeError, match=r"x must be a torch.Tensor, got list"):
        apply_rotary([[1.0, 2.0]])
    with pytest.raises(ValueError, match=r"base must be a positive number in \(0, inf\], got -1.0"):
        apply_rotary(torch.randn(3, 4), base=-1.0)
    with pytest.raises(ValueError, match=r"dim must be a positive even int .* got 5"):
        rotary_angles(4, 5)
    with pytest.raises(TypeError, match=r"positions must be integer or real, got dtype torch.bool"):
        rotary_angles(torch.tensor([True, False]), 4)


# ------------------------------------------------------------------- sinusoidal: properties

@given(half=st.integers(1, 32), k=st.integers(-60, 200), seed=seeds)
def test_sinusoidal_shift_is_one_rotation_for_all_positions(half, k, seed):
    d = 2 * half
    pos = torch.arange(abs(k), abs(k) + 40)  # every pos and pos + k stay >= 0
    pe = sinusoidal_encoding(abs(k) + 40 + max(k, 0), d).double()
    assert torch.allclose(pe[pos + k], pe[pos] @ shift_oracle(k, d).T, atol=1e-5)


@given(half=st.integers(1, 32), p=st.integers(0, 300), q=st.integers(0, 300), shift=st.integers(0, 300))
def test_sinusoidal_dot_product_depends_only_on_distance(half, p, q, shift):
    pe = sinusoidal_encoding(601, 2 * half).double()
    dot = pe[p] @ pe[q]
    assert math.isclose(dot, pe[p + shift] @ pe[q + shift], abs_tol=1e-4)
    closed_form = sum(math.cos((p - q) / 10000 ** (2 * i / (2 * half))) for i in range(half))
    assert math.isclose(dot, closed_form, abs_tol=1e-4)


def test_positional_encoding_adds_the_table_and_refuses_long_inputs():
    layer = PositionalEncoding(8, max_len=10)
    x = randn(0, 2, 4, 8).float()
    assert torch.allclose(layer(x), x + sinusoidal_encoding(10, 8)[:4])
    assert torch.allclose(layer(x, offset=6), x + sinusoidal_encoding(10, 8)[6:])
    with pytest.raises(ValueError, match=r"positions 7..10 exceed max_len=10"):
        layer(x, offset=7)


def test_positional_encoding_dropout_in_train_mode_only():
    layer = PositionalEncoding(32, max_len=64, dropout=0.5)
    x = randn(1, 8, 64, 32).float()
    clean = x + sinusoidal_encoding(64, 32)  # (8, 64, 32): no entry is 0
    with torch.random.fork_rng():
        torch.manual_seed(0)
        out = layer.train()(x)
    kept = out != 0
    assert 0.45 < kept.float().mean().item() < 0.55  # about half of the 16384 entries dropped ...
    assert torch.allclose(out[kept], 2 * clean[kept])  # ... and the rest scaled by 1 / (1 - p) = 2
    layer.eval()
    assert torch.equal(layer(x), layer(x)) and torch.allclose(layer(x), clean)


def test_wavelengths_follow_the_formula():
    # the pair (2i, 2i+1) turns by pos / 10000^(2i/d_model), so it repeats every 2 pi 10000^(2i/d_model) positions
    assert torch.allclose(wavelengths(8), 2 * math.pi * torch.tensor([1.0, 10.0, 100.0, 1000.0], dtype=torch.float64))
    assert torch.allclose(wavelengths(5), 2 * math.pi * 10000.0 ** (torch.tensor([0.0, 2, 4], dtype=torch.float64) / 5))
    lam = wavelengths(16)[3].item()  # one full period later, column 6 (sin) and 7 (cos) are back
    pe = sinusoidal_encoding(1, 16)
    angle = torch.tensor(lam, dtype=torch.float64) / 10000.0 ** (6 / 16)
    assert torch.allclose(torch.stack([angle.sin(), angle.cos()]).float(), pe[0, 6:8], atol=1e-6)


# -------------------------------------------------------------------------- learned embeddings

def test_learned_embedding_equals_table_rows():
    torch.manual_seed(0)
    emb = LearnedPositionalEmbedding(12, 6)
    x = randn(1, 3, 5, 6).float()
    assert emb.table.weight.shape == (12, 6)
    assert sum(p.numel() for p in emb.parameters()) == 72
    out = emb(x)
    assert out.shape == (3, 5, 6)
    assert torch.equal(out, x + emb.table.weight[:5])
    assert torch.equal(emb(x, offset=7), x + emb.table.weight[7:12])


def test_learned_embedding_trains_only_the_rows_it_uses():
    emb = LearnedPositionalEmbedding(10, 4)
    emb(torch.zeros(2, 3, 4), offset=2).sum().backward()
    grad = emb.table.weight.grad
    assert torch.equal(grad[2:5], torch.full((3, 4), 2.0))  # one per batch item
    assert torch.equal(grad[:2], torch.zeros(2, 4)) and torch.equal(grad[5:], torch.zeros(5, 4))


def test_learned_embedding_errors_name_the_problem():
    emb = LearnedPositionalEmbedding(8, 4)
    with pytest.raises(ValueError, match=r"positions 0..9 exceed max_len=8: a learned table has no row "
                                         r"for a position >= 8"):
        emb(torch.zeros(1, 10, 4))
    with pytest.raises(ValueError, match=r"positions 5..8 exceed max_len=8"):
        emb(torch.zeros(1, 4, 4), offset=5)
    with pytest.raises(ValueError, match=r"x must have shape \(B, T, d_model=4\), got \(1, 3, 5\)"):
        emb(torch.zeros(1, 3, 5))
    with pytest.raises(ValueError, match=r"offset must be a non-negative int, got -1"):
        emb(torch.zeros(1, 3, 4), offset=-1)
    with pytest.raises(TypeError, match=r"x must be a floating-point tensor"):
        emb(torch.zeros(1, 3, 4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"max_len must be a positive int, got 0"):
        LearnedPositionalEmbedding(0, 4)
    with pytest.raises(ValueError, match=r"d_model must be a positive int, got 2.5"):
        LearnedPositionalEmbedding(4, 2.5)


# ----------------------------------------------------------------------- the lesson's checks

def test_check_references_match_oracles():
    pe = sinusoidal_encoding(50, 16).double()
    assert torch.allclose(_shift_matrix(7, 16).double(), shift_oracle(7, 16), atol=1e-6)
    assert torch.allclose(_distance_scores(50, 16).double(), pe @ pe.T, atol=1e-4)
    x = randn(3, 2, 9, 8)
    perm = torch.tensor([0, 4, 1, 5, 2, 6, 3, 7])  # pair (i, i + D/2) next to each other
    assert torch.allclose(_rotate_half(x), rope_complex(x[..., perm], torch.arange(9))[..., torch.argsort(perm)],
                          atol=1e-12)
    assert torch.equal(_alibi(3, 2.0), torch.tensor([[0.0, -2, -4], [-2, 0, -2], [-4, -2, 0]]))


# --- the sinusoidal table by the formula ----------------------------------------------------------

def test_sinusoidal_encoding_formula_and_interleaving():
    pe = sinusoidal_encoding(50, 16)
    assert pe.shape == (50, 16)
    pos, i = 7, 3
    angle = pos / 10000 ** (2 * i / 16)
    assert math.isclose(pe[pos, 2 * i].item(), math.sin(angle), abs_tol=1e-6)
    assert math.isclose(pe[pos, 2 * i + 1].item(), math.cos(angle), abs_tol=1e-6)
    assert torch.equal(pe[0, 0::2], torch.zeros(8)) and torch.equal(pe[0, 1::2], torch.ones(8))



def test_sinusoidal_encoding_rotation_identity():
    """PE(pos + k) is a fixed rotation of PE(pos) in each (sin, cos) pair."""
    d, k = 16, 5
    pe = sinusoidal_encoding(60, d).double()
    freqs = 1.0 / 10000 ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    c, s = torch.cos(k * freqs), torch.sin(k * freqs)
    sin_p, cos_p = pe[:-k, 0::2], pe[:-k, 1::2]
    assert torch.allclose(pe[k:, 0::2], sin_p * c + cos_p * s, atol=1e-5)
    assert torch.allclose(pe[k:, 1::2], cos_p * c - sin_p * s, atol=1e-5)



def test_sinusoidal_odd_width_and_errors():
    assert sinusoidal_encoding(3, 5).shape == (3, 5)
    with pytest.raises(ValueError, match=r"d_model must be a positive int, got 0"):
        sinusoidal_encoding(3, 0)
