"""The workshop kit: solutions folded in JupyterLab and the book, the participant notebooks,
the preflight ``python -m tokenflow.check`` and the timetables of book/workshop.md."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import load_script

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def _script(name: str):
    return load_script(name)


fold_solutions = _script("fold_solutions")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_solutions_fold_in_lab(path):
    """Every solution opens folded in a plain JupyterLab: its prose (a markdown cell of its own,
    input hidden) and its code cell (input and output hidden, ``collapsed``), which the book
    folds as one toggle (``hide-cell``). scripts/fold_solutions.py would change nothing."""
    text = path.read_text(encoding="utf-8")
    nb = json.loads(text)
    prose = code = 0
    for i, cell in enumerate(nb["cells"]):
        md = cell.get("metadata", {})
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown" and fold_solutions.MARKER in source:
            assert fold_solutions.is_solution(cell) and source.startswith(fold_solutions.MARKER), \
                f"cell {i}: a solution dropdown shares its cell with the question"
            assert md.get("jupyter", {}).get("source_hidden") is True, f"cell {i} not folded in Lab"
            prose += 1
        elif cell["cell_type"] == "code" and fold_solutions.is_solution(cell):
            assert md.get("jupyter", {}).get("source_hidden") is True, f"cell {i}: code shown"
            assert md.get("jupyter", {}).get("outputs_hidden") is True, f"cell {i}: output shown"
            assert md.get("collapsed") is True, f"cell {i}: output shown (classic key)"
            assert "hide-cell" in md.get("tags", []), f"cell {i}: the book folds code only"
            assert "hide-input" not in md.get("tags", [])
            code += 1
    assert prose == code, f"{prose} solution dropdowns but {code} folded answer cells"
    if path.stem != "09_recap":
        assert prose >= 3, "every chapter has exercises"
    assert fold_solutions.dump(fold_solutions.fold(json.loads(text))) == text, \
        "run `python scripts/fold_solutions.py`"


# --- python -m tokenflow.check -----------------------------------------------------------------
import os
import subprocess
import sys

from tokenflow import check


def _run_check(*args, **env):
    """``python -m tokenflow.check`` in a fresh process with this checkout's package first."""
    e = dict(os.environ, **{"PYTHONPATH": str(ROOT / "src"), **env})
    return subprocess.run([sys.executable, "-m", "tokenflow.check", *args], cwd=ROOT, env=e,
                          capture_output=True, text=True, timeout=120)


def test_check_passes_here():
    """Every check passes in this environment (the font once the bundled one is in the package):
    one line per check, exit 0; the running example predicts 都. Without the bundled font the
    only failing line is the font's, and the exit status is 1."""
    proc = _run_check()
    lines = [l for l in proc.stdout.splitlines() if l.startswith("[")]
    assert [l.split("]")[1].split()[0] for l in lines] == \
        ["python", "torch", "font", "jupyterlab", "web", "example"], proc.stdout
    assert "predicts 都" in proc.stdout
    failed = [l for l in lines if l.startswith("[FAIL]")]
    if check.font_files():
        assert proc.returncode == 0 and not failed, proc.stdout
    else:
        assert proc.returncode == 1 and len(failed) == 1 and "bundled font missing" in failed[0]


