"""The chapters as a participant first sees them, and after "Run All": opened in a plain
JupyterLab (this environment's, no extension beyond the widget manager), untrusted, nothing run;
then run top to bottom in a kernel. Headless Chromium (conftest.py ``browser``) reads each
notebook; JupyterLab serves 127.0.0.1 only, from a temporary copy of the chapters (a run
notebook that JupyterLab autosaves never reaches notebooks/).

Checked per chapter: every solution is folded (its prose's input and its answer cell's input and
output show JupyterLab's placeholders), no solution output text is on the page, and no
control is drawn that cannot work: no slider or menu in a stored output (an untrusted
notebook's stored HTML loses its scripts; tokenflow.viz.precomputed_explorer then shows "run this
cell" instead of its controls), and no "Error displaying widget".

The stored outputs must be current (`jupyter execute --inplace notebooks/*.ipynb`): outputs
stored before the explorers learnt to hide their controls still show them.

Opening a chapter in JupyterLab takes several seconds (about 17 s for chapter 1, JupyterLab's
start included, on two busy cores), so by default the test reads chapter 1 (both kinds of
explorer control, live widgets, both kinds of solution); $TOKENFLOW_LAB_CHAPTERS=all reads
every chapter (about 1 minute, and about 3 more for Run All, on two cores), or a list such as
``02,05``. Each chapter opens once, in a reset workspace (``?reset``: no earlier chapter is
restored); it is read, then run with Run All in the same tab.
$TOKENFLOW_LAB_NOTEBOOKS points it at another folder of notebooks (e.g. freshly executed copies).

After Run All (JupyterLab's ``notebook:run-all-cells``, what the Run menu's "Run All Cells"
does; every code cell started on the kernel and given an execution count, the kernel idle),
checked per chapter: each explorer shows one set of controls, not two (a precomputed explorer
with a live one below shows its one-line note, tokenflow.viz.static.LIVE_NOTE, while the live
widget has the controls; one without a live twin shows its own) and no "Error displaying
widget". Every solution still folded after Run All is a known failure (xfail): JupyterLab
unfolds what it runs. Run All adds about 11 s for chapter 1 to the first test's 17 s.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tokenflow.viz.static import WIDGET_VIEW

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = Path(os.environ.get("TOKENFLOW_LAB_NOTEBOOKS") or ROOT / "notebooks")
CHAPTERS = os.environ.get("TOKENFLOW_LAB_CHAPTERS", "01")


def chapters() -> list[Path]:
    """The notebooks this run opens (see the module docstring)."""
    paths = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    if CHAPTERS != "all":
        paths = [p for p in paths if p.name[:2] in CHAPTERS.split(",")]
    return paths


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab on 127.0.0.1 (a free port, no token, no news or update checks) serving a
    temporary copy of the chapters in NOTEBOOKS, with ``window.jupyterapp`` exposed (for Run
    All) and its workspaces in a temporary folder too (not ~/.jupyter: JupyterLab reopens the
    notebooks a workspace had open, with their kernels) and, as ``make lab`` starts it, the
    book's web fonts in a ``custom.css``; yields its base URL."""
    root = tmp_path_factory.mktemp("lab")
    workspaces = tmp_path_factory.mktemp("lab-workspaces")
    for path in chapters():
        shutil.copy2(path, root / path.name)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1",
           f"--port={port}", "--ServerApp.token=", "--ServerApp.password=",
           f"--ServerApp.root_dir={root}", "--LabApp.news_url=",
           "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
           "--LabApp.expose_app_in_browser=True", f"--LabApp.workspaces_dir={workspaces}"]
    if os.name == "posix" and os.getuid() == 0:
        cmd.append("--allow-root")
    # as `make lab`: a Jupyter config folder whose custom/custom.css has the book's web fonts
    from tokenflow.viz.fonts import write_lab_css
    config = tmp_path_factory.mktemp("jupyter-config")
    if not os.environ.get("TOKENFLOW_NO_WEB_FONT"):      # set: Lab without the book's fonts
        write_lab_css(config / "custom" / "custom.css")
    cmd.append("--LabApp.custom_css=True")
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(config))
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, (
                    "JupyterLab did not start"
                )
                time.sleep(0.3)
        yield f"http://127.0.0.1:{port}/"
    finally:
        proc.terminate()
        proc.wait(20)


