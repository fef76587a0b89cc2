"""The figures' text is drawn for the page it is shown on: every figure of tokenflow.viz is at
most the book column wide (tokenflow.viz.style.COLUMN_WIDTH_IN, so the page shows it at its
natural size: tests/test_browser_glyphs.py measures that in Chromium) and every font size it gives
matplotlib is at least MIN_FONT_PT (body size at 120 px per inch); text on the book's coloured
boxes meets WCAG AA contrast (4.5:1)."""
from __future__ import annotations

import ast
import re
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


# --- the figures in Chinese ---------------------------------------------------------------------
# A word of English prose: three or more letters, not part of a name, a code identifier, a
# unit or a symbol (DeepSeek-V3, input_ids, top-k, temperature=, bf16, \mathdefault, GDN+full).
ENGLISH_WORD = re.compile(r"(?<![\w\-./=+\\$])[A-Za-z][a-z]{2,}(?![\w\-./=(])")
# terms the Chinese edition keeps in English (its catalogs write "logit lens", "rank")
NOT_PROSE = {"logit", "logits", "softmax", "rank"}


def _english_words(text: str) -> list[str]:
    text = re.sub(r"logit lens|<\w+>", "", text)   # the lens's name; special tokens
    return [w for w in ENGLISH_WORD.findall(text) if w not in NOT_PROSE]