def test_check_fails_without_the_font(tmp_path):
    """An empty font folder: a FAIL line naming the folder, the fix, exit status 1; in Chinese
    with --lang zh. A font without 都 (matplotlib's DejaVu Sans): a FAIL naming the glyph."""
    proc = _run_check(TOKENFLOW_FONT_DIR=str(tmp_path))
    assert proc.returncode == 1
    assert f"[FAIL] font       bundled font missing: no .ttf/.otf in {tmp_path}" in proc.stdout
    assert "fix: " in proc.stdout and "not ready: 1 of 6" in proc.stdout
    zh = _run_check("--lang", "zh", TOKENFLOW_FONT_DIR=str(tmp_path))
    assert zh.returncode == 1 and "缺少随书字体" in zh.stdout and "尚未就绪" in zh.stdout
    import matplotlib
    from pathlib import Path as P
    dejavu = P(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf"
    (tmp_path / "DejaVuSans.ttf").write_bytes(dejavu.read_bytes())
    r = check.check_font(tmp_path)
    assert r.status == check.FAIL and r.key == "font.noglyph", r
    assert "has no glyph for 都" in r.lines()[0]


def test_check_fails_without_torch(monkeypatch, capsys):
    """torch not importable: its line says so with the install command, the running example is
    skipped, exit status 1."""
    monkeypatch.setitem(sys.modules, "torch", None)      # import torch -> ImportError
    assert check.main([]) == 1
    out = capsys.readouterr().out
    assert "[FAIL] torch      torch is not installed (ModuleNotFoundError" in out
    assert "fix: pip install -r requirements.txt" in out
    assert "[FAIL] example    skipped: needs torch" in out


def test_check_reports_the_cuda_build(monkeypatch):
    """A CUDA build of torch is a warning (it works) that tells how to get the CPU build."""
    import torch
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    r = check.check_torch()
    assert r.status == check.WARN and "CUDA build (CUDA 12.8)" in r.lines()[0]
    assert "download.pytorch.org/whl/cpu" in r.lines()[1]


# --- participant notebooks ---------------------------------------------------------------------
import ast

participant_notebooks = _script("participant_notebooks")


def _names(source: str) -> tuple[set, set]:
    """(names bound, names read) by a code cell; IPython magics and shell lines are skipped."""
    code = "\n".join(l for l in source.splitlines() if not l.lstrip().startswith(("%", "!")))
    bound, read = set(), set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Name):
            (bound if isinstance(node.ctx, (ast.Store, ast.Del)) else read).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    return bound, read


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_participant_notebook(path):
    """The participant copy: no solution left, no output or execution count stored, one empty
    answer cell per exercise, every code cell run by nbval without comparing outputs, and no
    kept cell reads a name that only a left-out solution cell binds (so the copy runs top to
    bottom; `make test` executes it)."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    solutions = [c for c in nb["cells"] if fold_solutions.is_solution(c)]
    copy = participant_notebooks.participant(nb)
    cells = copy["cells"]
    assert "Participant copy" in "".join(cells[0]["source"])
    text = json.dumps(copy, ensure_ascii=False)
    assert fold_solutions.MARKER not in text and '"solution"' not in text
    assert "solutions are folded" not in text and "hidden cell" not in text, \
        "the copy's exercise text still promises folded solutions"
    if solutions:
        assert "`# your answer` cell under its exercise" in text
    code = [c for c in cells if c["cell_type"] == "code"]
    assert all(c["outputs"] == [] and c["execution_count"] is None for c in code)
    assert all("nbval-ignore-output" in c["metadata"]["tags"] for c in code)
    answers = [c for c in code if "".join(c["source"]) == participant_notebooks.ANSWER]
    assert len(answers) == sum(c["cell_type"] == "code" for c in solutions)
    kept_bound = set()
    for c in code:
        kept_bound |= _names("".join(c["source"]))[0]
    only_in_solutions = set()
    for c in solutions:
        if c["cell_type"] == "code":
            only_in_solutions |= _names("".join(c["source"]))[0]
    only_in_solutions -= kept_bound
    used = set()
    for c in code:
        used |= _names("".join(c["source"]))[1] & only_in_solutions
    assert not used, f"kept cells read names only a left-out solution defines: {sorted(used)}"
    assert json.loads(path.read_text(encoding="utf-8")) == nb, "the full notebook was changed"


# --- book/workshop.md: timetables that add up ---------------------------------------------------
import math
import re

RUN_TIMES = ROOT / "book" / "notebook_run_times.json"
DIAGRAM_MIN = 10       # each chapter session opens with 10 minutes at the whiteboard diagram
EXERCISE_MIN = 5       # and gives each exercise done in the room 5 minutes


def _timetables() -> dict[str, tuple[list[dict], str]]:
    """Each '### <name>' table of book/workshop.md's Timetables section: its rows (start,
    minutes, session, notebook, exercises, run time) and the 'Total: ...' line after it."""
    text = (ROOT / "book" / "workshop.md").read_text(encoding="utf-8")
    section = text.split("## Timetables", 1)[1].split("\n## ", 1)[0]
    tables = {}
    for block in section.split("\n### ")[1:]:
        name = block.splitlines()[0].strip()
        rows = []
        for line in block.splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if re.fullmatch(r"\d\d:\d\d", cells[0]):
                rows.append(dict(zip(("start", "minutes", "session", "notebook", "exercises",
                                      "run"), cells)))
        total = next(l for l in block.splitlines() if l.startswith("Total:"))
        tables[name] = (rows, total)
    return tables


def _minutes(hhmm: str) -> int:
    h, m = hhmm.split(":")
    return int(h) * 60 + int(m)


def test_timetables_add_up():
    """The three timetables of book/workshop.md: each row starts when the one before ends,
    the last row ('end') at the sum; the 'Total' line states the sums of sessions and breaks;
    each chapter session holds its diagram time, the notebook's measured run time (rounded up
    to a minute) and its exercises (no more than the chapter has); the run-time column is the
    measured one; the half day covers chapters 0 to 4 in order (the later ones build on them),
    the serving half day chapters 0, 2, 4 and 5, the full day every chapter."""
    measured = json.loads(RUN_TIMES.read_text(encoding="utf-8"))["seconds"]
    assert set(measured) == {p.stem for p in NOTEBOOKS}
    exercises = {p.stem: sum(fold_solutions.is_solution(c) and c["cell_type"] == "code"
                             for c in json.loads(p.read_text(encoding="utf-8"))["cells"])
                 for p in NOTEBOOKS}
    tables = _timetables()
    assert set(tables) == {"Half day", "Serving half day", "Full day"}
    for name, (rows, total) in tables.items():
        assert rows[-1]["session"] == "end" and not rows[-1]["minutes"]
        for a, b in zip(rows, rows[1:]):
            assert _minutes(a["start"]) + int(a["minutes"]) == _minutes(b["start"]), (name, a)
        breaks = sum(int(r["minutes"]) for r in rows[:-1] if r["session"] in ("break", "lunch"))
        sessions = sum(int(r["minutes"]) for r in rows[:-1]) - breaks
        span = _minutes(rows[-1]["start"]) - _minutes(rows[0]["start"])
        assert total == (f"Total: {sessions} minutes of sessions and {breaks} of "
                         f"{'break' if breaks <= 15 else 'breaks'}, {span} minutes."), (name, total)
        chapters = [r for r in rows if r["notebook"]]
        for r in chapters:
            nb, k, run = r["notebook"], int(r["exercises"]), measured[r["notebook"]]
            assert r["run"] == f"{round(run)} s", (name, nb, r["run"], run)
            assert 1 <= k <= exercises[nb], (name, nb, k)
            need = DIAGRAM_MIN + math.ceil(run / 60) + EXERCISE_MIN * k
            assert int(r["minutes"]) >= need, f"{name}: {nb} needs {need} min, has {r['minutes']}"
        order = [r["notebook"] for r in chapters]
        want = {"Half day": sorted(measured)[:5],
                "Serving half day": [sorted(measured)[k] for k in (0, 2, 4, 5)]
                }.get(name, sorted(measured))
        assert order == want, (name, order)


def test_timetable_sessions_use_the_chapters_own_titles():
    """A chapter session is named by its notebook's H1 (the title in the book's table of
    contents), optionally followed by what the room does next (", then ..."); and the preface
    counts the timetables the workshop page has."""
    for name, (rows, _) in _timetables().items():
        for r in (r for r in rows if r["notebook"]):
            nb = json.loads((ROOT / "notebooks" / f"{r['notebook']}.ipynb")
                            .read_text(encoding="utf-8"))
            h1 = "".join(nb["cells"][0]["source"]).splitlines()[0].removeprefix("# ")
            assert r["session"] == h1 or r["session"].startswith(h1 + ", then "), \
                (name, r["session"], h1)
    preface = (ROOT / "book" / "preface.md").read_text(encoding="utf-8")
    assert f"{['no', 'one', 'two', 'three', 'four'][len(_timetables())]} timetables" in preface


# --- explorers: one set of controls in each place -----------------------------------------------
def test_explorer_with_a_live_twin_carries_a_note_widget_in_a_kernel():
    """Run in a kernel (nbclient), a precomputed explorer with ``live_below`` stores its HTML and
    a widget view (the note JupyterLab draws in a running session instead of a second set of
    controls); without ``live_below``, or outside a kernel, only text and HTML. The book ranks
    the widget view below HTML (_config.yml), so it keeps showing the precomputed explorer."""
    import nbformat
    import yaml
    from nbclient import NotebookClient

    from tokenflow.viz.static import LIVE_NOTE, WIDGET_VIEW, precomputed_explorer
    code = ("from tokenflow.viz.static import precomputed_explorer\n"
            "precomputed_explorer(lambda n: str(n), {{'n': [1, 2]}}, live_below={})")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code.format(flag))
                                         for flag in (True, False)])
    NotebookClient(nb, timeout=60, kernel_name="python3").execute()
    twin, alone = (c.outputs[-1]["data"] for c in nb.cells)
    assert {"text/plain", "text/html", WIDGET_VIEW} <= set(twin)
    assert set(alone) == {"text/plain", "text/html"}
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    assert any(LIVE_NOTE in str(m["state"].get("value", "")) for m in state.values())
    ex = precomputed_explorer(lambda n: str(n), {"n": [1, 2]}, live_below=True)
    assert WIDGET_VIEW not in ex._repr_mimebundle_()                  # no kernel here
    cfg = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))["sphinx"]["config"]
    assert ["html", WIDGET_VIEW, 35] in cfg["nb_mime_priority_overrides"]   # after text/html (30)


def test_check_runs_with_an_empty_torch_module(tmp_path):
    """A module named torch that is not torch (an empty folder shadowing it) gives the torch
    line's FAIL and exit 1, in a fresh process: no traceback from importing the package, and
    the font line does not fail because of torch."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("")
    proc = _run_check(PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT / 'src'}")
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "[FAIL] torch" in proc.stdout and "pip install -r requirements.txt" in proc.stdout
    assert "[ok  ] font" in proc.stdout, proc.stdout
    assert "[FAIL] example    skipped" in proc.stdout
    assert proc.returncode == 1


