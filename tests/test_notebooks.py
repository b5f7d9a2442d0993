"""Structure of every notebook: skeleton, identical setup cell, normal form, derive-then-import."""

import ast
import importlib
import inspect
import json
import pkgutil
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "notebooks"))
import nbtools  # noqa: E402

LESSONS = sorted(nbtools.NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
SOLUTIONS = sorted(nbtools.SOLUTIONS.glob("[0-9][0-9]_*.ipynb"))
ALL = LESSONS + SOLUTIONS


def _note(doc):
    """The lesson number of the first "lesson NN" note in a docstring, or None."""
    found = re.search(r"\blessons? (\d{2})\b", doc or "")
    return int(found.group(1)) if found else None


def derive_lessons():
    """{dotted name: lesson} read from the "(lesson NN)" notes in the helpers' docstrings, the one source.

    Every public module of the package is walked, so a new module is covered without an edit here.
    A function or class takes its own note, else its module's; a name re-exported by a package
    (helpers.checks) takes the lesson of the object it names; a module takes the note of its
    docstring, else the earliest lesson of its functions and classes; a constant takes its module's.
    Names without a note are left out, so that ``lesson_of`` fails on them.
    """
    import helpers

    modules = {"helpers": helpers}
    for info in pkgutil.walk_packages(helpers.__path__, "helpers."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            modules[info.name] = importlib.import_module(info.name)
    by_object, lessons = {}, {}
    for name, module in modules.items():  # first the objects each module defines
        for attr, obj in vars(module).items():
            if not attr.startswith("_") and (inspect.isfunction(obj) or inspect.isclass(obj)) \
                    and obj.__module__ == name:
                lesson = _note(inspect.getdoc(obj)) if _note(inspect.getdoc(obj)) is not None \
                    else _note(module.__doc__)
                if lesson is not None:
                    by_object[id(obj)] = lessons[f"{name}.{attr}"] = lesson
    for name, module in modules.items():  # then re-exports
        for attr, obj in vars(module).items():
            if not attr.startswith("_") and id(obj) in by_object:
                lessons.setdefault(f"{name}.{attr}", by_object[id(obj)])
    for name, module in modules.items():  # then each module, and the constants it holds
        own = [lesson for key, lesson in lessons.items() if key.rsplit(".", 1)[0] == name]
        lesson = _note(module.__doc__) if _note(module.__doc__) is not None else min(own, default=None)
        if lesson is None:
            continue
        lessons[name] = lesson
        for attr, obj in vars(module).items():
            if not (attr.startswith("_") or inspect.ismodule(obj) or callable(obj)):
                lessons.setdefault(f"{name}.{attr}", lesson)
    return lessons


DERIVED_IN = derive_lessons()
# Drawing helpers are tools that no lesson derives: any lesson may import them. Their notes name the
# lesson that first explains the picture; they must still have one (lesson_of fails closed).
TOOLS = ("helpers.plot", "helpers.diagrams")


def cells(path):
    return json.loads(path.read_text())["cells"]


def text(cell):
    return cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])


def rel(path):
    return path.relative_to(nbtools.ROOT).as_posix()


def test_there_are_lessons_and_each_has_solutions():
    assert LESSONS, "no lesson notebooks found in notebooks/"
    for lesson in LESSONS:
        solution = nbtools.SOLUTIONS / (lesson.stem + "_solutions.ipynb")
        assert solution.exists(), f"{rel(lesson)} has no solutions notebook {rel(solution)}"


def test_the_welcome_map_lists_every_lesson():
    welcome = next(p for p in LESSONS if p.name.startswith("00_"))
    rows = re.findall(r"^\| (\d{2}) ", "\n".join(text(c) for c in cells(welcome) if c["cell_type"] == "markdown"),
                      flags=re.MULTILINE)
    lessons = [p.name[:2] for p in LESSONS if p != welcome]
    assert rows == lessons, f"lesson 00's map lists lessons {rows}; the lessons after it are {lessons}"


