"""The Chinese edition (中文版): extract the messages, update the catalogs, build, check.

One set of sources, two editions. Sphinx's gettext builder extracts every translatable message
of the markdown (book/*.md and the notebooks' markdown cells; code cells and outputs are not
messages) into one template per page; ``sphinx-intl`` merges them into the catalogs
``locale/zh_CN/LC_MESSAGES/<page>.po``; the Chinese edition is the same build with
``language=zh_CN``. Run from the repository root with the project's Python:

    python scripts/i18n.py update    # after changing English prose: re-extract, merge catalogs
    python scripts/i18n.py check     # fuzzy / untranslated / orphaned entries, % per page
    python scripts/i18n.py build     # the Chinese edition -> _build/html/zh/ (strict, -W -n)

``check`` is strict (exit 1 on any gap, naming the page and the message) when the environment
variable I18N_STRICT is 1, in report mode (prints, exits 0) when it is 0, and otherwise strict
exactly when the file locale/STRICT exists: empty, it covers every page; else it lists the pages
(one docname a line, e.g. ``book/preface``; ``#`` starts a comment) that must stay complete.
See locale/TRANSLATING.md. Exit codes: 0 pass (or report mode), 1 gaps in strict mode,
2 the extraction or build itself failed.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from babel.messages.pofile import read_po

ROOT = Path(__file__).resolve().parents[1]
LANG = "zh_CN"
EDITION_PATH = "zh"          # under _build/html/, as tokenflow_editions in _config.yml says
REPORT_DETAILS = 5           # problems shown per page in report mode (all in strict mode)
# Markup a translation must keep: MyST roles, link targets, inline code.
ROLE = re.compile(r"\{([a-z][\w:-]*)\}`[^`]*`")
LINK_TARGET = re.compile(r"\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`]+)`")
NUMBERED = re.compile(r"\d+[.)]\s")


def _bin(name: str) -> str:
    """A console script of this Python's environment (jupyter-book, sphinx-intl)."""
    exe = Path(sys.executable).with_name(name)
    return str(exe) if exe.exists() else (shutil.which(name) or name)


def extract(root: Path, out: Path) -> Path:
    """Run the gettext builder on the book at ``root``; return the folder of the .pot files
    (one per page, ``<docname>.pot``). The output path is its own: the gettext builder cannot
    share the HTML build's doctrees. Raises RuntimeError with the build log if it fails."""
    cmd = [_bin("jupyter-book"), "build", "--builder", "custom", "--custom-builder", "gettext",
           "--path-output", str(out), str(root)]
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    pot_dir = out / "_build" / "gettext"
    if proc.returncode != 0 or not pot_dir.is_dir():
        raise RuntimeError(
            f"{' '.join(cmd)} failed ({proc.returncode})\n{proc.stdout[-4000:]}\n"
            f"{proc.stderr[-4000:]}"
        )
    return pot_dir


def update(root: Path = ROOT) -> None:
    """Re-extract the messages and merge them into locale/zh_CN with sphinx-intl: new entries
    empty, changed ones fuzzy (carrying the old translation), removed ones dropped."""
    pot_dir = extract(root, root / "_build" / "i18n")
    # -j 1: sphinx-intl's worker pool races creating the catalog folders.
    subprocess.run([_bin("sphinx-intl"), "update", "-p", str(pot_dir), "-d", str(root / "locale"),
                    "-l", LANG, "-j", "1", "--no-obsolete"], cwd=root, check=True)


# --- check -------------------------------------------------------------------------------------
@dataclass
class PageReport:
    """The state of one page's catalog against the freshly extracted messages."""

    page: str
    total: int = 0
    translated: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def percent(self) -> float:
        return 100.0 * self.translated / self.total if self.total else 100.0


