"""tokenflow.viz: Table's HTML / text forms and the kernel-less explorer's HTML.

The expected values are computed independently here: display widths from Unicode's
east_asian_width table directly, the HTML parsed with the standard library's HTMLParser.
"""
import base64
import itertools
import unicodedata
from html.parser import HTMLParser

import matplotlib.pyplot as plt
import pytest

from tokenflow.viz import Table, precomputed_explorer
from tokenflow.viz import static


def _cols(s: str) -> int:
    """Terminal columns, independent of tokenflow: wide (W) and full-width (F) count 2."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in s)


class _Collect(HTMLParser):
    """Start tags with attributes and the text inside each element, in document order."""

    def __init__(self):
        super().__init__()
        self.tags, self.stack = [], []

    def handle_starttag(self, tag, attrs):
        rec = {"tag": tag, "attrs": dict(attrs), "text": ""}
        self.tags.append(rec)
        if tag not in ("input", "img", "br"):
            self.stack.append(rec)

    def handle_endtag(self, tag):
        while self.stack and self.stack.pop()["tag"] != tag:
            pass

    def handle_data(self, data):
        for rec in self.stack:
            rec["text"] += data


def _parse(html: str) -> list[dict]:
    p = _Collect()
    p.feed(html)
    return p.tags


ROWS = [["北京", 1, 0.5], ["是中国的首", 12288, 0.25], ["the", 7, 3.14159]]


def test_table_text_aligns_chinese_columns():
    text = Table(ROWS, ["token", "id", "p"], digits=3).to_text()
    lines = text.splitlines()
    assert len(lines) == 2 + len(ROWS)
    # every line ends its right-aligned last column at the same terminal column
    assert len({_cols(line) for line in lines}) == 1, text
    # the id column ends at the same terminal column on every row
    ends = {_cols(line[:line.index(cell) + len(cell)])
            for line, cell in zip(lines[2:], ["1", "12,288", "7"])}
    assert len(ends) == 1, text
    assert "3.142" in text and "0.500" in text and "12,288" in text


def test_table_html_is_a_real_table_with_numbers_right_aligned():
    tags = _parse(Table(ROWS, ["token", "id", "p"], title="demo")._repr_html_())
    cells = [t for t in tags if t["tag"] == "td"]
    assert [c["text"] for c in cells] == ["北京", "1", "0.50", "是中国的首", "12,288", "0.25",
                                          "the", "7", "3.14"]
    for c in cells:
        right = c["text"][0].isdigit()
        assert ("text-align:right" in c["attrs"]["style"]) == right, c
    assert [t["text"] for t in tags if t["tag"] == "caption"] == ["demo"]
    assert [t["text"] for t in tags if t["tag"] == "th"] == ["token", "id", "p"]


def test_table_escapes_html_and_is_deterministic():
    t = Table([["<b>&", -0.0001]], ["a", "b"])
    assert "&lt;b&gt;&amp;" in t._repr_html_() and "<b>" not in t._repr_html_()
    assert "-0.00" not in t.to_text()          # negative zero shown as 0.00
    assert t._repr_html_() == Table([["<b>&", -0.0001]], ["a", "b"])._repr_html_()


def test_table_fits_90_columns_by_narrowing_the_gap():
    rows = [["x" * 14] * 6]
    text = Table(rows, [f"h{i}" for i in range(6)]).to_text()
    assert max(_cols(line) for line in text.splitlines()) <= 90   # 6*14 + 5 = 89


def test_a_table_exactly_as_wide_as_the_page_is_not_folded():
    """One space between columns fits a table of exactly ``max_width`` columns on one part:
    here 5*14 + 15 + 5 spaces = 90; one more column of width (91) folds it."""
    for last, parts in ((15, 1), (16, 2)):
        rows = [["x" * 14] * 5 + ["y" * last]]
        lines = Table(rows, [f"h{i}" for i in range(6)]).to_text().splitlines()
        assert all(_cols(line) <= 90 for line in lines), lines
        assert len(_parts("\n".join(lines))) == parts, lines
        if parts == 1:
            assert len(lines) == 3 and _cols(lines[2]) == 90 and lines[0].split() == [
                f"h{i}" for i in range(6)]


def _parts(text: str) -> list[list[str]]:
    """A folded table's parts: runs of lines separated by a blank line."""
    return [part.splitlines() for part in text.split("\n\n")]


