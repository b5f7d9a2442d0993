"""The course's website (`make site`) in a real browser, as a reader meets it.

Run by .ci/run after `make site`, with the built site named in COURSE_SITE (not part of `make test`:
it needs Debian's `chromium` and the `playwright` package from PyPI; the browser is never
downloaded, `playwright install` is not used). Run on its own, without COURSE_SITE, it builds the
site first into build/site/html (docs/build_site.py, a few seconds once built), so it always tests
the current notebooks. Without the playwright package it is skipped, saying so; without Chromium
it fails, as the JupyterLab browser test does.

The site is served over HTTP from a local server. Every page (the home page, each lesson and its
solutions, the maintainers' page) loads with no console error and no failed request; every image
loads; every equation is typeset by MathJax, with no raw `$...$` or MathJax error left; the
Going-deeper sections are folded, as many per page as the notebook marks, and one opens when its
summary is clicked; no internal link is broken (the page exists, and so does the anchor); search
finds "softmax"; lessons link to the previous and next ones; the home page's course map is the
README's lesson table; a lesson offers its .ipynb exactly as stored and, while the repository is a
placeholder, a "not yet published" label instead of a Colab link; no page scrolls sideways at a
phone's width.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import sys
import threading
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "notebooks"))
sys.path.insert(0, str(ROOT / "docs"))
import build_site  # noqa: E402
import nbtools  # noqa: E402

CHROMIUM = os.environ.get("COURSE_CHROMIUM", "/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]
PHONE = {"width": 390, "height": 844}
SMART_QUOTES = str.maketrans("\u2018\u2019\u201c\u201d", "''\"\"")

NOTEBOOKS = nbtools.all_notebooks()
PAGES = ["index.html", "maintainers.html"] + [
    p.relative_to(ROOT).with_suffix(".html").as_posix() for p in NOTEBOOKS]
LESSON_PAGES = [p for p in PAGES if re.match(r"notebooks/\d\d_", p)]


def _collapsed_cells(notebook: Path) -> int:
    cells = json.loads(notebook.read_text())["cells"]
    return sum(1 for c in cells if c["cell_type"] == "markdown" and c["metadata"].get(nbtools.COLLAPSED))


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def site():
    """(base URL, site folder): the built site, served on a free local port."""
    built = os.environ.get("COURSE_SITE")
    if built:
        folder = Path(built).resolve()
        assert (folder / "index.html").is_file(), f"COURSE_SITE={built} holds no built site (run `make site`)"
    else:
        folder = ROOT / "build" / "site" / "html"
        assert build_site.main([str(folder)]) == 0, "the site did not build"
    handler = functools.partial(_Quiet, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/", folder
    server.shutdown()


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="needs the playwright package (.ci/run installs it)")
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no Chromium at {CHROMIUM} (apt-get install chromium, or set COURSE_CHROMIUM)")
    with sync_api.sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        yield chromium
        chromium.close()


# MathJax 3 typesets once its startup promise resolves; pages without math do not load it.
TYPESET = "() => !window.MathJax || (MathJax.startup && MathJax.startup.promise.then(() => true))"
# Text a reader sees outside code, with the typeset math left out: where raw TeX would show.
PROSE = """() => {
  const root = document.querySelector('article') || document.body;
  const copy = root.cloneNode(true);
  copy.querySelectorAll('pre, code, mjx-container, script, style, .cell_output').forEach(e => e.remove());
  return copy.innerText;
}"""
IMAGES = """() => Array.from(document.images).map(i => ({src: i.currentSrc || i.src,
  ok: i.complete && i.naturalWidth > 0}))"""
LINKS = "() => Array.from(document.querySelectorAll('a[href]')).map(a => a.href)"


def _visit(browser, url, viewport=None):
    """Open ``url``; return (page, problems): console errors, page errors and failed requests."""
    page = browser.new_page(viewport=viewport or {"width": 1280, "height": 900})
    problems = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
    page.on("response", lambda r: problems.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None)
    page.goto(url, wait_until="load")
    page.evaluate(TYPESET)
    return page, problems


@pytest.mark.parametrize("path", PAGES)
def test_page_loads_with_images_and_typeset_equations(site, browser, path):
    base, _ = site
    page, problems = _visit(browser, base + path)
    try:
        images = page.evaluate(IMAGES)
        broken = [i["src"] for i in images if not i["ok"]]
        assert not broken, f"{path}: images that did not load: {broken}"
        prose = page.evaluate(PROSE)
        raw = re.findall(r"\$[^$\n]{1,80}\$|\\\(.{1,80}?\\\)|\\\[.{1,80}?\\\]", prose)
        assert not raw, f"{path}: equations left as raw TeX: {raw[:5]}"
        assert page.locator("mjx-merror").count() == 0, f"{path}: MathJax could not typeset an equation"
        source = NOTEBOOKS[PAGES.index(path) - 2] if path.startswith("notebooks/") else None
        if source is not None:
            markdown = "".join("".join(c["source"]) for c in json.loads(source.read_text())["cells"]
                               if c["cell_type"] == "markdown")
            if "$" in markdown:
                assert page.locator("mjx-container").count() > 0, f"{path}: its equations were not typeset"
            # Figures: one image on the page for each stored PNG output
            pngs = sum(1 for c in json.loads(source.read_text())["cells"] for o in c.get("outputs", [])
                       if "image/png" in o.get("data", {}))
            assert len(images) >= pngs, f"{path}: {len(images)} images for {pngs} figures in the notebook"
            assert page.locator("details.going-deeper").count() == _collapsed_cells(source), (
                f"{path}: not one folded block per Going-deeper section the notebook marks")
        assert not problems, f"{path}: " + "; ".join(problems)
    finally:
        page.close()


def test_no_internal_link_is_broken(site, browser):
    base, folder = site
    targets: dict[str, set[str]] = {}
    for path in PAGES + ["search.html", "genindex.html"]:
        page, _ = _visit(browser, base + path)
        for href in page.evaluate(LINKS):
            if href.startswith(base):
                url, _, fragment = href.partition("#")
                targets.setdefault(url, set()).add(urllib.parse.unquote(fragment))
        page.close()
    assert len(targets) > len(PAGES), "too few internal links found: the walk is not seeing the pages"
    broken = []
    for url, fragments in sorted(targets.items()):
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                body = response.read().decode("utf-8", "replace")
        except OSError as err:
            broken.append(f"{url}: {err}")
            continue
        for fragment in sorted(fragments - {""}):
            if f'id="{fragment}"' not in body:
                broken.append(f"{url}#{fragment}: no such anchor")
    assert not broken, "broken internal links:\n" + "\n".join(broken)


def test_a_going_deeper_block_opens(site, browser):
    base, _ = site
    lesson = next(p for p, nb in zip(PAGES[2:], NOTEBOOKS, strict=True) if _collapsed_cells(nb))
    page, problems = _visit(browser, base + lesson)
    try:
        block = page.locator("details.going-deeper").first
        body = block.locator(":scope > :not(summary)").first
        assert block.get_attribute("open") is None and not body.is_visible(), "the section is not folded"
        block.locator("summary").click()
        assert block.get_attribute("open") is not None and body.is_visible(), "the section did not open"
        heading = block.locator("xpath=..").locator("h2, h3, h4").first.inner_text()
        assert heading.startswith("Going deeper"), heading
        assert not problems, "; ".join(problems)
    finally:
        page.close()


def test_search_finds_softmax(site, browser):
    base, _ = site
    page, problems = _visit(browser, base + "search.html?q=softmax")
    try:
        results = page.locator("#search-results li")
        results.first.wait_for(timeout=30_000)
        hrefs = [a.get_attribute("href") for a in page.locator("#search-results li a").all()]
        assert any("03_scaling_and_softmax" in h for h in hrefs), f"lesson 03 not among the results: {hrefs}"
        assert not problems, "; ".join(problems)
    finally:
        page.close()


def test_previous_and_next_links_follow_the_lessons(site, browser):
    base, _ = site
    page, _ = _visit(browser, base + "notebooks/03_scaling_and_softmax.html")
    try:
        assert page.locator("a.prev-page").get_attribute("href") == "02_queries_keys_values.html"
        assert page.locator("a.next-page").get_attribute("href") == "04_multi_head_attention.html"
    finally:
        page.close()


def test_home_page_course_map_is_the_readme_table(site, browser):
    base, _ = site
    readme = (ROOT / "README.md").read_text()
    table = readme.split("<!-- lessons:start -->", 1)[1].split("<!-- lessons:end -->", 1)[0]
    lessons = re.findall(r"^\| \[([^\]]+)\]\((notebooks/[^)]+)\.ipynb\) \| ([^|]+) \|", table, flags=re.M)
    assert lessons, "no lesson rows found in the README's table"
    page, _ = _visit(browser, base + "index.html")
    try:
        rows = page.locator("article table tbody tr")
        assert rows.count() == len(lessons)
        for i, (title, rel, what) in enumerate(lessons):
            cells = rows.nth(i).locator("td")
            assert cells.nth(0).inner_text().strip() == title
            assert cells.nth(0).locator("a").get_attribute("href") == f"{rel}.html"
            shown = cells.nth(1).inner_text().strip().translate(SMART_QUOTES)  # Sphinx curls the quotes
            assert shown == what.strip()
    finally:
        page.close()


def test_lesson_offers_its_notebook_and_says_colab_is_not_yet_published(site, browser):
    base, _ = site
    lesson = NOTEBOOKS[0]
    page, _ = _visit(browser, base + lesson.relative_to(ROOT).with_suffix(".html").as_posix())
    try:
        download = page.locator("a.download", has_text=lesson.name)
        assert download.count() == 1, "no link to the lesson's .ipynb"
        with urllib.request.urlopen(urllib.parse.urljoin(page.url, download.get_attribute("href"))) as r:
            assert r.read().decode() == lesson.read_text(), "the offered .ipynb is not the stored notebook"
        placeholder = nbtools.PLACEHOLDER_ACCOUNT in nbtools.course_config()["repository"]
        colab_links = page.locator("a[href*='colab.research.google.com']").count()
        if placeholder:
            assert page.locator(".course-unpublished").inner_text() == "Colab: not yet published"
            assert colab_links == 0, "a Colab link to a repository that does not exist yet"
        else:
            assert page.locator("a.course-colab").get_attribute("href") == nbtools.colab_url(
                lesson.relative_to(ROOT).as_posix())
    finally:
        page.close()


def test_launch_bar_once_published(monkeypatch):
    """After `make render REPOSITORY=...`, the button opens the lesson in Colab (no browser needed)."""
    monkeypatch.setattr(nbtools, "course_config",
                        lambda: {"repository": "https://github.com/someone/attention-step-by-step", "branch": "main"})
    bar = build_site.launch_bar("notebooks/04_multi_head_attention.ipynb")
    url = ("https://colab.research.google.com/github/someone/attention-step-by-step/blob/main/"
           "notebooks/04_multi_head_attention.ipynb")
    assert f'<a class="course-launch course-colab" href="{url}">Open in Colab</a>' in bar
    assert "not yet published" not in bar


@pytest.mark.parametrize("path", ["index.html", "notebooks/04_multi_head_attention.html"])
def test_readable_at_a_phones_width(site, browser, path):
    base, _ = site
    page, problems = _visit(browser, base + path, viewport=PHONE)
    try:
        width = page.evaluate("() => document.documentElement.scrollWidth")
        assert width <= PHONE["width"], f"{path} is {width} px wide at a phone's {PHONE['width']} px"
        assert page.locator("article h1").first.is_visible()
        assert not problems, "; ".join(problems)
    finally:
        page.close()
