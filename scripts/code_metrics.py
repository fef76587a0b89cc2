"""Print the code-size table of ``src/tokenflow`` (or another source folder), measured with
``ast``.

    python scripts/code_metrics.py [SRC]          # the figures of SRC (default src/tokenflow)
    python scripts/code_metrics.py --write        # refresh the table in ARCHITECTURE.md
    python scripts/code_metrics.py --check        # exit 1 if that table is stale

- function length: code lines of each function or method body, not counting its docstring,
  blank lines or comment-only lines (nested functions count inside their parent and once more
  on their own);
- functions over 60 code lines, and over 60 lines from ``def`` to the end (docstring included);
- docstring share: lines inside module, class and function docstrings over all non-blank lines;
- ``model/`` lines: all lines of the files in ``model/``; the modules over 600 lines and the
  largest one.

ARCHITECTURE.md holds these figures for the code before ``model/`` was split into ``config/``,
``model/`` and ``explain/`` (:data:`BEFORE`, measured by this script at commit ``df7fd5c``) and
for the code as it is, between the markers :data:`BEGIN` and :data:`END`;
``tests/test_code_metrics.py`` fails when the second column no longer matches the code.
"""
from __future__ import annotations

import ast
import io
import statistics
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "ARCHITECTURE.md"
BEGIN, END = "<!-- code_metrics: begin -->", "<!-- code_metrics: end -->"
BEFORE = {"functions": 738, "median": 7, "p90": 22, "over_60": 1, "over_60_span": 10,
          "doc_share": 0.334, "model_lines": 2845, "over_600": 4,
          "largest": (854, "analysis/costmodel.py")}
"""The figures of ``src/tokenflow`` at commit ``df7fd5c`` (``model/`` holding the config, the
HF config parser and the forward path; modules over 600 lines: ``analysis/costmodel.py``,
``parallel/expert_parallel.py``, ``interop/hf_models.py``, ``viz/serving.py``)."""


def _docstring_lines(tree: ast.AST) -> set[int]:
    """Line numbers covered by docstrings (module, class, function)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                out |= set(range(body[0].lineno, body[0].end_lineno + 1))
    return out


def _code_lines(text: str) -> set[int]:
    """Line numbers holding a token other than a comment, newline or indentation."""
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENDMARKER}
    lines = set()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type not in skip:
            lines |= set(range(tok.start[0], tok.end[0] + 1))
    return lines


def measure(src: Path) -> dict:
    lengths, spans, docs, nonblank = [], [], 0, 0
    model_lines, largest, over_600 = 0, (0, ""), []
    for path in sorted(src.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
        doc = _docstring_lines(tree)
        code = _code_lines(text) - doc
        blank = {i for i, line in enumerate(text.splitlines(), 1) if not line.strip()}
        n = len(text.splitlines())
        nonblank += n - len(blank)
        docs += len(doc - blank)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                body = set(range(node.body[0].lineno, node.end_lineno + 1))
                lengths.append(len(body & code))
                spans.append(node.end_lineno - node.lineno + 1)
        if path.parent.name == "model":
            model_lines += n
        largest = max(largest, (n, str(path.relative_to(src))))
        if n > 600:
            over_600.append(str(path.relative_to(src)))
    lengths.sort()
    return {
        "functions": len(lengths),
        "median": statistics.median(lengths),
        "p90": lengths[int(0.9 * (len(lengths) - 1))],
        "over_60": sum(n > 60 for n in lengths),
        "over_60_span": sum(n > 60 for n in spans),
        "doc_share": docs / nonblank,
        "model_lines": model_lines,
        "over_600": len(over_600),
        "over_600_names": sorted(over_600),
        "largest": largest,
    }


def rows(m: dict) -> list[tuple[str, str]]:
    """The figures of :func:`measure` as ``(name, value)`` text pairs."""
    return [
        ("functions (incl. methods)", f"{m['functions']}"),
        ("function length, code lines, median / p90", f"{m['median']:g} / {m['p90']}"),
        ("functions over 60 code lines", f"{m['over_60']}"),
        ("functions over 60 lines, docstring included", f"{m['over_60_span']}"),
        ("share of lines that are docstrings", f"{m['doc_share']:.0%}"),
        ("model/ lines", f"{m['model_lines']:,}"),
        ("modules over 600 lines", f"{m['over_600']}"),
        ("largest module (lines)", f"{m['largest'][1]} ({m['largest'][0]})"),
    ]


def table(src: Path | None = None) -> str:
    """The markdown table of ARCHITECTURE.md: :data:`BEFORE` beside the figures of ``src``."""
    now = rows(measure(src or ROOT / "src" / "tokenflow"))
    lines = [BEGIN, "| | before the split (`df7fd5c`) | now |", "|---|---|---|"]
    lines += [f"| {name} | {before} | {value} |"
              for (name, before), (_, value) in zip(rows(BEFORE), now)]
    return "\n".join(lines + [END])


def stored_table(doc: Path = DOC) -> str:
    """The table between the markers in ``doc`` (raises ``ValueError`` without them)."""
    text = doc.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        raise ValueError(f"{doc} has no {BEGIN} ... {END} block")
    return text[text.index(BEGIN):text.index(END) + len(END)]


def main(argv: list[str]) -> None:
    if argv[1:] == ["--write"]:
        text = DOC.read_text(encoding="utf-8")
        DOC.write_text(text.replace(stored_table(), table()), encoding="utf-8")
        return
    if argv[1:] == ["--check"]:
        if stored_table() != table():
            sys.exit(f"{DOC.name}'s code_metrics table is stale: run "
                     f"python scripts/code_metrics.py --write")
        return
    src = Path(argv[1]) if len(argv) > 1 else ROOT / "src" / "tokenflow"
    m = measure(src)
    w = max(len(r[0]) for r in rows(m))
    print(f"{src}")
    for name, value in rows(m):
        print(f"  {name:<{w}}  {value}")
    if m["over_600_names"]:
        print(f"  {'(over 600 lines)':<{w}}  {', '.join(m['over_600_names'])}")


if __name__ == "__main__":
    main(sys.argv)
