"""The Chinese edition: the translation check catches stale catalogs, and the zh build works.

* scripts/i18n.py ``check`` on a temporary two-page copy of the book (never the real catalogs):
  a complete catalog passes in strict mode; one changed English sentence makes it fail, naming
  the page and both the new (missing) and the old (orphaned) message; ``update`` turns the
  change into a fuzzy entry, which fails too; report mode and locale/STRICT decide strictness.
* The real catalogs keep the markup of their English (roles, link targets, inline code).
* The Chinese edition builds strictly (-W -n) into a temporary folder: every page has
  ``lang="zh-CN"``, its own title and search text, a switch to the same English page, and the
  search index finds 首都 (jieba segments Chinese; without it Sphinx indexes no Chinese at all).
"""
from __future__ import annotations

import base64

import hashlib
import json
import re
import shutil
import sys
from pathlib import Path

import pytest
import yaml
from babel.messages.pofile import read_po, write_po

from helpers import load_script

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
PO_DIR = ROOT / "locale" / "zh_CN" / "LC_MESSAGES"


def _load(name: str):
    return load_script(name)


i18n = _load("i18n")
ext = _load("tokenflow_i18n")

MINI_TOC = """\
format: jb-book
root: book/intro
parts:
  - caption: Before you start
    chapters:
      - file: book/preface
"""


def _fill(po_file: Path, prefix: str = "【译】") -> None:
    """A stand-in 'translation' that keeps every message's markup: prefix + the English."""
    with po_file.open("rb") as f:
        catalog = read_po(f)
    for message in catalog:
        if message.id:
            message.string = prefix + message.id
            message.flags.discard("fuzzy")
    with po_file.open("wb") as f:
        write_po(f, catalog)


def _first_sentence(path: Path) -> str:
    """The first sentence of the first prose paragraph of a markdown page."""
    for para in path.read_text(encoding="utf-8").split("\n\n"):
        para = " ".join(para.split())
        if para and para[0].isalpha():
            return para.split(". ")[0]
    raise AssertionError(f"no prose paragraph in {path}")


