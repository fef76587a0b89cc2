"""Print the code-size table of ``src/tokenflow`` (or another source folder), measured with
``ast``.

    python scripts/code_metrics.py [SRC]

- function length: code lines of each function or method body, not counting its docstring,
  blank lines or comment-only lines (nested functions count inside their parent and once more
  on their own);
- functions over 60 code lines, and over 60 lines from ``def`` to the end (docstring included);
- docstring share: lines inside module, class and function docstrings over all non-blank lines;
- ``model/`` lines: all lines of the files in ``model/``, and the largest module.
"""
from __future__ import annotations

import ast
import io
import statistics
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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
    model_lines, largest = 0, (0, "")
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
    lengths.sort()
    return {
        "functions": len(lengths),
        "median": statistics.median(lengths),
        "p90": lengths[int(0.9 * (len(lengths) - 1))],
        "over_60": sum(n > 60 for n in lengths),
        "over_60_span": sum(n > 60 for n in spans),
        "doc_share": docs / nonblank,
        "model_lines": model_lines,
        "largest": largest,
    }


def main(argv: list[str]) -> None:
    src = Path(argv[1]) if len(argv) > 1 else ROOT / "src" / "tokenflow"
    m = measure(src)
    rows = [
        ("functions (incl. methods)", f"{m['functions']}"),
        ("function length, code lines, median / p90", f"{m['median']:g} / {m['p90']}"),
        ("functions over 60 code lines", f"{m['over_60']}"),
        ("functions over 60 lines, docstring included", f"{m['over_60_span']}"),
        ("share of lines that are docstrings", f"{m['doc_share']:.0%}"),
        ("model/ lines", f"{m['model_lines']:,}"),
        ("largest module (lines)", f"{m['largest'][1]} ({m['largest'][0]})"),
    ]
    w = max(len(r[0]) for r in rows)
    print(f"{src}")
    for name, value in rows:
        print(f"  {name:<{w}}  {value}")


if __name__ == "__main__":
    main(sys.argv)
