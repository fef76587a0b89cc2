"""The workshop kit [W1]: solutions folded in JupyterLab and the book, the participant notebooks,
the preflight ``python -m tokenflow.check`` and the timetables of book/workshop.md."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def _script(name: str):
    """Import scripts/<name>.py as a module."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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
