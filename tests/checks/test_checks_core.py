"""The checks' engine (helpers/checks/_core.py): one line, stubs, crashes, in-place edits, types, layouts."""

from fractions import Fraction

import numpy as np
import pytest
import torch

from helpers import checks
from helpers.checks import Bug, Case, check, check_prediction, compare
from helpers.checks._core import Slip, slip_at


def _double(x):
    return 2 * x


CASES = [Case("a (3, 4) tensor", (torch.arange(12.0).view(3, 4),)), Case("a (5,) tensor", (torch.ones(5),))]


def run(fn, **kwargs):
    return check("double", fn, _double, CASES, **kwargs)


def test_right_answer_prints_the_stored_line(accepts):
    accepts(run, _double, "✓ double: matches the reference on all 2 cases")


def test_stub_crash_and_non_function(rejects):
    rejects(run, lambda x: None, "… double: not implemented yet (your function returned None)")

    def stub(x):
        raise NotImplementedError

    rejects(run, stub, "not implemented yet")
    rejects(run, lambda x: x @ x, "✗ double: on a (3, 4) tensor, your function raised RuntimeError")
    rejects(run, 3, "✗ double: expected a function, got int")


def test_in_place_edit_is_rejected(rejects):
    rejects(run, lambda x: x.mul_(2), "modified its input (argument 1) in place")

    def returns_right_but_scribbles(x):
        out = 2 * x
        x.zero_()
        return out

    rejects(run, returns_right_but_scribbles, "in place")


def test_numpy_and_wrong_dtype_are_rejected(rejects):
    rejects(run, lambda x: (2 * x).numpy(), "return a torch.Tensor (dtype torch.float32), got ndarray")
    rejects(run, lambda x: 2 * x.double(), "return dtype torch.float32, got torch.float64")
    rejects(run, lambda x: (2 * x).tolist(), "got list")


def test_non_contiguous_inputs_are_tried(rejects, accepts):
    def flattens_with_view(x):  # right on contiguous tensors, crashes on a transposed one
        return 2 * x.view(-1).view(x.shape)

    rejects(run, flattens_with_view, "non-contiguous input tensors")
    accepts(lambda fn: run(fn, layouts=False), flattens_with_view)


def test_known_bug_names_the_mistake(rejects):
    bugs = [Bug("you tripled instead of doubling", lambda x: 3 * x)]
    rejects(lambda fn: run(fn, bugs=bugs), lambda x: 3 * x, "✗ double: on a (3, 4) tensor: you tripled")
    rejects(lambda fn: run(fn, bugs=bugs), lambda x: 4 * x, "values differ from the reference")


def test_then_runs_after_all_cases(rejects, accepts):
    accepts(lambda fn: run(fn, then=lambda f: (True, ", and more")), _double,
            "✓ double: matches the reference on all 2 cases, and more")
    rejects(lambda fn: run(fn, then=lambda f: (False, "too slow")), _double, "✗ double: too slow")


def test_ints_must_be_ints(rejects, accepts):
    cases = [Case("3", (3,))]
    accepts(lambda fn: check("sq", fn, lambda n: n * n, cases), lambda n: n * n)
    rejects(lambda fn: check("sq", fn, lambda n: n * n, cases), lambda n: float(n * n), "return an int, got float")
    rejects(lambda fn: check("sq", fn, lambda n: n * n, cases), lambda n: np.float64(n * n), "return an int")


def test_compare_reasons():
    assert compare(torch.ones(2), torch.ones(2)) is None
    assert "shape (3,)" in compare(torch.ones(3), torch.ones(2))
    assert "NaN" in compare(torch.tensor([float("nan")]), torch.ones(1))
    assert "got 2, expected 3" in compare(2.0, 3.0)


def test_prediction(verdict):
    ok, line = verdict(lambda p: check_prediction("guess", p, lambda: 8.0, "width", rel_tol=0.1), 8.5)
    assert ok and line == "✓ guess: you predicted 8.5; the measured width is 8 (within 0.8)"
    ok, line = verdict(lambda p: check_prediction("guess", p, lambda: 8.0, "width", rel_tol=0.1), 64)
    assert not ok and line.startswith("✗ guess: you predicted 64; the measured width is 8, more than 0.8 away")
    ok, line = verdict(lambda p: check_prediction("guess", p, lambda: 8.0, "width", rel_tol=0.1), None)
    assert not ok and line.startswith("… guess: write your prediction first")
    ok, line = verdict(lambda p: check_prediction("guess", p, lambda: 8.0, "width", rel_tol=0.1), "8")
    assert not ok and "must be a finite number" in line
    ok, line = verdict(lambda p: check_prediction("count", p, lambda: 1_774_464, "count"), 1_774_000)
    assert not ok and line.startswith("✗ count: you predicted 1,774,000; the measured count is 1,774,464, more")
    ok, line = verdict(lambda p: check_prediction("count", p, lambda: 12345.5, "count"), 12345.5)
    assert ok and line.startswith("✓ count: you predicted 1.235e+04; the measured count is 1.235e+04")


