"""Reader-facing text never leans on documents the reader cannot see, nor on how the book was
written ("this session", "the seed's numbers", "we could not read"): the English notebooks
(every cell's source and stored text outputs), book/*.md, the cheat sheet, the hardware
presets' sources and the bundled model sources shown on chapter 7's model page."""
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BANNED = re.compile(
    r"seed's|\bthe seed\b|source note|this session|in-session|we could not|read in 2026|"
    r"as remembered|not re-read|text checked against", re.IGNORECASE)
SHOUTED = re.compile(r"\bUNVERIFIED\b")  # a label, written "unverified" like the rest of the prose


def _notebook_texts(path):
    for i, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
        yield f"{path.name} cell {i}", "".join(cell["source"])
        for out in cell.get("outputs", []):
            texts = [out.get("text", "")] + [v for k, v in out.get("data", {}).items()
                                             if k.startswith("text/")]
            for t in texts:
                yield f"{path.name} cell {i} output", "".join(t) if isinstance(t, list) else t


def _texts():
    for nb in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        yield from _notebook_texts(nb)
    for md in sorted((ROOT / "book").glob("*.md")):
        yield md.name, md.read_text(encoding="utf-8")
    from tokenflow.analysis.roofline import HARDWARE
    for name, spec in HARDWARE.items():
        yield f"hardware {name}", spec.source
    yield "models.json", (ROOT / "src/tokenflow/data/models.json").read_text(encoding="utf-8")
    yield "slides.py", (ROOT / "scripts/slides.py").read_text(encoding="utf-8")


def test_the_scan_can_fail():
    assert BANNED.search("against an NVIDIA datasheet in this session")
    assert SHOUTED.search("UNVERIFIED against an NVIDIA datasheet")
    assert BANNED.search("The seed's numbers in their places")
    assert not BANNED.search("a random seed of 0; the notebook; unverified copies")


_ALL = list(_texts())


@pytest.mark.parametrize("where,text", _ALL, ids=[w for w, _ in _ALL])
def test_no_authoring_process_in_reader_text(where, text):
    hits = [text[max(0, m.start() - 40):m.end() + 40]
            for pattern in (BANNED, SHOUTED) for m in pattern.finditer(text)]
    assert not hits, f"{where}: {hits}"
