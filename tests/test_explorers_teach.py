"""Explorers and the paging figures show what they claim: each control of a chapter's
explorer changes the output in view; a block table is the block manager's state; the KV slot
counts of a run match a count by hand; the chunked-prefill sentence follows the numbers."""
import itertools
import re
from types import SimpleNamespace

import math

import pytest

pytest.importorskip("matplotlib")
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot  # noqa: E402

from tokenflow.serving import (BlockManager, LLMEngine, SamplingParams,  # noqa: E402
                               request_timeline, run_with_arrivals)
from tokenflow.viz import (block_table_figure, block_table_rows, block_table_sentence,  # noqa: E402
                           chunked_prefill_sentence, kv_slot_sentence,
                           explore, kv_slot_table, kv_slot_usage, moe_routing_static,
                           serving_counts, serving_static, trace_shapes_static)
from helpers import random_model  # noqa: E402


def _png_payload(fragment: str) -> str:
    m = re.search(r'src="data:image/png;base64,([^"]+)"', fragment)
    return m.group(1) if m else fragment


def _each_control_changes_the_output(ex, view=lambda f: f):
    """Move each control through its values with the others at their default: every value
    gives a different output (``view`` picks what is in view)."""
    names = list(ex.controls)
    for k, name in enumerate(names):
        seen = set()
        for i in range(len(ex.controls[name])):
            idx = list(ex.default.values())
            idx[k] = i
            seen.add(view(ex.fragments["-".join(map(str, idx))]))
        assert len(seen) == len(ex.controls[name]), name


def test_trace_shapes_explorer_shows_what_E_changes_in_its_caption():
    cfg = random_model().config
    ex = trace_shapes_static(cfg, batch=(1, 2), seq_len=(3, 5), experts=(2, 4, 8),
                             default={"B": 2, "S": 5, "E": 4})
    # the caption (above the table, in view at any width) moves with every control
    _each_control_changes_the_output(ex, lambda f: re.search(r"<caption>(.*?)</caption>", f,
                                                             re.S).group(1))
    cap = re.search(r"<caption>(.*?)</caption>", ex.fragments["1-1-2"], re.S).group(1)
    k = cfg.num_experts_per_tok
    assert "[10, 8]" in cap and f"{10 * k / 8:g} (token, expert) pairs" in cap


def test_moe_routing_explorer_reaches_deepseek_v3_top_k():
    ex = moe_routing_static(num_experts=(8, 64), top_k=(6, 8), world_size=(8,),
                            batch_size=1, seq_len=8)
    assert 8 in ex.controls["top-k K"]
    _each_control_changes_the_output(ex, _png_payload)


def test_serving_explorer_shows_block_size_waste_and_moves_with_each_control():
    model = random_model()
    ids = list(range(4, 400))
    c16 = serving_counts(model, ids, 4, 16, 9, 2, 16, length_step=3)
    c4 = serving_counts(model, ids, 4, 16, 9, 2, 4, length_step=3)
    # prompts 16, 13, 10, 7 + 9 new = 25, 22, 19, 16 tokens; by hand:
    assert c16["tokens"] == [25, 22, 19, 16]
    assert c16["slots"] == [32, 32, 32, 16] and c16["unused_slots"] == 7 + 10 + 13 + 0
    assert c4["slots"] == [28, 24, 20, 16] and c4["unused_slots"] == 3 + 2 + 1 + 0
    assert c16["steps"] == c4["steps"]
    ex = serving_static(model, ids, controls={"requests": [2, 4], "seats": [1, 2],
                                              "block": [4, 16]},
                        default={"requests": 4, "seats": 2, "block": 16})
    assert all("<img" in f for f in ex.fragments.values())       # a figure, not a table
    _each_control_changes_the_output(ex, _png_payload)


def test_explore_live_has_the_same_controls_and_default():
    w = explore(lambda a, b: f"{a}{b}", {"a": [1, 2, 3], "b": ["x", "y"]}, live=True,
                default={"a": 2})
    assert [list(c.options) for c in w.children[:2]] == [[1, 2, 3], ["x", "y"]]
    assert w.children[0].value == 2 and w.children[1].value == "x"
    with pytest.raises(ValueError, match="default"):
        explore(lambda a: a, {"a": [1]}, live=True, default={"a": 5})