def test_a_wide_table_folds_into_parts_that_repeat_the_row_names():
    # 1 name column + 8 columns of 14: 8*14 + 7*2 + 10 > 90 even with one space between
    rows = [[f"row{i}"] + [f"c{i}{j}".rjust(14, ".") for j in range(8)] for i in range(3)]
    headers = ["name"] + [f"col {j}" for j in range(8)]
    text = Table(rows, headers, title="wide").to_text()
    assert text.splitlines()[0] == "wide"
    parts = _parts("\n".join(text.splitlines()[1:]))
    assert len(parts) >= 2
    assert all(_cols(line) <= 90 for line in text.splitlines()), text
    seen = []
    for part in parts:
        head = part[0].split()
        assert head[0] == "name" and set(part[1]) == {"-", " "}
        seen += [h for h in part[0].split("  ") if h.strip() and h.strip() != "name"]
        assert [line.split()[0] for line in part[2:]] == ["row0", "row1", "row2"]
    assert [h.strip() for h in seen] == headers[1:]             # each column once, in order
    for i, j in itertools.product(range(3), range(8)):            # each cell in its own row
        assert sum(line.split()[0] == f"row{i}" and f"c{i}{j}" in line
                   for part in parts for line in part) == 1


def test_a_folded_table_repeats_its_key_columns():
    rows = [["H800", "EP32", 37.6, 98, 20.1, 17.0, 10.8, "memory", 4369],
            ["H200", "EP128", 22.2, 298, 10.9, 17.4, 10.8, "InfiniBand", 5051]]
    headers = ["GPU", "EP", "weights/GPU GB", "sequences that fit", "memory ms",
               "InfiniBand ms", "compute ms", "binding", "decode tok/s per GPU"]
    parts = _parts(Table(rows, headers, digits=1, keys=2).to_text())
    assert len(parts) == 2
    for part in parts:
        assert part[0].split()[:2] == ["GPU", "EP"]
        assert [line.split()[:2] for line in part[2:]] == [["H800", "EP32"], ["H200", "EP128"]]
    assert parts[1][2].split()[-2:] == ["memory", "4,369"]


def test_a_table_with_a_cell_wider_than_the_page_is_written_as_records():
    long = "block pool, free list, reference counts, prefix-cache keys " * 2
    rows = [["block_manager.py", long.strip(), "", "vllm/v1/core/block_pool.py"],
            ["sampler.py", "greedy, temperature", "Sampler", "北京是中国的首都" * 8]]
    text = Table(rows, ["file", "what it does", "vLLM", "open next"], title="map").to_text()
    lines = text.splitlines()
    assert all(_cols(line) <= 90 for line in lines), text
    assert lines[0] == "map" and lines[1] == "file: block_manager.py"
    starts = [i for i, line in enumerate(lines) if line.startswith("file: ")]
    assert [lines[i] for i in starts] == ["file: block_manager.py", "file: sampler.py"]
    first = " ".join(line.strip() for line in lines[starts[0]:starts[1]])
    assert first == (f"file: block_manager.py what it does: {long.strip()} "
                     "open next: vllm/v1/core/block_pool.py")    # the empty vLLM cell: left out
    second = lines[starts[1]:]
    assert second[:3] == ["file: sampler.py", "  what it does: greedy, temperature",
                          "  vLLM: Sampler"]
    assert second[3].startswith("  open next: ") and all(ln.startswith("    ") for ln in second[4:])
    zh = "".join(ln.strip() for ln in second[3:]).replace("open next: ", "")
    assert zh == "北京是中国的首都" * 8                       # wrapped, nothing lost
    assert all(line.startswith(("file: ", "  ")) for line in lines[2:])


