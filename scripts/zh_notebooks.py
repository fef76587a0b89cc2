"""The Chinese notebooks, generated: ``notebooks/zh/NN_*.ipynb`` from ``notebooks/NN_*.ipynb``
and the chapter's catalog ``locale/zh_CN/LC_MESSAGES/notebooks/NN_*.po``, then run.

    python scripts/zh_notebooks.py build [NN_x ...]  # write and execute (make zh-notebooks)
    python scripts/zh_notebooks.py build --no-execute  # write only (outputs of the last run)
    python scripts/zh_notebooks.py check              # exit 1 if one is not current

One source of truth: the English notebook gives every cell, its code and its metadata; the
catalog (the same one the Chinese book uses) gives the prose. Each markdown message, as
Sphinx's gettext builder extracts it (a heading, a paragraph, a list item's paragraph, a table
cell, a dropdown's title and its paragraphs; lines joined by spaces), is replaced by its
translation; an untranslated or fuzzy message stays English, as in the book. Code is copied
as it is. Two additions:

* a first code cell, after the title, ``set_language("zh")`` (``tokenflow.viz.lang``), tagged
  ``remove-cell`` (the book does not show it): the conclusions, tables, explorers, figures
  and diagram the viz layer makes are then in Chinese; numbers and code are unchanged;
* the toggles of folded cells in Chinese (myst-nb's ``mystnb.code_prompt_show`` / ``_hide``);
* relative links out of ``notebooks/`` (``../book/references.md``) one folder deeper
  (``../../book/references.md``, :func:`rebase_links`), so that they resolve from
  ``notebooks/zh/`` in JupyterLab; links to the other chapters stay (each has its Chinese
  sibling). The Chinese book reads these notebooks as the pages ``notebooks/NN_*`` and moves
  the links back (scripts/tokenflow_i18n.py).

``build`` executes each written notebook in a fresh kernel as the English ones are run
(``ATEN_CPU_CAPABILITY=default OMP_NUM_THREADS=1 jupyter execute``, see the README) and strips
the run timestamps. ``check`` rebuilds the cells in memory and compares them with the stored
files (cell types, sources, tags): a changed English notebook or catalog makes it fail until
``make zh-notebooks`` runs; nbval (``make test``) checks the stored outputs.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
ZH = NOTEBOOKS / "zh"
LOCALE = ROOT / "locale" / "zh_CN" / "LC_MESSAGES" / "notebooks"
LANGUAGE_CELL = ('from tokenflow.viz import set_language\n'
                 'set_language("zh")   # 图表、表格和结论中的文字用中文')
LANGUAGE_CELL_ID = "zh-language"
# myst-nb's toggle labels of folded cells: (show, hide) per kind of fold.
PROMPTS = {
    "solution": ("显示答案：代码和输出", "隐藏答案"),
    "hide-cell": ("显示代码和输出", "隐藏代码和输出"),
    "hide-input": ("显示代码", "隐藏代码"),
    "hide-output": ("显示输出", "隐藏输出"),
}
EXTENSIONS = {"colon_fence", "deflist", "dollarmath", "linkify", "substitution"}   # _config.yml


def read_catalog(po: Path) -> dict[str, str]:
    """msgid -> msgstr of ``po`` without fuzzy or empty entries (``{}`` if there is none)."""
    if not po.is_file():
        return {}
    from babel.messages.pofile import read_po
    with po.open("rb") as f:
        return {m.id: m.string for m in read_po(f) if m.id and m.string and not m.fuzzy}


def _parser():
    from markdown_it.renderer import RendererHTML
    from myst_parser.config.main import MdParserConfig
    from myst_parser.parsers.mdit import create_md_parser
    return create_md_parser(MdParserConfig(enable_extensions=EXTENSIONS), RendererHTML)


def _message(text: str) -> str:
    """A message's key as the gettext builder writes it: lines joined by spaces."""
    return " ".join(text.split("\n")).strip()


