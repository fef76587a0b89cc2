"""The Chinese notebooks (notebooks/zh/, scripts/zh_notebooks.py) and the viz layer's language
(tokenflow.viz.lang): generated from the English notebooks and the catalogs, current, the same
code, the prose and the viz words in Chinese; a changed catalog makes the check fail."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from helpers import load_script

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
CJK = re.compile(r"[\u4e00-\u9fff]")


def _script(name: str):
    return load_script(name)


zh_notebooks = _script("zh_notebooks")
participant_notebooks = _script("participant_notebooks")


@pytest.fixture
def zh():
    """tokenflow.viz in Chinese for one test, English again after it."""
    from tokenflow.viz import lang
    lang.set_language("zh")
    yield lang
    lang.set_language("en")


def test_zh_notebooks_are_current():
    """Every chapter has its Chinese notebook, and each matches what the English notebook and
    its catalog give now (`make zh-notebooks` after changing either)."""
    assert zh_notebooks.check() == 0


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_zh_notebook_keeps_the_code_and_translates_the_prose(path):
    """Same code cells in the same order (plus the language cell after the title), every
    markdown cell of the English that has letters has Chinese, every code cell executed."""
    en = json.loads(path.read_text(encoding="utf-8"))["cells"]
    zh = json.loads((zh_notebooks.ZH / path.name).read_text(encoding="utf-8"))["cells"]
    assert zh[1]["id"] == zh_notebooks.LANGUAGE_CELL_ID
    assert "remove-cell" in zh[1]["metadata"]["tags"]
    del zh[1]
    assert [c["cell_type"] for c in en] == [c["cell_type"] for c in zh]
    for e, z in zip(en, zh):
        if e["cell_type"] == "code":
            assert e["source"] == z["source"]
            assert z["execution_count"] is not None, "run `make zh-notebooks`"
        elif re.search(r"[A-Za-z]{4}", "".join(e["source"])) and not \
                "".join(e["source"]).lstrip().startswith(("$$", "```")):
            assert CJK.search("".join(z["source"])), "".join(z["source"])[:200]


def test_a_changed_catalog_makes_the_check_fail(tmp_path, monkeypatch):
    """Change one translation of chapter 00 (in a copy of the catalogs): the stored Chinese
    notebook no longer matches, so ``check`` exits 1; an untranslated message stays English."""
    from babel.messages.pofile import read_po, write_po
    locale = tmp_path / "notebooks"
    locale.mkdir()
    src = zh_notebooks.LOCALE / "00_token_flow.po"
    with src.open("rb") as f:
        cat = read_po(f)
    msg = next(m for m in cat if m.id == "Chapter 0: the whole line, once")
    msg.string = "第 0 章：整条路径"
    with (locale / src.name).open("wb") as f:
        write_po(f, cat)
    monkeypatch.setattr(zh_notebooks, "LOCALE", locale)
    assert zh_notebooks.check(["00"]) == 1
    text, missing = zh_notebooks.translate_markdown("# Not in any catalog\n\nNor this.",
                                                    {"Nor this.": "这句也不在。"})
    assert text == "# Not in any catalog\n\n这句也不在。" and missing == ["Not in any catalog"]


def test_translate_markdown_keeps_the_markup():
    """Headings keep their level, list items their marker, table rows their pipes, a
    dropdown its fence, code blocks and maths stay; every message found by its key."""
    src = ("## 8. A heading\n\nOne para\nover two lines.\n\n- an item\n\n| a | b |\n|---|---|\n"
           "| x | `y` |\n\n$$x = 1$$\n\n:::{dropdown} Solution\nInside.\n:::\n\n```python\n"
           "Inside.\n```")
    cat = {"8. A heading": "8\\. 标题", "One para over two lines.": "一段。", "an item": "一项",
           "a": "甲", "b": "乙", "x": "丙", "Solution": "答案", "Inside.": "里面。"}
    text, missing = zh_notebooks.translate_markdown(src, cat)
    assert text == ("## 8\\. 标题\n\n一段。\n\n- 一项\n\n| 甲 | 乙 |\n|---|---|\n| 丙 | `y` |\n\n"
                    "$$x = 1$$\n\n:::{dropdown} 答案\n里面。\n:::\n\n```python\nInside.\n```")
    assert missing == ["`y`"]


def test_tr_whole_strings_and_templates(zh):
    """A whole string, a template with its pieces reordered, and what has no entry."""
    assert zh.tr("what it does") == "作用"
    assert zh.tr("layer 3") == "第 3 层"
    assert zh.tr("no such words") == "no such words" and zh.tr(3) == 3
    zh.set_language("en")
    assert zh.tr("what it does") == "what it does"
    with pytest.raises(ValueError, match="lang must be one of"):
        zh.set_language("fr")


def test_say_table_explorer_and_figure_in_chinese(zh, capsys):
    """The viz layer's words in Chinese: a conclusion, a table's header, an explorer's note and
    a matplotlib title (looked up as it is drawn); numbers unchanged."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tokenflow.viz import Table, precomputed_explorer, say
    say("3. MHA would cost 2x that for the same model.")
    assert capsys.readouterr().out == "3. 同一个模型若用 MHA，代价是它的 2 倍。\n"
    assert "<th" in Table([[1, "x"]], ["step", "what it does"])._repr_html_()
    assert Table([[1, "x"]], ["step", "what it does"]).headers == ["步骤", "作用"]
    html = precomputed_explorer(lambda n: str(n), {"n": [1, 2]})._repr_html_()
    assert "运行笔记本时已预先算好" in html and "Precomputed" not in html
    fig, ax = plt.subplots()
    ax.set_title("probability")
    fig.canvas.draw()
    assert ax.get_title() == "概率"
    plt.close(fig)


