"""The two simulator lenses (chapter 7): profiling one engine run through the pipeline and
the block lens. The parts must add up to the engine's own step times, every stage and module
class must appear, an injected delay must land in the stage and module it was put in, and
profiling must not change what the engine computes or leave hooks behind."""
import time

import pytest
import torch
import torch.nn.functional as F

from tokenflow.analysis.lenses import BLOCK_MODULES, PIPELINE_STAGES, profile_engine_run
from tokenflow.serving import LLMEngine, SamplingParams, run_with_arrivals

from helpers import random_model

SETTINGS = dict(num_blocks=64, block_size=4, max_num_seqs=4, max_num_batched_tokens=32)


def _workload():
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(4, 500, (n,), generator=g).tolist() for n in (9, 5, 14, 7, 11, 6)]
    params = [SamplingParams(n, temperature=0.8, seed=i, ignore_eos=True)
              for i, n in enumerate((6, 9, 4, 8, 5, 7))]
    return prompts, params, [0, 0, 2, 3, 5, 9]


@pytest.fixture(scope="module")
def profiled(model):
    engine = LLMEngine(model, **SETTINGS)
    t0 = time.perf_counter()
    prof = profile_engine_run(engine, *_workload())
    return engine, prof, time.perf_counter() - t0


def test_profiling_changes_nothing_and_leaves_no_hooks(model, profiled):
    engine, prof, _ = profiled
    plain = LLMEngine(model, **SETTINGS)
    outputs, _ = run_with_arrivals(plain, *_workload())
    assert [o.output_token_ids for o in prof.outputs] == [o.output_token_ids for o in outputs]
    assert len(prof.steps) == len(engine.steps) == len(plain.steps)
    for m in model.modules():
        assert not m._forward_hooks and not m._forward_pre_hooks
    for obj, name in ((engine.scheduler, "schedule"), (engine.runner, "execute"),
                      (engine.runner.strategy, "forward"), (engine.runner.strategy.cache, "update"),
                      (engine, "_finish")):
        assert name not in vars(obj), f"{name} still wrapped"


def test_every_stage_and_module_class_appears(profiled):
    _, prof, _ = profiled
    assert {s.phase for s in prof.steps} == {"prefill", "decode"}
    assert all(v > 0 for k, v in prof.pipeline().items() if k != "other")
    assert set(prof.pipeline()) == set(PIPELINE_STAGES) | {"other"}
    assert all(prof.blocks()[k] > 0 for k in BLOCK_MODULES)
    assert 0 < prof.kv_seconds() < prof.blocks()["attention"]
    assert prof.pipeline("decode")["prefill"] == 0 and prof.pipeline("prefill")["decode loop"] == 0
    assert prof.num_tokens() == sum(s.num_tokens for s in profiled[0].steps)


def test_parts_add_up_to_the_engine_time(profiled):
    engine, prof, wall = profiled
    for s in prof.steps:                      # disjoint pieces inside each step's time
        assert s.seconds == engine.steps[s.index].seconds
        assert sum(s.stages.values()) <= s.seconds + 1e-9
        assert sum(s.modules.values()) <= s.seconds + 1e-9
    total = prof.total_s()
    assert total == pytest.approx(engine.metrics()["elapsed_s"], rel=1e-12)
    assert total <= wall                      # an independent clock around the whole run
    for lens in (prof.pipeline(), prof.blocks()):
        assert sum(lens.values()) == pytest.approx(total, rel=1e-9)
        assert lens["other"] >= 0
    # the pipeline stages cover the step almost entirely (the rest is engine bookkeeping)
    assert prof.pipeline()["other"] < 0.2 * total
    for phase in ("prefill", "decode"):
        assert sum(prof.pipeline(phase).values()) == pytest.approx(prof.total_s(phase), rel=1e-9)


def test_injected_delays_land_where_they_were_put():
    """Sleep 3 ms in every LM-head call and 1 ms in every KV write: the block lens must put
    the first in 'LM head', the pipeline lens the second in 'KV cache'."""
    model = random_model(seed=1)
    lm, slept = model.lm_head, {"head": 0.0, "kv": 0.0}

    def nap(key, seconds):                     # the time really slept (sleep overshoots)
        t0 = time.perf_counter()
        time.sleep(seconds)
        slept[key] += time.perf_counter() - t0

    def slow_head(x):
        nap("head", 0.003)
        return F.linear(x, lm.weight)
    lm.forward = slow_head
    engine = LLMEngine(model, **SETTINGS)
    cache = engine.runner.strategy.cache
    update = cache.update

    def slow_update(*args):
        nap("kv", 0.001)
        return update(*args)
    cache.update = slow_update
    prof = profile_engine_run(engine, *_workload())
    n_fwd, n_kv = len(prof.steps), len(prof.steps) * model.config.num_hidden_layers
    assert slept["head"] >= n_fwd * 0.003 and slept["kv"] >= n_kv * 0.001
    head, kv = prof.blocks()["LM head"], prof.pipeline()["KV cache"]
    # each delay is counted where it was put (lower bound) and not where the other one was
    # (upper bound: the other delay's total, more than the real work of that part)
    assert slept["head"] <= head < slept["head"] + slept["kv"]
    assert slept["kv"] <= kv < slept["kv"] + slept["head"]
    assert prof.kv_seconds() >= slept["kv"]   # and, in the block lens, inside attention
    assert prof.blocks()["attention"] >= prof.kv_seconds()