def _sources_digest(root: Path) -> str:
    """A hash of what the gettext builder reads: every file under ``root`` but the catalogs
    (locale/), build outputs (_build/) and Python caches."""
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root)
        if rel.parts[0] in ("locale", "_build") or "__pycache__" in rel.parts:
            continue
        h.update(rel.as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


@pytest.fixture(scope="module", autouse=True)
def extract_once_per_sources(tmp_path_factory):
    """``i18n.extract`` (a Sphinx gettext build in a new process, seconds each) runs for real
    once per distinct source tree in this file; later calls on the same sources (``check``
    again after only locale/STRICT or the catalogs changed, ``update`` then ``check``) get a
    copy of the templates it wrote. The catalogs are not inputs of the extraction."""
    real, done = i18n.extract, {}
    store = tmp_path_factory.mktemp("pot")

    def extract(root: Path, out: Path) -> Path:
        key = _sources_digest(root)
        if key not in done:
            done[key] = real(root, store / key[:16])
        pot_dir = out / "_build" / "gettext"
        shutil.copytree(done[key], pot_dir, dirs_exist_ok=True)
        return pot_dir

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(i18n, "extract", extract)
        yield


@pytest.fixture(scope="module")
def mini_book(tmp_path_factory) -> Path:
    """A two-page copy of the book (intro + preface, real config and extensions) whose catalogs
    are complete."""
    root = tmp_path_factory.mktemp("mini") / "book-root"
    (root / "book").mkdir(parents=True)
    for page in ("intro.md", "preface.md"):
        shutil.copy(ROOT / "book" / page, root / "book" / page)
    shutil.copy(ROOT / "_config.yml", root / "_config.yml")
    shutil.copytree(SCRIPTS, root / "scripts", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "_toc.yml").write_text(MINI_TOC, encoding="utf-8")
    i18n.update(root)
    for po in (root / "locale").rglob("*.po"):
        _fill(po)
    return root


@pytest.fixture
def changed_book(mini_book, tmp_path) -> tuple[Path, str, str]:
    """A copy of mini_book whose preface has one English sentence changed."""
    root = tmp_path / "book-root"
    shutil.copytree(mini_book, root, ignore=shutil.ignore_patterns("_build", "*.mo"))
    page = root / "book" / "preface.md"
    old = _first_sentence(page)
    new = old + " This sentence is new"
    text = page.read_text(encoding="utf-8")
    first = old.split()[0]
    start = text.index(first)
    # the sentence may be wrapped over lines in the source: rewrite it on one line
    end = start
    for word in old.split():
        end = text.index(word, end) + len(word)
    page.write_text(text[:start] + new + text[end:], encoding="utf-8")
    return root, old, new


def test_complete_catalog_passes_strict(mini_book, capsys):
    assert i18n.check(mini_book, "1") == 0
    out = capsys.readouterr().out
    assert re.search(r"book/preface\s+\d+\s+\d+\s+100\.0%\s+0\s+strict", out), out
    assert "FAILED" not in out and "WARNING" not in out


def test_changed_sentence_fails_naming_page_and_message(changed_book, capsys):
    root, old, new = changed_book
    assert i18n.check(root, "1") == 1
    out = capsys.readouterr().out
    assert "FAILED" in out
    lines = [line for line in out.splitlines() if line.strip().startswith("book/preface:")]
    assert any("missing" in line and new[:60] in line for line in lines), out
    assert any("orphaned" in line and old[:60] in line for line in lines), out
    assert not any(line.strip().startswith("book/intro:") for line in out.splitlines())


def test_report_mode_and_strict_file(changed_book, capsys):
    root, _, _ = changed_book
    assert i18n.check(root, "0") == 0
    out = capsys.readouterr().out
    assert "WARNING" in out and "book/preface" in out
    (root / "locale" / "STRICT").write_text("book/intro  # done\n", encoding="utf-8")
    assert i18n.check(root, None) == 0              # the preface is not listed
    (root / "locale" / "STRICT").write_text("", encoding="utf-8")
    assert i18n.check(root, None) == 1              # empty STRICT: every page
    (root / "locale" / "STRICT").write_text("book/nope\n", encoding="utf-8")
    with pytest.raises(ValueError, match="book/nope"):
        i18n.check(root, None)


def test_update_marks_the_change_fuzzy_and_it_still_fails(changed_book, capsys):
    root, old, new = changed_book
    i18n.update(root)
    with (root / "locale" / "zh_CN" / "LC_MESSAGES" / "book" / "preface.po").open("rb") as f:
        entries = [m for m in read_po(f) if m.id and new in " ".join(m.id.split())]
    assert len(entries) == 1 and entries[0].fuzzy, (
        "sphinx-intl should carry the old translation as fuzzy"
    )
    assert entries[0].string.startswith("【译】")
    capsys.readouterr()
    assert i18n.check(root, "1") == 1
    assert any(
        line.strip().startswith("book/preface: fuzzy")
        for line in capsys.readouterr().out.splitlines()
    )


def test_markup_problems_flags_a_dropped_role_link_or_code():
    msgid = "See {term}`KV cache` in [the glossary](glossary.md) and `Trace()`."
    assert (
        i18n.markup_problems(
            msgid, "见 {term}`KV 缓存 <KV cache>`、[术语表](glossary.md) 与 `Trace()`。"
        )
        == []
    )
    assert any(
        "roles" in p
        for p in i18n.markup_problems(msgid, "见 KV 缓存、[术语表](glossary.md) 与 `Trace()`。")
    )
    assert any(
        "link" in p
        for p in i18n.markup_problems(msgid, "见 {term}`KV cache`、术语表与 `Trace()`。")
    )
    assert any(
        "code" in p
        for p in i18n.markup_problems(
            msgid, "见 {term}`KV cache`、[术语表](glossary.md) 与 Trace()。"
        )
    )
    assert any("numbered" in p for p in i18n.markup_problems("1. token id", "1. 词元 id"))
    assert i18n.markup_problems("1. token id", "1\\. 词元 id") == []


def test_real_catalogs_keep_their_markup():
    bad = []
    for po in sorted(PO_DIR.rglob("*.po")):
        with po.open("rb") as f:
            for m in read_po(f):
                if m.id and m.string and not m.fuzzy:
                    bad += [
                        f"{po.relative_to(PO_DIR)}: {p}: {m.id[:60]!r}"
                        for p in i18n.markup_problems(m.id, m.string)
                    ]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("page, here, there, expected", [
    ("book/intro", "", "zh", "../zh/book/intro.html"),
    ("notebooks/00_token_flow", "zh", "", "../../notebooks/00_token_flow.html"),
    ("search", "", "zh", "zh/search.html"),
    ("genindex", "zh", "", "../genindex.html"),
])
def test_edition_url_reaches_the_same_page(page, here, there, expected):
    url = ext.edition_url(page, here, there)
    assert url == expected
    site = Path("/site")
    source = site / here / f"{page}.html"
    assert (source.parent / url).resolve() == (site / there / f"{page}.html").resolve()


# --- the Chinese edition, built -------------------------------------------------------------
@pytest.fixture(scope="module")
def zh_html(zh_html_dir) -> Path:
    """The Chinese edition, built once per test run (conftest.py ``zh_html_dir``)."""
    return zh_html_dir


def _toc_pages() -> list[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    return [toc["root"]] + [c["file"] for part in toc["parts"] for c in part["chapters"]]


def _editions() -> dict:
    return yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))["sphinx"]["config"][
        "tokenflow_editions"
    ]


