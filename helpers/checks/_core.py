"""The one engine behind every exercise check: cases, known bugs with their messages, one printed line.

A check runs the learner's function and the reference on the same cases and prints exactly one
line: ``✓`` (all cases match), ``…`` (a stub that returns None) or ``✗`` with the first reason.
On each case it also rejects an answer that modifies its inputs in place, returns something
other than a tensor of the reference's dtype, or fails on the same inputs laid out
non-contiguously; when a wrong answer equals a known bug on every case, the bug's message names
the mistake. Whatever the learner's function returns or raises ends in one ✗ line, never a traceback.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.overrides import TorchFunctionMode


@dataclass
class Case:
    """One input to a check: a short description and the positional/keyword arguments."""

    name: str
    args: tuple
    kwargs: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Bug:
    """A typical mistake: ``fn`` reproduces it, ``message`` names it in the check's line."""

    message: str
    fn: Callable


def clone(x):
    """A deep copy of the tensors in ``x`` (tuples, lists, dicts); other objects are shared (lesson 00)."""
    if isinstance(x, torch.Tensor):
        return x.detach().clone(memory_format=torch.contiguous_format)
    if isinstance(x, (tuple, list)):
        return type(x)(clone(v) for v in x)
    if isinstance(x, dict):
        return {k: clone(v) for k, v in x.items()}
    if isinstance(x, set):
        return set(x)  # a vocabulary: the learner's function gets its own copy
    return x


def randn(generator: torch.Generator, *shape) -> torch.Tensor:
    """Standard-normal float32 test input of ``shape`` drawn from a check's own generator (lesson 02)."""
    return torch.randn(*shape, generator=generator)


def non_contiguous(x):
    """The same values as ``x`` with a non-contiguous layout (tensors of 2+ entries) (lesson 00)."""
    if isinstance(x, torch.Tensor):
        if x.numel() < 2:
            return x.clone()
        if x.dim() >= 2 and x.shape[-1] > 1 and x.shape[-2] > 1:
            return x.mT.contiguous().mT  # column-major in the last two axes
        return torch.stack((x, torch.zeros_like(x)), dim=-1)[..., 0]  # every other element of a buffer
    if isinstance(x, (tuple, list)):
        return type(x)(non_contiguous(v) for v in x)
    if isinstance(x, dict):
        return {k: non_contiguous(v) for k, v in x.items()}
    return x


class Reject(str):
    """What an ``adapt`` step returns to reject an answer: the reason, worded for the learner (lesson 00).

    A plain string from ``adapt`` is the learner's own answer passed through (``"42"``), never a reason.
    """


def describe(x) -> str:
    """A short description of any answer: its type, and the dtype, shape and device of a tensor (lesson 00)."""
    if isinstance(x, torch.Tensor):
        where = f" on the {x.device.type} device" if x.device.type != "cpu" else ""
        return f"Tensor of dtype {str(x.dtype).removeprefix('torch.')} and shape {tuple(x.shape)}{where}"
    if isinstance(x, (tuple, list)):
        return f"{type(x).__name__} of {len(x)} item{'s' if len(x) != 1 else ''}"
    if isinstance(x, str):
        return f"str {x[:30]!r}"
    if isinstance(x, numbers.Number):
        return f"{type(x).__name__} {x!r}"
    if hasattr(x, "shape") and hasattr(x, "dtype"):  # a numpy array
        return f"{type(x).__name__} of dtype {x.dtype} and shape {tuple(x.shape)}"
    return type(x).__name__


def first_output(got, expected):
    """Accept either ``out`` or ``(out, weights)`` from the learner; keep the output (lesson 02)."""
    if isinstance(got, (tuple, list)) and not isinstance(expected, (tuple, list)):
        return got[0] if len(got) in (1, 2) else Reject(
            f"return the output (or the pair (output, weights)), got {describe(got)}")
    return got