def test_a_long_table_title_wraps_and_a_narrow_table_is_unchanged():
    title = " ".join(f"word{i}" for i in range(40))
    lines = Table([[1, 2]], ["a", "b"], title=title).to_text().splitlines()
    assert all(_cols(line) <= 90 for line in lines)
    assert " ".join(lines[:-3]) == title and lines[-3:] == ["a  b", "-  -", "1  2"]
    with pytest.raises(ValueError, match="max_width"):
        Table([[1]], ["a"]).to_text(max_width=20)


def test_fold_breaks_at_spaces_and_between_chinese_characters():
    from tokenflow.viz.fmt import fold
    assert fold("aa bb cc dd", 12, "  ") == ["aa bb cc dd"]
    assert fold("aaaa bbbb cccc dddd", 12, "  ") == ["aaaa bbbb", "  cccc dddd"]
    assert fold(["x (1 values)", "y (2 values)"], 14) == ["x (1 values)", "y (2 values)"]
    lines = fold("北京是中国的首都，也是中国的政治中心。", 12)
    assert all(_cols(line) <= 12 for line in lines) and len(lines) == 4
    assert not any(line.startswith(("，", "。")) for line in lines)
    assert "".join(lines) == "北京是中国的首都，也是中国的政治中心。"
    assert fold("y" * 25, 10) == ["y" * 10, "y" * 10, "y" * 5]
    with pytest.raises(ValueError, match="width"):
        fold("a", 11, "  ")


def test_table_rejects_bad_shapes():
    with pytest.raises(ValueError, match="keys"):
        Table([[1, 2]], ["a", "b"], keys=3)
    with pytest.raises(ValueError, match="rows\\[0\\] has 2 cells"):
        Table([[1, 2]], ["a"])
    with pytest.raises(ValueError, match="align"):
        Table([[1, 2]], ["a", "b"], align="<<<")
    with pytest.raises(TypeError, match="digits"):
        Table([[1, 2]], ["a", "b"], digits=1.5)


CONTROLS = {"batch B": [1, 2, 4, 8], "mode": ["prefill", "decode", "both"]}


def _explorer(**kw):
    return precomputed_explorer(lambda **c: f"B={c['batch B']} mode={c['mode']}", CONTROLS, **kw)


def test_explorer_html_holds_every_combination_exactly_once():
    html = _explorer()._repr_html_()
    outs = [t for t in _parse(html) if "tf-out" in t["attrs"].get("class", "")]
    assert len(outs) == 12
    for (i, b), (j, m) in itertools.product(enumerate(CONTROLS["batch B"]),
                                            enumerate(CONTROLS["mode"])):
        want = f"B={b} mode={m}"
        assert html.count(want) == 1, want
        [o] = [o for o in outs if o["attrs"]["data-key"] == f"{i}-{j}"]
        assert o["text"].strip() == want


def test_explorer_shows_the_default_and_hides_the_rest():
    for default, key in [(None, "0-0"), ({"batch B": 4, "mode": "decode"}, "2-1")]:
        tags = _parse(_explorer(default=default)._repr_html_())
        visible = [t["attrs"]["data-key"] for t in tags
                   if "tf-out" in t["attrs"].get("class", "")
                   and "display:none" not in t["attrs"].get("style", "")]
        assert visible == [key]
        [rng] = [t for t in tags if t["tag"] == "input"]
        assert rng["attrs"]["type"] == "range" and rng["attrs"]["value"] == key.split("-")[0]
        [sel] = [t for t in tags if t["tag"] == "select"]
        assert [t["attrs"].get("selected", "no") for t in tags if t["tag"] == "option"
                ].index(None) == int(key.split("-")[1])   # `selected` has no value
        assert "oninput" in sel["attrs"] and "oninput" in rng["attrs"]


def test_explorer_has_no_external_code_and_a_short_text_repr():
    ex = _explorer(title="demo")
    html = ex._repr_html_()
    # one inline script (it reveals the controls where scripts run), nothing fetched
    assert html.count("<script") == 1 and "<script>" in html
    assert "src=\"http" not in html and "//" not in html
    assert repr(ex) == ("demo: precomputed explorer: batch B (4 values) x mode (3 values) "
                        "= 12 outputs")
    title = "B x S = 4 x 64 random tokens, H = 7168, 2 B/element, a title that goes on"
    lines = repr(_explorer(title=title)).splitlines()
    assert len(lines) == 2 and all(_cols(line) <= 90 for line in lines)
    assert lines[1].startswith("  ") and " ".join(line.strip() for line in lines) == (
        f"{title}: precomputed explorer: batch B (4 values) x mode (3 values) = 12 outputs")
    assert not any(line.endswith(("batch", "B", "(4")) for line in lines)   # parts kept whole
    assert _explorer(title=title)._repr_mimebundle_()["text/plain"] == "\n".join(lines)