STATE_JS = """() => {
  const shown = e => e.checkVisibility() && e.getBoundingClientRect().height > 0;
  const outs = [...document.querySelectorAll('.jp-Notebook .jp-OutputArea-output')];
  return {
    cells: document.querySelectorAll('.jp-Notebook .jp-Cell').length,
    inputs_folded: document.querySelectorAll('.jp-Notebook .jp-InputPlaceholder').length,
    outputs_folded: document.querySelectorAll('.jp-Notebook .jp-OutputPlaceholder').length,
    controls: outs.flatMap(o => [...o.querySelectorAll('input, select, button, textarea')])
                  .filter(shown).map(e => e.outerHTML.slice(0, 80)),
    widget_errors: outs.filter(o => o.innerText.includes('Error displaying widget')).length,
    text: document.querySelector('.jp-Notebook').innerText,
  };
}"""


def _solution_texts(nb: dict) -> list[str]:
    """A line of each solution's stored output text (to look for on the page)."""
    found = []
    for c in nb["cells"]:
        if c["cell_type"] == "code" and "solution" in c["metadata"].get("tags", []):
            for o in c.get("outputs", []):
                text = "".join(o.get("text", "")) or "".join(
                    o.get("data", {}).get("text/plain", "")
                )
                line = next((l.strip() for l in text.splitlines() if len(l.strip()) > 12), None)
                if line:
                    found.append(line)
                    break
    return found


def test_chapters_open_folded_without_dead_controls(in_lab):
    problems, seen = [], {}
    for stem, run in in_lab.items():
        nb, r = run["nb"], run["opened"]
        sol = [c for c in nb["cells"] if "solution" in c["metadata"].get("tags", [])]
        sol_code = [c for c in sol if c["cell_type"] == "code"]
        seen[stem] = (len(sol), r["inputs_folded"], r["outputs_folded"])
        if r["inputs_folded"] < len(sol) or r["outputs_folded"] < len(sol_code):
            problems.append(f"{stem}: {len(sol)} solution cells, {r['inputs_folded']} "
                            f"inputs and {r['outputs_folded']} outputs folded")
        problems += [f"{stem}: solution output on the page: {t!r}"
                     for t in _solution_texts(nb) if t in r["text"]]
        problems += [f"{stem}: dead control {c}" for c in r["controls"]]
        if r["widget_errors"]:
            problems.append(f"{stem}: {r['widget_errors']} 'Error displaying widget'")
    print("solution cells / inputs folded / outputs folded:", seen)
    assert seen and len(seen) == len(chapters()) and not problems, "\n".join(problems)


# Run All in the notebook JupyterLab shows, once its kernel is ready (not waiting for the run to
# end: RAN_JS does, with a timeout); count the cells the kernel starts (execute_input on IOPub),
# so that the wait does not pass on the stored execution counts.
RUN_ALL_JS = """async () => {
  const w = window.jupyterapp.shell.currentWidget;
  await w.sessionContext.ready;
  window.tfStarted = 0;
  w.sessionContext.session.kernel.iopubMessage.connect((_, msg) => {
    if (msg.header.msg_type === 'execute_input') window.tfStarted += 1;
  });
  window.jupyterapp.commands.execute('notebook:run-all-cells');   // resolves when all ran
}"""

# Every code cell ran (started on the kernel, an execution count set) and the kernel is idle.
RAN_JS = """n => {
  const w = window.jupyterapp.shell.currentWidget;
  const kernel = w.sessionContext.session && w.sessionContext.session.kernel;
  return kernel && kernel.status === 'idle' && window.tfStarted >= n &&
         [...w.content.model.cells].every(c => c.type !== 'code' || c.executionCount);
}"""

# Where a Run All that did not finish stands.
PROGRESS_JS = """() => {
  const w = window.jupyterapp.shell.currentWidget;
  const kernel = w.sessionContext.session && w.sessionContext.session.kernel;
  const cells = [...w.content.model.cells];
  return `kernel ${kernel ? kernel.status : 'none'}, ${window.tfStarted} cells started, ` +
         `code cells without an execution count: ` +
         cells.flatMap((c, i) => c.type === 'code' && !c.executionCount ? [i] : []).join(', ');
}"""

