"""Participant notebooks for a workshop: ``python scripts/participant_notebooks.py [DEST]
[--lang zh]`` (``make participant``, ``make participant LANG=zh``), default DEST
``_build/participant/`` (English, from ``notebooks/``) or ``_build/participant-zh/`` (Chinese,
from ``notebooks/zh/``, which ``make zh-notebooks`` writes and git tracks).

Each chapter notebook is copied with

- every output and execution count cleared (nothing to read off before predicting: the
  participant runs each cell), and the stored run timestamps dropped;
- every solution left out: the cells tagged ``solution`` by scripts/fold_solutions.py (the
  dropdown's prose and the answer's code cell) become one empty code cell, ``# your answer``,
  where the participant writes their own;
- a first markdown cell saying that this is the participant copy, and the exercises' opening
  sentence saying what the copy holds (an answer cell to write in, not a folded solution);
- links out of the chapters' folder (``../book/...``) rewritten to resolve from DEST;
- every code cell tagged ``nbval-ignore-output`` (invisible in Lab), so that ``make test`` runs
  them under nbval, checking that each cell runs, not what it prints.

The instructor keeps the full notebooks in ``notebooks/``. ``make test`` writes them and runs
them top to bottom under nbval; tests/test_workshop.py checks (statically, in a second) that no
kept cell uses a name that only a left-out solution cell defines.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from zh_notebooks import rebase_links  # noqa: E402  (scripts/ is no package)
DEST = ROOT / "_build" / "participant"
NOTE = ("*Participant copy: outputs cleared, solutions left out. Predict, then run each cell; "
        "write your answers in the `# your answer` cells. The full notebook with the solutions "
        "is the book's chapter.*")
ANSWER = "# your answer\n"
NOTE_ZH = ("*学员版：输出已清空，答案已移除。每个单元格先预测，再运行；"
           "把你的答案写在 `# your answer` 单元格里。带答案的完整笔记本就是本书的这一章。*")
# The exercises' opening sentence of the full notebooks (English, and its catalog translation)
# and what the participant copy says instead.
FOLDED = {
    "en": (r"The solutions are\s+folded; each is followed by a hidden cell that\s+computes the "
           r"answer \(click to show it\)\.",
           "Write each answer in the empty `# your answer` cell under its exercise; the "
           "solutions are in the instructor's copy (the book's chapter)."),
    "zh": (r"答案(?:默认|已)折叠；每个答案后面都有一个隐藏的单元格[^。]*（点击即可显示）。",
           "把答案写在每道练习下面空的 `# your answer` 单元格里；"
           "答案在讲师的版本里（本书的这一章）。"),
}
SOURCES = {"en": ROOT / "notebooks", "zh": ROOT / "notebooks" / "zh"}
DESTS = {"en": DEST, "zh": ROOT / "_build" / "participant-zh"}


def _is_solution(cell: dict) -> bool:
    return "solution" in cell.get("metadata", {}).get("tags", [])


def _ignore_output(cell: dict) -> dict:
    """Tag a code cell ``nbval-ignore-output``: `make test` runs the participant notebooks
    under nbval, which then checks that each cell runs without comparing outputs."""
    tags = cell.setdefault("metadata", {}).setdefault("tags", [])
    if "nbval-ignore-output" not in tags:
        tags.append("nbval-ignore-output")
    return cell


def _say_what_it_holds(source: str, folded: str, instead: str) -> str:
    """An exercises cell's text for the participant copy: the sentence about folded solutions
    replaced by ``instead``; an exercises heading without that sentence gets it after it."""
    source, n = re.subn(folded, instead, source)
    if not n:
        source = re.sub(r"\A(## (?:Exercises|练习)[^\n]*\n)",
                        lambda m: f"{m.group(1)}\n{instead}\n", source)
    return source


def participant(nb: dict, lang: str = "en") -> dict:
    """A participant copy of notebook ``nb`` (a new dict; ``nb`` is not changed) in ``lang``
    (``en`` or ``zh``: the language of ``nb``'s prose).
    Raises ValueError for another ``lang``, or if ``nb`` has no solution cells where it has
    exercises (its solutions would stay in: run scripts/fold_solutions.py first)."""
    if lang not in FOLDED:
        raise ValueError(f"lang must be one of {sorted(FOLDED)}, got {lang!r}")
    nb = json.loads(json.dumps(nb))
    cells, out = nb["cells"], []
    folded, instead = FOLDED[lang]
    has_exercises = any(c["cell_type"] == "markdown" and re.search(
        r"^## (Exercises|练习)", "".join(c["source"]), re.M) for c in cells)
    if has_exercises and not any(_is_solution(c) for c in cells):
        raise ValueError("notebook has exercises but no cell tagged 'solution'; "
                         "run scripts/fold_solutions.py")
    note = {"cell_type": "markdown", "id": "participant-note", "metadata": {},
            "source": [NOTE if lang == "en" else NOTE_ZH]}
    out.append(note)
    for i, cell in enumerate(cells):
        if _is_solution(cell):
            if cell["cell_type"] == "code":
                out.append(_ignore_output({"cell_type": "code", "execution_count": None,
                                           "id": f"answer-{i}", "metadata": {}, "outputs": [],
                                           "source": [ANSWER]}))
            continue
        if cell["cell_type"] == "markdown":
            cell["source"] = _say_what_it_holds("".join(cell["source"]), folded, instead)
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
            cell.get("metadata", {}).pop("execution", None)
            _ignore_output(cell)
        out.append(cell)
    nb["cells"] = out
    return nb


def write_all(dest: Path | None = None, notebooks: list[Path] | None = None,
              lang: str = "en") -> list[Path]:
    """Write the participant copy of each chapter notebook of ``lang`` into ``dest`` (default
    :data:`DESTS`); returns their paths. Raises ValueError for another ``lang``,
    FileNotFoundError when that edition has no notebooks (zh: ``make zh-notebooks``)."""
    if lang not in SOURCES:
        raise ValueError(f"lang must be one of {sorted(SOURCES)}, got {lang!r}")
    dest = Path(dest or DESTS[lang])
    paths = notebooks or sorted(SOURCES[lang].glob("[0-9][0-9]_*.ipynb"))
    if not paths:
        raise FileNotFoundError(f"no notebooks in {SOURCES[lang]}: run `make zh-notebooks`")
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    for p in paths:
        nb = participant(json.loads(p.read_text(encoding="utf-8")), lang)
        for cell in nb["cells"]:
            if cell["cell_type"] == "markdown":
                cell["source"] = rebase_links("".join(cell["source"]), p.parent, dest)
        target = dest / p.name
        target.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dest", nargs="?", type=Path, default=None)
    ap.add_argument("--lang", default="en", choices=sorted(SOURCES))
    args = ap.parse_args(argv)
    try:
        written = write_all(args.dest, lang=args.lang)
    except FileNotFoundError as exc:
        print(f"participant notebooks: {exc}", file=sys.stderr)
        return 1
    for p in written:
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