def test_the_live_explorer_says_what_it_is_within_90_columns():
    widgets = pytest.importorskip("ipywidgets")
    title = "trace shapes for batch B, sequence length S and experts E of the tiny model"
    controls = {"batch B": [1, 2, 8], "sequence length S": [16, 64], "experts E": [8, 32, 64]}
    made = [static.explore(lambda **c: None, controls, live=True, title=title,
                           default={"batch B": 2}) for _ in range(2)]
    w = made[0]
    assert isinstance(w, widgets.interactive)
    assert [c.value for c in w.children[:3]] == [2, 16, 8]
    bundle = w._repr_mimebundle_()
    text = bundle["text/plain"]
    assert "application/vnd.jupyter.widget-view+json" in bundle and text == repr(w)
    assert "interactive(" not in text and "…" not in text
    lines = text.splitlines()
    assert len(lines) >= 2 and all(_cols(line) <= 90 for line in lines)
    assert " ".join(line.strip() for line in lines) == (
        f"{title}: live explorer: batch B (3 values) x sequence length S (2 values) "
        "x experts E (3 values); needs a running kernel")
    assert made[1]._repr_mimebundle_()["text/plain"] == text     # nothing host- or run-specific
    assert repr(static.explore(lambda **c: None, {"B": [1, 2]}, live=True)) == (
        "live explorer: B (2 values); needs a running kernel")


def test_explorer_refuses_large_grids():
    big = {"a": list(range(static.MAX_OUTPUTS)), "b": [0, 1]}
    with pytest.raises(ValueError, match="MAX_OUTPUTS"):
        precomputed_explorer(lambda a, b: "", big)
    with pytest.raises(ValueError, match="default"):
        _explorer(default={"batch B": 3})


def test_explorer_embeds_figures_once_and_closes_them():
    plt.close("all")

    def fig(k):
        f, ax = plt.subplots(figsize=(3, 2))
        ax.plot([0, 1], [0, k])
        ax.set_title(f"slope {k}")
        plt.figure()   # a stray figure fn forgot: closed too
        return f

    ex = precomputed_explorer(fig, {"k": [1, 2]})
    assert plt.get_fignums() == []
    imgs = [t for t in _parse(ex._repr_html_()) if t["tag"] == "img"]
    assert [t["attrs"]["alt"] for t in imgs] == ["slope 1", "slope 2"]
    for t in imgs:
        png = base64.b64decode(t["attrs"]["src"].split(",", 1)[1])
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        assert int(t["attrs"]["width"]) * 2 in (int.from_bytes(png[16:20], "big"),
                                                int.from_bytes(png[16:20], "big") - 1)
    # same inputs, same bytes (stored outputs stay stable)
    assert precomputed_explorer(fig, {"k": [1, 2]})._repr_html_() == ex._repr_html_()
    svg = precomputed_explorer(fig, {"k": [1]}, kind="svg")._repr_html_()
    assert "<svg" in svg and svg == precomputed_explorer(fig, {"k": [1]}, kind="svg")._repr_html_()
    plt.close("all")