# Per cell (notebook order): for each of its output areas that shows a control, the first one.
# A live slider is a div with role=slider (noUiSlider), a precomputed one an <input>.
RUN_STATE_JS = """() => {
  const shown = e => e.checkVisibility() && e.getBoundingClientRect().height > 0;
  const cells = [...document.querySelectorAll('.jp-Notebook .jp-Cell')];
  const outs = [...document.querySelectorAll('.jp-Notebook .jp-OutputArea-output')];
  return {
    cells: cells.length,
    controls: cells.map(c => [...c.querySelectorAll('.jp-OutputArea-output')]
        .map(o => [...o.querySelectorAll('input, select, button, textarea, [role=slider]')]
                   .filter(shown))
        .filter(found => found.length)
        .map(found => found[0].outerHTML.slice(0, 80))),
    inputs_folded: document.querySelectorAll('.jp-Notebook .jp-InputPlaceholder').length,
    outputs_folded: document.querySelectorAll('.jp-Notebook .jp-OutputPlaceholder').length,
    widget_errors: outs.filter(o => o.innerText.includes('Error displaying widget')).length,
    text: document.querySelector('.jp-Notebook').innerText,
  };
}"""

def _explorers(nb: dict) -> dict[int, bool]:
    """Cell index -> whether a live explorer follows, for every cell whose stored output is a
    precomputed explorer (tokenflow.viz.static: HTML with ``tf-explorer``; run in a kernel with
    ``live_below``, the same output also holds the widget view of its note)."""
    found = {}
    for i, c in enumerate(nb["cells"]):
        for o in c.get("outputs", []) if c["cell_type"] == "code" else []:
            data = o.get("data", {})
            if 'class="tf-explorer"' in "".join(data.get("text/html", "")):
                found[i] = WIDGET_VIEW in data
    return found