def _req(rid, n, blocks):
    return SimpleNamespace(request_id=rid, num_tokens=n, block_table=list(blocks))


def test_block_table_rows_are_the_block_managers_state():
    model = random_model()
    shared = list(range(4, 4 + 8))                   # two full blocks of 4
    eng = LLMEngine(model, num_blocks=16, block_size=4)
    eng.add_request(shared + [20, 21], SamplingParams(4, ignore_eos=True))
    eng.step()
    eng.add_request(shared + [30], SamplingParams(4, ignore_eos=True))
    eng.step()
    running = list(eng.scheduler.running)
    rows = block_table_rows(eng.block_manager, running)
    for r in running:
        mine = [x for x in rows if x["request_id"] == r.request_id]
        assert [x["physical"] for x in mine] == r.block_table
        assert sum(x["tokens"] for x in mine) == r.num_tokens
    # the two prefix blocks: the same physical ids in both tables, held twice
    t0, t1 = (r.block_table for r in running)
    assert t0[:2] == t1[:2] and t0[2] != t1[2]
    assert all(x["shared"] == (x["logical"] < 2) for x in rows)
    assert all(x["ref_count"] == eng.block_manager.blocks[x["physical"]].ref_count for x in rows)
    matplotlib.pyplot.close(block_table_figure(eng.block_manager, running))
    # 2 requests, 3 logical blocks each, 4 physical: blocks t0[:2] shared twice
    assert block_table_sentence(eng.block_manager, running) == (
        f"2 requests hold 4 physical blocks for 6 logical ones; blocks {sorted(t0[:2])} are "
        "shared, reference count 2.")
    # a third request shares only the first prefix block: counts 3 and 2, in block order
    eng.add_request(shared[:4] + [40, 41, 42, 43, 44], SamplingParams(4, ignore_eos=True))
    eng.step()
    running = list(eng.scheduler.running)
    first, second = running[0].block_table[:2]
    assert block_table_sentence(eng.block_manager, running).endswith(
        f"blocks {sorted([first, second])} are shared, reference counts "
        + ("3 and 2." if first < second else "2 and 3."))
    bm = BlockManager(4, 4)
    with pytest.raises(ValueError, match="holds no blocks"):
        block_table_rows(bm, [_req("a", 3, [])])
    with pytest.raises(ValueError, match="at least one"):
        block_table_rows(bm, [])


def test_kv_slot_usage_counts_by_hand():
    """One seat, blocks of 4: request 0 (5 prompt + 3 new) runs steps 0-2, request 1 (7 + 3)
    steps 3-5, counted after each step. After step 0 request 0 holds 5 K/V in 2 blocks (its 6
    tokens: 8 slots), after step 1 6 K/V (a decode writes the token it feeds; its slot is
    allocated when it is scheduled); step 2 gives its last token and frees it. Request 1: 7 K/V
    in 2 blocks, then 8 in 2, then done."""
    model = random_model()
    eng = LLMEngine(model, num_blocks=8, block_size=4, max_num_seqs=1,
                    enable_prefix_caching=False)
    prompts = [list(range(4, 9)), list(range(10, 17))]
    outs, arr = run_with_arrivals(eng, prompts, SamplingParams(3, ignore_eos=True), [0, 0])
    u = kv_slot_usage(eng.steps, request_timeline(eng, arr, outs), 8, 4, reserve_len=32)
    assert u["used"] == [5, 6, 0, 7, 8, 0]
    assert u["paged"] == [8, 8, 0, 8, 8, 0]
    assert u["contiguous"] == [32, 32, 0, 32, 32, 0]
    assert u["used_total"] == 26 and u["contiguous_total"] == 128 and u["paged_total"] == 32
    t = kv_slot_table(u)
    assert t.rows[0][2] == 128 and t.rows[0][4] == 102 and t.rows[1][4] == 6
    # 128 / 26 = 4.9x (20% used); 32 / 26 = 1.23x (81% used); busiest 32 of a 32-slot pool
    assert kv_slot_sentence(u) == (
        "Over the run a contiguous reservation of 32 slots per request would hold 4.9x the "
        "slot-steps the K/V fills (20% used); the paged blocks hold 1.23x (81% used). At the "
        "busiest step the reservation needs 32 slots, the pool has 32.")
    with pytest.raises(ValueError, match="reserve_len"):
        kv_slot_usage(eng.steps, [], 8, 4, 0)


