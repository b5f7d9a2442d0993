"""A clone made with Git for Windows' default core.autocrlf=true loads every data file, byte for byte.

And when a data file is damaged anyway, its error names its own remedy, which works.
"""

import hashlib
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers.data import DataFileError, load_dates, load_text

ROOT = Path(__file__).resolve().parents[1]
GIT = shutil.which("git")
pytestmark = pytest.mark.skipif(GIT is None or not (ROOT / ".git").exists(),
                                reason="needs git and the course's git repository")


def _git(cwd, *args):
    done = subprocess.run([GIT, *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    """The committed tree, cloned as Git for Windows clones it by default."""
    dst = tmp_path_factory.mktemp("autocrlf") / "course"
    _git(ROOT, "-c", "core.autocrlf=true", "clone", "-q", "--no-hardlinks", str(ROOT), str(dst))
    _git(dst, "config", "core.autocrlf", "true")
    _git(dst, "checkout", "-q", _git(ROOT, "rev-parse", "HEAD").strip())  # this worktree's commit
    return dst


def _listed(readme: Path) -> dict[str, str]:
    """file name -> the sha256 its row in data/README.md lists."""
    rows = re.findall(r"^\| `([^`]+)` \|.*\| `([0-9a-f]{64})` \|$", readme.read_text("utf-8"), re.M)
    return dict(rows)


def test_every_data_file_is_byte_exact_in_an_autocrlf_clone(clone, monkeypatch):
    listed = _listed(clone / "data" / "README.md")
    assert {"shakespeare.txt", "dates_train.tsv", "minilm_reference.json", "gpt_shakespeare.pt",
            "gpt_shakespeare_log.json"} <= set(listed)
    for name, sha in listed.items():
        assert hashlib.sha256((clone / "data" / name).read_bytes()).hexdigest() == sha, name
    # and the loaders, which check the same sums, read them
    for split in ("train", "valid", "test"):
        assert load_dates(split, clone / "data")
        assert "\r" not in load_text(split, clone / "data")
    monkeypatch.setenv("COURSE_DATA_DIR", str(clone / "data"))
    from helpers.gpt import load_course_gpt

    model, vocab = load_course_gpt()
    assert model.config.vocab_size == len(vocab)
    from helpers.lm import load_training_log

    assert load_training_log(clone / "data")["checkpoint_sha256"] == listed["gpt_shakespeare.pt"]


def test_code_and_notebooks_keep_lf_line_ends_in_an_autocrlf_clone(clone):
    for rel in ("helpers/lm.py", "notebooks/12_gpt_from_scratch.ipynb", "data/README.md", "Makefile"):
        assert b"\r\n" not in (clone / rel).read_bytes(), rel


def test_a_crlf_text_file_names_its_remedy_and_the_remedy_works(clone):
    """Forced to CRLF (as a checkout without .gitattributes would write it), then restored as the error says."""
    data = clone / "data"
    attributes = clone / ".git" / "info" / "attributes"
    attributes.parent.mkdir(exist_ok=True)
    attributes.write_text("data/shakespeare.txt text eol=crlf\n")  # overrides .gitattributes
    (data / "shakespeare.txt").unlink()
    _git(clone, "checkout", "--", "data/shakespeare.txt")
    assert b"\r\n" in (data / "shakespeare.txt").read_bytes()
    with pytest.raises(DataFileError, match=r"has Windows line ends \(CRLF\)") as info:
        load_text("valid", data)
    remedy = re.search(r"Restore it with its own line ends: (.+) \(run in", str(info.value)).group(1)
    assert remedy == f"rm {data / 'shakespeare.txt'} && git checkout HEAD -- shakespeare.txt"
    attributes.unlink()  # the repository's own .gitattributes again
    subprocess.run(remedy, shell=True, cwd=data, check=True)
    assert "\r" not in load_text("valid", data)


@pytest.mark.parametrize("name, remedy", [
    ("shakespeare.txt", "data/make_shakespeare.py"),
    ("dates_valid.tsv", "helpers.data.write_date_splits"),
    ("gpt_shakespeare.pt", "make train-gpt writes the checkpoint and its log"),
])
def test_each_damaged_data_file_names_its_own_remedy(tmp_path, name, remedy):
    from helpers.data import check_sha256

    shutil.copy(ROOT / "data" / "README.md", tmp_path / "README.md")
    body = (ROOT / "data" / name).read_bytes()
    (tmp_path / name).write_bytes(body[:-1] + bytes([body[-1] ^ 1]))  # one bit changed
    with pytest.raises(DataFileError) as info:
        check_sha256(tmp_path / name)
    message = str(info.value)
    assert remedy in message and f"git checkout HEAD -- {name}" in message
    others = {"data/make_shakespeare.py", "helpers.data.write_date_splits", "make train-gpt"} - {remedy}
    assert not any(o in message for o in others if o not in remedy), message
