"""JupyterLab in a real browser, as a learner meets it after `make lab`.

Run by .ci/run after `make test` (not part of `make test`): needs Debian's `chromium` and the
`playwright` package from PyPI (the browser is never downloaded; `playwright install` is not used).

JupyterLab starts the way `make lab` starts it (the learner's working copies made by
`nbtools.py workcopy`, this environment's settings overrides) plus what a test needs: temporary
settings and workspace folders, a token, a free port, autosave off. For lesson 00 and lesson 04
(a training loop with a progress bar): the notebook is not marked modified after it opens;
*Run → Run All Cells* from the menu; then every code cell has run, no cell shows an error, every
progress bar is a rendered widget, every image has loaded, and the page raised no error. Lesson
04 is then saved, closed and reopened: its progress bar still renders (widget state was saved).
On failure a screenshot goes to tests/screenshots/ (git-ignored).
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "notebooks"))
import nbtools  # noqa: E402

CHROMIUM = os.environ.get("COURSE_CHROMIUM", "/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SHOTS = Path(__file__).parent / "screenshots"
RUN_TIMEOUT_MS = 300_000  # Run All Cells on 2 busy cores

# The notebook as the page shows it, read from the model (the app is exposed for this test).
STATE_JS = """() => {
  const panel = window.jupyterapp.shell.currentWidget;
  const cells = [];
  for (const cell of panel.content.model.cells) {
    if (cell.type !== 'code') continue;
    const outputs = [];
    for (let i = 0; i < cell.outputs.length; i++) {
      const o = cell.outputs.get(i).toJSON();
      outputs.push({type: o.output_type, mimes: Object.keys(o.data || {}), ename: o.ename || null});
    }
    cells.push({count: cell.executionCount, outputs});
  }
  return {cells, dirty: panel.context.model.dirty,
          status: panel.sessionContext.session?.kernel?.status ?? 'none'};
}"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no Chromium at {CHROMIUM} (apt-get install chromium, or set COURSE_CHROMIUM)")
    overrides = Path(sys.prefix) / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
    if "saveState" not in (overrides.read_text() if overrides.exists() else ""):
        pytest.fail(f"{overrides} does not turn on the widgets' saveState: run `make install`")
    tmp = tmp_path_factory.mktemp("lab")
    work, settings, workspaces = tmp / "work", tmp / "settings", tmp / "workspaces"
    assert nbtools.cmd_workcopy(work) == 0
    plugin = settings / "@jupyterlab" / "docmanager-extension" / "plugin.jupyterlab-settings"
    plugin.parent.mkdir(parents=True)
    plugin.write_text(json.dumps({"autosave": False}))
    tracker = settings / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings"
    tracker.parent.mkdir(parents=True)
    tracker.write_text(json.dumps({"windowingMode": "none"}))  # every cell in the page, to look at
    news = settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    news.parent.mkdir(parents=True)
    news.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))  # no network
    port, token = _free_port(), secrets.token_hex(16)
    env = {**os.environ, "COURSE_DEVICE": "cpu", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "COURSE_DATA_DIR": str(nbtools.ROOT / "data")}
    env.pop("COURSE_PROGRESS", None)  # widgets, as a learner sees them
    jupyter = Path(sys.executable).with_name("jupyter")
    cmd = [str(jupyter), "lab", str(work), "--no-browser", f"--port={port}", "--ip=127.0.0.1",
           f"--IdentityProvider.token={token}", f"--LabApp.user_settings_dir={settings}",
           f"--LabApp.workspaces_dir={workspaces}", "--LabApp.expose_app_in_browser=True",
           "--ServerApp.open_browser=False"]
    if os.getuid() == 0:
        cmd.append("--allow-root")
    log = open(tmp / "jupyter.log", "w")  # noqa: SIM115
    server = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    for _ in range(120):
        try:
            urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
            break
        except OSError:
            if server.poll() is not None:
                pytest.fail("JupyterLab exited: " + (tmp / "jupyter.log").read_text()[-2000:])
            time.sleep(1)
    else:
        pytest.fail("JupyterLab did not start in 120 s")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        yield browser, base, token, work
        browser.close()
    server.terminate()
    try:
        server.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.kill()
    log.close()