def test_kv_slot_usage_adds_up_a_prompt_prefilled_in_chunks():
    """A budget of 4 tokens a step splits a 7-token prompt: 4 K/V after step 0, 7 after
    step 1 (the last chunk gives the first token), then the one decode gives the last token
    and frees the request."""
    eng = LLMEngine(random_model(), num_blocks=8, block_size=4, max_num_seqs=1,
                    max_num_batched_tokens=4, enable_prefix_caching=False)
    outs, arr = run_with_arrivals(eng, [list(range(10, 17))], SamplingParams(2, ignore_eos=True),
                                  [0])
    assert [len(s.prefill) for s in eng.steps] == [1, 1, 0]
    u = kv_slot_usage(eng.steps, request_timeline(eng, arr, outs), 8, 4, reserve_len=16)
    assert u["used"] == [4, 7, 0]
    assert all(p >= n for p, n in zip(u["paged"], u["used"]))


def _eng(ttft_s, step_s):
    steps = [SimpleNamespace(seconds=s, decode=[0]) for s in step_s]
    return SimpleNamespace(outputs={4: SimpleNamespace(ttft=ttft_s)}, steps=steps)


def test_chunked_prefill_sentence_follows_the_numbers():
    runs = {2048: _eng(0.0648, [0.084, 0.002]), 256: _eng(0.0693, [0.028]),
            64: _eng(0.0600, [0.009])}
    s = chunked_prefill_sentence(runs, 4, 2048)
    assert "budget 256 it came 4.5 ms later (69.3 ms)" in s
    assert "budget 64 it came 4.8 ms sooner (60.0 ms)" in s
    assert "longest decode step took 84 ms" in s
    # a slower step that only prefills is no decode step
    runs[2048].steps.append(SimpleNamespace(seconds=0.5, decode=[]))
    assert "longest decode step took 84 ms" in chunked_prefill_sentence(runs, 4, 2048)
    with pytest.raises(ValueError, match="baseline"):
        chunked_prefill_sentence(runs, 4, 1)


def test_kv_scale_explorer_counts_llama_by_hand_and_moves_with_each_control():
    from tokenflow.analysis.costmodel import reference_config
    from tokenflow.viz import kv_cache_scale_static, kv_cache_scale_table
    llama = reference_config("Llama-3-8B")
    t = kv_cache_scale_table(llama, 8192, 32, 8)
    # 32 layers x 2 (K, V) x 8 heads x 128 x 2 B = 128 KiB per token
    assert t.rows[1][1] == pytest.approx(32 * 8192 * 128 / 2**20)
    assert t.rows[2][1] == pytest.approx(t.rows[0][1] + t.rows[1][1])
    # the title's count follows from the rows: (usable - weights) / one sequence, rounded down
    weights, one, usable = t.rows[0][1], t.rows[3][1], t.rows[4][1]
    assert usable == pytest.approx(0.9 * 80e9 / 2**30) and one == pytest.approx(8192 / 2**3 / 2**10)
    assert f"at most {math.floor((usable - weights) / one)} sequences" in t.title
    with pytest.raises(ValueError, match="num_key_value_heads"):
        kv_cache_scale_table(llama, 8192, 1, 3)
    ex = kv_cache_scale_static(llama, context=(1024, 8192), batch=(1, 32), kv_heads=(1, 8, 32),
                               default={"S": 8192, "B": 32, "kv_heads": 8})
    _each_control_changes_the_output(ex)


# ---- every explorer the chapters show, each control moved through all its values
COLUMN_PX = 784
"""The book's content column at a 1280 px window (tokenflow.viz.style.COLUMN_WIDTH_IN at 120
dpi; _static/tokenflow.css)."""


class _Vocab:
    def id_to_token(self, i):
        return f"t{i}"