@pytest.mark.parametrize("damage", ["truncated", "empty"])
def test_check_reports_a_damaged_font_file(tmp_path, damage):
    """One font file of the set damaged (cut short, or empty): the font line FAILs naming it
    and says how to restore the fonts; no traceback, exit 1."""
    fonts = check.font_files()
    for f in fonts:
        data = f.read_bytes()
        if f == fonts[0]:
            data = data[:3000] if damage == "truncated" else b""
        (tmp_path / f.name).write_bytes(data)
    proc = _run_check(TOKENFLOW_FONT_DIR=str(tmp_path))
    assert "Traceback" not in proc.stderr, proc.stderr
    line = next(l for l in proc.stdout.splitlines() if l.startswith("[FAIL] font"))
    assert "missing or damaged" in line
    assert "git checkout -- src/tokenflow/data/fonts" in proc.stdout
    assert proc.returncode == 1


def test_package_without_torch_names_the_fix(tmp_path):
    """With a broken torch, ``import tokenflow`` works (so the check can run) and any public
    name raises an ImportError that says torch is the cause and how to fix it."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("")
    code = ("import tokenflow\n"
            "try:\n    tokenflow.load_pretrained\n"
            "except ImportError as e:\n    print('IMPORTERROR', e)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT / 'src'}"),
                          timeout=120)
    assert "IMPORTERROR tokenflow.load_pretrained needs a working torch" in proc.stdout, \
        proc.stdout + proc.stderr
    assert "pip install -r requirements.txt" in proc.stdout


def test_check_web_font_needs_lab_stylesheet(tmp_path, monkeypatch):
    """The notebooks' web fonts: without a JupyterLab custom.css declaring them a WARN with the
    command that writes one; once written (tokenflow.viz.fonts.write_lab_css) OK; a font folder
    without them a FAIL."""
    css = tmp_path / "custom" / "custom.css"
    monkeypatch.setattr(check, "lab_css_paths", lambda: [css])
    r = check.check_web_font()
    assert r.status == check.WARN and "--lab-css" in "\n".join(r.lines())
    from tokenflow.viz.fonts import write_lab_css
    write_lab_css(css)
    assert check.check_web_font().status == check.OK
    assert "--jp-content-font-family" in css.read_text(encoding="utf-8")
    assert check.check_web_font(tmp_path).status == check.FAIL