def test_dtype_tolerances_and_success_wording(verdict):
    strict = {torch.float64: 1e-10, torch.float32: 1e-5}
    assert compare(torch.ones(2, dtype=torch.float64) + 1e-8, torch.ones(2, dtype=torch.float64), strict, 0.0)
    assert compare(torch.ones(2) + 1e-6, torch.ones(2), strict, 0.0) is None
    assert compare(1.0 + 1e-8, 1.0, strict, 0.0)  # python floats use the float64 tolerance
    cases = [Case("x = 3", (torch.full((3,), 3.0, dtype=torch.float64),))]  # 2x = 6, the bug x + 1 = 4
    ok, line = verdict(lambda fn: check("double", fn, lambda x: 2 * x, cases, atol=strict, rtol=0.0,
                                        matches="matches 2x"), lambda x: x + x)
    assert ok and line == "✓ double: matches 2x on all 1 cases"
    ok, line = verdict(lambda fn: check("double", fn, lambda x: 2 * x, cases, atol=strict, rtol=0.0,
                                        bugs=[Bug("that is x + 1", lambda x: x + 1)]), lambda x: x + 1 + 1e-8)
    assert not ok and "values differ" in line  # the bug matches to the check's tolerance only
    ok, line = verdict(lambda fn: check("double", fn, lambda x: 2 * x, cases, atol=strict, rtol=0.0,
                                        bugs=[Bug("that is x + 1", lambda x: x + 1)], bug_tolerance=(1e-6, 0.0)),
                       lambda x: x + 1 + 1e-8)
    assert not ok and line.endswith("that is x + 1")


# --- every exercise check of every lesson: a stub and a crash --------------------------------------

EXERCISE_CHECKS = sorted(
    (getattr(checks, name) for name in dir(checks)
     if name.startswith("check_") and not name.startswith("check_predict") and name != "check_prediction"),
    key=lambda c: c.__name__)


def _stub_answer(*args, **kwargs):
    return None


def _crashing_answer(*args, **kwargs):
    raise IndexError("boom")


@pytest.mark.parametrize("check", EXERCISE_CHECKS, ids=lambda c: c.__name__)
def test_every_check_calls_a_stub_not_implemented_yet(check, verdict):
    ok, line = verdict(check, _stub_answer)
    assert not ok and line.startswith("…") and "not implemented yet" in line


@pytest.mark.parametrize("check", EXERCISE_CHECKS, ids=lambda c: c.__name__)
def test_every_check_reports_a_crash_instead_of_raising(check, verdict):
    ok, line = verdict(check, _crashing_answer)
    assert not ok and "raised IndexError: boom" in line


# --- every exercise check: whatever the learner's function returns, one line and never a traceback ----

def _returning(value):
    def answer(*args, **kwargs):
        return value() if callable(value) else value
    return answer


ODD_ANSWERS = {
    "an empty tuple": (),
    "a list of strings": ["a", "b"],
    "the string '42'": "42",
    "a bfloat16 scalar": lambda: torch.tensor(1.5, dtype=torch.bfloat16),
    "a meta tensor": lambda: torch.zeros(2, 3, device="meta"),
    "a tuple of tensors": lambda: (torch.zeros(2), torch.ones(2)),
    "a tuple of three tensors": lambda: (torch.zeros(2),) * 3,
    "a float": 0.5,
    "an int": 3,
    "True": True,
    "a numpy array": lambda: np.zeros((2, 2)),
    "a dict": {"out": 1},
    "an object": object(),
    "a complex tensor": lambda: torch.zeros(3, dtype=torch.complex64),
}


@pytest.mark.parametrize("answer", list(ODD_ANSWERS), ids=str)
@pytest.mark.parametrize("check", EXERCISE_CHECKS, ids=lambda c: c.__name__)
def test_every_check_names_an_odd_answer_in_one_line(check, answer, verdict):
    ok, line = verdict(check, _returning(ODD_ANSWERS[answer]))
    assert not ok and line.startswith("✗"), line
    assert not line.rstrip().endswith((": 42", ": a", ": b")), line  # the answer is never printed as the reason
    assert "Traceback" not in line


PREDICTION_CHECKS = sorted(
    (getattr(checks, name) for name in dir(checks) if name.startswith("check_predict_")), key=lambda c: c.__name__)