@pytest.mark.parametrize("path", ALL, ids=rel)
def test_title_badge_and_setup_cell(path):
    cs = cells(path)
    first = text(cs[0])
    assert cs[0]["cell_type"] == "markdown" and first.startswith("# "), "first cell must be a # title"
    assert nbtools.badge(rel(path)) in first, "Colab badge missing or stale (run `make render`)"
    assert cs[1]["cell_type"] == "code" and text(cs[1]) == nbtools.setup_source(), (
        "second cell must be the generated setup cell (run `make render`)")


@pytest.mark.parametrize("path", LESSONS, ids=rel)
def test_lesson_skeleton(path):
    cs = cells(path)
    goals = re.search(r"learning goals.*?\n((?:\s*[-*] .*\n?)+)", text(cs[0]), flags=re.I | re.S)
    assert goals, "the title cell must list the learning goals as bullets"
    n_goals = len(re.findall(r"^\s*[-*] ", goals.group(1), flags=re.M))
    assert 3 <= n_goals <= 5, f"{n_goals} learning goals; the skeleton asks for 3 to 5"
    markdown = [text(c) for c in cs if c["cell_type"] == "markdown"]
    code = [text(c) for c in cs if c["cell_type"] == "code"]
    assert any("seed_everything(" in c for c in code), "no seed_everything(...) call"
    summary = [m.split("## Summary", 1)[1] for m in markdown if re.search(r"^## Summary", m, re.M)]
    exercises = [i for i, c in enumerate(cs)
                 if c["cell_type"] == "markdown" and re.search(r"^## Exercises", text(c), re.M)]
    assert summary, "no '## Summary' heading"
    bullets = len(re.findall(r"^\s*[-*] ", summary[0].split("\n## ", 1)[0], flags=re.M))
    assert 3 <= bullets <= 6, f"summary has {bullets} bullets; the skeleton asks for 3 to 6"
    assert exercises, "no '## Exercises' heading"
    after = "".join(text(c) for c in cs[exercises[0]:] if c["cell_type"] == "code")
    assert re.search(r"\bcheck_\w+\(", after), "the exercises use no helpers.checks check_*"


@pytest.mark.parametrize("path", ALL, ids=rel)
def test_outputs_recorded_without_errors_or_skips(path):
    code = [c for c in cells(path) if c["cell_type"] == "code"]
    assert any(c["outputs"] for c in code), "no outputs stored: run `make execute`"
    for i, c in enumerate(code):
        tags = c.get("metadata", {}).get("tags", [])
        assert "nbval-skip" not in tags and "NBVAL_SKIP" not in text(c), f"code cell {i} is skipped"
        errors = [o for o in c["outputs"] if o["output_type"] == "error"]
        assert not errors, f"code cell {i} stored an error: {errors[0].get('ename')}"


@pytest.mark.parametrize("path", ALL, ids=rel)
def test_normalised(path):
    assert nbtools.cmd_check([path]) == 0, f"{rel(path)} is not normalised: run `make render`"