@pytest.fixture(scope="module")
def in_lab(browser, lab) -> dict:
    """Each chapter opened once in JupyterLab (a reset workspace, untrusted, nothing run) for
    every test of this file: chapter stem -> ``nb`` (the notebook), ``glyphs`` (tests/glyphs.js once
    its markdown is drawn), ``opened`` (STATE_JS once they settled), and, run with Run All
    in the same tab afterwards, ``ran`` (RUN_STATE_JS's result or a str saying where an
    unfinished Run All stopped) and ``seconds`` (from opening to that result)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    glyphs = (Path(__file__).with_name("glyphs.js")).read_text(encoding="utf-8")
    runs = {}
    for path in chapters():
        nb = json.loads(path.read_text(encoding="utf-8"))
        n_code = sum(c["cell_type"] == "code" and "".join(c["source"]).strip() != ""
                     for c in nb["cells"])
        sol_code = [c for c in nb["cells"] if c["cell_type"] == "code"
                    and "solution" in c["metadata"].get("tags", [])]
        ctx = browser.new_context(viewport={"width": 1280, "height": 900})
        page = ctx.new_page()
        try:
            start = time.monotonic()
            page.goto(f"{lab}lab/tree/{path.name}?reset", wait_until="load")
            # the glyphs once the markdown is drawn (as a reader first sees the chapter)
            page.wait_for_function("() => document.querySelectorAll('.jp-Notebook .jp-Cell')"
                                   ".length > 10 && !!document.querySelector("
                                   "'.jp-RenderedMarkdown')", timeout=60_000)
            page.evaluate("() => document.fonts.ready.then(() => null)")
            run = {"nb": nb, "glyphs": page.evaluate(glyphs)}
            page.wait_for_function(
                f"() => window.jupyterapp && window.jupyterapp.shell.currentWidget && "
                f"window.jupyterapp.shell.currentWidget.sessionContext && "
                f"window.jupyterapp.shell.currentWidget.context.path === '{path.name}' && "
                f"document.querySelectorAll('.jp-Notebook .jp-Cell').length >= "
                f"{len(nb['cells'])} && document.querySelectorAll('.jp-OutputPlaceholder')"
                f".length >= {len(sol_code)}", timeout=60_000)
            page.wait_for_timeout(1500)          # outputs and widgets settle
            run["opened"] = page.evaluate(STATE_JS)
            page.evaluate(RUN_ALL_JS)
            try:
                page.wait_for_function(RAN_JS, arg=n_code, timeout=180_000, polling=500)
                page.wait_for_timeout(1500)          # widgets render, explorer scripts run
                run["ran"] = page.evaluate(RUN_STATE_JS)
            except PlaywrightTimeout:
                run["ran"] = (f"Run All did not finish in 180 s: "
                              f"{page.evaluate(PROGRESS_JS)} ({n_code} code cells)")
            run["seconds"] = round(time.monotonic() - start, 1)
            runs[path.stem] = run
            page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.shutdown()")
        finally:
            ctx.close()
    return runs


@pytest.fixture(scope="module")
def ran_all(in_lab) -> dict:
    """chapter stem -> (notebook, the state after Run All or where it stopped, seconds)."""
    return {stem: (run["nb"], run["ran"], run["seconds"]) for stem, run in in_lab.items()}


def test_run_all_shows_one_set_of_controls_per_explorer(ran_all):
    """After Run All, each explorer shows one set of controls: the live widget's where a live
    explorer follows the precomputed one (which shows its note), else the precomputed one's;
    never both. And no "Error displaying widget"."""
    problems, seen = [], {}
    for stem, (nb, r, seconds) in ran_all.items():
        if isinstance(r, str):
            problems.append(f"{stem}: {r}")
            continue
        if r["cells"] != len(nb["cells"]):
            problems.append(f"{stem}: {r['cells']} cells on the page, {len(nb['cells'])} in "
                            f"the notebook")
            continue
        explorers = _explorers(nb)
        with_controls = {i: found for i, found in enumerate(r["controls"]) if found}
        n_sets = sum(len(found) for found in with_controls.values())
        seen[stem] = (len(explorers), n_sets, seconds)
        if n_sets != len(explorers):
            problems.append(f"{stem}: {n_sets} sets of controls for {len(explorers)} explorers, "
                            f"in cells {sorted(with_controls)}")
        problems += [f"{stem}: cell {i} shows the precomputed explorer's controls while the "
                     f"live one below runs: {with_controls[i][0]}"
                     for i, live in explorers.items() if live and i in with_controls]
        problems += [f"{stem}: cell {i}, a precomputed explorer with no live one, shows no "
                     f"controls" for i, live in explorers.items()
                     if not live and i not in with_controls]
        if r["widget_errors"]:
            problems.append(f"{stem}: {r['widget_errors']} 'Error displaying widget'")
    print("explorers / sets of controls / seconds to open and Run All:", seen)
    assert seen and len(seen) == len(chapters()) and not problems, "\n".join(problems)


@pytest.mark.xfail(strict=True, reason=(
    "JupyterLab unfolds what it runs: running a markdown cell sets inputHidden = false and "
    "CodeCell.execute sets outputHidden = false (JupyterLab 4.6), so after Run All each "
    "solution's prose and answer output show; only the answer code stays folded"))
def test_run_all_keeps_solutions_folded(ran_all):
    """After Run All every solution is still folded: its prose's input and its answer cell's
    input and output show JupyterLab's placeholders, and no solution output text is on the
    page."""
    problems = []
    for stem, (nb, r, _) in ran_all.items():
        if isinstance(r, str):
            problems.append(f"{stem}: {r}")
            continue
        sol = [c for c in nb["cells"] if "solution" in c["metadata"].get("tags", [])]
        sol_code = [c for c in sol if c["cell_type"] == "code"]
        if r["inputs_folded"] < len(sol) or r["outputs_folded"] < len(sol_code):
            problems.append(f"{stem}: after Run All {len(sol)} solution cells, "
                            f"{r['inputs_folded']} inputs and {r['outputs_folded']} outputs "
                            f"folded")
        problems += [f"{stem}: solution output on the page after Run All: {t!r}"
                     for t in _solution_texts(nb) if t in r["text"]]
    assert ran_all and not problems, "\n".join(problems)


def test_an_untrusted_chapter_draws_every_character(in_lab):
    """Each chapter opened untrusted (chapter 1 by default) in JupyterLab started as ``make
    lab`` does (custom.css with the book's web fonts): no Chinese character or emoji of its
    markdown, code or stored outputs is drawn as the missing-glyph box (tests/glyphs.js, as the
    book's browser test measures it)."""
    for stem, run in in_lab.items():
        r = run["glyphs"]
        assert r["checked"] > 20, (stem, r)
        assert not r["missing"], stem + "\n" + "\n".join(r["missing"][:20])