def _snapshot(args: tuple, kwargs: dict):
    """Copies of every tensor and every module's state in the arguments, to detect in-place changes."""
    saved = []
    for where, value in [(f"argument {i + 1}", a) for i, a in enumerate(args)] + \
            [(f"argument {k!r}", v) for k, v in kwargs.items()]:
        if isinstance(value, torch.Tensor):
            saved.append((where, value, value.detach().clone()))
        elif isinstance(value, set):
            saved.append((where, value, set(value)))
        elif isinstance(value, nn.Module):
            saved.append((where, value, {k: t.detach().clone() for k, t in value.state_dict().items()}))
    return saved


def _modified(saved) -> str | None:
    for where, value, before in saved:
        if isinstance(value, set):
            if value != before:
                return f"your function changed the set passed as {where}; leave it unchanged"
        elif isinstance(value, torch.Tensor):
            if value.shape != before.shape or not torch.equal(value.detach().nan_to_num(7.0),
                                                              before.nan_to_num(7.0)):
                return (f"your function modified its input ({where}) in place; leave the inputs "
                        "unchanged (use out-of-place operations, or work on a copy)")
        else:
            state = value.state_dict()
            if any(not torch.equal(state[k], t) for k, t in before.items()):
                return f"your function changed the parameters of the module passed as {where}; leave them unchanged"
    return None


def _first_reason(got, expected, reason_of) -> str | None:
    """``reason_of`` applied to each result of a tuple answer; the first reason found, or None."""
    if not isinstance(got, (tuple, list)) or len(got) != len(expected):
        return f"expected a tuple of {len(expected)} results, got {describe(got)}"
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        reason = reason_of(g, e)
        if reason:
            return f"result {i}: {reason}"
    return None


