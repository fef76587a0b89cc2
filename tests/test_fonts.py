"""Every figure of the book draws with the font the book ships, never a system font.

* The bundled font (``tokenflow/data/fonts``, Noto Sans CJK SC subsets, OFL) has a glyph for
  every character the figures can show (corpus, tokenizer vocabulary, notebooks, package
  source), and the Chinese edition's web font one for every CJK character of its pages'
  sources (scripts/build_fonts.py says how to rebuild them when this fails).
* After the chapters' setup (``setup_notebook``) matplotlib resolves every family, weight and
  style a figure asks for to the bundled files, and drawing real book figures with Chinese,
  Latin, bold and mathtext text opens no other font file and warns of no missing glyph.
"""
from __future__ import annotations

import sys
import warnings
from pathlib import Path

import matplotlib
import pytest

from helpers import load_script

matplotlib.use("Agg")

ROOT = Path(__file__).resolve().parents[1]


def _build_fonts():
    return load_script("build_fonts")


@pytest.fixture(scope="module")
def book_fonts():
    """The chapters' figure setup, then the bundled font files (resolved paths)."""
    from tokenflow.viz import setup_notebook
    from tokenflow.viz import fonts
    setup_notebook()
    return {str((fonts.FONT_DIR / f).resolve()) for f in fonts.FONT_FILES}  # 4 files


def test_the_font_files_and_their_licence_ship_in_the_package():
    from fontTools.ttLib import TTFont
    from tokenflow.viz import fonts
    assert (fonts.FONT_DIR / "OFL.txt").read_text().count("SIL OPEN FONT LICENSE Version 1.1")
    assert "Bitstream Vera" in (fonts.FONT_DIR / "LICENSE_DEJAVU").read_text()
    for weight, style in (("regular", "Regular"), ("bold", "Bold")):
        name = TTFont(str(fonts.font_path(weight)))["name"]
        assert name.getDebugName(1) == fonts.FAMILY and name.getDebugName(2) == style
        assert "Open Font License" in (name.getDebugName(13) or "")
    with pytest.raises(ValueError, match="weight"):
        fonts.font_path("italic")


def test_the_figure_font_covers_every_character_the_figures_can_draw():
    from fontTools.ttLib import TTFont
    from tokenflow.viz import fonts
    wanted = _build_fonts().figure_characters()
    assert {"北", "京", "首", "都"} <= wanted
    for weight in ("regular", "bold"):
        cmap = TTFont(str(fonts.font_path(weight)))["cmap"].getBestCmap()
        assert all(ord(c) in cmap for c in "→×≈αβ…·—"), "arrows, maths, Greek, punctuation"
        cmap = {**cmap, **TTFont(str(fonts.font_path(weight, fallback=True)))["cmap"].getBestCmap()}
        missing = sorted(c for c in wanted if ord(c) not in cmap)
        assert not missing, (
            f"{weight}: no glyph for {''.join(missing)!r}: rerun scripts/build_fonts.py"
        )


def test_the_web_font_covers_the_chinese_edition():
    pytest.importorskip("brotli", reason="woff2 needs brotli (requirements.txt)")
    from fontTools.ttLib import TTFont
    build_fonts = _build_fonts()
    cmap = TTFont(str(build_fonts.WEB_FONT))["cmap"].getBestCmap()
    missing = sorted(c for c in build_fonts.web_characters() if ord(c) not in cmap)
    assert not missing, f"no glyph for {''.join(missing)!r}: rerun scripts/build_fonts.py"


@pytest.mark.parametrize("family", ["sans-serif", "serif", "monospace", "cursive", "fantasy",
                                    None])
@pytest.mark.parametrize("weight", ["normal", "bold"])
@pytest.mark.parametrize("style", ["normal", "italic"])
def test_findfont_resolves_to_the_bundled_font(book_fonts, family, weight, style):
    """Whatever a figure asks for (the rc default when family is None), it gets a bundled file,
    and nothing falls back to another font."""
    from matplotlib import font_manager
    prop = font_manager.FontProperties(family=family, weight=weight, style=style)
    found = font_manager.findfont(prop, fallback_to_default=False)
    assert str(Path(found).resolve()) in book_fonts, found


