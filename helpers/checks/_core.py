"""The exercise-checker pattern: run the learner's function and the reference on the same cases."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Case:
    """One input to a check: a short description and the positional/keyword arguments."""

    name: str
    args: tuple
    kwargs: dict = field(default_factory=dict)


def _clone(x):
    if isinstance(x, torch.Tensor):
        return x.clone()
    if isinstance(x, (tuple, list)):
        return type(x)(_clone(v) for v in x)
    if isinstance(x, dict):
        return {k: _clone(v) for k, v in x.items()}
    return x


def compare(got, expected, atol: float = 1e-5, rtol: float = 1e-4):
    """Return None when ``got`` matches ``expected`` (tensors, numbers or tuples), else a reason."""
    if isinstance(expected, (tuple, list)):
        if not isinstance(got, (tuple, list)) or len(got) != len(expected):
            return f"expected a tuple of {len(expected)} results, got {type(got).__name__}"
        for i, (g, e) in enumerate(zip(got, expected, strict=True)):
            reason = compare(g, e, atol, rtol)
            if reason:
                return f"result {i}: {reason}"
        return None
    if isinstance(expected, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            try:
                got = torch.as_tensor(got, dtype=expected.dtype)
            except (TypeError, ValueError, RuntimeError):
                return f"expected a tensor, got {type(got).__name__}"
        if tuple(got.shape) != tuple(expected.shape):
            return f"shape {tuple(got.shape)}, but the reference gives {tuple(expected.shape)}"
        if expected.dtype == torch.bool or not expected.is_floating_point():
            if not torch.equal(got.to(expected.dtype), expected):
                wrong = (got.to(expected.dtype) != expected).sum().item()
                return f"{wrong} of {expected.numel()} entries differ from the reference"
            return None
        got = got.to(expected.dtype)
        if torch.isnan(got).any() and not torch.isnan(expected).any():
            return "contains NaN where the reference has none (overflow? a fully masked row?)"
        if not torch.allclose(got, expected, atol=atol, rtol=rtol, equal_nan=True):
            diff = (got - expected).abs().nan_to_num(float("inf")).max().item()
            return f"values differ from the reference (largest difference {diff:.3g})"
        return None
    if isinstance(expected, float):
        return None if abs(float(got) - expected) <= atol + rtol * abs(expected) else (
            f"got {float(got):.6g}, expected {expected:.6g}")
    return None if got == expected else f"got {got!r}, expected {expected!r}"


class CheckResult:
    """True or False like a bool (so `assert check_x(fn)` works), but shows nothing in a notebook."""

    def __init__(self, ok: bool):
        self.ok = bool(ok)

    def __bool__(self) -> bool:
        return self.ok

    def __repr__(self) -> str:
        return f"CheckResult(ok={self.ok})"

    def _ipython_display_(self):
        pass  # the check already printed its one line


def run_check(name: str, learner_fn, reference_fn, cases, atol: float = 1e-5,
              rtol: float = 1e-4, adapt=None) -> CheckResult:
    """Run ``learner_fn`` and ``reference_fn`` on every case; print one line; truthy if all match.

    ``adapt(got, expected)`` may reshape the learner's answer first (e.g. keep only the output).
    """
    if not callable(learner_fn):
        print(f"✗ {name}: expected a function, got {type(learner_fn).__name__}")
        return CheckResult(False)
    for case in cases:
        try:
            got = learner_fn(*_clone(case.args), **_clone(case.kwargs))
        except NotImplementedError:
            got = None
        except Exception as err:  # the learner's bug is the message, not a crash of the check
            print(f"✗ {name}: on {case.name}, your function raised {type(err).__name__}: {err}")
            return CheckResult(False)
        if got is None:
            print(f"… {name}: not implemented yet (your function returned None)")
            return CheckResult(False)
        expected = reference_fn(*_clone(case.args), **_clone(case.kwargs))
        if adapt is not None:
            got = adapt(got, expected)
        reason = compare(got, expected, atol=atol, rtol=rtol)
        if reason:
            print(f"✗ {name}: on {case.name}: {reason}")
            return CheckResult(False)
    print(f"✓ {name}: matches the reference on all {len(cases)} cases")
    return CheckResult(True)