def _short(text: str, width: int = 90) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def markup_problems(msgid: str, msgstr: str) -> list[str]:
    """What markup of ``msgid`` the translation ``msgstr`` lost or changed: MyST roles
    (``{term}`...```), link targets ``](...)`` and inline code spans must all be kept."""
    out = []
    for name, pattern in (("roles", ROLE), ("link targets", LINK_TARGET), ("inline code", CODE)):
        want, got = sorted(pattern.findall(msgid)), sorted(pattern.findall(msgstr))
        if name == "roles":   # role contents may be translated; code spans are what is left
            msgid, msgstr = ROLE.sub("", msgid), ROLE.sub("", msgstr)
        if want != got:
            out.append(f"{name} differ: English {want}, 中文 {got}")
    if NUMBERED.match(msgstr):
        # parsed alone, "1. text" is a list, not the paragraph/title it replaces: Sphinx then
        # silently keeps the English
        out.append(r"starts like a numbered list: write `1\. ...`")
    return out


# Word choices the Chinese edition refuses (locale/TRANSLATING.md): (forbidden pattern, what to
# write instead, why). A translated entry that matches fails `check` in every mode.
FORBIDDEN_TERMS = (
    (r"主流", "主数据流", "'main flow': 主流 reads as 'mainstream'"),
    (r"共享模型", "全书共用的小模型", "'the shared model' is the one small model every chapter "
     "uses, not a model with shared weights"),
    (r"(少|慢|小|低|短|缩小|减少|降低)约?\s*[\d.,一二两三四五六七八九十百千万]+\s*倍|倍(少|慢|小|低|短)",
     "a fraction (约三百分之一, 约 1/3.2)", "'N 倍少/慢' is ambiguous in Chinese"),
    (r"整条流水线|这条流水线及其箭头", "整条路径", "流水线 is the serving pipeline only, not the "
     "whole line"),
    (r"前向计算", "前向传播", "one term for 'forward pass'"),
    (r"执行器", "运行器", "one term for the engine's 'runner'"),
    (r"(?<!（logit )(?<!，logit )透镜", "logit lens", "one term for 'logit lens': glossed "
     "logit lens（logit 透镜） at first use, then logit lens"),
    (r"确定性(的)?设置", "可复现的设置", "one term for 'deterministic'"),
    (r"提示词元", "提示词词元", "one term for 'prompt token'"),
    (r"这就是\*\*解码\*\*", "这就是**解码阶段**", "label the decode phase where the "
     "tokenizer's decode() is near"),
    (r"(?<!分词器的 )`decode` 不会", "分词器的 `decode`", "say that `decode` is the tokenizer's, "
     "not the decode phase"),
)
EXACT_TERMS = {"Solution": "解答"}
"""Messages with one fixed translation (the exercises' solution heading)."""


def term_problems(msgid: str, msgstr: str) -> list[str]:
    """Forbidden word choices in the translation ``msgstr`` of ``msgid``
    (:data:`FORBIDDEN_TERMS`, :data:`EXACT_TERMS`), each naming what to write instead."""
    out = []
    if msgid in EXACT_TERMS and msgstr != EXACT_TERMS[msgid]:
        out.append(f"{msgid!r} is always {EXACT_TERMS[msgid]!r}, got {msgstr!r}")
    for pattern, instead, why in FORBIDDEN_TERMS:
        m = re.search(pattern, msgstr)
        if m:
            out.append(f"{m.group(0)!r}: write {instead} ({why})")
    return out


def _key(message) -> tuple:
    return (message.id, message.context)