def test_book_figures_open_only_the_bundled_font(book_fonts, monkeypatch):
    """Draw chapter figures (a heatmap labelled 北京 / 中国 / 首, a bar chart, a mathtext title,
    bold text) and record every font file matplotlib opens: only the bundled ones, no
    'Glyph missing' warning."""
    import matplotlib.pyplot as plt
    import torch
    from matplotlib import font_manager
    from matplotlib.backends import backend_agg

    from tokenflow.viz import hidden_state_heatmap, topk_bar

    opened = set()
    real_get_font = font_manager.get_font

    def recording_get_font(paths, *args, **kwargs):
        for p in [paths] if isinstance(paths, (str, Path)) else list(paths):
            opened.add(str(Path(p).resolve()))
        return real_get_font(paths, *args, **kwargs)

    monkeypatch.setattr(font_manager, "get_font", recording_get_font)
    monkeypatch.setattr(backend_agg, "get_font", recording_get_font)
    mathtext = sys.modules.get("matplotlib._mathtext")
    if mathtext is not None and hasattr(mathtext, "get_font"):
        monkeypatch.setattr(mathtext, "get_font", recording_get_font)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "Glyph ... missing from font(s)" fails
        figs = [
            hidden_state_heatmap(torch.randn(3, 8), ["北京", "中国", "首"], title="北京 hidden"),
            topk_bar(["åĲ", "ĠĦ", "\ufffd"], [1.0, 2.0, 3.0]),  # byte-level pieces: fallback
            topk_bar(["都", "府", "<eos>", " capital"], [9.0, 3.75, 3.63, 3.39]),
        ]
        fig, ax = plt.subplots()
        ax.set_title(r"$\alpha_t = \sum_j w_j$ 首都")
        ax.text(0.5, 0.5, "首 → 都 (bold)", fontweight="bold")
        figs.append(fig)
        for f in figs:
            f = f if hasattr(f, "canvas") else f.figure
            f.canvas.draw()
            plt.close(f)
    assert opened, "no font was opened: the recording hook missed the renderer"
    assert opened <= book_fonts, f"figures opened other fonts: {sorted(opened - book_fonts)}"
    assert any("Fallback" in p for p in opened) and any("Fallback" not in p for p in opened)


def test_the_emoji_web_font_covers_the_pages_emoji():
    """Every emoji of the pages' sources (chapter 1's byte-level example) has a glyph in
    TokenflowEmoji.woff2, declared with the Chinese web font (tokenflow.viz.fonts.WEB_FONTS)."""
    pytest.importorskip("brotli", reason="woff2 needs brotli (requirements.txt)")
    from fontTools.ttLib import TTFont
    from tokenflow.viz import fonts
    build_fonts = _build_fonts()
    wanted = build_fonts.emoji_characters()
    assert "\U0001F642" in wanted
    cmap = TTFont(str(build_fonts.EMOJI_FONT))["cmap"].getBestCmap()
    missing = sorted(c for c in wanted if ord(c) not in cmap)
    assert not missing, f"no glyph for {''.join(missing)!r}: rerun scripts/build_fonts.py"
    assert build_fonts.EMOJI_FONT.name in dict(fonts.WEB_FONTS)
    assert build_fonts.WEB_FONT.name in dict(fonts.WEB_FONTS)


def test_the_lab_css_reaches_widget_form_controls():
    """JupyterLab's CSS puts the bundled web font first on Lab's font variables and on form
    controls (a dropdown's options do not inherit the page's font), and the book's CSS does
    not touch Lab's variables."""
    import re
    from tokenflow.viz.fonts import web_font_css
    lab, book = web_font_css(target="lab"), web_font_css(target="book")
    family = re.search(r"font-family: ([^;]+);", lab).group(1)
    rule = re.search(r"select, option[^{]*\{ font-family: ([^;]+);", lab)
    assert rule and rule.group(1).startswith(family)
    assert f"--jp-ui-font-family: {family}" in lab
    # code keeps a monospace font first; the web font only fills in the Chinese characters
    code = re.search(r"--jp-code-font-family: ([^;]+);", lab).group(1)
    assert code.startswith("menlo") and code.rstrip(" !important").endswith(family)
    assert "--jp-" not in book