def translate_markdown(source: str, catalog: dict[str, str], md=None) -> tuple[str, list[str]]:
    """``source`` with each message replaced by its translation; also the messages left
    English (no entry in ``catalog``)."""
    md = md or _parser()
    lines = source.split("\n")
    edits: list[tuple[int, int, list[str]]] = []
    missing: list[str] = []

    def tr(text: str) -> str | None:
        key = _message(text)
        if not key:
            return None
        if key not in catalog:
            missing.append(key)
            return None
        return catalog[key].replace("\n", " ")

    tokens = md.parse(source)
    i = 0
    while i < len(tokens):
        t = tokens[i]
        if t.type in ("heading_open", "paragraph_open") and t.map and \
                tokens[i + 1].type == "inline":
            a, b = t.map
            content = tokens[i + 1].content
            zh = tr(content)
            if zh is not None:
                first = content.split("\n")[0]
                at = lines[a].find(first)
                prefix = lines[a][:at] if at >= 0 else ""
                edits.append((a, b, [prefix + zh]))
        elif t.type == "tr_open" and t.map:
            cells, j = [], i + 1
            while tokens[j].type != "tr_close":
                if tokens[j].type == "inline":
                    cells.append(tokens[j].content)
                j += 1
            out = [tr(c) for c in cells]
            if any(z is not None for z in out):
                row = " | ".join(z if z is not None else c for z, c in zip(out, cells))
                edits.append((t.map[0], t.map[1], [f"| {row} |"]))
            i = j
        elif t.type == "colon_fence" and t.map:
            a, b = t.map
            name, _, arg = t.info.partition(" ")
            head = lines[a]
            if arg.strip():
                zh = tr(arg)
                if zh is not None:
                    head = head[: head.index(t.info)] + f"{name} {zh}"
            inner, more = translate_markdown(t.content.rstrip("\n"), catalog, md)
            missing += more
            closed = b - a >= 2 and lines[b - 1].strip().startswith(":::")
            edits.append((a, b, [head, *inner.split("\n"), *([lines[b - 1]] if closed else [])]))
        i += 1
    for a, b, new in sorted(edits, reverse=True):
        lines[a:b] = new
    return "\n".join(lines), missing


# a markdown link or image target: ](target) or ](target "title"); an HTML src= or href=
LINK = re.compile(r'(\]\(|(?:src|href)=")([^)"\s]+)')


def rebase_links(markdown: str, written_in: Path, moved_to: Path) -> str:
    """``markdown``, written in the folder ``written_in``, as it must read in ``moved_to``:
    each relative link whose target lies outside ``written_in`` is rewritten relative to
    ``moved_to``; links inside ``written_in`` (which moves along), absolute links, URLs and
    ``#anchors`` stay as they are."""
    inside = Path(os.path.abspath(written_in))

    def move(m: re.Match) -> str:
        target = m.group(2)
        if re.match(r"[a-zA-Z][\w+.-]*:|#|/", target):
            return m.group(0)
        path, hash_, anchor = target.partition("#")
        at = Path(os.path.normpath(inside / path))
        if at == inside or inside in at.parents:
            return m.group(0)
        new = Path(os.path.relpath(at, os.path.abspath(moved_to))).as_posix()
        return m.group(1) + new + hash_ + anchor

    return LINK.sub(move, markdown)


def _lines(text: str) -> list[str]:
    out = text.splitlines(keepends=True)
    return out


def zh_notebook(nb: dict, catalog: dict[str, str]) -> tuple[dict, list[str]]:
    """The Chinese notebook of the English notebook ``nb`` (a new dict), and the messages
    that stayed English."""
    nb = json.loads(json.dumps(nb))
    md, missing, cells = _parser(), [], []
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            text, more = translate_markdown("".join(cell["source"]), catalog, md)
            cell["source"] = _lines(rebase_links(text, NOTEBOOKS, ZH))
            missing += more
        elif cell["cell_type"] == "code":
            tags = cell.get("metadata", {}).get("tags", [])
            kind = next((k for k in PROMPTS if k in tags), None)
            if kind:
                show, hide = PROMPTS[kind]
                cell["metadata"].setdefault("mystnb", {}).update(code_prompt_show=show,
                                                                 code_prompt_hide=hide)
        cells.append(cell)
    language = {"cell_type": "code", "execution_count": None, "id": LANGUAGE_CELL_ID,
                "metadata": {"tags": ["remove-cell"]}, "outputs": [],
                "source": _lines(LANGUAGE_CELL)}
    cells.insert(1, language)
    nb["cells"] = cells
    nb["metadata"]["language_info"] = nb["metadata"].get("language_info", {})
    nb["metadata"]["tokenflow"] = {"lang": "zh_CN", "generated_from": "notebooks/ (English) + "
                                   "locale/zh_CN (catalogs) by scripts/zh_notebooks.py"}
    return nb, missing


