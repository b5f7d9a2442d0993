"""The import graph of helpers/ (its top-level modules): no circle, so no module imports one that imports it;
and importing any module of the package has no side effect."""

import ast
from pathlib import Path

HELPERS = Path(__file__).resolve().parent.parent / "helpers"


def helper_imports(path: Path) -> set[str]:
    """The helpers modules ``path`` imports anywhere in its code (inside functions too), by short name."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("helpers"):
            parts = node.module.split(".")
            if len(parts) == 1:  # from helpers import x
                found |= {alias.name for alias in node.names}
            else:
                found.add(parts[1])
        elif isinstance(node, ast.Import):
            found |= {alias.name.split(".")[1] for alias in node.names
                      if alias.name.startswith("helpers.") and alias.name.count(".") >= 1}
    return found


def graph() -> dict[str, set[str]]:
    modules = {p.stem: p for p in HELPERS.glob("*.py")} | {"checks": HELPERS / "checks" / "__init__.py"}
    return {name: helper_imports(path) & set(modules) - {name} for name, path in modules.items()}


def find_cycle(edges: dict[str, set[str]]):
    """A list of modules that import each other in a circle, or None (depth-first search)."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_find_cycle_finds_a_circle_and_only_a_circle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_helpers_import_graph_has_no_cycle():
    edges = graph()
    assert {"transformer", "gpt", "decoding", "layers", "_validate"} <= set(edges)
    assert "attention" in edges["transformer"]  # the parser sees the imports
    cycle = find_cycle(edges)
    assert cycle is None, " -> ".join(cycle)


def test_shared_modules_import_no_model():
    """The layers, the decoders and the checks sit below the models: they import none of them."""
    edges = graph()
    models = {"transformer", "gpt", "pretrained", "rnn"}
    for low in ("_validate", "layers", "decoding", "masks", "positional", "attention"):
        assert not edges[low] & models, (low, edges[low] & models)


def test_import_has_no_side_effects():
    """Every module of the package, found by walking it (so a new one is covered too)."""
    import importlib.util
    import pkgutil
    import subprocess
    import sys

    import helpers

    # A module that exists to hold code for an optional package is imported only where it is installed.
    needs = {"helpers._flash_triton": "triton"}
    modules = sorted(m.name for m in pkgutil.walk_packages(helpers.__path__, "helpers.")
                     if m.name not in needs or importlib.util.find_spec(needs[m.name]) is not None)
    assert {"helpers.rnn", "helpers.transformer", "helpers.sdpa_kernels", "helpers.checks"} <= set(modules)
    code = "import torch; s = torch.random.get_rng_state(); import helpers, " + ", ".join(modules) + \
           "; assert torch.equal(s, torch.random.get_rng_state())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and done.stderr == ""