def test_explorer_figures_are_shown_at_120_px_per_inch():
    """An explorer's figure is shown at 120 CSS px per inch, as the chapters' inline figures
    (figure.dpi 120), so its 10 pt text is 16.7 px: a 5 x 2 inch figure whose drawing fills
    it (bbox_inches="tight" keeps the whole of it, plus matplotlib's 0.1 inch pad on each side:
    5.2 inches) is an <img> 624 px wide, its PNG twice as many pixels (2x sharp)."""
    from matplotlib.patches import Rectangle

    def fig(k):
        f = plt.figure(figsize=(5, 2))
        ax = f.add_axes((0, 0, 1, 1))
        ax.set_axis_off()
        ax.add_patch(Rectangle((0, 0), 1, 1, color=f"C{k}", transform=ax.transAxes))
        return f

    img = next(t for t in _parse(precomputed_explorer(fig, {"k": [1]})._repr_html_())
               if t["tag"] == "img")
    png = base64.b64decode(img["attrs"]["src"].split(",", 1)[1])
    assert abs(int(img["attrs"]["width"]) - 5.2 * 120) <= 2, img["attrs"]["width"]
    assert abs(int.from_bytes(png[16:20], "big") - 2 * 5.2 * 120) <= 4


def test_explorer_renders_tables_as_html():
    ex = precomputed_explorer(lambda n: Table([[n, n * n]], ["n", "n^2"]), {"n": [2, 3]})
    cells = [t["text"] for t in _parse(ex._repr_html_()) if t["tag"] == "td"]
    assert cells == ["2", "4", "3", "9"]



def test_nbval_sanitizer_hides_only_the_explorer_pixels(monkeypatch):
    """tests/nbval_sanitize.cfg makes two renderings of one explorer whose PNGs differ (as they
    do across machines with other fonts) compare equal, and keeps the rest compared."""
    import configparser
    import re
    from pathlib import Path
    cfg = configparser.ConfigParser()
    cfg.read(Path(__file__).with_name("nbval_sanitize.cfg"))
    rules = [(cfg[s]["regex"], cfg[s]["replace"]) for s in cfg.sections()]

    def clean(text):
        for regex, replace in rules:
            text = re.sub(regex, replace, text)
        return text

    def fig(k):
        f, ax = plt.subplots(figsize=(3, 2))
        ax.plot([0, 1], [0, k])
        return f

    a = precomputed_explorer(fig, {"k": [1, 2]})._repr_html_()
    monkeypatch.setattr(static, "PNG_DPI", 150)
    b = precomputed_explorer(fig, {"k": [1, 2]})._repr_html_()
    c = precomputed_explorer(fig, {"k": [1, 3]})._repr_html_()
    assert a != b and clean(a) == clean(b)
    assert clean(a) != clean(c)            # the slider labels are still compared
    assert clean(a).count('base64,..."') == 2


def test_say_wraps_by_display_width_under_the_first_word(capsys):
    """Conclusions fit a ~90-column page: Chinese characters count two columns, continuation
    lines are indented under the item's first word, Chinese text breaks between characters,
    and every character is kept."""
    from tokenflow.viz import display_width, say
    text = ("3. The prompt 北京是中国的首北京是中国的首 is 14 tokens; every block keeps the shape "
            "[1, 14, 64] and sends each token to 2 of 8 experts, then the LM head scores 888 "
            "entries.")
    say(text, width=40)
    lines = capsys.readouterr().out.rstrip("\n").split("\n")
    assert len(lines) > 2
    assert all(display_width(line) <= 40 for line in lines), lines
    assert all(line.startswith("   ") and not line.startswith("    ") for line in lines[1:])
    # breaks fall at spaces and between Chinese characters: no character lost or added
    assert "".join(lines).replace(" ", "") == text.replace(" ", "")
    assert " ".join(line.strip() for line in lines).count(" ") >= text.count(" ")
    say("x" * 30 + " y", width=20)                     # a word wider than the page is cut
    assert capsys.readouterr().out == "x" * 20 + "\n" + "x" * 10 + " y\n"
    say("- " + "北京是中国的首都。" * 6, width=30)     # Chinese without spaces still wraps
    lines = capsys.readouterr().out.rstrip("\n").split("\n")
    assert len(lines) == 4 and all(display_width(line) <= 30 for line in lines), lines
    assert all(line.startswith("  ") and not line.startswith("   ") for line in lines[1:])
    assert not any(line.strip().startswith("。") for line in lines)   # no line opens on 。
    assert "".join(line.strip() for line in lines) == "- " + "北京是中国的首都。" * 6
    with pytest.raises(ValueError, match="width"):
        say("a", width=19)