def test_the_catalog_templates_name_their_pieces():
    """Each template's translation uses {0}..{n-1}, exactly the pieces its English has."""
    from tokenflow.viz.lang import CATALOG
    for en, zh in json.loads(CATALOG.read_text(encoding="utf-8"))["messages"].items():
        n = en.count("{}")
        assert sorted(set(map(int, re.findall(r"\{(\d+)\}", zh)))) == list(range(n)), en


def test_zh_participant_notebooks(tmp_path):
    """`make participant LANG=zh`: the Chinese copies, their exercise text saying what they
    hold, in Chinese; an unknown language is refused."""
    written = participant_notebooks.write_all(tmp_path, lang="zh")
    assert len(written) == len(CHAPTERS)
    for path in written:
        text = json.dumps(json.loads(path.read_text(encoding="utf-8")), ensure_ascii=False)
        assert "学员版" in text and "隐藏的单元格" not in text, path.name
        assert "`# your answer` 单元格里" in text, path.name
    with pytest.raises(ValueError, match="lang must be one of"):
        participant_notebooks.participant({"cells": []}, lang="fr")


def _relative_links(nb: dict) -> list[str]:
    """The relative link targets (no URL, no #anchor, no absolute path) of ``nb``'s markdown,
    without their #anchor."""
    out = []
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            for _, target in zh_notebooks.LINK.findall("".join(cell["source"])):
                if not re.match(r"[a-zA-Z][\w+.-]*:|#|/", target):
                    out.append(target.partition("#")[0])
    return out


def _unresolved(nb: dict, folder: Path) -> list[str]:
    return [t for t in _relative_links(nb) if not (folder / t).exists()]


def test_every_relative_link_resolves_in_the_english_and_generated_chinese_notebooks():
    """From notebooks/ (English) and from notebooks/zh/ (the Chinese notebooks as `make
    zh-notebooks` writes them now), every relative link reaches a file: the book's pages one
    folder further up from zh/, the other chapters beside them."""
    n = 0
    for path in CHAPTERS:
        en = json.loads(path.read_text(encoding="utf-8"))
        zh, _ = zh_notebooks.generate(path)
        assert _unresolved(en, path.parent) == [], path.name
        assert _unresolved(zh, zh_notebooks.ZH) == [], path.name
        chapters = [t for t in _relative_links(zh) if t.endswith(".ipynb")]
        assert all((zh_notebooks.ZH / t).resolve().parent == zh_notebooks.ZH.resolve()
                   for t in chapters), chapters   # the Chinese chapters, not the English
        assert len(_relative_links(zh)) == len(_relative_links(en)), path.name
        n += len(_relative_links(zh))
    assert n >= 20   # the chapters link the references, glossary, benchmarks and each other


