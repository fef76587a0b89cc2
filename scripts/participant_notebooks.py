"""Participant notebooks for a workshop: ``python scripts/participant_notebooks.py [DEST]``
(``make participant``), default DEST ``_build/participant/`` (git-ignored).

Each chapter notebook is copied with

- every output and execution count cleared (nothing to read off before predicting: the
  participant runs each cell), and the stored run timestamps dropped;
- every solution left out: the cells tagged ``solution`` by scripts/fold_solutions.py (the
  dropdown's prose and the answer's code cell) become one empty code cell, ``# your answer``,
  where the participant writes their own;
- a first markdown cell saying that this is the participant copy;
- every code cell tagged ``nbval-ignore-output`` (invisible in Lab), so that ``make test`` runs
  them under nbval, checking that each cell runs, not what it prints.

The instructor keeps the full notebooks in ``notebooks/``. ``make test`` writes them and runs
them top to bottom under nbval; tests/test_workshop.py checks (statically, in a second) that no
kept cell uses a name that only a left-out solution cell defines.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEST = ROOT / "_build" / "participant"
NOTE = ("*Participant copy: outputs cleared, solutions left out. Predict, then run each cell; "
        "write your answers in the `# your answer` cells. The full notebook with the solutions "
        "is the book's chapter.*")
ANSWER = "# your answer\n"


def _is_solution(cell: dict) -> bool:
    return "solution" in cell.get("metadata", {}).get("tags", [])


def _ignore_output(cell: dict) -> dict:
    """Tag a code cell ``nbval-ignore-output``: `make test` runs the participant notebooks
    under nbval, which then checks that each cell runs without comparing outputs."""
    tags = cell.setdefault("metadata", {}).setdefault("tags", [])
    if "nbval-ignore-output" not in tags:
        tags.append("nbval-ignore-output")
    return cell


def participant(nb: dict) -> dict:
    """A participant copy of notebook ``nb`` (a new dict; ``nb`` is not changed).
    Raises ValueError if ``nb`` has no solution cells where it has a ``## Exercises`` heading
    (its solutions would stay in: run scripts/fold_solutions.py first)."""
    nb = json.loads(json.dumps(nb))
    cells, out = nb["cells"], []
    has_exercises = any(c["cell_type"] == "markdown" and "## Exercises" in "".join(c["source"])
                        for c in cells)
    if has_exercises and not any(_is_solution(c) for c in cells):
        raise ValueError("notebook has exercises but no cell tagged 'solution'; "
                         "run scripts/fold_solutions.py")
    note = {"cell_type": "markdown", "id": "participant-note", "metadata": {},
            "source": [NOTE]}
    out.append(note)
    for i, cell in enumerate(cells):
        if _is_solution(cell):
            if cell["cell_type"] == "code":
                out.append(_ignore_output({"cell_type": "code", "execution_count": None,
                                           "id": f"answer-{i}", "metadata": {}, "outputs": [],
                                           "source": [ANSWER]}))
            continue
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
            cell.get("metadata", {}).pop("execution", None)
            _ignore_output(cell)
        out.append(cell)
    nb["cells"] = out
    return nb


def write_all(dest: Path = DEST, notebooks: list[Path] | None = None) -> list[Path]:
    """Write the participant copy of each chapter notebook into ``dest``; returns their paths."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    paths = notebooks or sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    written = []
    for p in paths:
        nb = participant(json.loads(p.read_text(encoding="utf-8")))
        target = dest / p.name
        target.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dest", nargs="?", type=Path, default=DEST)
    args = ap.parse_args(argv)
    for p in write_all(args.dest):
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