# ---- agree: agreement printed as a claim with its tolerance ------------------------------
def test_agree_prints_the_claim_not_the_noise():
    import torch
    from tokenflow.viz import agree
    a = torch.ones(4)
    for noise in (3.0e-7, 1.8e-7, 0.0):          # what different CPUs give: the same line
        got = agree(a, a + noise, 1e-6, what="loop vs vectorised")
        assert str(got) == repr(got) == "loop vs vectorised: equal within 1e-6: True"
        assert got and got.max_abs_diff == pytest.approx(noise, abs=1e-7)
    bad = agree([1.0, 2.0], [1.0, 2.5], 1e-6)
    assert not bad and str(bad) == "equal within 1e-6: False (max |a - b| = 0.5)"
    assert not agree(1.0, float("nan"), 1.0)
    assert str(agree(1, 1, 2.5e-5)) == "equal within 2.5e-5: True"


@pytest.mark.parametrize("args, err", [
    (([1.0], [1.0, 2.0], 1e-6), ValueError),       # shapes differ
    (([1.0], [1.0], -1.0), ValueError),            # negative tolerance
    (([1.0], [1.0], float("nan")), ValueError),
    ((["x"], [1.0], 1e-6), TypeError),             # not numeric
])
def test_agree_rejects_bad_input(args, err):
    from tokenflow.viz import agree
    with pytest.raises(err):
        agree(*args)


def test_explorer_untrusted_in_lab_shows_no_dead_control():
    """JupyterLab shows an untrusted notebook's stored HTML sanitized: scripts and on* handlers
    gone (inputs disabled). Then no control is drawn (their box stays display:none), the "run
    this cell" note and the default output are; where the script runs, it swaps them."""
    import re

    from tokenflow.viz.static import RUN_NOTE, _REVEAL
    html = _explorer(title="demo")._repr_html_()
    sanitized = re.sub(r"<script>.*?</script>", "", html, flags=re.S)
    sanitized = re.sub(r' on\w+="[^"]*"', "", sanitized)
    tags = _parse(sanitized)
    [box] = [t for t in tags if t["attrs"].get("class") == "tf-controls"]
    assert "display:none" in box["attrs"].get("style", "")
    [run] = [t for t in tags if "tf-note-run" in t["attrs"].get("class", "")]
    assert "display:none" not in run["attrs"].get("style", "") and RUN_NOTE in sanitized
    [live] = [t for t in tags if "tf-note-live" in t["attrs"].get("class", "")]
    assert "display:none" in live["attrs"].get("style", "")
    assert f"<script>{_REVEAL}</script>" in html


def test_no_figure_calls_a_context_length_L():
    """``L`` is the number of layers everywhere in the book (intro's notation): no figure
    label in viz/ writes a context length as ``L`` (chapter 5's decode panel once read
    "context length L", "recompute [1, L+1]")."""
    import re
    from pathlib import Path
    import tokenflow.viz as viz
    bad = []
    for path in Path(viz.__file__).parent.glob("*.py"):
        for lit in re.findall(r'"([^"\n]*)"', path.read_text(encoding="utf-8")):
            if re.search(r"context[^\"]*\bL\b|\[1, L\+1\]", lit):
                bad.append(f"{path.name}: {lit}")
    assert not bad, bad


def test_rank_heatmap_ticks_do_not_overlap_inside_the_routing_figure():
    """At W = 8 inside chapter 3's two-panel routing figure the rank ticks stay apart (numbers,
    with the direction on the axis labels)."""
    import matplotlib
    matplotlib.use("Agg")
    from tokenflow.parallel.expert_parallel import simulate_routing
    from tokenflow.viz.moe import routing_load_plot
    fig = routing_load_plot(simulate_routing(64, 6, 4, 64, world_size=8, hidden_size=64))
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    ax = fig.axes[-1]
    assert ax.get_xlabel() == "to rank" and ax.get_ylabel() == "from rank"
    boxes = [t.get_window_extent(r) for t in ax.get_xticklabels() if t.get_text()]
    assert len(boxes) == 8
    assert all(a.x1 < b.x0 for a, b in zip(boxes, boxes[1:]))
    matplotlib.pyplot.close(fig)


