"""How much of helpers/ is input checking: the share of code lines that validate (issue 29's measure).

Code lines: lines of helpers/*.py (helpers/checks/ excluded: it is the exercise checker) that hold code,
not a comment, a docstring or nothing. Validation lines:
- the lines of every ``raise`` statement;
- the lines of every ``if`` block whose body only raises (its condition and any ``else`` that only raises
  included);
- the lines of every statement that holds a call to a checking function anywhere inside it: the call
  itself (``check_ids(ids, "ids", V)``), or a call inside an assignment, a tuple, an argument, a
  conditional expression or a comprehension (``T, w = positive_int(T, "T"), 3``). For a compound
  statement (``if``, ``for``, ``while``, ``with``, ``def``) only its header counts (the lines from its
  keyword, or its first decorator, to the end of the expression that holds the call), and the statements
  of its body are judged one by one.
A checking function is one whose name starts with ``check_``, ``_check``, ``require_``, one of
helpers._validate's ``as_int``, ``positive_int``, ``positive_ints``, ``probability``, or one of the private
helpers below whose work is checking under another name (PRIVATE_CHECKERS). A call is matched by its
name alone (``f(...)``, ``obj.f(...)``), wherever the function is defined.
Run ``python tests/validation_share.py`` for the share and the files that check most. It also prints what
rewrapping alone would reach: the share if every ``raise`` statement filled the 120-column lines (the project's
line length), its message and everything else kept as they are.
"""

import ast
import io
import math
import sys
import tokenize
from pathlib import Path

HELPERS = Path(__file__).resolve().parent.parent / "helpers"
CHECKERS = {"as_int", "positive_int", "positive_ints", "probability"}
# Private helpers that check under a name the prefixes miss; each returns what it checked, reshaped or filled in.
PRIVATE_CHECKERS = {
    "_heads",  # diagrams: d_model and n_heads positive, d_model divisible by n_heads; returns the head width
    "_as_bhtt",  # heads: attention weights (B, H, T, T) or (H, T, T), square, floating; returns (B, H, T, T)
    "_header_entry",  # pretrained: one safetensors header entry; returns its shape and offsets
    "_triton_setup",  # flash: what the Triton kernels can run; returns the block sizes with defaults filled in
}


def is_checker(call) -> bool:
    if not isinstance(call, ast.Call):
        return False
    f = call.func
    name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
    return name in CHECKERS or name in PRIVATE_CHECKERS or name.startswith(("check_", "_check", "require_"))


def lines_of(node) -> set[int]:
    return set(range(node.lineno, node.end_lineno + 1))


def docstring_lines(tree) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                found |= lines_of(first)
    return found


def code_lines(source: str, tree) -> set[int]:
    lines = set()
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENDMARKER, tokenize.ENCODING}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in skip:
            lines |= set(range(tok.start[0], tok.end[0] + 1))
    return lines - docstring_lines(tree)


def only_raises(body) -> bool:
    return bool(body) and all(isinstance(stmt, ast.Raise) for stmt in body)


def is_block(value) -> bool:
    """Whether a field of a statement is a block of statements (a body, an orelse, handlers, match cases)."""
    return isinstance(value, list) and any(isinstance(v, (ast.stmt, ast.excepthandler, ast.match_case))
                                           for v in value)


def checker_call_lines(stmt) -> set[int]:
    """The lines of ``stmt`` that a call to a checking function inside it makes validation lines: the whole
    statement for a simple one; for a compound one, its header up to the end of the expression holding the call."""
    lines = set()
    for value in (v for _, v in ast.iter_fields(stmt) if not is_block(v)):
        for part in value if isinstance(value, list) else [value]:
            if isinstance(part, ast.AST) and any(is_checker(n) for n in ast.walk(part)):
                lines |= set(range(min(stmt.lineno, part.lineno), part.end_lineno + 1))  # decorators come first
    return lines


def validation_lines(tree) -> set[int]:
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise):
            lines |= lines_of(node)
        elif isinstance(node, ast.If) and only_raises(node.body) and (not node.orelse or only_raises(node.orelse)):
            lines |= lines_of(node)
        if isinstance(node, ast.stmt):
            lines |= checker_call_lines(node)
    return lines


def packed_raise_lines(source: str, tree, width: int = 120) -> int:
    """How many lines fewer the ``raise`` statements would take rewrapped to fill ``width`` columns: each one's
    source is joined (continuation indents dropped) and split again into lines of ``width`` characters."""
    lines, saved = source.splitlines(), 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and node.end_lineno > node.lineno:
            first = lines[node.lineno - 1]
            joined = first.rstrip() + "".join(" " + line.strip() for line in lines[node.lineno:node.end_lineno])
            saved += node.end_lineno - node.lineno + 1 - math.ceil(len(joined) / width)
    return saved


def measure(files=None) -> dict[str, tuple[int, int]]:
    """{file name: (validation lines, code lines)} for helpers/*.py."""
    out = {}
    for path in sorted(files or HELPERS.glob("*.py")):
        source = path.read_text()
        tree = ast.parse(source)
        code = code_lines(source, tree)
        out[path.name] = (len(validation_lines(tree) & code), len(code))
    return out


def share(per_file) -> float:
    return sum(v for v, _ in per_file.values()) / sum(c for _, c in per_file.values())


if __name__ == "__main__":
    per_file = measure()
    for name, (v, c) in sorted(per_file.items(), key=lambda kv: -kv[1][0]):
        print(f"{name:20} {v:4} of {c:4} code lines validate ({v / c:5.1%})")
    code = sum(c for _, c in per_file.values())
    print(f"helpers/ (without helpers/checks/): {share(per_file):.1%} of {code} code lines validate")
    saved = sum(packed_raise_lines(path.read_text(), ast.parse(path.read_text())) for path in HELPERS.glob("*.py"))
    packed = sum(v for v, _ in per_file.values()) - saved
    print(f"every raise rewrapped to 120 columns, every check and message kept: {packed} lines, "
          f"{packed / (code - saved):.1%} of {code - saved} code lines")
    sys.exit(0)