def _chapter_explorers(live: bool) -> dict:
    """Each chapter's explorer as the notebooks call it (their grids and starting points),
    on a random tiny model: name -> the ``explore`` result (precomputed or live)."""
    import torch

    from tokenflow import Trace
    from tokenflow.analysis.costmodel import reference_config
    from tokenflow.analysis.logit_lens import logit_lens
    from tokenflow import viz
    model = random_model()
    cfg = model.config
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    tokens = ["北京", "是", "中国", "的", "首"]
    trace = Trace(keep_tensors=True)
    with torch.no_grad():
        model(ids, trace=trace)
        logits = model(ids)[0, -1]
    form = (lambda f: f) if live else (lambda f: getattr(viz, f.__name__.replace(
        "_explorer", "_static")))
    e = {n: form(getattr(viz, n + "_explorer")) for n in (
        "trace_shapes", "hidden_size", "residual_stream", "attention", "kv_cache",
        "kv_cache_scale", "moe_routing", "sampling", "serving", "logit_lens", "decode_trace",
        "roofline")}
    return {
        "trace_shapes": e["trace_shapes"](cfg),
        "hidden_size": e["hidden_size"](12288, 129280, default={"B": 16, "S": 8192}),
        "residual_stream": e["residual_stream"](trace.hidden_states, tokens),
        "attention": e["attention"](trace.attention_weights, tokens, tokens),
        "kv_cache": e["kv_cache"](cfg),
        "kv_cache_scale": e["kv_cache_scale"](reference_config("Llama-3-8B"),
                                              default={"S": 8192, "B": 32, "kv_heads": 8}),
        "moe_routing": e["moe_routing"](),
        "sampling": e["sampling"](logits, _Vocab()),
        "serving": e["serving"](model, list(range(4, 400))),
        "logit_lens": e["logit_lens"](logit_lens(model, ids), _Vocab(), tokens,
                                      token_ids=[5, 6]),
        "decode_trace": e["decode_trace"](cfg),
        "roofline": e["roofline"](reference_config("DeepSeek-V3")),
    }


@pytest.fixture(scope="module")
def precomputed():
    """:func:`_chapter_explorers` precomputed, each output the test shows rendered as the book
    renders it: the starting point and every setting one control away from it (the others
    of the grid, which no test here shows, are left empty to save their rendering)."""
    import tokenflow.viz.static as st

    def star_only(fn, controls, *, title=None, kind="auto", default=None, live_below=False):
        index = st._check_controls(controls, default)
        names = list(controls)
        fragments = {}
        for idx in itertools.product(*(range(len(controls[n])) for n in names)):
            moved = sum(i != index[n] for n, i in zip(names, idx))
            combo = {n: controls[n][i] for n, i in zip(names, idx)}
            fragments["-".join(map(str, idx))] = (st._render_call(fn, combo, kind)
                                                  if moved <= 1 else "")
        return st.PrecomputedExplorer(controls, fragments, index, title, live_below)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(st, "precomputed_explorer", star_only)
        return _chapter_explorers(live=False)


# For one control of one explorer: move it to value i, bring the explorer to the top of the
# window and return the part of the shown output that is inside the 1280 x 900 window.
_MOVE_JS = """([n, c, i]) => {
  const x = document.querySelectorAll('.tf-explorer')[n];
  const ctl = x.querySelectorAll('[data-tf-ctl]')[c];
  ctl.value = String(i);
  ctl.dispatchEvent(new Event('input', {bubbles: true}));
  x.scrollIntoView();
  const shown = [...x.querySelectorAll('.tf-out')].filter(o => o.style.display !== 'none');
  if (shown.length !== 1) return null;
  const r = shown[0].getBoundingClientRect();
  const x0 = Math.max(r.left, 0), y0 = Math.max(r.top, 0);
  const x1 = Math.min(r.right, innerWidth), y1 = Math.min(r.bottom, innerHeight);
  return x1 > x0 && y1 > y0 ? {x: x0, y: y0, width: x1 - x0, height: y1 - y0} : null;
}"""


