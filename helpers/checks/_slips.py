"""Prediction checks that name the classic slips: a wrong number the learner is likely to write gets its reason.

Shared by the prediction exercises of lessons 04-06. ``slips`` pairs a likely wrong number with what it
means; any other wrong number gets ``hint``, a pointer to the quantity to count, instead of a bare "differs".
"""

from __future__ import annotations

from collections.abc import Callable

from helpers.checks._core import CheckResult, Reject, _as_number, _number, check_prediction


def check_prediction_with_slips(name: str, predicted, measure: Callable[[], float], what: str, *, abs_tol: float,
                                slips: tuple[tuple[float, str], ...], hint: str) -> CheckResult:
    """``check_prediction``, but a prediction near one of ``slips`` (value, reason) is answered with that reason."""
    value = None if predicted is None or predicted is ... else _as_number(predicted)
    if value is None or isinstance(value, Reject):
        return check_prediction(name, predicted, measure, what, abs_tol=abs_tol)
    measured = float(measure())
    if abs(value - measured) <= abs_tol:
        return check_prediction(name, predicted, lambda: measured, what, abs_tol=abs_tol)
    tol = max(abs_tol / 2, 1e-9)
    reason = next((text for slip, text in slips if abs(value - slip) <= tol + 1e-6 * abs(slip)), hint)
    print(f"✗ {name}: you predicted {_number(value)}; the measured {what} is {_number(measured)}: {reason}")
    return CheckResult(False)
