"""The stored notebooks carry no execution timestamps (scripts/strip_notebooks.py removes them
after a re-run; README, "Regenerating notebook outputs"), and the strip touches nothing else.
Every stored text output (a stream, or any output's text/plain: what a terminal, nbval and a
plain-text viewer show) fits a book page of 90 columns, in English and in Chinese."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from helpers import load_script
from tokenflow.viz.fmt import display_width

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
ZH_NOTEBOOKS = sorted((ROOT / "notebooks" / "zh").glob("*.ipynb"))
PAGE_COLUMNS = 90


def _load_strip():
    return load_script("strip_notebooks")


strip_notebooks = _load_strip()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_no_notebook_stores_execution_timestamps(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    cells = strip_notebooks.timestamped_cells(nb)
    assert not cells, (f"{path.name}: cells {cells[:5]} have metadata.execution (timestamps of "
                       "the last run): python scripts/strip_notebooks.py")


def test_the_strip_removes_only_the_timestamps(tmp_path):
    """A notebook as `jupyter execute` writes it: only metadata.execution goes; outputs,
    execution counts, tags and the file's layout stay."""
    cell = {"cell_type": "code", "execution_count": 3, "source": "print('都')",
            "metadata": {"tags": ["slide"], "execution": {
                "iopub.execute_input": "2026-12-01T10:00:00.000001Z",
                "iopub.status.busy": "2026-12-01T10:00:00.000000Z",
                "iopub.status.idle": "2026-12-01T10:00:00.100000Z",
                "shell.execute_reply": "2026-12-01T10:00:00.090000Z"}},
            "outputs": [{"name": "stdout", "output_type": "stream", "text": "都\n"}]}
    nb = {"cells": [cell, {"cell_type": "markdown", "metadata": {}, "source": "# x"}],
          "metadata": {"kernelspec": {"name": "python3"}}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "x.ipynb"
    path.write_text(strip_notebooks.dumps(nb), encoding="utf-8")
    assert strip_notebooks.main(["--check", str(path)]) == 1
    assert strip_notebooks.strip_file(path) == 1
    want = copy.deepcopy(nb)
    del want["cells"][0]["metadata"]["execution"]
    assert path.read_text(encoding="utf-8") == strip_notebooks.dumps(want)
    assert strip_notebooks.main(["--check", str(path)]) == 0
    assert strip_notebooks.strip_file(path) == 0


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_the_stored_notebooks_are_written_as_the_strip_writes_them(path):
    """Stripping rewrites a notebook byte for byte as nbformat does, so its diff is only the
    removed timestamps."""
    text = path.read_text(encoding="utf-8")
    assert strip_notebooks.dumps(json.loads(text)) == text


def wide_output_lines(nb: dict, columns: int = PAGE_COLUMNS) -> list[str]:
    """``"cell N, <kind>, line L (W columns): text"`` for each stored text line of ``nb``
    wider than ``columns`` display columns (a Chinese character takes two): stream text and
    every output's text/plain."""
    wide = []
    for n, cell in enumerate(nb["cells"]):
        for out in cell.get("outputs", []) if cell["cell_type"] == "code" else []:
            if out["output_type"] == "stream":
                kind, text = out["name"], out["text"]
            elif "text/plain" in out.get("data", {}):
                kind, text = "text/plain", out["data"]["text/plain"]
            else:
                continue
            text = "".join(text) if isinstance(text, list) else text
            for k, line in enumerate(text.splitlines(), 1):
                if display_width(line) > columns:
                    wide.append(f"cell {n}, {kind}, line {k} ({display_width(line)} columns): "
                                f"{line[:60]}...")
    return wide


def test_wide_output_lines_finds_stream_and_plain_text_lines():
    """The scan reads streams and text/plain, counts a Chinese character as two columns, and
    names the cell and the line."""
    nb = {"cells": [
        {"cell_type": "markdown", "source": "x" * 200, "metadata": {}},
        {"cell_type": "code", "source": "", "metadata": {}, "outputs": [
            {"output_type": "stream", "name": "stdout", "text": ["ok\n", "y" * 91 + "\n"]},
            {"output_type": "execute_result", "data": {"text/plain": "北" * 45,
                                                       "text/html": "<p>" + "z" * 200}},
            {"output_type": "display_data", "data": {"text/plain": "a\n" + "北" * 46}}]}]}
    wide = wide_output_lines(nb)
    assert len(wide) == 2, wide
    assert wide[0].startswith("cell 1, stdout, line 2 (91 columns)")
    assert wide[1].startswith("cell 1, text/plain, line 2 (92 columns)")


@pytest.mark.parametrize("path", NOTEBOOKS + ZH_NOTEBOOKS,
                         ids=[p.name for p in NOTEBOOKS] + [f"zh/{p.name}" for p in ZH_NOTEBOOKS])
def test_stored_text_outputs_fit_the_page(path):
    wide = wide_output_lines(json.loads(path.read_text(encoding="utf-8")))
    assert not wide, (f"{path.relative_to(ROOT)}: {len(wide)} stored output lines are wider than "
                      f"{PAGE_COLUMNS} columns:\n" + "\n".join(wide[:10]))
