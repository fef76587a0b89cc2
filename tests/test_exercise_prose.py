"""What the chapters' prose says about their own outputs, checked on the stored outputs.

A markdown cell cannot compute, so an exercise's text names no number the model produces; what
it still claims in words (which token leads, that a ratio squares, that two expert lists are
equal) is read here off the outputs the notebook stored. Also: the counts printed in outputs
agree with their nouns ("1 position", "1 KV head"), no markdown cell holds an escaped newline
that renders as a literal "\\n", and no ``$`` math reaches the slides' text (they load no math
renderer).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from helpers import load_script

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def _cells(name: str) -> list[dict]:
    return json.loads((ROOT / "notebooks" / name).read_text(encoding="utf-8"))["cells"]


def _text(cell: dict) -> str:
    """The stored text outputs of a code cell (streams and text/plain), joined."""
    out = []
    for o in cell.get("outputs", []):
        t = o.get("text") or o.get("data", {}).get("text/plain", "")
        out.append("".join(t) if isinstance(t, list) else t)
    return "".join(out)


def _output_of(cells: list[dict], code: str) -> str:
    hits = [c for c in cells if c["cell_type"] == "code" and code in "".join(c["source"])]
    assert len(hits) == 1, code
    return _text(hits[0])


def _markdown(cells: list[dict], start: str) -> str:
    hits = ["".join(c["source"]) for c in cells if c["cell_type"] == "markdown"
            and start in "".join(c["source"])]
    assert len(hits) == 1, start
    return hits[0]


# --- chapter 4 ------------------------------------------------------------------------------
CH4 = "04_lm_head_sampling.ipynb"


def _unsure_table(cells):
    """Section 7's table after 北京是: [(token, p)] best first."""
    text = _output_of(cells, "unsure = model_logits[0, 1]")
    rows = re.findall(r"^\s*(\d+)\s+(\S+)\s+(-?[\d.]+)\s+([\d.e-]+)\s*$", text, re.M)
    assert len(rows) == 6, text
    return [(tok, float(p)) for _, tok, _, p in rows]


def test_ch4_exercise_1_ratio_squares_when_temperature_halves():
    cells = _cells(CH4)
    text = _output_of(cells, "for temperature in (1.0, 0.5, 0.1):")
    ratio = {float(t): float(r) for t, r in
             re.findall(r"temperature ([\d.]+): p\(\S+\)/p\(\S+\) = ([\d.]+)", text)}
    assert set(ratio) == {1.0, 0.5, 0.1}, text
    assert "halving $\\tau$\nsquares the ratio" in _markdown(cells,
                                                          "The ratio is $e^{\\Delta z / \\tau}$")
    assert ratio[0.5] == pytest.approx(ratio[1.0] ** 2, abs=2e-3)
    assert ratio[0.1] == pytest.approx(ratio[1.0] ** 10, rel=1e-2)
    assert 1.0 < ratio[1.0] < 1.1, "the prompt says the two logits are almost the same"


def test_ch4_exercise_2_best_token_holds_a_little_under_one_half():
    cells = _cells(CH4)
    (best, p1), (second, _), *_ = _unsure_table(cells)
    assert 0.45 <= p1 < 0.5, "the solution: a little under one half, reached by p = 0.45"
    text = _output_of(cells, "for top_p in (0.5, 0.45):")
    kept = dict(re.findall(r"top-p=([\d.]+): keeps (\[.*\])", text))
    assert sorted(eval(kept["0.5"])) == sorted([best, second]), text
    assert eval(kept["0.45"]) == [best], text


def test_ch4_exercise_3_min_p_keeps_the_two_leading_tokens():
    cells = _cells(CH4)
    table = _unsure_table(cells)
    (best, p1), (second, p2), (_, p3) = table[:3]
    assert p2 >= 0.05 * p1 > p3, "the solution: the two leading tokens pass, the third not"
    text = _output_of(cells, 'min_p=0.05))')
    assert re.search(r"after 首: 1 kept \['都'\]", text), text
    after = re.search(r"after 北京是: 2 kept (\[.*\])", text)
    assert after and sorted(eval(after.group(1))) == sorted([best, second]), text


