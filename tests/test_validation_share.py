"""The share of helpers/ code lines that check input (tests/validation_share.py), against issue 29's target."""

import ast
import textwrap
from pathlib import Path

import pytest
from validation_share import code_lines, measure, packed_raise_lines, share, validation_lines


def test_the_measure_counts_raises_raising_ifs_and_checker_calls_only():
    source = textwrap.dedent('''
        """Module docstring."""
        def f(x, n):
            """Docstring."""
            # a comment
            n = positive_int(n, "n")
            if x is None:
                raise ValueError(
                    "x is None")
            y = x + n
            if y > 3:
                y = 3
            check_ids(x, "x")
            return y
    ''')
    tree = ast.parse(source)
    code, checks = code_lines(source, tree), validation_lines(tree)
    assert sorted(code) == [3, 6, 7, 8, 9, 10, 11, 12, 13, 14]
    assert sorted(checks & code) == [6, 7, 8, 9, 13]


def test_the_measure_counts_checker_calls_inside_statements_and_headers_only():
    source = textwrap.dedent('''
        def g(self, a, b, xs):
            a, b = positive_int(a, "a"), b + 1
            setattr(self, "b", as_int(b, "b",
                                      0, 9))
            c = None if a is None else _heads(a, b)
            total = a + b
            for x in xs:
                require_tensor(x, "x")
            if check_room(a):
                total += 1
            if total > 99:
                raise ValueError(f"total={total}")
            try:
                total = int(total)
            except TypeError:
                raise ValueError("total must be a number") from None
            return [probability(p, "p") for p in xs]
    ''')
    tree = ast.parse(source)
    code, checks = code_lines(source, tree), validation_lines(tree)
    assert sorted(code) == list(range(2, 19))
    # the tuple, the setattr over two lines, the conditional, the call in a loop's body, the if's header, the
    # if-block that only raises, the raise in the handler, the comprehension; not the def, the plain sum, the
    # for line, the if's body, the try, the conversion, the except line
    assert sorted(checks & code) == [3, 4, 5, 6, 9, 10, 12, 13, 17, 18]


def test_rewrapping_counts_the_lines_a_raise_would_save_at_the_given_width():
    source = textwrap.dedent('''
        def f(x):
            if x:
                raise ValueError(
                    "short"
                )
            raise TypeError("one line")
    ''')
    tree = ast.parse(source)
    assert packed_raise_lines(source, tree) == 2  # three lines become one; the one-line raise saves nothing
    joined = '        raise ValueError( "short" )'
    assert packed_raise_lines(source, tree, width=len(joined) - 1) == 1  # one character too long: two lines


def test_the_measure_of_a_file_adds_up():
    checked = measure([Path(__file__).with_name("validation_share.py")])
    assert list(checked) == ["validation_share.py"]
    v, c = checked["validation_share.py"]
    assert 0 <= v <= c and c > 50
    assert share({"a.py": (3, 10), "b.py": (1, 30)}) == pytest.approx(0.1)


@pytest.mark.xfail(strict=True, reason="measured 18.5% of helpers/' code lines: the measure counts every statement "
                                       "holding a checker call (in a tuple, an assignment, a setattr, a "
                                       "conditional) and the private checkers; it gave 17.3% when it counted only "
                                       "statements that are such a call, 18.7% at first when it counted them "
                                       "all; the target is 15%. Rewrapping every raise to 120 columns, every "
                                       "check and message kept, would reach only 17.8%")
def test_validation_is_at_most_15_percent_of_the_helpers_code():
    assert share(measure()) <= 0.15