@pytest.mark.parametrize("path", ALL, ids=rel)
def test_metadata_as_jupyterlab_writes_it(path):
    """JupyterLab rewrites a kernelspec or language_info that differs from its own on opening."""
    meta = json.loads(path.read_text())["metadata"]
    assert meta["kernelspec"] == {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
    info = meta["language_info"]
    assert {k: v for k, v in info.items() if k != "version"} == nbtools.LANGUAGE_INFO
    assert re.fullmatch(r"3\.\d+\.\d+", info["version"]), info["version"]


def test_workcopy_keeps_the_learners_work_and_resets_one_lesson(tmp_path, capsys):
    assert nbtools.cmd_workcopy(tmp_path) == 0
    copies = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.ipynb"))
    assert copies == sorted(p.relative_to(nbtools.NOTEBOOKS) for p in ALL)
    lesson = tmp_path / LESSONS[0].name
    solution = tmp_path / "solutions" / (LESSONS[0].stem + "_solutions.ipynb")
    assert json.loads(lesson.read_text())["cells"] == cells(LESSONS[0])
    untouched = solution.read_text()
    lesson.write_text('{"learner": "work"}')
    assert nbtools.cmd_workcopy(tmp_path) == 0  # a second `make lab` keeps it
    assert lesson.read_text() == '{"learner": "work"}'
    capsys.readouterr()
    assert nbtools.cmd_workcopy(tmp_path, reset=LESSONS[0].name[:2]) == 0  # make reset LESSON=00
    out = capsys.readouterr().out
    assert json.loads(lesson.read_text())["cells"] == cells(LESSONS[0])
    saved = list(tmp_path.rglob("*.saved-*.ipynb"))
    assert [p.name for p in saved] == [f"{lesson.stem}.saved-{saved[0].name.split('.saved-')[1]}"]
    assert saved[0].read_text() == '{"learner": "work"}'
    assert solution.read_text() == untouched, "the untouched solutions were copied again"
    assert "1 notebook(s) of lesson 00 and its solutions put back" in out and "1 already as there" in out
    assert "close its tab without saving" in out and "Revert" in out  # what to do with an open tab
    assert nbtools.cmd_workcopy(tmp_path, reset="00") == 0  # nothing differs now: nothing copied, no advice
    out = capsys.readouterr().out
    assert "0 notebook(s)" in out and "2 already as there" in out and "Revert" not in out
    assert len(list(tmp_path.rglob("*.saved-*.ipynb"))) == 1
    assert nbtools.cmd_workcopy(tmp_path, reset="99") == 1  # no such lesson


def test_workcopy_reset_counts_a_copy_jupyterlab_saved_unchanged_as_untouched(tmp_path):
    """JupyterLab writes sorted keys and its own indent; an unchanged lesson still counts as untouched."""
    assert nbtools.cmd_workcopy(tmp_path) == 0
    lesson = tmp_path / LESSONS[0].name
    nb = json.loads(lesson.read_text())
    nb["metadata"]["language_info"]["version"] = "3.99.0"  # another Python wrote it
    lesson.write_text(json.dumps(nb, indent=2, sort_keys=True))
    assert nbtools.cmd_workcopy(tmp_path, reset="0") == 0
    assert not list(tmp_path.rglob("*.saved-*.ipynb"))
    nb["cells"][0]["source"] += "\nmy note"
    lesson.write_text(json.dumps(nb))
    assert nbtools.cmd_workcopy(tmp_path, reset="0") == 0
    assert len(list(tmp_path.rglob("*.saved-*.ipynb"))) == 1


@pytest.mark.parametrize("number", ["1", "01", " 1 "])
def test_workcopy_reset_names_exactly_one_lesson(tmp_path, number):
    assert nbtools.cmd_workcopy(tmp_path) == 0
    for copy in tmp_path.rglob("*.ipynb"):
        copy.write_text('{"learner": "work"}')
    assert nbtools.cmd_workcopy(tmp_path, reset=number) == 0  # make reset LESSON=1: lesson 01, not 10 or 11
    reset = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.ipynb")
                   if ".saved-" not in p.name and p.read_text() != '{"learner": "work"}')
    assert reset == sorted(p.relative_to(nbtools.NOTEBOOKS) for p in ALL if p.name.startswith("01_"))
    assert len(list(tmp_path.rglob("*.saved-*.ipynb"))) == 2  # the lesson and its solutions


@pytest.mark.parametrize("bad", ["x", "1x", "-1", "01_why_attention", "100"])
def test_workcopy_reset_rejects_what_is_not_a_lesson_number(tmp_path, bad, capsys):
    assert nbtools.cmd_workcopy(tmp_path, reset=bad) == 1
    assert not list(tmp_path.rglob("*.ipynb"))  # nothing copied
    assert f"LESSON={bad!r} is not a lesson number; the lessons are 00, 01, " in capsys.readouterr().out


# --- The repository named in one place -------------------------------------------------------------

COLAB_LINK = re.compile(r"https://colab\.research\.google\.com/github/([^/\s)]+)/([^/\s)]+)/blob/([^/\s)]+)/([^\s)]+)")