def test_every_zh_page_switches_to_the_same_english_page(zh_html):
    zh = _editions()["zh_CN"]
    for page in _toc_pages():
        text = (zh_html / f"{page}.html").read_text(encoding="utf-8")
        assert '<html lang="zh-CN"' in text, page
        assert "<title>" in text and zh["html_title"] in text, f"{page}: no Chinese html_title"
        assert f'placeholder="{zh["search_bar_text"]}"' in text, f"{page}: search placeholder"
        links = re.findall(r'<a href="([^"]+)" hreflang="en"[^>]*tokenflow-language-switch', text)
        assert links, f"{page}: no language switch"
        target = (zh_html / page).parent / links[0]
        # zh/ sits under the English site root: the link must land on <root>/<page>.html
        assert target.resolve() == (zh_html.parent / f"{page}.html").resolve(), (page, links[0])


def test_zh_edition_takes_its_footer_from_the_editions_config():
    """The licence footer is an edition config value (tokenflow_editions), not a message."""
    class Config:
        language = "zh_CN"
        tokenflow_editions = _editions()
        html_title = "tokenflow"
        html_theme_options = {"extra_footer": "<p>Text and figures</p>"}
        templates_path: list = []

    config = Config()
    ext._apply_edition_config(None, config)
    assert config.html_theme_options["extra_footer"] == _editions()["zh_CN"]["extra_footer"]
    assert "CC BY 4.0" in config.html_theme_options["extra_footer"]


def test_every_zh_page_names_the_licences_in_its_footer(zh_html):
    zh_footer = _editions()["zh_CN"]["extra_footer"]
    for page in _toc_pages():
        text = (zh_html / f"{page}.html").read_text(encoding="utf-8")
        footer = re.search(r'<div class="extra_footer">(.*?)</div>', text, re.S)
        assert footer, f"{page}: no licence footer"
        assert zh_footer in footer.group(1) and "Text and figures" not in footer.group(1), page


def test_zh_front_page_and_workshop_link_the_zh_book_pdf(zh_html):
    """scripts/book_pdf.py writes the Chinese book to zh/tokenflow.pdf: the same relative link
    as the English pages reaches it."""
    for name in ("book/intro", "book/workshop"):
        page = zh_html / f"{name}.html"
        hrefs = re.findall(r'<p class="tf-pdf"><a href="([^"]+)"', page.read_text(encoding="utf-8"))
        assert len(hrefs) == 1, f"{name}: {hrefs}"
        assert (page.parent / hrefs[0]).resolve() == (zh_html / "tokenflow.pdf").resolve()


