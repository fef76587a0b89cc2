"""The stored notebooks carry no execution timestamps (scripts/strip_notebooks.py removes them
after a re-run; README, "Regenerating notebook outputs"), and the strip touches nothing else."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from helpers import load_script

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


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
