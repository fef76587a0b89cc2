"""Notebooks show ideas, not output plumbing.

A visible code line is a non-blank, non-comment line of a code cell the book shows (not tagged
``hide-input``, ``hide-cell``, ``remove-input`` or ``remove-cell``). It is *plumbing* when it
starts a ``print(`` / ``say(`` / ``display(`` / ``Table(`` call (also as ``x = Table(``) or
continues a message with an f-string literal. At most 15% of a chapter's visible code lines may
be plumbing; formatting belongs in ``tokenflow.viz`` helpers or in hidden cells.
"""
from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("[0-9][0-9]_*.ipynb"))
HIDDEN_TAGS = {"hide-input", "hide-cell", "remove-input", "remove-cell"}
MAX_PLUMBING = 0.15
PLUMBING = re.compile(r"""^\s*(?:[A-Za-z_][\w.]*\s*=\s*)?(?:print|say|display|Table)\("""
                      r"""|^\s*(?:rf|fr|f)["']""")


def is_plumbing(line: str) -> bool:
    """True for a line that prints or formats output (see the module docstring)."""
    return bool(PLUMBING.match(line))


def visible_code_lines(path: Path) -> list[str]:
    """The non-blank, non-comment code lines of the cells the book shows, in order."""
    lines = []
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type != "code" or HIDDEN_TAGS & set(cell.metadata.get("tags", [])):
            continue
        lines += [ln for ln in cell.source.splitlines()
                  if ln.strip() and not ln.strip().startswith("#")]
    return lines


def plumbing_ratio(path: Path) -> tuple[int, int]:
    """``(plumbing lines, visible lines)`` of one notebook."""
    lines = visible_code_lines(path)
    return sum(map(is_plumbing, lines)), len(lines)


@pytest.mark.parametrize("line, expected", [
    ('print("tokens:", tokens)', True),
    ("say(f\"1. {x}\", width=84)", True),
    ("display(peer_table(peer))", True),
    ("t = Table(rows, headers)", True),
    ('      f"{format_bytes(n)} in bf16")', True),
    ("logits = prefill(model, ids, cache)", False),
    ("fig = lens_bars(prof)", False),
    ('names = ["都", "府"]', False),
    ("printer = make()", False),
])
def test_classifier(line, expected):
    assert is_plumbing(line) is expected


def test_every_chapter_is_counted():
    assert len(NOTEBOOKS) >= 10


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_plumbing_ratio(path):
    plumbing, visible = plumbing_ratio(path)
    ratio = plumbing / visible if visible else 0.0
    print(f"{path.stem}: {plumbing} of {visible} visible code lines are plumbing ({ratio:.1%})")
    assert ratio <= MAX_PLUMBING, (
        f"{path.name}: {plumbing} of {visible} visible code lines ({ratio:.1%}) print or format "
        f"output; at most {MAX_PLUMBING:.0%}: move the formatting into a tokenflow.viz helper "
        f"or tag the cell hide-input")


SAY_HEADING = "## What you can now say with numbers"


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if not p.stem.startswith("09")],
                         ids=[p.stem for p in NOTEBOOKS if not p.stem.startswith("09")])
def test_what_you_can_now_say_has_one_form(path):
    """Chapters 00-08 end on the same section: the heading, then one code cell, its input
    hidden, that prints the sentences with their computed values (``say``)."""
    cells = nbformat.read(path, as_version=4).cells
    at = [i for i, c in enumerate(cells) if c.cell_type == "markdown"
          and any(line.strip() == SAY_HEADING for line in c.source.splitlines())]
    assert len(at) == 1, f"{path.name}: {len(at)} '{SAY_HEADING}' headings"
    cell = cells[at[0] + 1]
    assert cell.cell_type == "code" and "hide-input" in cell.metadata.get("tags", []), path.name
    assert "say(" in cell.source and cell.get("outputs"), path.name
