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

