"""The figures' text is drawn for the page it is shown on: every figure of tokenflow.viz is at
most the book column wide (tokenflow.viz.style.COLUMN_WIDTH_IN, so the page shows it at its
natural size: tests/test_browser_glyphs.py measures that in Chromium) and every font size it gives
matplotlib is at least MIN_FONT_PT (body size at 120 px per inch); text on the book's coloured
boxes meets WCAG AA contrast (4.5:1)."""
from __future__ import annotations

import ast
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")

VIZ = Path(__file__).resolve().parents[1] / "src" / "tokenflow" / "viz"


def _calls(path: Path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            yield node


def test_every_figure_size_and_font_size_goes_through_the_column_rules():
    from tokenflow.viz.style import MIN_FONT_PT
    problems = []
    for path in sorted(VIZ.glob("*.py")):
        for call in _calls(path):
            for kw in call.keywords:
                where = f"{path.name}:{kw.value.lineno}"
                if kw.arg == "figsize":
                    ok = (isinstance(kw.value, ast.Call)
                          and getattr(kw.value.func, "id", "") == "column_figsize")
                    if not ok:
                        problems.append(f"{where}: figsize not through column_figsize")
                if kw.arg in ("fontsize", "labelsize", "size") and isinstance(
                        kw.value, ast.Constant) and isinstance(kw.value.value, (int, float)):
                    if kw.value.value < MIN_FONT_PT:
                        problems.append(f"{where}: {kw.arg}={kw.value.value} < {MIN_FONT_PT}")
    assert not problems, "\n".join(problems)


def _texts(fig):
    from matplotlib.text import Text
    return [t for t in fig.findobj(Text) if t.get_text().strip() and t.get_visible()]


def test_drawn_figures_are_column_wide_with_body_size_text():
    import matplotlib.pyplot as plt

    from tokenflow.viz import lens_bars, line_figure, setup_notebook
    from tokenflow.viz.style import COLUMN_WIDTH_IN, MIN_FONT_PT
    setup_notebook()
    figs = [line_figure([("token ids", "token", "7 ids", "V = 129,280"),
                         ("FFN / MoE", "moe", "2 of 8", "8 of 256"),
                         ("sampling", "token", "都", "")], title="t"),
            lens_bars({"embed": 0.001, "attention": 0.2, "FFN / MoE": 0.3, "LM head": 0.004},
                      {"Embedding": 0.001, "Attention": 0.2, "MoE": 0.3, "LMHead": 0.004})]
    for fig in figs:
        fig.canvas.draw()
        assert fig.get_size_inches()[0] <= COLUMN_WIDTH_IN + 1e-9
        sizes = [t.get_fontsize() for t in _texts(fig)]
        assert sizes and min(sizes) >= MIN_FONT_PT, sorted(sizes)[:5]
        plt.close(fig)


def test_lens_bars_names_every_segment():
    """Every coloured segment of the lens figure has its name on the bar or in the legend."""
    import matplotlib.pyplot as plt

    from tokenflow.viz import lens_bars
    pipeline = {"embed": 0.001, "attention": 0.2, "FFN / MoE": 0.3, "LM head": 0.004}
    blocks = {"Embedding": 0.002, "Attention": 0.2, "MoE": 0.3, "RMSNorm": 0.003}
    fig = lens_bars(pipeline, blocks)
    shown = " ".join(t.get_text() for t in _texts(fig))
    for part in [*pipeline, *blocks]:
        assert part in shown, part
    plt.close(fig)


def test_contrast_follows_wcag():
    from tokenflow.viz.style import contrast
    assert contrast("black", "white") == pytest.approx(21.0)
    assert contrast("#767676", "white") == pytest.approx(4.54, abs=0.01)   # WCAG's AA grey
    assert contrast("#777777", "#ffffff") < 4.5


def test_text_on_the_book_colours_passes_aa():
    from tokenflow.analysis.trace import COLORS
    from tokenflow.viz.style import contrast, text_on
    for kind, fill in COLORS.items():
        for alpha in (1.0, 0.9, 0.88):
            colour = text_on(fill, alpha)
            from matplotlib.colors import to_rgba
            r, g, b, _ = to_rgba(fill)
            assert contrast(colour, (r, g, b, alpha)) >= 4.5, (kind, alpha, colour)
    assert text_on("#e0b000") == "black" and text_on("#1a237e") == "white"
