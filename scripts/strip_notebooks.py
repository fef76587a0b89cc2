"""Remove the execution timestamps that running a notebook stores in it.

    python scripts/strip_notebooks.py                 # every notebooks/*.ipynb, in place
    python scripts/strip_notebooks.py a.ipynb b.ipynb # these
    python scripts/strip_notebooks.py --check         # exit 1 naming the notebooks that have some

``jupyter execute`` (nbclient) records in each code cell's ``metadata.execution`` when the cell
was sent, started and finished (``iopub.execute_input``, ``iopub.status.busy``,
``shell.execute_reply``, ``iopub.status.idle``): a diff on every re-run and nothing a reader
needs. Only that key goes; sources, outputs, execution counts and every other metadata key stay,
and the file is written as nbformat writes it (one-space indent, sorted keys, UTF-8), so the
diff of a stripped notebook is exactly the removed lines. Run it after re-executing the
notebooks (README, "Regenerating notebook outputs"); tests/test_notebooks_clean.py fails on a
notebook under notebooks/ that still has them.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
KEY = "execution"


def timestamped_cells(nb: dict) -> list[int]:
    """Indices of the cells whose metadata has execution timestamps."""
    return [i for i, cell in enumerate(nb.get("cells", [])) if KEY in cell.get("metadata", {})]


def strip(nb: dict) -> int:
    """Remove every cell's ``metadata.execution`` from ``nb`` (in place); return how many."""
    cells = timestamped_cells(nb)
    for i in cells:
        del nb["cells"][i]["metadata"][KEY]
    return len(cells)


def dumps(nb: dict) -> str:
    """The notebook as nbformat writes it (``nbformat.write``: indent 1, sorted keys)."""
    return json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def strip_file(path: Path) -> int:
    """Strip ``path`` in place (rewritten only if it had timestamps); return how many cells."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    n = strip(nb)
    if n:
        path.write_text(dumps(nb), encoding="utf-8")
    return n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", type=Path, help="default: notebooks/*.ipynb")
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 if a notebook has timestamps")
    args = parser.parse_args(argv)
    paths = args.paths or sorted(NOTEBOOKS.glob("*.ipynb"))
    dirty = 0
    for path in paths:
        if args.check:
            cells = timestamped_cells(json.loads(path.read_text(encoding="utf-8")))
            if cells:
                dirty += 1
                print(f"{path}: {len(cells)} cell(s) with execution timestamps "
                      f"(python scripts/strip_notebooks.py)")
        else:
            n = strip_file(path)
            if n:
                print(f"{path}: timestamps removed from {n} cell(s)")
    return 1 if dirty else 0


if __name__ == "__main__":
    sys.exit(main())