def _chinese_figures(model, tok, traced):
    """One figure of every figure function of tokenflow.viz (FIGURE_FUNCTIONS), drawn from
    the tiny model as the chapters draw them, smaller: yields (function name, Figure)."""
    import torch

    from tokenflow import viz
    from tokenflow.analysis.attention_kinds import example_layouts
    from tokenflow.analysis.costmodel import moe_comm_bytes_per_token, reference_config
    from tokenflow.analysis.logit_lens import logit_lens
    from tokenflow.model.moe import load_stats
    from tokenflow.parallel.expert_parallel import simulate_routing
    from tokenflow.serving import LLMEngine, SamplingParams, request_timeline, run_with_arrivals
    _, _, tokens, trace = traced
    ids = torch.tensor([tok.encode("北京是中国的首")])
    cfg = model.config
    with torch.no_grad():
        logits = model(ids)[0, -1]
    top = logits.topk(5)
    yield "topk_bar", viz.topk_bar([tok.id_to_token(int(i)) for i in top.indices],
                                   top.values.tolist())
    h = trace.hidden_states
    yield "hidden_state_heatmap", viz.hidden_state_heatmap(
        h[0][0], tokens, title="hidden_states_l0 of 北京是中国的首: rows = tokens, "
        "columns = features")
    yield "residual_stream_plot", viz.residual_stream_plot(h, len(tokens) - 1, tokens)
    yield "shape_flow", viz.shape_flow([(f"input_ids\n{list(ids.shape)}", "token"),
                                        ("lookup: one row of\nembedding_table\n[888, 128]",
                                         "hidden")],
                                       title="the first arrow: lookup, [B,S] -> [B,S,H]")
    yield "attention_context_plot", viz.attention_context_plot(trace.attention_weights, tokens)
    w0 = next(iter(trace.attention_weights.values()))[0, 0]
    yield "attention_head_heatmap", viz.attention_head_heatmap(w0, tokens, tokens,
                                                               title="layer 0, head 0")
    yield "kv_cache_growth_plot", viz.kv_cache_growth_plot(cfg, 64, [1, 2, 4],
                                                           bytes_per_element=2)
    yield "cache_per_sequence_plot", viz.cache_per_sequence_plot(
        example_layouts(), [2 ** i for i in range(8, 14)],
        title="cache per sequence, bf16 (from the bundled configs)")
    lens = logit_lens(model, ids)
    yield "logit_lens_heatmap", viz.logit_lens_heatmap(
        lens, tok, tokens, title="logit lens on 北京是中国的首: top token per depth and position")
    yield "moe_flow_diagram", viz.moe_flow_diagram()
    E, K = cfg.num_experts, cfg.num_experts_per_tok
    g = torch.Generator().manual_seed(0)
    idx = torch.stack([torch.randperm(E, generator=g)[:K] for _ in tokens])
    wts = torch.softmax(torch.randn(len(tokens), K, generator=g), -1)
    yield "routing_heatmap", viz.routing_heatmap(
        idx, wts, E, tokens,
        title="block 1: router weights of the chosen experts (blank = not chosen)")
    yield "dispatch_combine_diagram", viz.dispatch_combine_diagram(idx, wts, E, tokens)
    st = load_stats(idx, E, capacity_factor=1.25)
    yield "expert_load_bar", viz.expert_load_bar(
        st["counts"], st["capacity"], title="block 1: pairs per expert on 7 corpus tokens "
        "(hatched: over capacity at factor 1.25)")
    sim = simulate_routing(8, 2, 1, 64, world_size=4)
    yield "traffic_heatmap", viz.traffic_heatmap(sim["traffic"])
    yield "routing_load_plot", viz.routing_load_plot(sim)
    names = ["DeepSeek-V3", "Mixtral-8x7B"]
    comm = [moe_comm_bytes_per_token(reference_config(n)) for n in names]
    yield "moe_comm_bars", viz.moe_comm_bars(
        names, [c["dispatch"] for c in comm], [c["combine"] for c in comm],
        title="all-to-all bytes per token per MoE layer (bf16, all experts remote)")
    yield "vocab_scores", viz.vocab_scores(logits, {int(top.indices[0]): "都"},
                                           chosen=int(top.indices[0]))
    watch = top.indices.tolist()
    yield "temperature_curves", viz.temperature_curves(logits, watch,
                                                       [tok.id_to_token(i) for i in watch])
    viz.sampling_panel(logits, tok, temperature=1.0, top_k=3)
    yield "sampling_bars", __import__("matplotlib.pyplot").pyplot.gcf()
    p = logits.softmax(-1)[watch]
    yield "frequency_bars", viz.frequency_bars([tok.id_to_token(i) for i in watch], p, p,
                                               title="20,000 seeded draws after 北京是, "
                                               "temperature=2.0, top_k=8, top_p=0.95, min_p=0.1")
    yield "phase_times_plot", viz.phase_times_plot([1, 8], [1e-3, 2e-3], [8, 16], [1e-3, 1e-3],
                                                   [2e-3, 4e-3])
    yield "decode_batch_plot", viz.decode_batch_plot([1, 2, 4], [1e-3, 1.1e-3, 1.3e-3],
                                                     title="tiny model: one decode step, "
                                                     "context 64")
    yield "arithmetic_intensity_plot", viz.arithmetic_intensity_plot(
        [16, 512], [100.0, 900.0], [1, 64], [1.0, 60.0], 295,
        title="Llama-3-8B, bf16: prefill vs decode at context 512")
    prompts = [list(range(4, 4 + n)) for n in (5, 9, 13)]
    runs = {}
    for budget in (4, 64):
        engine = LLMEngine(model, num_blocks=32, block_size=4, max_num_seqs=2,
                           max_num_batched_tokens=budget, enable_prefix_caching=False)
        outs, arr = run_with_arrivals(engine, prompts, SamplingParams(3, ignore_eos=True),
                                      [0, 0, 1])
        runs[budget] = engine, outs, arr
    engine, outs, arr = runs[64]
    timelines = request_timeline(engine, arr, outs)
    yield "serving_timeline", viz.serving_timeline(
        timelines, title="continuous batching, 2 seats: 3 requests")
    yield "batch_composition_plot", viz.batch_composition_plot(engine.steps)
    yield "batching_comparison_plot", viz.batching_comparison_plot(
        {"continuous": engine.metrics(), "static": engine.metrics()})
    step = next(s for s in engine.steps if s.prefill)
    yield "packed_step_figure", viz.packed_step_figure(step)
    usage = viz.kv_slot_usage(engine.steps, timelines, 32, 4, reserve_len=16)
    yield "kv_slot_figure", viz.kv_slot_figure(usage,
                                               title="the mixed workload: KV slots per step")
    bt = LLMEngine(model, num_blocks=16, block_size=4)
    for pr in prompts:
        bt.add_request(pr, SamplingParams(3, ignore_eos=True))
    bt.step()
    yield "block_table_figure", viz.block_table_figure(
        bt.block_manager, list(bt.scheduler.running),
        title="block tables of three requests with a 48-token shared prefix")
    yield "chunked_prefill_time_plot", viz.chunked_prefill_time_plot(
        {b: e for b, (e, _, _) in runs.items()}, long_id=2,
        title="budget 4: the 13-token prompt (request 2) in chunks")
    yield "lens_bars", viz.lens_bars(
        {"prefill": 0.3, "KV cache": 0.1, "decode loop": 0.6, "sampling": 0.02, "other": 0.01},
        {"attention": 0.3, "FFN / MoE": 0.4, "embedding": 0.01, "norm": 0.05, "LM head": 0.02,
         "other": 0.2}, title="the same 100 engine steps through both lenses")
    yield "serving_view", viz.serving_view(viz.serving_counts(
        model, list(range(4, 40)), batch_size=4, prompt_len=8, output_len=4, max_num_seqs=2,
        block_size=4))
    ds = reference_config("DeepSeek-V3")
    yield "roofline_bars", viz.roofline_bars(viz.roofline_summary(ds, "H800", "decode", 64,
                                                                  4096, ep_size=128))
    yield "line_figure", viz.line_figure([("token ids", "token", "5 ids", "V = 129,280"),
                                          ("FFN / MoE  route top-k", "moe", "2 of 8 experts",
                                           "8 of 256 experts"),
                                          ("LM head", "hidden", "888 logits", "129,280 logits")],
                                         title="the whole line, with the book's numbers")