# --- chapter 9 ------------------------------------------------------------------------------
def test_ch9_exercise_2_says_what_the_expert_lists_show():
    cells = _cells("09_recap.ipynb")
    text = _output_of(cells, "东京是日本的")
    rows = re.findall(r"^(北京是中国的首|东京是日本的首)\s+(\[\[.*\]\])\s+(\S+)\s*$", text, re.M)
    assert len(rows) == 2, text
    prose = _markdown(cells, "The router does not see the token id 首")
    same = rows[0][1:] == rows[1][1:]
    assert ("In the run below they do not" in prose) == same, (rows, prose)


# --- every chapter's exercises: their numbers come from the outputs -------------------------
NUMBER = re.compile(r"(?<![\w.^{])(\d{1,3}(?:,\d{3})+|\d+\.\d+|\d{3,})(?![\w}])")
# numbers an exercise may state that no cell prints: config values and hardware specs with
# their source, and arithmetic on them that the hidden cell prints in another form
CITED = {
    "01": {"128,256": "Llama-3-8B's vocab_size (its config.json, reference_config)",
           "1.05": "128,256 x 4,096 x 2 bytes = 1.05e9, printed as 1002.00 MiB"},
    "02": {"244,000": "16 GiB / 70,272 bytes, printed as 244,476"},
    "03": {"0.66": "3/4 x 7/8, printed as 0.656"},
    "04": {"0.53": "V H = 128,256 x 4,096 = 0.53 B, printed as 525,336,576 weights"},
    "07": {"400": "the H800's and H200's 400 Gb/s NIC per GPU (DeepSeek's deployment)"},
    "09": {"576": "DeepSeek-V3's kv_lora_rank 512 + qk_rope_head_dim 64 (config.json)",
           "512": "DeepSeek-V3's kv_lora_rank (config.json)",
           "240": "the absorbed attention's FLOPs per byte of cache, printed as 242"},
}


def _printed_numbers(cells: list[dict]) -> list[str]:
    text = ""
    for c in cells:
        if c["cell_type"] == "code":
            text += "".join(c["source"]) + "\n"
            for o in c.get("outputs", []):
                for t in (o.get("text"), *o.get("data", {}).values()):
                    if isinstance(t, (str, list)):
                        text += ("".join(t) if isinstance(t, list) else t) + "\n"
    return re.findall(r"\d[\d,]*(?:\.\d+)?", text)