def test_bad_use_raises(model):
    prompts, params, arrivals = _workload()
    with pytest.raises(ValueError, match="paged"):
        profile_engine_run(LLMEngine(model, **SETTINGS, kv_storage="contiguous"), prompts,
                           params, arrivals)
    used = LLMEngine(model, **SETTINGS)
    run_with_arrivals(used, prompts[:1], params[:1], [0])
    with pytest.raises(ValueError, match="fresh"):
        profile_engine_run(used, prompts, params, arrivals)
    prof = profile_engine_run(LLMEngine(model, **SETTINGS), prompts[:1], params[:1], [0])
    with pytest.raises(ValueError, match="phase"):
        prof.pipeline("decoding")


def test_lens_bars_and_roofline_panel(capsys):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tokenflow.analysis.costmodel import param_count, reference_config
    from tokenflow.viz import lens_bars, roofline_panel
    from tokenflow.viz import roofline_explorer
    fig = lens_bars({"prefill": 0.3, "other": 0.1}, {"attention": 0.25, "other": 0.15})
    assert len(fig.axes[0].patches) == 4
    with pytest.raises(ValueError, match="pipeline"):
        lens_bars({}, {"attention": 1.0})
    # Llama-3-8B decode, batch 1, context 1 on an H100 in bf16 is memory-bound: every weight
    # but the input embedding table, plus the one embedding row looked up (2 bytes each), plus
    # one token of K/V written (2 * layers * kv heads * head_dim * 2 bytes) per step
    llama = reference_config("Llama-3-8B")
    V, H = llama.vocab_size, llama.hidden_size
    nbytes = (param_count(llama) - V * H + H) * 2 + 2 * 32 * 8 * 128 * 2
    roofline_panel(llama, "H100", "decode", batch=1, context_len=1, ep_size=1, dtype="bf16",
                   bytes_per_param=2)
    text = capsys.readouterr().out
    assert f"{3.35e12 / nbytes:,.0f} tokens/s per device" in text
    assert "memory-bound" in text
    with pytest.raises(ValueError, match="ep_size"):
        roofline_panel(reference_config("DeepSeek-V3"), ep_size=144)
    w = roofline_explorer(reference_config("DeepSeek-V3"))
    eps = w.children[2].options
    assert eps[-1] == 256 and all(256 % e == 0 for e in eps)
    plt.close("all")


def test_roofline_table_marks_the_bound_and_the_fit():
    """roofline_table shows roofline_summary's three times and marks the largest; a one-node
    DeepSeek-V3 (EP8, FP8 weights: 671B bytes / 8 GPUs > 80 GB) does not fit."""
    from tokenflow.analysis.costmodel import reference_config
    from tokenflow.viz import roofline_summary
    from tokenflow.viz import roofline_static, roofline_table
    ds = reference_config("DeepSeek-V3")
    s = roofline_summary(ds, "H800", "decode", 64, 4096, 32)
    t = roofline_table(s)
    times = {r[0]: r[1] for r in t.rows[:3]}
    assert times["memory"] == pytest.approx(s["memory_s"] * 1e3)
    assert [r[0] for r in t.rows[:3] if r[2]] == [max(times, key=times.get)]
    assert "does not fit" in roofline_table(roofline_summary(ds, "H800", "decode", 1, 4096,
                                                             8)).rows[-1][2]
    ex = roofline_static(ds, hw_names=("H800",), batch=(1, 64), ep_size=(32,))
    assert sorted(ex.fragments) == ["0-0-0", "0-1-0"]


