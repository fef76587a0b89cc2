"""The chapters as a participant first sees them: opened in a plain JupyterLab (this
environment's, no extension beyond the widget manager), untrusted, nothing run. Headless
Chromium (conftest.py ``browser``) reads each notebook; JupyterLab serves 127.0.0.1 only.

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
every chapter (about 3 minutes on two busy cores), or a list such as ``02,05``.
$TOKENFLOW_LAB_NOTEBOOKS points it at another folder of notebooks (e.g. freshly executed copies).
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

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
def lab():
    """JupyterLab on 127.0.0.1 (a free port, no token, no news or update checks) serving
    NOTEBOOKS; yields its base URL."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1",
           f"--port={port}", "--ServerApp.token=", "--ServerApp.password=",
           f"--ServerApp.root_dir={NOTEBOOKS}", "--LabApp.news_url=",
           "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    if os.name == "posix" and os.getuid() == 0:
        cmd.append("--allow-root")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, "JupyterLab did not start"
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
                text = "".join(o.get("text", "")) or "".join(o.get("data", {}).get("text/plain", ""))
                line = next((l.strip() for l in text.splitlines() if len(l.strip()) > 12), None)
                if line:
                    found.append(line)
                    break
    return found


def test_chapters_open_folded_without_dead_controls(browser, lab):
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    page = ctx.new_page()
    problems, seen = [], {}
    try:
        for path in chapters():
            nb = json.loads(path.read_text(encoding="utf-8"))
            sol = [c for c in nb["cells"] if "solution" in c["metadata"].get("tags", [])]
            sol_code = [c for c in sol if c["cell_type"] == "code"]
            page.goto(f"{lab}lab/tree/{path.name}", wait_until="load")
            page.wait_for_function(
                f"() => document.querySelectorAll('.jp-Notebook .jp-Cell').length >= "
                f"{len(nb['cells'])} && document.querySelectorAll('.jp-OutputPlaceholder')"
                f".length >= {len(sol_code)}", timeout=60_000)
            page.wait_for_timeout(1500)          # outputs and widgets settle
            r = page.evaluate(STATE_JS)
            seen[path.stem] = (len(sol), r["inputs_folded"], r["outputs_folded"])
            if r["inputs_folded"] < len(sol) or r["outputs_folded"] < len(sol_code):
                problems.append(f"{path.stem}: {len(sol)} solution cells, {r['inputs_folded']} "
                                f"inputs and {r['outputs_folded']} outputs folded")
            problems += [f"{path.stem}: solution output on the page: {t!r}"
                         for t in _solution_texts(nb) if t in r["text"]]
            problems += [f"{path.stem}: dead control {c}" for c in r["controls"]]
            if r["widget_errors"]:
                problems.append(f"{path.stem}: {r['widget_errors']} 'Error displaying widget'")
            page.goto("about:blank")
    finally:
        ctx.close()
    print("solution cells / inputs folded / outputs folded:", seen)
    assert seen and len(seen) == len(chapters()) and not problems, "\n".join(problems)
