"""Exercise checks of lesson 06 (each one prints a single line and returns True or False)."""

from __future__ import annotations

import torch

from helpers.checks._core import Bug, Case, CheckResult, check, torch_calls
from helpers.checks._slips import check_prediction_with_slips
from helpers.positional import apply_rotary, sinusoidal_encoding

__all__ = ["check_shift_matrix", "check_distance_scores", "check_rotate_half", "check_alibi_bias",
           "check_predict_self_dot"]


def _omega(d_model: int) -> torch.Tensor:
    return 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # (C/2,)


def _shift_matrix(k, d_model):
    c, s = torch.cos(k * _omega(d_model)), torch.sin(k * _omega(d_model))  # (C/2,) each
    m = torch.zeros(d_model, d_model, dtype=torch.float64)  # (C, C)
    # rows (2i, 2i+1): new sin = cos(kw) sin + sin(kw) cos, new cos = -sin(kw) sin + cos(kw) cos
    m[0::2, 0::2], m[0::2, 1::2] = torch.diag(c), torch.diag(s)
    m[1::2, 0::2], m[1::2, 1::2] = torch.diag(-s), torch.diag(c)
    return m.float()


def _shift_matrix_with(k, d_model, omega):
    c, s = torch.cos(k * omega), torch.sin(k * omega)  # (C/2,) each
    m = torch.zeros(d_model, d_model, dtype=torch.float64)
    m[0::2, 0::2], m[0::2, 1::2] = torch.diag(c), torch.diag(s)
    m[1::2, 0::2], m[1::2, 1::2] = torch.diag(-s), torch.diag(c)
    return m.float()


def _half_split_shift(k, d_model):
    """The same rotations laid out for pairs (i, i + C/2) instead of (2i, 2i + 1)."""
    order = torch.cat((torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)))  # (C,)
    return _shift_matrix(k, d_model)[order][:, order]


def _distance_scores(length, d_model, n_freq=None):
    omega = _omega(d_model) if n_freq is None else 10000.0 ** (-torch.arange(n_freq) / n_freq)
    pos = torch.arange(length, dtype=torch.float64)  # (T,)
    dist = pos[:, None] - pos[None, :]  # (T, 1) - (1, S) -> (T, S)
    return torch.cos(dist[..., None] * omega).sum(-1).float()  # (T, S, C/2) -> (T, S)


def _distance_scores_omega(length, omega):
    pos = torch.arange(length, dtype=torch.float64)  # (T,)
    dist = pos[:, None] - pos[None, :]  # (T, S)
    return torch.cos(dist[..., None] * omega).sum(-1).float()  # (T, S, C/2) -> (T, S)


def _distance_scores_with(length, d_model, wave, combine=torch.sub, reduce="sum"):
    pos = torch.arange(length, dtype=torch.float64)
    dist = combine(pos[:, None], pos[None, :])  # (T, S)
    terms = wave(dist[..., None] * _omega(d_model))  # (T, S, C/2)
    return {"sum": terms.sum(-1), "mean": terms.mean(-1), "none": terms}[reduce].float()


