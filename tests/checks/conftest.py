"""Helpers for the checks' tests: every check must print exactly one line."""

import pytest


@pytest.fixture
def verdict(capsys):
    """``verdict(check, answer) -> (ok, line)``; fails the test unless the check printed exactly one line."""

    def run(check, answer):
        capsys.readouterr()
        ok = check(answer)
        lines = capsys.readouterr().out.splitlines()
        assert len(lines) == 1, f"{check.__name__} printed {len(lines)} lines: {lines}"
        return bool(ok), lines[0]

    return run


@pytest.fixture
def rejects(verdict):
    """``rejects(check, wrong, words)``: the check says ✗ (or … for a stub) and its line contains ``words``."""

    def run(check, wrong, words):
        ok, line = verdict(check, wrong)
        assert not ok, f"{check.__name__} accepted a wrong answer: {line}"
        assert line[0] in "✗…", line
        assert words in line, f"expected {words!r} in: {line}"
        return line

    return run


@pytest.fixture
def accepts(verdict):
    """``accepts(check, right, line=None)``: the check says ✓ (and prints exactly ``line`` when given)."""

    def run(check, right, line=None):
        ok, got = verdict(check, right)
        assert ok and got.startswith("✓"), got
        if line is not None:
            assert got == line
        return got

    return run