def test_zh_search_index_finds_shoudu(zh_html):
    text = (zh_html / "searchindex.js").read_text(encoding="utf-8")
    index = json.loads(text[text.index("(") + 1: text.rindex(")")])
    assert "首都" in index["terms"], "no Chinese words in the search index: is jieba installed?"
    docs = index["terms"]["首都"]
    docs = docs if isinstance(docs, list) else [docs]
    assert "book/intro" in [index["docnames"][i] for i in docs]


def test_zh_toc_captions_follow_the_catalog(zh_html):
    with (PO_DIR / "book" / "intro.po").open("rb") as f:
        catalog = read_po(f)
    text = (zh_html / "book" / "preface.html").read_text(encoding="utf-8")
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    captions = [part["caption"] for part in toc["parts"] if "caption" in part]
    assert captions, "_toc.yml has no part captions to check"
    for caption in captions:
        part = {"caption": caption}
        entry = catalog.get(part["caption"])
        want = (
            entry.string
            if entry is not None and entry.string and not entry.fuzzy
            else part["caption"]
        )
        assert re.search(rf'class="caption-text">{re.escape(want)}<', text), (
            f"caption {part['caption']!r} -> {want!r}"
        )


def test_zh_pages_ship_their_web_font(zh_html):
    """Every zh page links the stylesheet that declares the shipped CJK web font, the font
    file and its licence are in the build, the stylesheet embeds exactly that font, and the font
    has a glyph for every CJK character of every page's text (a browser without a Chinese
    system font draws no boxes)."""
    from fontTools.ttLib import TTFont
    sys.path.insert(0, str(SCRIPTS))
    import tokenflow_i18n
    static = zh_html / "_static"
    woff2 = static / "fonts" / tokenflow_i18n.WEB_FONT.name
    assert woff2.is_file() and (static / "fonts" / "OFL.txt").is_file()
    assert woff2.read_bytes() == (ROOT / tokenflow_i18n.WEB_FONT).read_bytes()
    css = (static / tokenflow_i18n.WEB_FONT_CSS).read_text(encoding="utf-8")
    assert css == tokenflow_i18n.web_font_css()
    assert base64.b64encode(woff2.read_bytes()).decode() in css
    cmap = TTFont(str(woff2))["cmap"].getBestCmap()
    cjk = re.compile(r"[\u2e80-\u9fff\uf900-\ufaff\ufe30-\ufe4f\uff00-\uffef]")
    pages = sorted(p for p in zh_html.rglob("*.html") if "_static" not in p.parts)
    assert len(pages) >= len(_toc_pages())
    checked = 0
    for page in pages:
        text = page.read_text(encoding="utf-8")
        if '<link rel="stylesheet"' in text:          # not the root's redirect page
            href = re.search(r'<link rel="stylesheet"[^>]*href="([^"]*tokenflow-zh-font\.css)'
                             r'[^"]*"', text)
            assert href, f"{page.relative_to(zh_html)}: no tokenflow-zh-font.css"
            assert ((page.parent / href.group(1)).resolve()
                    == (static / tokenflow_i18n.WEB_FONT_CSS).resolve())
            checked += 1
        missing = sorted({c for c in cjk.findall(text) if ord(c) not in cmap})
        assert not missing, (f"{page.relative_to(zh_html)}: the web font lacks {''.join(missing)}: "
                             "rerun scripts/build_fonts.py")
    assert checked >= len(_toc_pages())


# ---- found by planting bugs (review of F12)
def test_compare_reports_an_obsolete_entry_as_orphaned(tmp_path):
    """A catalog whose only message is translated but which still carries one obsolete
    ``#~`` entry: 1/1 translated, and exactly one problem, the obsolete entry, named."""
    pot, po = tmp_path / "page.pot", tmp_path / "page.po"
    pot.write_text('msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=UTF-8\\n"\n\n'
                   'msgid "The capital"\nmsgstr ""\n', encoding="utf-8")
    po.write_text('msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=UTF-8\\n"\n\n'
                  'msgid "The capital"\nmsgstr "首都"\n\n'
                  '#~ msgid "An old sentence"\n#~ msgstr "旧句子"\n', encoding="utf-8")
    report = i18n.compare(pot, po, "page")
    assert (report.total, report.translated) == (1, 1)
    assert len(report.problems) == 1
    assert "orphaned" in report.problems[0] and "An old sentence" in report.problems[0]


