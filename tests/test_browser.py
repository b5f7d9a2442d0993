"""JupyterLab in a real browser, as a learner meets it after `make lab`.

Run by .ci/run after `make test` (not part of `make test`): needs Debian's `chromium` and the
`playwright` package from PyPI (the browser is never downloaded; `playwright install` is not used).

JupyterLab starts the way `make lab` starts it (the learner's working copies made by
`nbtools.py workcopy`, the settings and server config `make` writes into this environment) plus
what a test needs: temporary settings and workspace folders, a token, a free port, autosave off.
For lesson 00 and lesson 04 (a training loop with a progress bar): the notebook is not marked
modified after it opens; no news pop-up; *Run → Run All Cells* from the menu; then every code
cell has run, no cell shows an error, every progress bar is a rendered widget, every image has
loaded, output lines wrap at spaces, and the page raised no error. Lesson 04 is then saved (its
progress bar is saved as text), closed and reopened: it is not marked modified and shows the bar.
Last, with lesson 04 open and edited, `make reset LESSON=04` puts it back: saving from the old tab
makes JupyterLab ask ("File Changed") before it writes anything, and Revert loads the lesson put back.
On failure a screenshot goes to tests/screenshots/ (git-ignored).
"""

from __future__ import annotations

import contextlib
import io
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
WIDGET = "application/vnd.jupyter.widget-view+json"

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
    config = Path(sys.prefix) / "etc" / "jupyter" / "jupyter_lab_config.py"
    if not (overrides.exists() and json.loads(overrides.read_text()) == nbtools.LAB_OVERRIDES and config.exists()):
        pytest.fail(f"{overrides} or {config} is missing or out of date: run `make install`")
    tmp = tmp_path_factory.mktemp("lab")
    work, settings, workspaces = tmp / "work", tmp / "settings", tmp / "workspaces"
    assert nbtools.cmd_workcopy(work) == 0
    plugin = settings / "@jupyterlab" / "docmanager-extension" / "plugin.jupyterlab-settings"
    plugin.parent.mkdir(parents=True)
    plugin.write_text(json.dumps({"autosave": False}))
    tracker = settings / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings"
    tracker.parent.mkdir(parents=True)
    tracker.write_text(json.dumps({"windowingMode": "none"}))  # every cell in the page, to look at
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


KERNEL_IDLE = ("() => window.jupyterapp && window.jupyterapp.shell.currentWidget"
               " && window.jupyterapp.shell.currentWidget.sessionContext"
               " && window.jupyterapp.shell.currentWidget.sessionContext.session"
               " && window.jupyterapp.shell.currentWidget.sessionContext.session.kernel"
               " && window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.status === 'idle'")
DIRTY = "() => window.jupyterapp.shell.currentWidget.context.model.dirty"
CLEAN = "() => !window.jupyterapp.shell.currentWidget.context.model.dirty"


def _open(page, base, token, name):
    page.goto(f"{base}/lab/tree/{name}?token={token}&reset")
    page.wait_for_function(KERNEL_IDLE, timeout=120_000)
    page.wait_for_timeout(2000)  # let JupyterLab apply the kernel's metadata, if it would


def _sessions(base, token):
    """The notebooks that have a running kernel, as the server lists them."""
    with urllib.request.urlopen(f"{base}/api/sessions?token={token}", timeout=10) as answer:
        return sorted(s["path"] for s in json.loads(answer.read()))


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

        news = page.get_by_text("official Jupyter news").count()
        assert news == 0, "JupyterLab's news pop-up is shown (make's overrides turn it off)"
        wrap = page.evaluate("() => [...window.jupyterapp.shell.currentWidget.node.querySelectorAll("
                             "'.jp-OutputArea-output pre')].map(e => getComputedStyle(e).wordBreak)")
        assert wrap and set(wrap) == {"normal"}, f"output lines may break inside a word: {set(wrap)}"

        if progress_bars:
            _save_close_reopen(page, base, token, work, name)
            _reset_while_open(page, work, name)
    except BaseException:
        SHOTS.mkdir(exist_ok=True)
        page.screenshot(path=str(SHOTS / f"{Path(name).stem}.png"), full_page=True)
        raise
    finally:
        page.close()