def links_and_setup_repositories(root):
    """Every Colab link in README.md and the notebooks under ``root``, and every setup cell's REPOSITORY.

    Read with a regular expression of its own, not with the renderer, so that a wrong renderer fails.
    """
    links = [("README.md", *m.groups()) for m in COLAB_LINK.finditer((root / "README.md").read_text())]
    repositories = []
    for path in sorted((root / "notebooks").rglob("[0-9][0-9]_*.ipynb")):
        rel_path = path.relative_to(root).as_posix()
        for cell in json.loads(path.read_text())["cells"]:
            links += [(rel_path, *m.groups()) for m in COLAB_LINK.finditer(text(cell))]
            repositories += [(rel_path, m) for m in re.findall(r'^REPOSITORY = "([^"]*)"', text(cell), flags=re.M)]
    return links, repositories


def assert_all_agree(root, repository, branch):
    owner, name = repository.removeprefix("https://github.com/").split("/")
    links, repositories = links_and_setup_repositories(root)
    notebooks = sorted(p.relative_to(root).as_posix() for p in (root / "notebooks").rglob("[0-9][0-9]_*.ipynb"))
    lessons = sorted(p for p in notebooks if "/solutions/" not in p)
    assert sorted(f for f, *_ in links if f != "README.md") == notebooks, "one badge per notebook"
    assert sorted(path for f, *_, path in links if f == "README.md") == lessons, "one README badge per lesson"
    for where, o, n, b, path in links:
        assert (o, n, b) == (owner, name, branch), f"{where} links to {o}/{n} at {b}"
        assert where == "README.md" or path == where, f"{where}'s badge opens {path}"
    assert sorted(f for f, _ in repositories) == notebooks, "one setup cell per notebook"
    assert {r for _, r in repositories} == {repository}


def test_every_badge_setup_cell_and_readme_link_names_the_one_repository():
    cfg = nbtools.course_config()
    assert_all_agree(nbtools.ROOT, cfg["repository"], cfg["branch"])