def test_term_problems_refuse_each_forbidden_variant():
    """Issue 26 item 20: each word choice the Chinese edition refuses is flagged, naming what to
    write instead; the preferred forms pass."""
    bad = {
        "**蓝色**是隐藏状态主流": "主数据流",
        "我们加载共享模型": "全书共用的小模型",
        "比 H100 能做到的少约三百倍": "fraction",
        "慢 3.2 倍": "fraction",
        "把整条流水线跑一遍": "整条路径",
        "一次前向计算": "前向传播",
        "**执行器**（runner）": "运行器",
        "确定性设置（单线程）": "可复现",
        "每步的提示词元": "提示词词元",
        "这就是**解码**：注意力": "解码阶段",
        "（`decode` 不会打印它）": "分词器的",
        "再加上 logit 透镜。": "logit lens",
        "透镜只读到“首”本身的嵌入": "logit lens",
    }
    for zh, hint in bad.items():
        problems = i18n.term_problems("any", zh)
        assert problems and hint in problems[0], (zh, problems)
    good = [
        "**蓝色**是隐藏状态主数据流",
        "全书共用的小模型",
        "约为 H100 能力的三百分之一",
        "约 1/3.2",
        "把整条路径跑一遍",
        "一次前向传播",
        "**运行器**（runner）",
        "可复现的设置",
        "提示词词元",
        "这就是**解码阶段**：",
        "（分词器的 `decode` 不会打印它）",
        "服务流水线",
        "快好几倍",
        "再加上 logit lens（logit 透镜）。",
        "（即 **logit lens**，logit 透镜）",
        "logit lens 只读到“首”本身的嵌入",
    ]
    for zh in good:
        assert i18n.term_problems("any", zh) == [], zh
    assert i18n.term_problems("Solution", "答案") and not i18n.term_problems("Solution", "解答")


def test_real_catalogs_use_the_agreed_terms():
    bad = []
    for po in sorted(PO_DIR.rglob("*.po")):
        with po.open("rb") as f:
            for m in read_po(f):
                if m.id and m.string and not m.fuzzy:
                    bad += [f"{po.relative_to(PO_DIR)}: {p}: {m.id[:60]!r}"
                            for p in i18n.term_problems(m.id, m.string)]
    assert not bad, "\n".join(bad)


def test_zh_prose_names_the_arrow_words_the_zh_diagram_shows():
    """Where the English prose names an arrow action of the diagram (outside code), the
    Chinese names it as the Chinese diagram labels it (查表, 读取 KV, ...), so the reader finds
    the word on the figure."""
    from tokenflow.viz import lang
    from tokenflow.viz.diagram import load_diagram
    actions = sorted(set(load_diagram().arrow_actions()))
    lang.set_language("zh")
    try:
        zh = {a: lang.tr(a) for a in actions}
    finally:
        lang.set_language("en")
    assert zh["read KV"] != "read KV" and zh["lookup"] != "lookup"
    bad = []
    for po in sorted(PO_DIR.rglob("*.po")):
        with po.open("rb") as f:
            for m in read_po(f):
                if not (m.id and m.string) or m.fuzzy:
                    continue
                msgid = re.sub(r"`[^`]*`", "", m.id if isinstance(m.id, str) else m.id[0])
                string = m.string if isinstance(m.string, str) else m.string[0]
                for a in actions:
                    if re.search(rf"(?<![\w-]){re.escape(a)}(?![\w-])", msgid) and \
                            zh[a] not in string:
                        bad.append(f"{po.relative_to(PO_DIR)}: {a!r} -> {zh[a]!r} missing in "
                                   f"{string[:70]!r}")
    assert not bad, "\n".join(bad)