def chapters(names: list[str] | None = None) -> list[Path]:
    """The English chapter notebooks (all, or those named ``NN_x``)."""
    paths = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    if names:
        paths = [p for p in paths if p.stem in names or p.stem[:2] in names]
    return paths


def generate(path: Path) -> tuple[dict, list[str]]:
    """The Chinese notebook of ``notebooks/<path>`` with the stored outputs of its last run
    (cells matched by id), and the messages left English."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    zh, missing = zh_notebook(nb, read_catalog(LOCALE / f"{path.stem}.po"))
    old = ZH / path.name
    if old.is_file():
        stored = {c.get("id"): c for c in json.loads(old.read_text(encoding="utf-8"))["cells"]}
        for cell in zh["cells"]:
            prev = stored.get(cell.get("id"))
            if cell["cell_type"] == "code" and prev and prev["source"] == cell["source"]:
                cell["outputs"] = prev.get("outputs", [])
                cell["execution_count"] = prev.get("execution_count")
    return zh, missing


def _key(nb: dict) -> list:
    return [(c["cell_type"], "".join(c["source"]), c.get("metadata", {}).get("tags", []),
             c.get("metadata", {}).get("mystnb")) for c in nb["cells"]]


CELL_TIMEOUT = 60   # s; no cell takes more than a few (README, "jupyter execute stops at a cell")


def execute(path: Path) -> float:
    """Run ``path`` in place in a fresh kernel, as the English notebooks are run; seconds.
    Each cell gets :data:`CELL_TIMEOUT`: after a cell that draws a live widget the executor
    can miss the kernel's reply and would wait until the time limit (nbclient issue 312)."""
    env = dict(os.environ, ATEN_CPU_CAPABILITY="default", OMP_NUM_THREADS="1")
    start = time.perf_counter()
    subprocess.run([str(Path(sys.executable).with_name("jupyter")), "execute",
                    f"--timeout={CELL_TIMEOUT}", "--inplace", str(path)],
                   check=True, env=env, cwd=ROOT, capture_output=True)
    sys.path.insert(0, str(ROOT / "scripts"))
    import strip_notebooks
    strip_notebooks.strip_file(path)
    return time.perf_counter() - start


def build(names: list[str] | None = None, run: bool = True) -> int:
    ZH.mkdir(exist_ok=True)
    for path in chapters(names):
        nb, missing = generate(path)
        target = ZH / path.name
        target.write_text(json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n",
                          encoding="utf-8")
        took = f", ran in {execute(target):.0f} s" if run else ""
        print(f"{target.relative_to(ROOT)}: {len(missing)} message(s) left English{took}")
    return 0


def check(names: list[str] | None = None) -> int:
    """0 when every notebooks/zh/ file matches its English notebook and catalog, else 1."""
    stale = []
    for path in chapters(names):
        target = ZH / path.name
        if not target.is_file():
            stale.append(f"{target.relative_to(ROOT)}: missing")
            continue
        want, _ = zh_notebook(json.loads(path.read_text(encoding="utf-8")),
                              read_catalog(LOCALE / f"{path.stem}.po"))
        if _key(want) != _key(json.loads(target.read_text(encoding="utf-8"))):
            stale.append(f"{target.relative_to(ROOT)}: differs from {path.relative_to(ROOT)} "
                         "+ its catalog")
    for line in stale:
        print(line)
    if stale:
        print("run `make zh-notebooks` (scripts/zh_notebooks.py build)")
    return 1 if stale else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["build", "check"])
    parser.add_argument("chapters", nargs="*", help="NN or NN_name (default: all)")
    parser.add_argument("--no-execute", action="store_true", help="build: do not run them")
    args = parser.parse_args(argv)
    if args.command == "check":
        return check(args.chapters)
    return build(args.chapters, run=not args.no_execute)


if __name__ == "__main__":
    sys.exit(main())