def test_render_with_a_repository_rewrites_everything_in_one_step(tmp_path):
    """`make render REPOSITORY=...` on a copy of the course: pyproject, badges, setup cells, README."""
    for rel_path in ("README.md", "pyproject.toml"):
        shutil.copy(nbtools.ROOT / rel_path, tmp_path / rel_path)
    shutil.copytree(nbtools.NOTEBOOKS, tmp_path / "notebooks",
                    ignore=shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints"))
    tool = [sys.executable, str(tmp_path / "notebooks" / "nbtools.py"), "render"]
    bad = subprocess.run([*tool, "--repository", "https://gitlab.com/someone/course"], capture_output=True, text=True)
    assert bad.returncode != 0 and "https://github.com/OWNER/NAME" in bad.stderr
    done = subprocess.run([*tool, "--repository", "https://github.com/some-one/my-course.git", "--branch", "v1"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    pyproject = (tmp_path / "pyproject.toml").read_text()
    assert 'repository = "https://github.com/some-one/my-course"\nbranch = "v1"' in pyproject
    assert_all_agree(tmp_path, "https://github.com/some-one/my-course", "v1")
    published = json.loads((tmp_path / "notebooks" / LESSONS[0].name).read_text())["cells"][1]["source"]
    assert "git\", \"clone\"" in published and nbtools.PLACEHOLDER_ACCOUNT not in published
    assert "placeholder" not in done.stdout
    again = subprocess.run([*tool, "--repository", nbtools.PLACEHOLDER, "--branch", nbtools.course_config()["branch"]],
                           capture_output=True, text=True)
    assert again.returncode == 0 and "still the placeholder" in again.stdout
    for rel_path in ("README.md", "pyproject.toml", *(p.relative_to(nbtools.ROOT) for p in ALL)):
        if rel_path != "pyproject.toml":  # back to the placeholder: the same files as committed
            assert (tmp_path / rel_path).read_text() == (nbtools.ROOT / rel_path).read_text(), rel_path


# --- JupyterLab's settings and progress bars saved as text ------------------------------------------

def test_lab_settings_turn_off_the_news_and_serve_the_wrapping_style(tmp_path):
    overrides, css, config = nbtools.lab_settings(tmp_path)
    settings = json.loads(overrides.read_text())
    assert settings["@jupyter-widgets/jupyterlab-manager:plugin"] == {"saveState": True}
    assert settings["@jupyterlab/apputils-extension:notification"]["fetchNews"] == "false"
    assert "word-break: normal" in css.read_text()
    namespace = {"c": type("Config", (), {})()}
    for part in ("LabApp", "ServerApp", "ContentsManager"):
        setattr(namespace["c"], part, type(part, (), {})())
    exec(config.read_text(), namespace)  # the config file JupyterLab runs
    c = namespace["c"]
    assert c.LabApp.custom_css is True
    assert c.ServerApp.tornado_settings == {"static_custom_path": [str(css.parent.resolve())]}
    assert c.ContentsManager.pre_save_hook.__name__ == "lab_pre_save_hook"


def _bar_notebook(value, top, model_name="FloatProgressModel"):
    ids = ["box", "left", "bar", "right"]
    state = {
        "box": {"model_name": "HBoxModel", "state": {"children": [f"IPY_MODEL_{i}" for i in ids[1:]]}},
        "left": {"model_name": "HTMLModel", "state": {"value": "epoch 1: 100%"}},
        "bar": {"model_name": model_name, "state": {"value": value, "max": top, "bar_style": "success"}},
        "right": {"model_name": "HTMLModel", "state": {"value": "\u20073/3\u2007[00:00&lt;00:00,\u200712.5it/s]"}},
    }
    view = {"model_id": "box", "version_major": 2, "version_minor": 0}
    out = {"output_type": "display_data", "metadata": {},
           "data": {nbtools.WIDGET_VIEW: view, "text/plain": "  0%|          | 0/3 [00:00<?, ?it/s]"}}
    return {"cells": [{"cell_type": "code", "outputs": [out], "source": ""}],
            "metadata": {"widgets": {nbtools.WIDGET_STATE: {"state": state, "version_major": 2}}}}


def test_saved_progress_bars_become_their_final_text():
    nb = _bar_notebook(3, 3)
    model = {"type": "notebook", "content": nb}
    nbtools.lab_pre_save_hook(model=model, path="x.ipynb", contents_manager=None)
    text_bar = "epoch 1: 100%|██████████| 3/3 [00:00<00:00, 12.5it/s]"
    assert nb["cells"][0]["outputs"][0]["data"] == {"text/plain": text_bar}
    assert "widgets" not in nb["metadata"]
    half = _bar_notebook(1, 2)
    assert nbtools.widget_bars_as_text(half) and "|█████     |" in half["cells"][0]["outputs"][0]["data"]["text/plain"]
    other = _bar_notebook(1, 2, model_name="IntSliderModel")  # not a progress bar: left as it is
    before = json.dumps(other)
    assert not nbtools.widget_bars_as_text(other) and json.dumps(other) == before


def imported_names(source):
    """Yield dotted names a cell imports from helpers ('helpers.masks', 'helpers.attention.softmax')."""
    lines = [ln for ln in source.split("\n") if not ln.lstrip().startswith(("%", "!"))]
    for node in ast.walk(ast.parse("\n".join(lines))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("helpers"):
            for alias in node.names:
                yield f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("helpers"):
                    yield alias.name


def lesson_of(name):
    """The lesson that derives the helper ``name``; fails (closed) on a name with no "(lesson NN)" note."""
    if name not in DERIVED_IN:
        raise KeyError(f"{name} is not a helper with a (lesson NN) note in its docstring (or its module's): "
                       "add the note, or fix the name")
    return 0 if name.startswith(tuple(t + "." for t in TOOLS)) or name in TOOLS else DERIVED_IN[name]


@pytest.mark.parametrize("path", ALL, ids=rel)
def test_helpers_imported_only_after_the_lesson_that_derives_them(path):
    number = int(path.name[:2])
    for c in cells(path):
        if c["cell_type"] != "code":
            continue
        for name in imported_names(text(c)):
            assert lesson_of(name) <= number, (
                f"{rel(path)} imports {name}, which lesson {lesson_of(name):02d} derives")


def test_derive_map_is_read_from_the_docstrings_and_fails_closed():
    assert lesson_of("helpers.masks.causal_mask") == 5
    assert lesson_of("helpers.attention.to_torch_mha") == 4 and lesson_of("helpers.attention.softmax") == 3
    assert lesson_of("helpers.transformer.TransformerConfig") == 7 and lesson_of("helpers.transformer.Transformer") == 8
    assert lesson_of("helpers.device.peak_memory") == 9 and lesson_of("helpers.device.seed_everything") == 0
    assert lesson_of("helpers.checks.check_causal_mask") == 5  # re-exported: the lesson of the object
    assert lesson_of("helpers.data.DIGITS") == lesson_of("helpers.data") == 1  # a constant: its module's
    assert lesson_of("helpers.plot.attention_heatmap") == 0  # a tool
    for unknown in ("helpers.masks.no_such_mask", "helpers.nowhere", "helpers._validate.positive_int"):
        with pytest.raises(KeyError, match="lesson NN"):
            lesson_of(unknown)


def test_derive_map_detects_early_import():
    assert lesson_of("helpers.masks.causal_mask") == 5
    assert list(imported_names("from helpers.masks import causal_mask\n%matplotlib inline")) == [
        "helpers.masks.causal_mask"]


# Rounding noise: float64 results that should be equal differ by ~1e-16, and the last digits of that
# difference change with the CPU's kernels (AVX-512, AVX2, plain code), so a compared output that
# prints it fails on another machine. Print a bound instead ("below 1e-12: True").
NOISE = re.compile(r"(?<![\w.])\d\.\d+e-(1[3-9]|[2-9]\d)\b")


def compared_text(cell):
    """The text of a code cell's outputs that nbval compares (none for nbval-ignore-output cells)."""
    if "nbval-ignore-output" in cell.get("metadata", {}).get("tags", []):
        return ""
    parts = []
    for out in cell.get("outputs", []):
        if "text" in out:
            parts.append("".join(out["text"]))
        elif "text/plain" in out.get("data", {}):
            parts.append("".join(out["data"]["text/plain"]))
    return "".join(parts)


@pytest.mark.parametrize("path", ALL, ids=rel)
def test_compared_outputs_print_no_rounding_noise(path):
    noisy = [(i, m.group(0)) for i, c in enumerate(cells(path)) if c["cell_type"] == "code"
             for m in NOISE.finditer(compared_text(c))]
    assert not noisy, f"{rel(path)}: cells print rounding noise that varies between CPUs (cell, value): {noisy}"


def test_the_noise_pattern_finds_noise_and_spares_bounds():
    assert NOISE.findall("largest difference 1.1e-15") and NOISE.findall("diff 2.36e-16; 8.9e-21")
    for stable in ("below 1e-12: True", "ratio 2.76e+04", "median 3.9e-09", "eps 1e-12", "v1.1e-15x"):
        assert not NOISE.search(stable), stable


@pytest.mark.parametrize("path", ALL, ids=rel)
def test_going_deeper_sections_open_collapsed(path):
    headings = [text(c).split("\n")[0] for c in cells(path) if c["cell_type"] == "markdown"
                and text(c).startswith("## Going deeper") and not c["metadata"].get(nbtools.COLLAPSED)]
    assert not headings, f"{rel(path)}: set metadata {nbtools.COLLAPSED!r}: true on {headings}"


def test_normalise_keeps_the_collapsed_heading_and_drops_other_metadata():
    cell = {"cell_type": "markdown", "id": "x", "source": "## Going deeper: more",
            "metadata": {nbtools.COLLAPSED: True, "editable": False}}
    out = nbtools.normalise({"cells": [cell], "metadata": {}}, nbtools.NOTEBOOKS / "03_x.ipynb")
    assert out["cells"][0]["metadata"] == {nbtools.COLLAPSED: True}