def _save_close_reopen(page, base, token, work, name):
    """Save (progress bars are saved as their text), close the tab (its kernel stops), open it again."""
    page.keyboard.press("Control+s")
    page.wait_for_function(CLEAN, timeout=30_000)
    saved = json.loads((work / name).read_text())
    outputs = [o for c in saved["cells"] for o in c.get("outputs", [])]
    bars = [o for o in outputs if "100%|██████████|" in "".join(o.get("data", {}).get("text/plain", ""))]
    assert bars and not any(WIDGET in o.get("data", {}) for o in outputs), "progress bars not saved as text"
    assert "widgets" not in saved["metadata"], "widget state saved: JupyterLab would restore it on reopening"
    page.evaluate("() => window.jupyterapp.commands.execute('application:close')")
    page.wait_for_function("() => !window.jupyterapp.shell.currentWidget"
                           " || !window.jupyterapp.shell.currentWidget.context", timeout=30_000)
    for _ in range(30):  # closing the tab shuts its kernel down (make's overrides)
        if name not in _sessions(base, token):
            break
        time.sleep(1)
    assert name not in _sessions(base, token), "the kernel still runs after its tab was closed"
    page.evaluate(f"() => window.jupyterapp.commands.execute('docmanager:open', {{path: {name!r}}})")
    page.wait_for_function(KERNEL_IDLE, timeout=120_000)
    page.wait_for_timeout(3000)  # JupyterLab marked such a lesson modified within a second
    assert not page.evaluate(DIRTY), f"{name} is marked modified just by reopening it"
    assert page.locator(".lm-TabBar-tab.jp-mod-current.jp-mod-dirty").count() == 0
    shown = _rendered(page)
    assert shown["widgetErrors"] == 0 and shown["broken"] == 0, shown
    text = page.evaluate("() => window.jupyterapp.shell.currentWidget.node.innerText")
    assert "100%|██████████|" in text, "the reopened lesson does not show its progress bar"


def _reset_while_open(page, work, name):
    """`make reset` with the lesson open and edited: JupyterLab asks before its save would undo the reset."""
    page.evaluate("""() => { const cells = window.jupyterapp.shell.currentWidget.content.model.cells;
      const cell = [...cells].filter(c => c.type === 'code').pop();
      cell.sharedModel.setSource(cell.sharedModel.getSource() + '\\n# my unsaved work'); }""")
    page.wait_for_function(DIRTY, timeout=10_000)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert nbtools.cmd_workcopy(work, reset=name[:2]) == 0  # make reset LESSON=04
    assert f"put back {name}" in out.getvalue() and "close its tab without saving" in out.getvalue()
    pristine = (work / name).read_text()
    assert nbtools.same_notebook(json.loads(pristine), nbtools.pristine(nbtools.NOTEBOOKS / name))
    page.keyboard.press("Control+s")
    dialog = page.locator(".jp-Dialog")
    dialog.wait_for(timeout=30_000)
    assert "File Changed" in dialog.inner_text() and "Revert" in dialog.inner_text()
    assert (work / name).read_text() == pristine, "the old tab's save overwrote the reset lesson unasked"
    dialog.get_by_role("button", name="Revert").click()
    page.wait_for_function(CLEAN, timeout=30_000)
    assert (work / name).read_text() == pristine
    shown = page.evaluate("() => [...window.jupyterapp.shell.currentWidget.content.model.cells]"
                          ".map(c => c.sharedModel.getSource()).join('\\n')")
    assert "# my unsaved work" not in shown, "Revert did not load the lesson put back"