def test_cross_tab_nests_the_block_lens_in_the_pipeline_stages(profiled):
    """Issue 26 item 11: rows add up to the pipeline lens, columns to the block lens; the
    modules of a forward pass sit in its prefill / decode-loop stage, the KV-cache update in
    the KV cache stage, and nothing but time in between sits in queue or response."""
    _, prof, _ = profiled
    for phase in (None, "prefill", "decode"):
        tab, pipe, blk = prof.cross_tab(phase), prof.pipeline(phase), prof.blocks(phase)
        for st, row in tab.items():
            assert sum(row.values()) == pytest.approx(pipe[st], rel=1e-9, abs=1e-12)
        for k in blk:
            assert sum(row[k] for row in tab.values()) == pytest.approx(blk[k], rel=1e-9,
                                                                        abs=1e-12)
    tab = prof.cross_tab()
    assert tab["prefill"]["FFN / MoE"] > 0 and tab["decode loop"]["FFN / MoE"] > 0
    assert tab["KV cache"]["attention"] == pytest.approx(prof.kv_seconds(), rel=1e-12)
    for st in ("request queue", "response"):
        assert all(v == 0 for k, v in tab[st].items() if k != "other")
    assert all(v >= -1e-9 for row in tab.values() for v in row.values())
    assert prof.cross_tab("decode")["prefill"]["attention"] == 0


def test_roofline_summary_charges_attention_at_bf16_like_chapter_7s_table():
    """Issue C1r item 2: the summary behind chapter 7's bar chart defaults to DeepSeek's
    service (matmuls FP8, attention core BF16), so its times are the table's, and its title
    says so."""
    from tokenflow.analysis.costmodel import reference_config
    from tokenflow.analysis.roofline import Deployment, hardware, roofline
    from tokenflow.viz import roofline_summary, roofline_table
    ds = reference_config("DeepSeek-V3")
    s = roofline_summary(ds, "H800", "decode", 88, 4989, ep_size=128)
    fp8 = Deployment(hardware("H800"), ep_size=128, dtype="fp8", attention_dtype="bf16",
                     bytes_per_param=1, kv_bytes_per_element=2, dispatch_bytes_per_element=1,
                     combine_bytes_per_element=2)
    r = roofline(ds, fp8, phase="decode", batch=88, context_len=4989)
    assert s["compute_s"] == pytest.approx(r["compute_s"], rel=1e-12)
    assert s["attention_dtype"] == "bf16" and "attention bf16" in roofline_table(s).title


def test_lens_bars_legend_is_unambiguous_and_clear_of_the_axis_label():
    """The numbered narrow segments each get their own colour in the legend, and the legend
    sits below the x-axis label, not over it."""
    import matplotlib
    matplotlib.use("Agg")
    from tokenflow.viz.roofline import lens_bars
    pipeline = {"request queue": 0.002, "prefill": 0.05, "KV cache": 0.004,
                "decode loop": 0.2, "sampling": 0.003, "response": 0.001}
    blocks = {"embedding": 0.002, "attention": 0.08, "FFN / MoE": 0.12, "norm": 0.01,
              "LM head": 0.03, "other": 0.018}
    odd = {k: v for k, v in pipeline.items() if k != "response"}        # 7 numbered segments
    for p, n in ((pipeline, 8), (odd, 7)):
        fig = lens_bars(p, blocks)
        legend = fig.legends[0] if fig.legends else fig.axes[0].get_legend()
        colours = [tuple(h.get_facecolor()) for h in legend.legend_handles]
        assert len(set(colours)) == len(colours) == n
        fig.canvas.draw()
        r = fig.canvas.get_renderer()
        label = fig.axes[0].xaxis.label.get_window_extent(r)
        box = legend.get_window_extent(r)
        assert box.y1 <= label.y0, (n, box, label)


def test_lens_bars_numbers_do_not_overlap():
    """No two texts drawn in the lens bars' axes overlap or come within 3 pt of each other
    (their extents as rendered): narrow
    neighbours (the 3 ms sampling and 1 ms response of a 260 ms run, 1 px apart at the
    figure's width) share one number label instead of two printed over each other, and every
    narrow segment still has its number on the bar."""
    import matplotlib
    matplotlib.use("Agg")
    from tokenflow.viz.roofline import lens_bars
    pipeline = {"request queue": 0.002, "prefill": 0.05, "KV cache": 0.004,
                "decode loop": 0.2, "sampling": 0.003, "response": 0.001}
    blocks = {"embedding": 0.002, "attention": 0.08, "FFN / MoE": 0.12, "norm": 0.01,
              "LM head": 0.03, "other": 0.018}
    fig = lens_bars(pipeline, blocks)
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    texts = [t for t in fig.axes[0].texts if t.get_visible() and t.get_text()]
    boxes = [(t.get_text(), t.get_window_extent(r)) for t in texts]
    gap = 3 / 72 * fig.dpi                     # 3 pt apart at least: "3 4-5" is not "34-5"
    overlaps = [(a, b) for i, (a, ba) in enumerate(boxes) for b, bb in boxes[i + 1:]
                if ba.padded(gap).overlaps(bb)]
    assert not overlaps, overlaps
    numbers = set()
    for text, _ in boxes:
        if text[0].isdigit():
            first, _, last = text.partition("-")
            numbers |= set(range(int(first), int(last or first) + 1))
    assert numbers == set(range(1, 9)), numbers          # 8 narrow segments, each numbered
