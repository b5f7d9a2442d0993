"""The Makefile's first step on a fresh machine: the virtual environment, whole or not at all.

Debian and Ubuntu ship Python's venv without pip (that is the package python3-venv): there
`python3 -m venv` stops half-way. A stand-in Python that fails the same way shows what `make` does.
(The rule's path on a working Python runs first in every `make install`.)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
PACKAGE = f"python{sys.version_info[0]}.{sys.version_info[1]}-venv"


def _make_venv(venv_dir: Path, python: Path | str) -> subprocess.CompletedProcess:
    # run from `make test` too: the outer make's flags and variables must not reach this one
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")}
    return subprocess.run(["make", "-s", "--no-print-directory", "-C", str(ROOT), "venv", f"VENV={venv_dir}",
                           f"PYTHON={python}"], capture_output=True, text=True, env=env)


def _python_without_venv_pip(tmp: Path) -> Path:
    """A Python whose `-m venv` makes the folder and then fails for want of ensurepip, as Debian's does."""
    fake = tmp / "python3"
    fake.write_text(f"""#!/bin/sh
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
    "{sys.executable}" -m venv --without-pip "$3" || exit 1
    echo "The virtual environment was not created successfully because ensurepip is not available." >&2
    exit 1
fi
exec "{sys.executable}" "$@"
""")
    fake.chmod(0o755)
    return fake


def test_no_venv_pip_leaves_nothing_half_made_and_names_the_package(tmp_path):
    target = tmp_path / ".venv"
    run = _make_venv(target, _python_without_venv_pip(tmp_path))
    assert run.returncode != 0
    assert "nothing was installed" in run.stdout
    assert f"install the package python3-venv (for this Python: {PACKAGE})" in run.stdout
    assert f"sudo apt install {PACKAGE}" in run.stdout
    assert not target.exists(), "a half-made environment was left behind"


def test_a_half_made_environment_found_is_named_and_left_alone(tmp_path):
    target = tmp_path / ".venv"
    venv.EnvBuilder(with_pip=False).create(target)  # what an older Makefile left on such a machine
    run = _make_venv(target, sys.executable)
    assert run.returncode != 0
    assert f"{target} exists but has no working pip" in run.stdout and f"rm -rf {target}" in run.stdout
    assert (target / "pyvenv.cfg").is_file(), "make removed a folder it did not make"



# --- make -j, make render, and the README's first screen ------------------------------------------------

def _python_that_logs(tmp: Path, log: Path) -> Path:
    """A stand-in Python whose `-m venv DIR` makes DIR/bin/python: a Python that only logs what it is asked to
    run (pip installs take a second, as real ones take minutes), so `make install` runs in seconds."""
    inner = f"""#!/bin/sh
echo "$*" >> "{log}"
case "$*" in *"pip install"*) sleep 1 ;; esac
exit 0
"""
    fake = tmp / "python3"
    fake.write_text(f"""#!/bin/sh
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
    mkdir -p "$3/bin" && cat > "$3/bin/python" <<'INNER'
{inner}INNER
    chmod +x "$3/bin/python"
    exit 0
fi
exit 0
""")
    fake.chmod(0o755)
    return fake


def test_install_under_make_j_waits_for_the_environment(tmp_path):
    """`make -j2 install` on a fresh machine: JupyterLab's settings are written only once .venv is installed."""
    log = tmp_path / "python.log"
    target = tmp_path / ".venv"
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")}
    run = subprocess.run(["make", "-j2", "--no-print-directory", "-C", str(ROOT), "install", f"VENV={target}",
                          f"PYTHON={_python_that_logs(tmp_path, log)}"], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    calls = log.read_text().splitlines()
    requirements = next(i for i, c in enumerate(calls) if "pip install -r requirements.txt" in c)
    editable = next(i for i, c in enumerate(calls) if "pip install --no-deps -e ." in c)
    settings = [i for i, c in enumerate(calls) if "nbtools.py lab-settings" in c]
    assert settings, f"JupyterLab's settings were not written: {calls}"
    assert min(settings) > max(requirements, editable), f"lab-settings ran before the install finished: {calls}"
    assert (target / ".installed").is_file()


def test_render_with_a_repository_does_not_make_make_reinstall(tmp_path):
    """`make render REPOSITORY=...` changes [tool.course] only: pyproject.toml keeps its modification time."""
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    shutil.copytree(ROOT / "notebooks", tmp_path / "notebooks",
                    ignore=shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints"))
    pyproject = tmp_path / "pyproject.toml"
    os.utime(pyproject, (1_000_000_000, 1_000_000_000))
    tool = [sys.executable, str(tmp_path / "notebooks" / "nbtools.py"), "render"]
    done = subprocess.run([*tool, "--repository", "https://github.com/some-one/my-course"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert 'repository = "https://github.com/some-one/my-course"' in pyproject.read_text()
    assert pyproject.stat().st_mtime == 1_000_000_000, "pyproject.toml looks newer: the next make would reinstall"
    readme = (tmp_path / "README.md").read_text()
    assert "<https://some-one.github.io/my-course/>" in readme, "the README does not say where to read it online"


def test_readme_first_screen_has_the_two_commands_and_the_course_map():
    lines = (ROOT / "README.md").read_text().splitlines()
    first = "\n".join(lines[:45])  # a screen of a terminal or of GitHub's page, roughly
    assert "make lab " in first and "make test " in first, "the two commands are not on the first screen"
    assert "<!-- lessons:start -->" in first and "| lesson | what you build | open |" in first
    assert "[00 welcome](notebooks/00_welcome.ipynb)" in first, "the course map is not on the first screen"
    readme = "\n".join(lines)
    assert "nvidia-smi" in readme, "the README does not say how the torch build is chosen"
    assert "make render REPOSITORY=" in readme and ".github/workflows/ci.yml" in readme