def test_each_control_changes_what_is_in_view_in_chromium(browser, precomputed):
    """The precomputed explorers (what the book shows) in a column as wide as the book's at a
    1280 x 900 window, with the book's CSS: each control of each explorer, moved through all
    its values with the others at their starting point, shows a different picture each time
    in the part of the output that is in the window (a change in a column scrolled out of the
    box, or below the window, does not count)."""
    import hashlib
    from pathlib import Path
    css = (Path(__file__).resolve().parents[1] / "_static" / "tokenflow.css").read_text()
    names = list(precomputed)
    body = "".join(f'<section style="width:{COLUMN_PX}px;margin:0 0 1000px 200px">'
                   f"{precomputed[n]._repr_html_()}</section>" for n in names)
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    page = ctx.new_page()
    try:
        page.set_content(f"<!doctype html><meta charset=utf-8><style>{css}</style>"
                         f"<body>{body}</body>", wait_until="load")
        problems = []
        for n, name in enumerate(names):
            ex = precomputed[name]
            for c, (ctl, values) in enumerate(ex.controls.items()):
                views = {}
                for i, v in enumerate(values):
                    clip = page.evaluate(_MOVE_JS, [n, c, i])
                    if clip is None:
                        problems.append(f"{name}: {ctl}={v!r} shows no output in view")
                        continue
                    shot = hashlib.sha1(page.screenshot(clip=clip)).hexdigest()
                    views.setdefault(shot, []).append(v)
                same = [vs for vs in views.values() if len(vs) > 1]
                if same:
                    problems.append(f"{name}: {ctl} = {same} look the same in view")
                # back to the starting value before the next control moves
                page.evaluate(_MOVE_JS, [n, c, ex.default[ctl]])
    finally:
        ctx.close()
    assert not problems, "\n".join(problems)


def test_each_control_changes_the_live_widgets_output(monkeypatch):
    """The live explorers (``ipywidgets``, for a running kernel): each control, moved through
    all its values with the others at their starting point, makes the widget show a
    different output each time (what it displays and prints)."""
    import contextlib
    import hashlib
    import io

    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure

    from tokenflow.viz.static import _render
    shown = []

    def display(obj, *a, **k):                  # a figure as its pixels, anything else as HTML
        if isinstance(obj, Figure):
            obj.set_dpi(50)
            obj.canvas.draw()
            shown.append(hashlib.sha1(bytes(obj.canvas.buffer_rgba())).hexdigest())
            plt.close(obj)
        else:
            shown.append(_render(obj, "auto"))
    monkeypatch.setattr("IPython.display.display", display)
    problems = []
    for name, w in _chapter_explorers(live=True).items():
        for ctl in w.children[:-1]:                         # the last child is the Output
            views = {}
            start = ctl.value
            for v in ctl.options:
                shown.clear()
                out = io.StringIO()
                with contextlib.redirect_stdout(out):
                    if ctl.value == v:
                        w.update()                          # no change event: draw again
                    else:
                        ctl.value = v
                text = out.getvalue().replace("\x1b[2K\r", "") + "".join(shown)
                if not text.strip():
                    problems.append(f"{name}: {ctl.description}={v!r} shows nothing")
                key = hashlib.sha1(re.sub(r"\s+", " ", text).encode()).hexdigest()
                views.setdefault(key, []).append(v)
            same = [vs for vs in views.values() if len(vs) > 1]
            if same:
                problems.append(f"{name}: {ctl.description} = {same} show the same output")
            ctl.value = start
    assert not problems, "\n".join(problems)


def test_an_explorer_starts_where_the_chapter_does_or_at_the_grids_first_value():
    """The roofline explorer starts at H800, batch 64, EP32 when its grid has them; a grid
    without some of them starts those controls at their first value instead of failing."""
    from tokenflow.analysis.costmodel import reference_config
    from tokenflow.viz import roofline_static
    ds = reference_config("DeepSeek-V3")
    ex = roofline_static(ds, hw_names=("H200", "H800"), batch=(8, 64), ep_size=(8, 32))
    assert ex.default == {"hardware": 1, "batch": 1, "EP": 1}
    ex = roofline_static(ds, hw_names=("H200",), batch=(1, 8), ep_size=(8, 256))
    assert ex.default == {"hardware": 0, "batch": 0, "EP": 0}