def test_every_relative_link_resolves_in_the_stored_chinese_notebooks():
    """The stored notebooks/zh/ files (fails until `make zh-notebooks` after a link change)."""
    for path in sorted(zh_notebooks.ZH.glob("[0-9][0-9]_*.ipynb")):
        nb = json.loads(path.read_text(encoding="utf-8"))
        assert _unresolved(nb, path.parent) == [], path.name


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_every_relative_link_resolves_in_the_participant_notebooks(tmp_path, lang):
    """`make participant` (both languages), written anywhere: its links still reach the book
    and the other chapters. The Chinese ones are made from the in-memory Chinese notebooks, so
    this does not depend on notebooks/zh/ being current."""
    dest = tmp_path / "deep" / "participant"
    if lang == "zh":
        (tmp_path / "zh").mkdir()
        sources = []
        for path in CHAPTERS:
            target = tmp_path / "zh" / path.name
            target.write_text(json.dumps(zh_notebooks.zh_notebook(
                json.loads(path.read_text(encoding="utf-8")),
                zh_notebooks.read_catalog(zh_notebooks.LOCALE / f"{path.stem}.po"))[0]))
            sources.append(target)
        # as if notebooks/zh/: the links were written for that folder
        for path in sources:
            nb = json.loads(path.read_text())
            for cell in nb["cells"]:
                if cell["cell_type"] == "markdown":
                    cell["source"] = zh_notebooks.rebase_links(
                        "".join(cell["source"]), zh_notebooks.ZH, path.parent)
            path.write_text(json.dumps(nb))
    else:
        sources = CHAPTERS
    written = participant_notebooks.write_all(dest, notebooks=sources, lang=lang)
    links = 0
    for path in written:
        nb = json.loads(path.read_text(encoding="utf-8"))
        assert _unresolved(nb, dest) == [], path.name
        links += len(_relative_links(nb))
    assert links >= 20


def test_rebase_links_moves_only_links_out_of_the_folder(tmp_path):
    """Out-of-folder targets move, with their #anchor; in-folder targets, URLs, anchors and
    absolute paths stay; the Chinese book moves them back to the page's folder."""
    nbs, zh = tmp_path / "notebooks", tmp_path / "notebooks" / "zh"
    text = ('[a](../book/references.md#kv) [b](02_x.ipynb) [c](https://x.org/a.md) '
            '[d](#top) ![e](../_static/f.png "t") <img src="../img/g.png"> [h](./sub/i.md)')
    moved = zh_notebooks.rebase_links(text, nbs, zh)
    assert moved == ('[a](../../book/references.md#kv) [b](02_x.ipynb) [c](https://x.org/a.md) '
                     '[d](#top) ![e](../../_static/f.png "t") <img src="../../img/g.png"> '
                     '[h](./sub/i.md)')
    assert zh_notebooks.rebase_links(moved, zh, nbs) == text
    assert zh_notebooks.rebase_links("[here](./) [up](../)", nbs, zh) == \
        "[here](./) [up](../..)"
    i18n = _script("tokenflow_i18n")
    zh.mkdir(parents=True)
    for name in ("book/references.md", "_static/f.png", "img/g.png"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    page = {"cells": [{"cell_type": "markdown", "source": [moved]},
                      {"cell_type": "code", "source": ["x = '](../../keep)'"]}]}
    back = json.loads(i18n._links_from_notebooks(json.dumps(page), zh, nbs))
    assert back["cells"][0]["source"].startswith("[a](../book/references.md#kv) [b](02_x.ipynb)")
    assert back["cells"][1]["source"] == ["x = '](../../keep)'"]
    stale = {"cells": [{"cell_type": "markdown", "source": ["[a](../book/references.md)"]}]}
    assert json.loads(i18n._links_from_notebooks(json.dumps(stale), zh, nbs))["cells"][0][
        "source"] == "[a](../book/references.md)"     # written before the move: it stays
    # as the zh_CN build reads the page notebooks/02_x from notebooks/zh/02_x.ipynb
    zh.mkdir(parents=True, exist_ok=True)
    (zh / "02_x.ipynb").write_text(json.dumps(page), encoding="utf-8")
    from types import SimpleNamespace
    app = SimpleNamespace(srcdir=str(tmp_path),
                          env=SimpleNamespace(note_dependency=lambda path: None),
                          config=SimpleNamespace(language="zh_CN",
                                                 tokenflow_editions=i18n.DEFAULT_EDITIONS))
    source = ["English"]
    i18n._chinese_notebook(app, "notebooks/02_x", source)
    assert json.loads(source[0])["cells"][0]["source"] == back["cells"][0]["source"]


def test_tr_gives_its_own_translation_back_unchanged(zh):
    """Every entry, filled in, translates once: its translation looked up again (matplotlib
    draws a text more than once, and a printed sentence is looked up by say() after the
    function wrote it) stays as it is, with no doubled measure word ("888 个个 logits")."""
    from helpers import doubled_measure_words
    from tokenflow.viz.lang import CATALOG
    bad = []
    for en in json.loads(CATALOG.read_text(encoding="utf-8"))["messages"]:
        text = en.replace("{}", "7")
        once = zh.tr(text)
        twice = zh.tr(once)
        if twice != once or doubled_measure_words(once):
            bad.append(f"{en!r}: {once!r} -> {twice!r}")
    assert not bad, "\n".join(bad)
    assert zh.tr("888 logits") == "888 个 logits" == zh.tr(zh.tr("888 logits"))