@pytest.mark.parametrize("check", PREDICTION_CHECKS, ids=lambda c: c.__name__)
def test_every_prediction_check_reads_any_number_and_names_the_rest(check, verdict):
    for odd in [(), ["a"], "42", torch.zeros(2), torch.zeros(2, device="meta"), float("nan"), object(), True]:
        ok, line = verdict(check, odd)
        assert not ok and line.startswith("✗") and "must be" in line, line
    ok, line = verdict(check, "42")
    assert "not a string" in line
    for number in [torch.tensor(64.0).sqrt(), Fraction(1, 3), np.float32(2.0), torch.tensor([3], dtype=torch.int32),
                   torch.tensor(1.5, dtype=torch.bfloat16)]:
        ok, line = verdict(check, number)
        assert line.startswith(("✓", "✗")) and "must be" not in line, line


def test_an_error_inside_then_or_adapt_is_one_line(rejects):
    def right_on_small_inputs(x):
        if x.numel() > 50:
            raise MemoryError("too big")
        return 2 * x

    rejects(lambda fn: run(fn, then=lambda f: (f(torch.ones(100)) is not None, "")), right_on_small_inputs,
            "✗ double: all cases match, but on the extra test that follows them your function raised MemoryError: "
            "too big")

    def picky_adapt(got, expected):
        return got.double().float()  # fails on anything but a tensor

    rejects(lambda fn: run(fn, adapt=picky_adapt), lambda x: [1, 2],
            "the check cannot read your answer (list of 2 items)")


def test_a_string_answer_is_never_read_as_the_reason(rejects):
    rejects(lambda fn: run(fn, adapt=lambda got, expected: got), lambda x: "42", "got str '42'")
    rejects(lambda fn: run(fn, adapt=lambda got, expected: checks.Reject("say why")), _double,
            "✗ double: on a (3, 4) tensor: say why")


def test_tuples_of_the_wrong_length_say_both_lengths():
    assert compare((1, 2, 3), (1, 2, 3, 4)) == "expected a tuple of 4 results, got tuple of 3 items"


def test_every_check_names_a_missing_function(capsys):
    """None or a string in place of the function: every exercise check says so, even one that wraps the
    learner's function in its own (which would otherwise report "'NoneType' object is not callable")."""


    names = [n for n in dir(checks) if n.startswith("check_") and not n.startswith("check_predict")
             and n != "check_prediction"]
    for name in names:
        for answer, kind in ((None, "NoneType"), ("my answer", "str")):
            capsys.readouterr()
            assert not getattr(checks, name)(answer)
            line = capsys.readouterr().out.strip()
            assert line.startswith("✗") and f"expected a function, got {kind}" in line, (name, line)


def test_a_non_callable_inside_the_learners_code_is_the_learners_error(rejects):
    helper = None

    def uses_a_missing_helper(x):
        return helper(x)

    rejects(run, uses_a_missing_helper, "your function raised TypeError: 'NoneType' object is not callable")


def test_prediction_slips_name_the_classic_mistake(verdict):
    slips = [slip_at(64.0, "64 is the variance"), Slip("never negative", lambda p, m: p < 0)]
    ok, line = verdict(lambda p: check_prediction("std", p, lambda: 8.0, "width", rel_tol=0.1, slips=slips), 64)
    assert not ok and line.endswith("more than 0.8 away: 64 is the variance")
    ok, line = verdict(lambda p: check_prediction("std", p, lambda: 8.0, "width", rel_tol=0.1, slips=slips), -8)
    assert not ok and line.endswith("never negative")
    ok, line = verdict(lambda p: check_prediction("std", p, lambda: 8.0, "width", rel_tol=0.1, slips=slips), 20)
    assert not ok and line.endswith("find the step of your reasoning that differs")


def test_value_and_shape_hints():
    assert compare(-torch.arange(1.0, 4.0), torch.arange(1.0, 4.0)).endswith("your values have the opposite sign")
    assert "2 times the right ones" in compare(2 * torch.arange(1.0, 4.0), torch.arange(1.0, 4.0))
    m = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    assert "transpose of the right one" in compare(m.T, m)
    assert "an extra axis of size 1" in compare(torch.ones(2, 1), torch.ones(2))
    assert "an axis of size 1 is missing" in compare(torch.ones(2), torch.ones(2, 1))
    assert "the last two axes are swapped" in compare(torch.ones(3, 2), torch.ones(2, 3))
    assert compare(torch.tensor([1.0, 5.0]), torch.tensor([1.0, 2.0])).endswith("(largest difference 3)")