def _rotate_half(x, sign=1.0, exponent=2, first=0, swap=False):
    T, D = x.shape[-2], x.shape[-1]
    theta = 10000.0 ** (-torch.arange(0, D, 2, dtype=torch.float64) * (exponent / 2) / D)  # (D/2,)
    angle = sign * (torch.arange(T, dtype=torch.float64)[:, None] + first) * theta  # (T, D/2)
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)  # (T, D/2) each
    x1, x2 = x[..., : D // 2], x[..., D // 2:]  # (..., T, D/2) each: feature i pairs with i + D/2
    halves = (x1 * cos - x2 * sin, x2 * cos + x1 * sin)
    return torch.cat(halves[::-1] if swap else halves, dim=-1)  # (..., T, D)


def _alibi(T, slope):
    pos = torch.arange(T, dtype=torch.float32)  # (T,)
    return -slope * (pos[:, None] - pos[None, :]).abs()  # (T, S)


def _float64_as_float32(got, expected):
    """The exercise states no dtype: a float64 answer (the lesson computes in float64) counts by its values."""
    if isinstance(got, torch.Tensor) and got.dtype == torch.float64 and isinstance(expected, torch.Tensor):
        return got.to(expected.dtype)
    return got


def check_shift_matrix(fn) -> CheckResult:
    """Check ``shift_matrix(k, d_model) -> (C, C)`` with PE[pos + k] = M @ PE[pos] (lesson 06)."""
    cases = [Case("k=1, d_model=4", (1, 4)), Case("k=5, d_model=16", (5, 16)),
             Case("k=0, d_model=8 (the identity)", (0, 8)), Case("k=-3, d_model=8 (a shift back)", (-3, 8))]
    bugs = [Bug("this is the transpose, which shifts by -k; row 2i must give sin(a + b) = sin a cos b + cos a sin b",
              lambda k, d: _shift_matrix(k, d).T),
            Bug("the frequencies are 10000^(-2i/d_model) for pair i; yours use 10000^(-i/d_model)",
              lambda k, d: _shift_matrix_with(k, d, 10000.0 ** (-torch.arange(d // 2, dtype=torch.float64) / d))),
            Bug("your blocks act on features (i, i + d_model/2); the encoding interleaves: sin in column 2i, "
                "cos in column 2i + 1", _half_split_shift),
            Bug("the frequencies are 10000^(-2i/d_model) for pair i; yours divide the exponent by d_model / 2",
              lambda k, d: _shift_matrix_with(k, d, 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64)
                                                                 / (d // 2)))),
            Bug("every pair turns by the angle k; pair i turns by k * w_i, with its own frequency "
                "w_i = 10000^(-2i/d_model)",
                lambda k, d: _shift_matrix_with(k, d, torch.ones(d // 2, dtype=torch.float64)))]
    return check("shift_matrix", fn, _shift_matrix, cases, bugs=bugs, adapt=_float64_as_float32)


def check_distance_scores(fn) -> CheckResult:
    """Check ``distance_scores(length, d_model) -> (T, S)`` = PE(p) . PE(q) from the closed form (lesson 06)."""
    cases = [Case("length=6, d_model=4", (6, 4)), Case("length=20, d_model=16", (20, 16)),
             Case("length=50, d_model=64", (50, 64))]
    bugs = [Bug("you summed d_model cosines; there is one frequency per (sin, cos) pair, so d_model / 2 of them",
              lambda n, d: _distance_scores(n, d, n_freq=d)),
             Bug("twice the reference: each pair contributes one cosine, cos((p - q) w_i), not two",
              lambda n, d: 2 * _distance_scores(n, d)),
             Bug("you summed sines: sin a sin b + cos a cos b = cos(a - b), so each pair gives cos((p - q) w_i)",
              lambda n, d: _distance_scores_with(n, d, torch.sin)),
             Bug("the frequencies are 10000^(-2i/d_model) for pair i; yours use 10000^(-i/d_model)",
              lambda n, d: _distance_scores_omega(
                  n, 10000.0 ** (-torch.arange(d // 2, dtype=torch.float64) / d))),
             Bug("cos((p + q) w_i): sin a sin b + cos a cos b = cos(a - b), so the angle is the DIFFERENCE, "
                 "cos((p - q) w_i)", lambda n, d: _distance_scores_with(n, d, torch.cos, combine=torch.add)),
             Bug("the angle is the difference of the two angles, (p - q) w_i, not the product p q w_i",
              lambda n, d: _distance_scores_with(n, d, torch.cos, combine=torch.mul)),
             Bug("that is the mean over the pairs; a dot product sums them: sum_i cos((p - q) w_i)",
              lambda n, d: _distance_scores_with(n, d, torch.cos, reduce="mean")),
             Bug("sum over the d_model / 2 frequencies (the last axis): the result is one score per (p, q), (T, S)",
              lambda n, d: _distance_scores_with(n, d, torch.cos, reduce="none"))]

    def closed_form_only(fn):  # the encoding needs sines; the closed form sum_i cos((p - q) w_i) does not
        used = torch_calls(fn, 20, 16) & {"sin", "sin_", "sinusoidal_encoding"}
        if used:
            return False, ("the values are right, but your function computes sines, so it builds the encoding; "
                           "use only the closed form sum_i cos((p - q) w_i)")
        return True, ""

    return check("distance_scores", fn, _distance_scores, cases, bugs=bugs, atol=1e-4, adapt=_float64_as_float32,
                 then=closed_form_only)


def check_rotate_half(fn) -> CheckResult:
    """Check ``rotate_half(x (..., T, D)) -> (..., T, D)``, RoPE with pairs (i, i + D/2) (lesson 06)."""
    g = torch.Generator().manual_seed(6)
    cases = [Case("x of shape (5, 4)", (torch.randn(5, 4, generator=g),)),
             Case("x of shape (2, 3, 7, 8) (B, H, T, D)", (torch.randn(2, 3, 7, 8, generator=g),)),
             Case("x of shape (40, 16)", (torch.randn(40, 16, generator=g),))]
    bugs = [Bug("that is the interleaved layout of apply_rotary; here feature i pairs with feature i + D/2",
              apply_rotary),
             Bug("your rotation goes the wrong way (angle -m*theta): the first half gets x1 cos - x2 sin",
              lambda x: _rotate_half(x, sign=-1.0)),
             Bug("the frequencies are 10000^(-2i/D) for pair i; yours use 10000^(-i/D)",
              lambda x: _rotate_half(x, exponent=1)),
             Bug("positions start at 0: the first token is not rotated (angle 0 * theta_i); yours start at 1",
              lambda x: _rotate_half(x, first=1)),
             Bug("the two halves are swapped in the output: first x1 cos - x2 sin, then x2 cos + x1 sin",
              lambda x: _rotate_half(x, swap=True))]
    return check("rotate_half", fn, _rotate_half, cases, bugs=bugs)


def check_alibi_bias(fn) -> CheckResult:
    """Check ``alibi_bias(T, slope) -> (T, S)`` with bias[m, n] = -slope * |m - n| (lesson 06)."""
    cases = [Case("T=4, slope=1.0", (4, 1.0)), Case("T=9, slope=0.25", (9, 0.25)), Case("T=1, slope=0.5", (1, 0.5))]
    bugs = [Bug("the sign is flipped: far keys must be penalised, so the bias is <= 0 and largest (0) on the diagonal",
              lambda T, s: -_alibi(T, s)),
             Bug("use the distance |m - n|: without abs() keys to the right get a bonus instead of a penalty",
              lambda T, s: -s * (torch.arange(T)[:, None] - torch.arange(T)[None, :]).float()),
             Bug("use the distance |m - n|: without abs() keys on one side get a bonus instead of a penalty",
              lambda T, s: -s * (torch.arange(T)[None, :] - torch.arange(T)[:, None]).float()),
             Bug("the bias is 0 above the diagonal: it is -slope * |m - n| for every pair, future keys too (a causal "
                 "mask, applied separately, hides them)", lambda T, s: _alibi(T, s).tril()),
             Bug("return the (T, S) matrix, without a leading axis", lambda T, s: _alibi(T, s)[None]),
             Bug("you added a causal mask (-inf above the diagonal): the exercise asks for the bias alone, finite "
                 "everywhere; the mask is applied separately",
              lambda T, s: _alibi(T, s).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))),
             Bug("the slope is missing: multiply the distance by slope",
              lambda T, s: _alibi(T, 1.0))]
    return check("alibi_bias", fn, _alibi, cases, bugs=bugs)


def _self_dot(d_model: int = 64, position: int = 37) -> float:
    pe = sinusoidal_encoding(position + 1, d_model)[position].double()  # (C,)
    return float(pe @ pe)


def check_predict_self_dot(predicted) -> CheckResult:
    """Predict then measure: PE(37) . PE(37), the squared length of one position's encoding, d_model=64 (lesson 06)."""
    slips = ((64.0, "the 64 features are not 1 each: each (sin, cos) pair gives sin^2 + cos^2 = 1, and there are "
                    "d_model / 2 = 32 pairs"),
             (1.0, "the encoding is not normalised to length 1: each of the 32 (sin, cos) pairs contributes "
                   "sin^2 + cos^2 = 1"),
             (0.0, "a nonzero vector's dot product with itself is its squared length, never 0"),
             (8.0, "that is the length of a 64-vector of ones, not the squared length of PE(37): each (sin, cos) "
                   "pair contributes sin^2 + cos^2 = 1"),
             (32 ** 0.5, "that is the length of PE(37); its dot product with itself is the squared length"),
             (37.0, "the position does not matter: sin^2 + cos^2 = 1 for every pair at every position"))
    return check_prediction_with_slips(
        "predict_self_dot", predicted, _self_dot, "PE(37) . PE(37) at d_model=64", abs_tol=0.5, slips=slips,
        hint="group the 64 features into their 32 (sin, cos) pairs: what does one pair contribute?")