def _type_reason(got, expected) -> str | None:
    """Reject numpy arrays, lists, and tensors of another dtype where the reference gives a tensor."""
    if isinstance(expected, (tuple, list)):
        return _first_reason(got, expected, _type_reason)
    if isinstance(expected, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return f"return a torch.Tensor (dtype {expected.dtype}), got {describe(got)}"
        if got.device.type == "meta":
            return "your function returned a meta tensor, which holds no values: compute on the inputs' device"
        if got.dtype != expected.dtype:
            if got.dtype == torch.float64 and expected.dtype == torch.float32:
                return (f"return dtype {expected.dtype}, got {got.dtype}: a .double(), or a float64 tensor "
                        "made inside your function, changed the dtype; keep the inputs' float32")
            return f"return dtype {expected.dtype}, got {got.dtype}"
        return None
    if isinstance(expected, bool):
        return None if isinstance(got, bool) else f"return True or False, got {type(got).__name__}"
    if isinstance(expected, numbers.Integral):
        if isinstance(got, bool) or not isinstance(got, numbers.Integral):
            return f"return an int, got {describe(got)}"
    return None


def compare(got, expected, atol: float | dict = 1e-5, rtol: float = 1e-4):
    """Return None when ``got`` matches ``expected`` (tensors, numbers or tuples), else a reason (lesson 00).

    ``atol`` may be a dict from dtype to tolerance (python floats count as torch.float64).
    """
    if isinstance(expected, (tuple, list)):
        return _first_reason(got, expected, lambda g, e: compare(g, e, atol, rtol))
    if isinstance(expected, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return f"expected a tensor, got {describe(got)}"
        if got.device.type == "meta":
            return "your function returned a meta tensor, which holds no values: compute on the inputs' device"
        if got.is_complex() and not expected.is_complex():
            return f"your function returned a complex tensor ({describe(got)}); the answer is real"
        if tuple(got.shape) != tuple(expected.shape):
            return f"shape {tuple(got.shape)}, but the reference gives {tuple(expected.shape)}" + _shape_hint(
                tuple(got.shape), tuple(expected.shape))
        got = got.detach().to(expected.device)
        if expected.dtype == torch.bool or not expected.is_floating_point():
            if not torch.equal(got.to(expected.dtype), expected):
                wrong = (got.to(expected.dtype) != expected).sum().item()
                return f"{wrong} of {expected.numel()} entries differ from the reference"
            return None
        got = got.to(expected.dtype)
        tol = atol[expected.dtype] if isinstance(atol, dict) else atol
        if torch.isnan(got).any() and not torch.isnan(expected).any():
            return "contains NaN where the reference has none (overflow? a fully masked row?)"
        if not torch.allclose(got, expected, atol=tol, rtol=rtol, equal_nan=True):
            diff = (got - expected).abs().nan_to_num(float("inf")).max().item()
            return f"values differ from the reference (largest difference {diff:.3g})" + _value_hint(
                got, expected, tol, rtol)
        return None
    if isinstance(expected, float):
        if isinstance(got, (str, bytes)):
            return f"expected a number, got {describe(got)}"
        try:
            value = float(got)
        except (TypeError, ValueError, RuntimeError, NotImplementedError):
            return f"expected a number, got {describe(got)}"
        tol = atol[torch.float64] if isinstance(atol, dict) else atol
        if math.isnan(value) or abs(value - expected) > tol + rtol * abs(expected):
            return f"got {value:.6g}, expected {expected:.6g}"
        return None
    try:
        same = bool(got == expected)
    except Exception:  # e.g. a tensor compared with a tuple
        same = False
    return None if same else f"got {_short(got)}, expected {expected!r}"


def _shape_hint(got: tuple, expected: tuple) -> str:
    """Name the slip behind a wrong shape when the shape itself shows it (an axis of 1, a transpose)."""
    def squeezed(shape):
        return tuple(n for n in shape if n != 1)

    if math.prod(got) != math.prod(expected):
        return ""
    if len(got) == len(expected) >= 2 and got[:-2] + got[-2:][::-1] == expected:
        return ": the last two axes are swapped (a transpose too many, or one missing)"
    if squeezed(got) == squeezed(expected) and len(got) > len(expected):
        return ": an extra axis of size 1 (a keepdim=True, an [None] or an unsqueeze too many?)"
    if squeezed(got) == squeezed(expected):
        return ": an axis of size 1 is missing (a squeeze too many, or keepdim=True forgotten?)"
    return ": the same number of entries in another shape (check the order of the axes of your view or reshape)"


def _value_hint(got: torch.Tensor, expected: torch.Tensor, atol: float, rtol: float) -> str:
    """Name the slip behind wrong values when they are a simple transform of the right ones."""
    if not torch.isfinite(got).all() or not torch.isfinite(expected).all():
        return ""
    if torch.allclose(got, -expected, atol=atol, rtol=rtol):
        return ": your values have the opposite sign"
    if expected.dim() >= 2 and expected.shape[-1] == expected.shape[-2] and \
            torch.allclose(got, expected.mT, atol=atol, rtol=rtol):
        return ": your result is the transpose of the right one (are rows and columns swapped?)"
    big = expected.abs() > 10 * atol
    if big.any():
        ratio = (got[big] / expected[big]).median().item()
        if math.isfinite(ratio) and abs(ratio - 1) > 1e-3 and ratio != 0 and \
                torch.allclose(got, ratio * expected, atol=atol, rtol=rtol):
            return (f": your values are {ratio:.4g} times the right ones, a constant factor "
                    "(a scale missing, doubled or inverted?)")
    return ""


def _short(x) -> str:
    """``repr`` for short answers, a description for long ones (tensors, long lists)."""
    text = repr(x) if not isinstance(x, torch.Tensor) or x.numel() <= 8 else describe(x)
    return text if len(text) <= 80 else describe(x)


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


class _Stop(Exception):
    """The one line a check prints, raised from deep inside so that nothing else is printed."""


def _not_a_function(err: Exception) -> str | None:
    """The type name when ``err`` is a check's own wrapper calling a learner's answer that is no function.

    Some checks wrap the learner's function (to time it, or to read its answer); given None or a string
    instead of a function, the wrapper's call raises "'NoneType' object is not callable" inside the
    checks package. The same error raised inside the learner's own code is the learner's bug, not this.
    """
    if not isinstance(err, TypeError) or not str(err).endswith("object is not callable"):
        return None
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None or "helpers/checks/" not in tb.tb_frame.f_code.co_filename.replace("\\", "/"):
        return None
    return str(err).split("'")[1] if str(err).count("'") >= 2 else "something else"


def _call(fn, args, kwargs, where):
    try:
        return fn(*args, **kwargs)
    except NotImplementedError:
        return None
    except Exception as err:  # the learner's bug is the message, not a crash of the check
        kind = _not_a_function(err)
        if kind is not None:
            raise _Stop(f"✗ expected a function, got {kind}") from None
        text = str(err).strip().splitlines()[0] if str(err).strip() else ""
        hint = ""
        if "view size is not compatible" in text:
            hint = " (view needs contiguous memory: use reshape, or call .contiguous() first)"
        raise _Stop(f"✗ on {where}, your function raised {type(err).__name__}: {text[:200]}{hint}") from None


def _adapted(adapt, got, expected, where):
    """``adapt(got, expected)``; an error inside it (an answer it cannot read) becomes the check's line."""
    if adapt is None:
        return got
    try:
        return adapt(got, expected)
    except _Stop:
        raise
    except Exception:
        raise _Stop(f"✗ on {where}: the check cannot read your answer ({describe(got)})") from None


_RAISED = object()  # an answer that raised on a case


def _answer(f, case):
    try:
        return f(*clone(case.args), **clone(case.kwargs))
    except Exception:
        return _RAISED


def _known_bug(fn, cases, bugs, atol, rtol, adapt) -> str | None:
    """The message of the first bug that reproduces the learner's answer on every case, if any.

    A bug reproduces an answer when it returns the same on every case where the answer returns,
    and raises where the answer raises (a slip such as W instead of W.T fails only on some shapes).
    """
    answers = [_answer(fn, case) for case in cases]
    if all(a is _RAISED for a in answers):
        return None
    for bug in bugs:
        try:
            for case, got in zip(cases, answers, strict=True):
                wrong = _answer(bug.fn, case)
                if (got is _RAISED) != (wrong is _RAISED):
                    break
                if got is _RAISED:
                    continue
                if adapt is not None:
                    got = adapt(got, wrong)
                if isinstance(got, Reject) or compare(got, wrong, atol, rtol) is not None:
                    break
            else:
                return bug.message
        except Exception:  # an answer adapt cannot read
            continue
    return None


def _run_case(name, fn, reference_fn, case, cases, bugs, atol, rtol, adapt, strict_types, layouts, validate,
              bug_tolerance):
    args, kwargs = clone(case.args), clone(case.kwargs)
    saved = _snapshot(args, kwargs)
    got = _call(fn, args, kwargs, case.name)
    if got is None:
        raise _Stop(f"… {name}: not implemented yet (your function returned None)")
    if isinstance(got, Reject):  # a check's own wrapper of the learner's function rejected the answer
        raise _Stop(f"✗ {name}: on {case.name}: {got}")
    modified = _modified(saved)
    if modified:
        raise _Stop(f"✗ {name}: on {case.name}: {modified}")
    expected = reference_fn(*clone(case.args), **clone(case.kwargs))
    bug_atol, bug_rtol = bug_tolerance or (atol, rtol)
    raw, got = got, _adapted(adapt, got, expected, case.name)
    try:
        if isinstance(got, Reject):  # a known bug's message comes first
            raise _Stop(f"✗ {name}: on {case.name}: "
                        f"{_known_bug(fn, cases, bugs, bug_atol, bug_rtol, adapt) or got}")
        reason = _type_reason(got, expected) if strict_types else None
        if reason is None:
            reason = compare(got, expected, atol, rtol)
        if reason is not None:  # a known bug's message names the mistake, even one of the wrong type
            reason = _known_bug(fn, cases, bugs, bug_atol, bug_rtol, adapt) or reason
        if reason is None and validate is not None:
            reason = validate(got, case)
    except _Stop:
        raise
    except Exception:  # an answer of a kind no step above foresaw: name it, never a traceback
        raise _Stop(f"✗ {name}: on {case.name}: the check cannot read your answer ({describe(raw)})") from None
    if reason is not None:
        raise _Stop(f"✗ {name}: on {case.name}: {reason}")
    tensors = [a for a in list(case.args) + list(case.kwargs.values()) if isinstance(a, torch.Tensor)]
    if layouts and any(a.numel() > 1 for a in tensors):
        where = f"{case.name}, with non-contiguous input tensors (e.g. transposed views)"
        other = _call(fn, non_contiguous(clone(case.args)), non_contiguous(clone(case.kwargs)), where)
        if other is None:
            raise _Stop(f"✗ {name}: on {where}: your function returned None")
        other = _adapted(adapt, other, expected, where)
        try:
            reason = other if isinstance(other, Reject) else compare(other, expected, atol, rtol)
        except Exception:
            reason = f"the check cannot read your answer ({describe(other)})"
        if reason is not None:
            raise _Stop(f"✗ {name}: on {where}: {reason}")


def _then(name, then, fn):
    """Run the extra step after all cases; whatever the learner's function raises there becomes the line."""
    try:
        return then(fn)
    except _Stop:
        raise
    except Exception as err:
        raise _Stop(f"✗ {name}: all cases match, but on the extra test that follows them your function raised "
                    f"{type(err).__name__}: {err}") from None


def check(name: str, fn, reference_fn, cases, *, bugs=(), atol: float | dict = 1e-5, rtol: float = 1e-4,
          adapt=None, strict_types: bool = True, layouts: bool = True, validate=None,
          then=None, matches: str = "matches the reference", bug_tolerance=None) -> CheckResult:
    """Run ``fn`` and ``reference_fn`` on every case; print exactly one line; truthy if all match (lesson 00).

    ``bugs``: known mistakes (``Bug``), whose message replaces the generic reason when the answer
    equals one of them on every case. ``adapt(got, expected)`` may reshape the learner's
    answer first (or return a ``Reject``, the reason to reject it). ``strict_types``: a tensor of the
    reference's dtype, an int where it gives an int. ``layouts``: also run every case with
    non-contiguous tensors. ``validate(got, case)`` may return an extra reason; ``then(fn)``,
    run once all cases pass, returns ``(ok, text)``: the reason of failure, or what follows the
    success line. ``matches`` words the success line: ``✓ name: {matches} on all N cases``.
    ``bug_tolerance``: ``(atol, rtol)`` for matching a known bug, when it must be looser than the check's.
    Nothing the learner's function returns or raises escapes as a traceback: it ends in one ✗ line.
    """
    if not callable(fn):
        print(f"✗ {name}: expected a function, got {describe(fn)}")
        return CheckResult(False)
    try:
        for case in cases:
            _run_case(name, fn, reference_fn, case, cases, bugs, atol, rtol, adapt, strict_types, layouts, validate,
                      bug_tolerance)
        line = f"✓ {name}: {matches} on all {len(cases)} cases"
        if then is not None:
            ok, text = _then(name, then, fn)
            if not ok:
                raise _Stop(f"✗ {name}: {text}")
            line += text
    except _Stop as stop:
        line = str(stop)
        if line.startswith("✗ on ") or line.startswith("✗ expected a function"):
            line = f"✗ {name}: " + line[2:]
        print(line)
        return CheckResult(False)
    print(line)
    return CheckResult(True)


class _Recorder(TorchFunctionMode):
    """Record every torch function and tensor method called inside the block, and which got -inf."""

    def __init__(self):
        super().__init__()
        self.names, self.with_minus_inf = set(), set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        self.names.add(name)
        values = list(args) + list((kwargs or {}).values())
        if any(isinstance(a, float) and a == float("-inf") for a in values):
            self.with_minus_inf.add(name)
        return func(*args, **(kwargs or {}))


def torch_calls(fn, *args, minus_inf: bool = False, **kwargs) -> set:
    """Names of the torch functions and tensor methods ``fn(*args, **kwargs)`` calls (lesson 06).

    With ``minus_inf=True``, only those that received the number -inf as an argument.
    """
    with _Recorder() as recorder:
        fn(*args, **kwargs)
    return recorder.with_minus_inf if minus_inf else recorder.names


def _number(x) -> str:
    """4 significant digits, but whole numbers of 5 digits or more in full (1,774,464, not 1.774e+06)."""
    return f"{int(x):,}" if float(x).is_integer() and 1e4 <= abs(x) < 1e15 else f"{x:.4g}"


def _as_number(x) -> float | Reject:
    """A prediction as a float: Python and numpy numbers, fractions, one-element tensors; else the reason."""
    if isinstance(x, torch.Tensor):
        if x.numel() != 1 or x.dtype == torch.bool or x.is_complex() or x.device.type == "meta":
            return Reject(f"the prediction must be one number, got {describe(x)}")
        x = x.detach().cpu().reshape(()).item()
    elif type(x).__module__ == "numpy" and getattr(x, "size", 0) == 1 and hasattr(x, "item"):
        x = x.item()  # a numpy scalar or one-element array
    if isinstance(x, str):
        return Reject(f"the prediction must be a finite number, not a string: write it without quotes (got {x[:30]!r})")
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        return Reject(f"the prediction must be a finite number, got {describe(x)}")
    value = float(x)
    if not math.isfinite(value):
        return Reject(f"the prediction must be a finite number, got {x!r}")
    return value


@dataclass(frozen=True)
class Slip:
    """A typical wrong prediction: ``near(predicted, measured)`` recognises it, ``message`` names it."""

    message: str
    near: Callable[[float, float], bool]


def slip_at(value: float, message: str, rel: float = 0.05) -> Slip:
    """A slip recognised by its value: a prediction within ``rel`` (relative) of ``value`` (lesson 01)."""
    return Slip(message, lambda predicted, measured: abs(predicted - value) <= rel * abs(value) + 1e-12)


def check_prediction(name: str, predicted, measure: Callable[[], float], what: str,
                     rel_tol: float = 0.0, abs_tol: float = 0.0, slips=()) -> CheckResult:
    """Compare a number the learner wrote down before running with a measurement; print one line (lesson 01).

    ``measure()`` makes the measurement; the prediction is right when it lies within
    ``max(abs_tol, rel_tol * |measured|)`` of it. ``slips`` (``Slip``): classic wrong predictions,
    each named by its own message; the first that recognises a wrong prediction replaces the
    generic "find the step of your reasoning that differs".
    """
    if predicted is None or predicted is ...:
        print(f"… {name}: write your prediction first (a number in place of None)")
        return CheckResult(False)
    value = _as_number(predicted)
    if isinstance(value, Reject):
        print(f"✗ {name}: {value}")
        return CheckResult(False)
    predicted = value
    measured = float(measure())
    margin = max(abs_tol, rel_tol * abs(measured))
    if abs(predicted - measured) <= margin:
        print(f"✓ {name}: you predicted {_number(predicted)}; the measured {what} is {_number(measured)} "
              f"(within {margin:.2g})")
        return CheckResult(True)
    hint = next((slip.message for slip in slips if slip.near(predicted, measured)),
                "find the step of your reasoning that differs")
    print(f"✗ {name}: you predicted {_number(predicted)}; the measured {what} is {_number(measured)}, "
          f"more than {margin:.2g} away: {hint}")
    return CheckResult(False)
