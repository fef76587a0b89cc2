"""Fold every exercise solution, in the book and in a plain JupyterLab.

An exercise in a chapter notebook is a markdown cell that ends with a ``:::{dropdown} Solution``
block, followed by the code cell that computes the answer. This script, run on
``notebooks/*.ipynb`` (or the files given), makes both fold until the reader asks:

- the dropdown block moves out of the exercise's markdown cell into its own markdown cell
  (the question stays where it was), tagged ``solution`` and stored with
  ``metadata.jupyter.source_hidden = true``: JupyterLab shows it collapsed (a "..." bar), the
  book renders the dropdown as before (closed);
- the answer's code cell gets the tags ``hide-cell`` (myst-nb folds its code *and* its output
  into one toggle, labelled by ``metadata.mystnb.code_prompt_show``) and ``solution`` (the book
  gives the cell the class ``tag_solution``, which tests/test_browser.py looks for), and
  ``jupyter.source_hidden`` / ``jupyter.outputs_hidden`` / ``collapsed`` (JupyterLab reads these
  when it opens the notebook: code and output collapsed).

Only metadata changes and the split of the exercise cell; sources, outputs and execution counts
of every other cell stay as they are. Idempotent: run it again after editing a notebook
(``python scripts/fold_solutions.py``; ``--check`` exits 1 if a notebook needs it).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = ":::{dropdown} Solution"
TAG = "solution"
PROMPT_SHOW = "Show the answer: code and output"
PROMPT_HIDE = "Hide the answer"


def _lines(text: str) -> list[str]:
    """``text`` as a notebook ``source`` list (lines keep their newline, the last has none)."""
    out = text.splitlines(keepends=True)
    if out and out[-1].endswith("\n"):
        out[-1] = out[-1][:-1]
    return out


def _fold_code(cell: dict) -> None:
    md = cell.setdefault("metadata", {})
    tags = [t for t in md.get("tags", []) if t not in ("hide-input", "hide-output")]
    for t in ("hide-cell", TAG):
        if t not in tags:
            tags.append(t)
    md["tags"] = tags
    md["collapsed"] = True
    md.setdefault("jupyter", {}).update(source_hidden=True, outputs_hidden=True)
    md.setdefault("mystnb", {}).update(code_prompt_show=PROMPT_SHOW, code_prompt_hide=PROMPT_HIDE)


def _solution_md(source: list[str], cell_id: str | None) -> dict:
    cell = {"cell_type": "markdown"}
    if cell_id is not None:
        cell["id"] = cell_id[:60] + "-sol"
    cell["metadata"] = {"tags": [TAG], "jupyter": {"source_hidden": True}}
    cell["source"] = source
    return cell


def fold(nb: dict) -> dict:
    """Return ``nb`` with every solution folded (see the module docstring); ``nb`` is changed
    in place too. Raises ValueError when a dropdown is not followed by the answer's code cell."""
    cells = nb["cells"]
    out: list[dict] = []
    i = 0
    while i < len(cells):
        cell = cells[i]
        text = "".join(cell["source"])
        if cell["cell_type"] == "markdown" and MARKER in text:
            start = text.index(MARKER)
            is_solution_cell = TAG in cell.get("metadata", {}).get("tags", [])
            if start == 0 or is_solution_cell:
                sol = cell
                cell.setdefault("metadata", {}).setdefault("tags", [])
                if TAG not in cell["metadata"]["tags"]:
                    cell["metadata"]["tags"].append(TAG)
                cell["metadata"].setdefault("jupyter", {})["source_hidden"] = True
                out.append(sol)
            else:
                cell["source"] = _lines(text[:start].rstrip("\n"))
                out.append(cell)
                out.append(_solution_md(_lines(text[start:].rstrip("\n")), cell.get("id")))
            nxt = cells[i + 1] if i + 1 < len(cells) else None
            if nxt is None or nxt["cell_type"] != "code":
                raise ValueError(f"cell {i}: a solution dropdown must be followed by the "
                                 f"answer's code cell")
            _fold_code(nxt)
            out.append(nxt)
            i += 2
            continue
        out.append(cell)
        i += 1
    nb["cells"] = out
    return nb


def dump(nb: dict) -> str:
    """The notebook as the repository stores it (indent 1, UTF-8, trailing newline)."""
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


def is_solution(cell: dict) -> bool:
    """True for a cell this script marked as part of a solution (markdown or code)."""
    return TAG in cell.get("metadata", {}).get("tags", [])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("notebooks", nargs="*", type=Path)
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if a notebook "
                    "would change")
    args = ap.parse_args(argv)
    paths = args.notebooks or sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    stale = []
    for p in paths:
        before = p.read_text(encoding="utf-8")
        after = dump(fold(json.loads(before)))
        if after != before:
            stale.append(p)
            if not args.check:
                p.write_text(after, encoding="utf-8")
    verb = "would change" if args.check else "changed"
    for p in stale:
        print(f"{verb}: {p}")
    return 1 if (args.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