def compare(pot_file: Path, po_file: Path, page: str) -> PageReport:
    """Compare one page's template with its catalog: missing, untranslated, fuzzy, orphaned
    (in the catalog but no longer in the English, incl. obsolete ``#~`` entries), markup."""
    with pot_file.open("rb") as f:
        template = read_po(f)
    report = PageReport(page)
    if not po_file.is_file():
        report.total = sum(1 for m in template if m.id)
        report.problems.append(f"no catalog {po_file.relative_to(po_file.parents[3])} "
                               f"({report.total} messages): run `make i18n-update`")
        return report
    with po_file.open("rb") as f:
        catalog = read_po(f)
    for message in template:
        if not message.id:
            continue
        report.total += 1
        entry = catalog.get(message.id, message.context)
        if entry is None:
            report.problems.append(
                f"missing (not in the catalog, run `make i18n-update`): {_short(message.id)!r}"
            )
        elif entry.fuzzy:
            report.problems.append(
                f"fuzzy (English changed, check the translation): {_short(message.id)!r}"
            )
        elif not entry.string:
            report.problems.append(f"untranslated: {_short(message.id)!r}")
        else:
            bad = markup_problems(message.id, entry.string)
            report.problems += [f"markup ({b}): {_short(message.id)!r}" for b in bad]
            terms = term_problems(message.id, entry.string)
            report.problems += [f"term ({t}): {_short(message.id)!r}" for t in terms]
            report.translated += not bad and not terms
    wanted = {_key(m) for m in template if m.id}
    for entry in catalog:
        if entry.id and _key(entry) not in wanted:
            report.problems.append(f"orphaned (no longer in the English): {_short(entry.id)!r}")
    for entry in catalog.obsolete.values():
        report.problems.append(f"orphaned (obsolete #~ entry, delete it): {_short(entry.id)!r}")
    return report


def check_catalogs(pot_dir: Path, locale_dir: Path) -> list[PageReport]:
    """One PageReport per page (docname order), plus one per catalog whose page is gone."""
    po_dir = locale_dir / LANG / "LC_MESSAGES"
    reports = []
    pages = sorted(
        p.relative_to(pot_dir).with_suffix("").as_posix() for p in pot_dir.rglob("*.pot")
    )
    for page in pages:
        reports.append(compare(pot_dir / f"{page}.pot", po_dir / f"{page}.po", page))
    known = set(pages)
    for po in sorted(po_dir.rglob("*.po")) if po_dir.is_dir() else []:
        page = po.relative_to(po_dir).with_suffix("").as_posix()
        if page not in known:
            reports.append(
                PageReport(
                    page, problems=[f"orphaned catalog {po.name}: the page is gone, delete it"]
                )
            )
    return reports


def strict_pages(locale_dir: Path, pages: list[str], env: str | None) -> set[str]:
    """The pages whose gaps fail the check (see the module docstring for the rules)."""
    value = (env or "").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return set(pages)
    if value in ("0", "false", "no", "off"):
        return set()
    if value:
        raise ValueError(f"I18N_STRICT must be 1 or 0 (or unset), got {env!r}")
    marker = locale_dir / "STRICT"
    if not marker.is_file():
        return set()
    listed = {
        line.split("#")[0].strip() for line in marker.read_text(encoding="utf-8").splitlines()
    }
    listed.discard("")
    unknown = listed - set(pages)
    if unknown:
        raise ValueError(f"{marker} lists pages that do not exist: {sorted(unknown)}")
    return listed or set(pages)


ORDER = ("fuzzy", "markup", "term", "orphaned", "missing", "no catalog", "untranslated")


def _rank(problem: str) -> int:
    """Stale translations first (fuzzy, broken markup, orphaned), then plain gaps."""
    return next((i for i, word in enumerate(ORDER) if problem.startswith(word)), len(ORDER))


def print_report(reports: list[PageReport], strict: set[str]) -> int:
    """Print the table and the problems; return the number of messages missing in strict pages."""
    width = max(len(r.page) for r in reports) if reports else 10
    print(f"{'page':<{width}}  messages  translated       gaps  mode")
    for r in reports:
        mode = "strict" if r.page in strict else "report"
        print(
            f"{r.page:<{width}}  {r.total:8d}  {r.translated:5d} {r.percent:5.1f}%  "
            f"{len(r.problems):5d}  {mode}"
        )
    total = sum(r.total for r in reports)
    done = sum(r.translated for r in reports)
    print(f"{'all pages':<{width}}  {total:8d}  {done:5d} {100.0 * done / max(total, 1):5.1f}%")
    failing = 0
    for r in reports:
        if not r.problems:
            continue
        r.problems.sort(key=_rank)
        shown = r.problems if r.page in strict else r.problems[:REPORT_DETAILS]
        print(f"\n{r.page} ({LANG}): {len(r.problems)} gap(s)")
        for problem in shown:
            print(f"  {r.page}: {problem}")
        if len(shown) < len(r.problems):
            print(f"  ... {len(r.problems) - len(shown)} more (I18N_STRICT=1 lists them all)")
        failing += len(r.problems) if r.page in strict else 0
    return failing