def _shown(n: str, printed: list[str]) -> bool:
    """``n`` is printed, digit for digit (commas aside; ``1,002`` matches ``1002.00``)."""
    bare = n.replace(",", "")
    return any(p.replace(",", "") == bare
               or re.fullmatch(re.escape(bare) + (r"0*" if "." in bare else r"(\.0*)?"),
                               p.replace(",", "")) for p in printed)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_exercise_numbers_are_printed_by_the_notebook(path):
    """A number in an exercise or its solution is one the notebook prints, or a cited
    config/hardware value or a rounding in ``CITED``: a retrained model or a changed
    corpus then fails here instead of leaving the prose behind its outputs."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    start = [i for i, c in enumerate(cells) if c["cell_type"] == "markdown"
             and "## Exercises" in "".join(c["source"])]
    assert start, path.stem
    printed = _printed_numbers(cells)
    cited = CITED.get(path.stem[:2], {})
    for c in cells[start[0]:]:
        if c["cell_type"] != "markdown":
            continue
        src = "".join(c["source"]).replace("{,}", ",")
        src = src[src.find("## Exercises"):]
        stale = [n for n in NUMBER.findall(src) if n not in cited and not _shown(n, printed)]
        assert not stale, (path.stem, stale, src[:200])


# --- every chapter's markdown ---------------------------------------------------------------
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_markdown_cell_holds_an_escaped_newline(path):
    """A ``\\n`` typed into a caption renders as the two characters; LaTeX commands that start
    with ``\\n`` (``\\nabla``, ``\\neq``) are letters after it, so they do not match."""
    for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
        if cell["cell_type"] == "markdown":
            src = "".join(cell["source"])
            assert not re.search(r"\\n(?![A-Za-z])", src), src[:200]


# --- counts agree with their nouns ----------------------------------------------------------
def test_counted():
    from tokenflow.viz.fmt import counted
    assert counted(1, "KV head") == "1 KV head"
    assert counted(0, "KV head") == "0 KV heads"
    assert counted(8, "KV head") == "8 KV heads"
    assert counted(2048, "entry", "entries") == "2,048 entries"
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="n must be"):
            counted(bad, "head")


def test_kv_head_texts_agree_in_number(pretrained):
    from tokenflow.analysis.attention_kinds import with_kv_heads
    from tokenflow.viz.attention import kv_cache_scale_table, kv_cache_summary
    config = pretrained[0].config
    for n, noun in ((1, "1 KV head "), (2, "2 KV heads ")):
        assert noun in kv_cache_summary(config, 1, 8, n, "bf16")
        assert f"{noun.strip()} (" in str(kv_cache_scale_table(config, 128, 1, n))
        assert with_kv_heads(config, n).name.endswith(f"({noun.strip()})")
    assert "1 KV heads" not in kv_cache_summary(config, 1, 8, 1, "bf16")


def test_trace_notes_agree_in_number(pretrained):
    from tokenflow import KVCache, Trace, decode_step, prefill
    model, tok = pretrained
    trace = Trace()
    cache = KVCache(model.config, 1, 4)
    with torch.no_grad():
        prefill(model, torch.tensor([tok.encode("首")]), cache)
        decode_step(model, torch.tensor([tok.token_to_id("都")]), cache, trace=trace)
    notes = [e.note for e in trace.events if e.action in ("read KV", "write KV")]
    assert notes and all("(s)" not in n and "1 positions" not in n for n in notes), notes
    assert any("K,V of 1 new token ->" in n for n in notes), notes
    assert any("(2 positions)" in n for n in notes), notes


# --- the slides' text -----------------------------------------------------------------------
def _slides():
    return load_script("slides", "tokenflow_slides_prose")


def test_math_text_renders_the_formulas_the_handout_shows():
    slides = _slides()
    assert slides.math_text(r"capacity $\lceil c\,TK/E \rceil$ first") == "capacity ⌈c·TK/E⌉ first"
    assert slides.math_text(r"$p(\text{一}) / p(\text{中国})$") == "p(一) / p(中国)"
    assert slides.math_text(r"with $2N$ per token") == "with 2N per token"
    assert slides.math_text(r"$e^{\Delta z / T}$, $T \to 0$") == "e^(Δz / T), T → 0"
    assert slides.math_text(r"$16 \cdot 2^{30} / 131{,}072$") == "16 · 2³⁰ / 131,072"
    assert slides.math_text(r"$\tfrac{3}{4} \cdot \tfrac{7}{8}$") == "3/4 · 7/8"
    assert slides.math_text("code `$x$` stays") == "code `$x$` stays"


@pytest.mark.parametrize("lang", ["en", "zh_CN"])
def test_no_dollar_math_reaches_the_handout_prompts_or_slides(lang):
    slides = _slides()
    for nb in slides.chapters(ROOT):
        deck = slides.chapter_deck(nb, ROOT, lang)
        prompts = slides.exercise_prompts(nb, ROOT, lang)
        slides.speaker_notes(deck, prompts, lang)
        texts = prompts + [s.title + s.notes for s in deck.slides]
        for text in texts:
            visible = re.sub(r"<code>.*?</code>", "", re.sub(r"data:[^\"')]+", "", text))
            assert not re.search(r"\$[^$]*\\[A-Za-z]|\$\$|\$[^$\s][^$]*\$", visible), (
                nb.stem, visible[:300])


def test_slides_index_links_the_cheat_sheet_and_the_handout():
    slides = _slides()
    page = slides.index_html([], "en", "")
    assert 'href="cheatsheet.html"' in page and 'href="handout.html"' in page