def _figure_functions() -> set[str]:
    """The public functions of tokenflow.viz that make a matplotlib figure (plt.subplots)."""
    out = set()
    for path in sorted(VIZ.glob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_") and any(
                    isinstance(c, ast.Attribute) and c.attr in ("subplots", "figure")
                    for c in ast.walk(node)):
                out.add(node.name)
    return out


def test_every_figure_in_chinese_has_no_english_prose(pretrained, traced_prompt, monkeypatch):
    """With set_language("zh"), every figure function's titles, axis labels, tick labels,
    legends and annotations, as drawn (matplotlib sets tick labels again at each draw, so the
    text is read in Text.draw), hold no English prose word (names, code, units and symbols
    stay)."""
    import matplotlib.pyplot as plt
    from matplotlib.text import Text

    from tokenflow.viz import lang
    model, tok = pretrained
    lang.set_language("zh")
    shown, draw = [], Text.draw

    def record(self, renderer, *args, **kwargs):
        out = draw(self, renderer, *args, **kwargs)
        if self.get_visible():
            shown.append(self.get_text())
        return out

    monkeypatch.setattr(Text, "draw", record)
    problems, drawn = [], set()
    try:
        for name, fig in _chinese_figures(model, tok, traced_prompt):
            shown.clear()
            fig.canvas.draw()
            drawn.add(name)
            assert shown, name
            problems += [f"{name}: {t!r}" for t in shown if _english_words(t)]
            plt.close(fig)
    finally:
        lang.set_language("en")
        plt.close("all")
    missing = {"sampling_panel", "roofline_panel", "serving_panel"}
    assert _figure_functions() - missing - drawn == set(), "figure functions not drawn here"
    assert not problems, "\n".join(sorted(set(problems)))


def test_the_english_word_check_finds_english():
    assert _english_words("block 1: router weights (blank = not chosen)") == [
        "block", "router", "weights", "blank", "not", "chosen"]
    assert _english_words("DeepSeek-V3 MoE 的 input_ids [B,S] top-k temperature=2.0 "
                          "bf16 KiB GDN+full $\\mathdefault{10^{2}}$ logits 专家") == []


def test_trace_tables_in_chinese_have_no_english_prose(traced_prompt):
    """The printed trace of the running example (its actions, places and notes, which
    tokenflow.explain.trace writes in English) reads in Chinese with set_language("zh")."""
    from tokenflow.viz import Table, diagram_trace_table, lang, trace_table
    _, _, _, trace = traced_prompt
    lang.set_language("zh")
    try:
        texts = [t.to_text() if isinstance(t, Table) else str(t)
                 for t in (trace_table(trace), diagram_trace_table(trace))]
    finally:
        lang.set_language("en")
    for text in texts:
        assert len(text.splitlines()) >= 10
        words = [w for line in text.splitlines()[1:] for w in _english_words(line)]
        assert words == [], sorted(set(words))


def test_chinese_recap_figure_names_each_count_once(monkeypatch):
    """The recap figure in Chinese, drawn twice (the notebook's display and a save), writes
    "888 个 logits": each drawn text is translated once, no measure word doubled."""
    import io

    import matplotlib.pyplot as plt
    from matplotlib.text import Text

    from helpers import doubled_measure_words
    from tokenflow.viz import lang, line_figure
    lang.set_language("zh")
    shown, draw = [], Text.draw

    def record(self, renderer, *args, **kwargs):
        out = draw(self, renderer, *args, **kwargs)
        shown.append(self.get_text())
        return out

    monkeypatch.setattr(Text, "draw", record)
    try:
        fig = line_figure([("token ids", "token", "5 ids", "V = 129,280"),
                           ("FFN / MoE  route top-k", "moe", "2 of 8 experts", "8 of 256 experts"),
                           ("LM head", "hidden", "888 logits", "129,280 logits")],
                          title="the whole line, with the book's numbers")
        fig.canvas.draw()
        fig.savefig(io.BytesIO(), format="png")
        fig.canvas.draw()
        plt.close(fig)
    finally:
        lang.set_language("en")
    assert "888 个 logits" in shown and "129,280 个 logits" in shown, shown
    assert [t for t in shown if doubled_measure_words(t)] == []
