"""Build the course's website from the stored notebooks (`make site`): nothing is re-executed.

    python docs/build_site.py [OUTDIR]     # default build/site/html (git ignores build/)

Sphinx reads one source folder, so this script first lays one out under build/site/src: the pages of
docs/ (the home page, the maintainers' page, the theme's extra CSS), a copy of every lesson and
solutions notebook found by glob (a new lesson needs no change here), and the course map taken from
the README's lesson table (between its `lessons:` markers: one source for both). In the copies, the
notebook's Colab badge becomes the site's launch bar: an "Open in Colab" button built from
pyproject.toml's `[tool.course] repository` (while that is the placeholder, a "not yet published"
label instead of a dead link) and a link to download the lesson's .ipynb, which is the notebook
exactly as stored. The setup cell, which only Colab and Jupyter need, is left out of the page.
Going-deeper sections (a heading cell that JupyterLab opens folded) get a label that docs/conf.py
turns into a collapsed block.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
sys.path.insert(0, str(ROOT / "notebooks"))
import nbtools  # noqa: E402

STAGE = ROOT / "build" / "site" / "src"
# A Going-deeper heading gets the label deeper-<notebook>-<n>; docs/conf.py collapses those sections.
DEEPER_LABEL = "deeper-{stem}-{n}"


def launch_bar(rel: str) -> str:
    """The Colab button (or the "not yet published" label) and the .ipynb link, as MyST markdown."""
    repository = nbtools.course_config()["repository"]
    if nbtools.PLACEHOLDER_ACCOUNT in repository:
        colab = ('<span class="course-launch course-unpublished" title="The course\'s repository is still a '
                 'placeholder in pyproject.toml, so Colab has nothing to open yet.">'
                 'Colab: not yet published</span>')
    else:
        colab = f'<a class="course-launch course-colab" href="{nbtools.colab_url(rel)}">Open in Colab</a>'
    name = Path(rel).name
    return f"{colab} {{download}}`Download the notebook ({name}) </_ipynb/{rel}>`"


def stage_notebook(src: Path) -> None:
    rel = src.relative_to(ROOT).as_posix()
    nb = json.loads(src.read_text())
    first = nb["cells"][0]
    text = "".join(first["source"])
    if not nbtools.BADGE_RE.search(text):
        raise SystemExit(f"{rel}: its first cell has no Colab badge to turn into the launch bar (run `make render`)")
    first["source"] = nbtools.BADGE_RE.sub(lambda _: launch_bar(rel), text, count=1)
    count = 0
    for cell in nb["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "code" and source.startswith(nbtools.SETUP_MARKER_PREFIX):
            cell["metadata"].setdefault("tags", []).append("remove-cell")
        if cell["cell_type"] == "markdown" and cell["metadata"].get(nbtools.COLLAPSED):
            if not source.lstrip().startswith("#"):
                raise SystemExit(f"{rel}: a cell marked {nbtools.COLLAPSED} does not start with a heading")
            count += 1
            cell["source"] = f"({DEEPER_LABEL.format(stem=src.stem, n=count)})=\n{source.lstrip()}"
    write_if_changed(STAGE / rel, json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    write_if_changed(STAGE / "_ipynb" / rel, src.read_text())  # the download: the notebook as stored


def course_map() -> str:
    """The README's lesson table, with the site's launch buttons in place of the Colab badges."""
    readme = (ROOT / "README.md").read_text()
    found = re.search(r"<!-- lessons:start -->\n(.*?)<!-- lessons:end -->", readme, flags=re.S)
    if not found:
        raise SystemExit("README.md has no lesson table between <!-- lessons:start --> and <!-- lessons:end -->")
    rows = []
    for line in found.group(1).strip().splitlines():
        badge = nbtools.BADGE_RE.search(line)
        if badge:
            rel = re.search(r"\]\((notebooks/[^)]+\.ipynb)\)", line).group(1)
            line = line.replace(badge.group(0), launch_bar(rel).split(" {download}")[0])
        rows.append(line)
    return "\n".join(rows) + "\n"


def write_if_changed(path: Path, text: str) -> None:
    """Sphinx rebuilds a page whose source is newer than its last build: leave unchanged files alone."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)


def stage() -> list[Path]:
    notebooks = nbtools.all_notebooks()
    wanted = {STAGE / p.relative_to(ROOT) for p in notebooks}
    wanted |= {STAGE / "_ipynb" / p.relative_to(ROOT) for p in notebooks}
    for path in notebooks:
        stage_notebook(path)
    for page in DOCS.glob("*.md"):
        write_if_changed(STAGE / page.name, page.read_text())
        wanted.add(STAGE / page.name)
    write_if_changed(STAGE / "_course_map.md", course_map())
    wanted.add(STAGE / "_course_map.md")
    for old in STAGE.rglob("*"):  # a notebook or page removed since the last build goes from the site too
        if old.is_file() and old not in wanted:
            old.unlink()
    return notebooks


def main(argv: list[str]) -> int:
    from sphinx.cmd.build import build_main

    out = Path(argv[0]).resolve() if argv else ROOT / "build" / "site" / "html"
    start = time.perf_counter()
    notebooks = stage()
    # -W: a warning (a broken cross-reference, a missing page) fails the build; -q: warnings and errors only
    code = build_main(["-b", "html", "-c", str(DOCS), "-d", str(STAGE.parent / "doctrees"), "-W", "--keep-going",
                       "-q", str(STAGE), str(out)])
    if code == 0:
        print(f"site: {len(notebooks)} notebook pages in {out} ({time.perf_counter() - start:.0f} s); "
              f"open {out / 'index.html'}")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