def _open(page, base, token, name):
    page.goto(f"{base}/lab/tree/{name}?token={token}&reset")
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell.currentWidget"
                           " && window.jupyterapp.shell.currentWidget.sessionContext"
                           " && window.jupyterapp.shell.currentWidget.sessionContext.session"
                           " && window.jupyterapp.shell.currentWidget.sessionContext.session.kernel"
                           " && window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.status"
                           " === 'idle'", timeout=120_000)
    page.wait_for_timeout(2000)  # let JupyterLab apply the kernel's metadata, if it would


def _run_all(page):
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
    page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
    page.wait_for_function(
        "() => { const p = window.jupyterapp.shell.currentWidget;"
        " const cells = [...p.content.model.cells].filter(c => c.type === 'code');"
        " return p.sessionContext.session.kernel.status === 'idle'"
        " && cells.every(c => c.executionCount !== null)"
        " && !document.querySelector('.jp-InputPrompt[data-status=\"running\"]'); }",
        timeout=RUN_TIMEOUT_MS, polling=1000)


def _rendered(page):
    """What the page shows: images and their loading, progress widgets, widget errors."""
    return page.evaluate("""() => {
      const nb = window.jupyterapp.shell.currentWidget.node;
      const imgs = [...nb.querySelectorAll('.jp-OutputArea-output img')];
      return {images: imgs.length,
              broken: imgs.filter(i => !(i.complete && i.naturalWidth > 0)).length,
              widgetOutputs: nb.querySelectorAll(
                '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.widget-view+json"]').length,
              progress: nb.querySelectorAll('.widget-hprogress, .jupyter-widget-hprogress').length,
              widgetErrors: (nb.innerText.match(/Error displaying widget/g) || []).length,
              mathjax: nb.querySelectorAll('mjx-container').length};
    }""")


@pytest.mark.parametrize("name, progress_bars", [("00_welcome.ipynb", 0), ("04_multi_head_attention.ipynb", 1)])
def test_run_all_cells_in_jupyterlab(lab, name, progress_bars):
    browser, base, token, work = lab
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors = []
    page.on("pageerror", lambda err: errors.append(str(err)))
    try:
        _open(page, base, token, name)
        state = page.evaluate(STATE_JS)
        assert not state["dirty"], f"{name} is marked modified just by opening it"
        assert page.locator(".lm-TabBar-tab.jp-mod-current.jp-mod-dirty").count() == 0

        _run_all(page)
        state = page.evaluate(STATE_JS)
        code = state["cells"]
        assert code and all(c["count"] is not None for c in code), "a code cell did not run"
        errs = [(i, o["ename"]) for i, c in enumerate(code) for o in c["outputs"] if o["type"] == "error"]
        assert not errs, f"error outputs in code cells (index, name): {errs}"
        shown = _rendered(page)
        widget_outputs = sum("application/vnd.jupyter.widget-view+json" in o["mimes"]
                             for c in code for o in c["outputs"])
        assert widget_outputs >= progress_bars, f"expected {progress_bars} progress bar(s) as widgets"
        assert shown["progress"] >= widget_outputs and shown["widgetErrors"] == 0, shown
        pngs = sum("image/png" in o["mimes"] for c in code for o in c["outputs"])
        assert shown["images"] == pngs and shown["broken"] == 0, (pngs, shown)
        assert not errors, f"page errors: {errors}"

        if progress_bars:  # save, close, reopen: widget state was saved with the notebook
            page.keyboard.press("Control+s")
            page.wait_for_function("() => !window.jupyterapp.shell.currentWidget.context.model.dirty",
                                   timeout=30_000)
            saved = json.loads((work / name).read_text())
            assert saved["metadata"].get("widgets"), "the saved notebook holds no widget state"
            page.goto("about:blank")
            _open(page, base, token, name)
            again = _rendered(page)
            assert again["widgetErrors"] == 0 and again["progress"] >= widget_outputs, again
    except BaseException:
        SHOTS.mkdir(exist_ok=True)
        page.screenshot(path=str(SHOTS / f"{Path(name).stem}.png"), full_page=True)
        raise
    finally:
        page.close()