# ----------------------------------------------------------------------- the package's names
_HELPER_MODULES = {"lang", "fmt", "static", "style", "fonts", "model_page"}   # not star-exported


def _defined_public_names(path) -> set:
    """Public names a module's own top-level statements bind (def, class, assignment), read
    from its source with ``ast``, not from the module."""
    import ast
    names = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
    return {n for n in names if not n.startswith("_")}


def test_viz_all_is_every_public_name_its_modules_define():
    """Each viz module's ``__all__`` is the public names it defines (none imported, none
    left out), and the package exports every one of a chapter module's, the same objects."""
    import importlib
    from pathlib import Path

    import tokenflow.viz as viz
    folder = Path(viz.__file__).parent
    chapters = 0
    for path in sorted(folder.glob("*.py")):
        if path.name == "__init__.py":
            continue
        mod = importlib.import_module(f"tokenflow.viz.{path.stem}")
        defined = _defined_public_names(path)
        assert len(mod.__all__) == len(set(mod.__all__)), path.stem
        assert set(mod.__all__) == defined, (path.stem, set(mod.__all__) ^ defined)
        if path.stem in _HELPER_MODULES:
            continue
        chapters += 1
        missing = sorted(defined - set(viz.__all__))
        assert not missing, f"tokenflow.viz does not export {path.stem}'s {missing}"
        assert all(getattr(viz, n) is getattr(mod, n) for n in defined), path.stem
    assert chapters == 14


def test_fold_cuts_an_unbreakable_chinese_piece_by_display_width():
    """A list entry (never broken inside) wider than the line is cut where the next
    character would pass ``width`` columns, a Chinese character counting two; so is an
    explorer's long Chinese title."""
    from tokenflow.viz.fmt import fold
    text = "北京是中国的首都" * 3                                          # 48 columns
    lines = fold([text, "ok"], 20)
    assert [_cols(line) for line in lines] == [20, 20, 8 + 3], lines
    assert "".join(lines) == text + " ok"
    title = "混合专家路由的每个专家收到的词元数与通信量，按专家数与每个词元的专家数分别列出" * 2
    lines = repr(_explorer(title=title)).splitlines()
    assert all(_cols(line) <= 90 for line in lines), [(_cols(ln), ln) for ln in lines]
    assert "".join(line.strip() for line in lines).startswith(title + ":")


def test_table_keys_must_name_at_least_one_column():
    """``keys`` counts the leading columns that name a row: 1 to the number of columns."""
    for keys in (0, -1, 3, True, 1.0):
        with pytest.raises(ValueError, match=r"keys must be an int in 1\.\.2"):
            Table([[1, 2]], ["a", "b"], keys=keys)
    assert Table([[1, 2]], ["a", "b"], keys=2).keys == 2


def test_a_table_exactly_page_wide_with_two_spaces_keeps_them():
    """Two spaces between columns are kept while the table is at most ``max_width`` wide:
    5*14 + 10 + 5 gaps of 2 = 90 columns; at 91 the gaps narrow to one space."""
    for last, gap in ((10, "  "), (11, " ")):
        rows = [["x" * 14] * 5 + ["y" * last]]
        lines = Table(rows, [f"h{i}" for i in range(6)]).to_text().splitlines()
        assert lines[2] == gap.join(["x" * 14] * 5 + ["y" * last]), lines
        assert len(lines) == 3 and all(_cols(line) <= 90 for line in lines)


def test_a_record_starts_with_its_first_column_even_when_empty():
    """Written as records, every row opens with its first column's line (flush left), so a
    row with an empty first cell still shows where it begins; its other empty cells are left
    out."""
    long = "reference counts and prefix-cache keys, " * 4
    rows = [["block_pool.py", long.strip(), "x"], ["", "the free list", ""]]
    lines = Table(rows, ["file", "what it does", "note"]).to_text().splitlines()
    assert all(_cols(line) <= 90 for line in lines), lines
    starts = [i for i, line in enumerate(lines) if not line.startswith(" ")]
    assert [lines[i].split(":")[0] for i in starts] == ["file", "file"], lines
    assert lines[starts[1] + 1:] == ["  what it does: the free list"], lines