def check(root: Path = ROOT, env: str | None = None) -> int:
    """Re-extract the messages of the book at ``root`` and compare them with its catalogs;
    return the exit code (0 pass or report mode, 1 gaps in strict pages)."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tokenflow-i18n-") as tmp:
        pot_dir = extract(root, Path(tmp))
        reports = check_catalogs(pot_dir, root / "locale")
    strict = strict_pages(root / "locale", [r.page for r in reports], env)
    failing = print_report(reports, strict)
    terms = sum(p.startswith("term") for r in reports for p in r.problems)
    gaps = sum(len(r.problems) for r in reports)
    print(f"\ni18n check ({time.perf_counter() - start:.1f} s): {gaps} gap(s) in {LANG}, "
          f"{len(strict)} of {len(reports)} page(s) strict")
    if terms:
        print(f"FAILED: {terms} forbidden word choice(s) in the Chinese catalogs (the `term` lines "
              "above; FORBIDDEN_TERMS in scripts/i18n.py), in any mode.")
        return 1
    if failing:
        print(
            f"FAILED: {failing} gap(s) in strict pages (above). After changing English prose: "
            "`make i18n-update`, translate the new/fuzzy entries in locale/zh_CN/, "
            "rerun `make i18n-check`."
        )
        return 1
    if gaps:
        print(
            f"WARNING: the Chinese edition is incomplete ({gaps} gap(s)); not failing because the "
            "pages are in report mode (I18N_STRICT=1 or locale/STRICT makes them fail)."
        )
    elif not strict:
        print("All catalogs complete: `touch locale/STRICT` to make every future gap fail.")
    return 0


# --- build -------------------------------------------------------------------------------------
def build(root: Path = ROOT, dest: Path | None = None, staging: Path | None = None) -> int:
    """Build the Chinese edition strictly (-W -n --keep-going) into ``staging`` (its own
    doctrees), then copy the HTML to ``dest`` (default _build/html/zh/). Built elsewhere and
    copied because building straight into a subfolder of the English site lets myst-nb write
    into the English tree. Returns the Sphinx status code."""
    from jupyter_book.sphinx import build_sphinx

    dest = dest or root / "_build" / "html" / EDITION_PATH
    staging = staging or root / "_build" / "i18n" / LANG
    html = staging / "_build" / "html"
    overrides = {
        "external_toc_path": (root / "_toc.yml").as_posix(),
        "latex_individualpages": False,
        "nitpicky": True,
        "language": LANG,
    }
    start = time.perf_counter()
    status = build_sphinx(
        root,
        html,
        noconfig=True,
        path_config=str(root / "_config.yml"),
        confoverrides=overrides,
        builder="html",
        warningiserror=True,
        keep_going=True,
    )
    if status != 0:
        print(f"the {LANG} edition failed to build ({status})", file=sys.stderr)
        return status if isinstance(status, int) else 2
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(html, dest)
    print(f"{LANG} edition built in {time.perf_counter() - start:.1f} s: {dest / 'index.html'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["update", "check", "build"])
    parser.add_argument(
        "--root", type=Path, default=ROOT, help="the book's root (default: this repository)"
    )
    parser.add_argument(
        "--dest", type=Path, help="build: where the HTML goes (default ROOT/_build/html/zh)"
    )
    parser.add_argument(
        "--staging", type=Path, help="build: where Sphinx builds (default ROOT/_build/i18n/zh_CN)"
    )
    args = parser.parse_args(argv)
    root = args.root.resolve()
    try:
        if args.command == "update":
            update(root)
            return 0
        if args.command == "check":
            return check(root, os.environ.get("I18N_STRICT"))
        return build(root, args.dest, args.staging)
    except (RuntimeError, ValueError, subprocess.CalledProcessError) as exc:
        print(f"i18n {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
