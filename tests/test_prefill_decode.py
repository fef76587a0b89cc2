"""Chapter 05's library pieces: phase timers, staggered arrivals, static batching, request
timelines, the corpus workload, and a smoke test per figure / widget."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from tokenflow import generate, viz as plots  # noqa: E402
from tokenflow.inference.phases import (best_time, time_decode, time_decode_batch,  # noqa: E402
                              time_prefill, time_recompute, with_context_length)
from tokenflow.serving import (DECODE, PREFILL, WAIT, LLMEngine, SamplingParams,  # noqa: E402
                               mixed_workload, request_timeline, run_with_arrivals)
from tokenflow.viz import serving_explorer  # noqa: E402



def _prompts(n, lengths):
    g = torch.Generator().manual_seed(n)
    return [torch.randint(4, 500, (lengths[i % len(lengths)],), generator=g).tolist()
            for i in range(n)]


def _alone(model, prompt, new):
    out = generate(model, torch.tensor([prompt]), new, stop_at_eos=False)
    return out[0, len(prompt):].tolist()


# ------------------------------------------------------------------ arrivals and timelines
def test_run_with_arrivals_gives_each_request_what_generate_gives(model):
    prompts = _prompts(6, [5, 17, 9])
    news = [3, 8, 5, 2, 6, 4]
    engine = LLMEngine(model, num_blocks=64, block_size=4, max_num_seqs=3)
    outs, arrivals = run_with_arrivals(engine, prompts,
                                       [SamplingParams(n, ignore_eos=True) for n in news],
                                       [0, 0, 2, 2, 9, 40])
    for o, p, n in zip(outs, prompts, news):
        assert o.output_token_ids == _alone(model, p, n)
    # nobody is computed before it arrives; the idle engine jumps to the arrival at step 40
    for s in engine.steps:
        for rid in [r for r, _ in s.prefill] + s.decode:
            assert arrivals[rid] <= s.index
    assert arrivals[5] == engine.steps[-1].index - 3 < 40


def test_request_timeline_counts_match_the_requests(model):
    prompts = _prompts(5, [6, 11])
    news = [4, 7, 1, 5, 3]
    engine = LLMEngine(model, num_blocks=64, block_size=4, max_num_seqs=2)
    outs, arrivals = run_with_arrivals(engine, prompts,
                                       [SamplingParams(n, ignore_eos=True) for n in news],
                                       [0, 0, 0, 1, 1])
    rows = request_timeline(engine, arrivals, outs)
    assert [r.request_id for r in rows] == list(range(5))
    for r, n in zip(rows, news):
        assert r.count(DECODE) == n - 1                  # first token comes from prefill
        assert r.count(PREFILL) == 1                     # short prompts: one chunk each
        span = r.finish_step - r.arrival + 1
        assert r.count(WAIT) + r.count(PREFILL) + r.count(DECODE) == span
        assert r.ttft_steps == r.first_token_step - r.arrival + 1
    # two seats: request 2 waits until one of the first two (4 and 7 tokens) is done
    assert rows[2].ttft_steps == 5 and rows[2].count(WAIT) == 4


def test_chunked_prefill_first_token_is_after_the_last_chunk(model):
    engine = LLMEngine(model, num_blocks=64, block_size=4, max_num_batched_tokens=8)
    outs, arrivals = run_with_arrivals(engine, _prompts(1, [20]),
                                       SamplingParams(3, ignore_eos=True), [0])
    (r,) = request_timeline(engine, arrivals, outs)
    assert r.count(PREFILL) == 3 and r.first_token_step == 2 and r.ttft_steps == 3


def test_run_with_arrivals_rejects_bad_input(model):
    engine = LLMEngine(model)
    with pytest.raises(ValueError, match="arrival_steps"):
        run_with_arrivals(engine, [[5, 6]], None, [0, 1])
    with pytest.raises(ValueError, match="arrival_steps"):
        run_with_arrivals(engine, [[5, 6]], None, [-1])
    engine.add_request([5, 6])
    with pytest.raises(ValueError, match="fresh"):
        run_with_arrivals(engine, [[5, 6]], None, [0])


# ------------------------------------------------------------------ static batching
def test_static_batching_admits_only_when_the_batch_is_done(model):
    prompts = _prompts(7, [4, 9, 6])
    params = [SamplingParams(n, ignore_eos=True) for n in [2, 9, 4, 3, 6, 2, 5]]
    runs = {}
    for static in (False, True):
        engine = LLMEngine(model, num_blocks=64, block_size=4, max_num_seqs=3,
                           static_batching=static)
        outs = engine.run(prompts, params, use_tqdm=False)
        runs[static] = (engine, [o.output_token_ids for o in outs])
    assert runs[True][1] == runs[False][1]               # same tokens either way
    engine = runs[True][0]
    first = {}                                           # request -> step of its first prefill
    for st in engine.steps:
        for rid, _ in st.prefill:
            first.setdefault(rid, st.index)
    last = {rid: _last(engine, rid) for rid in first}
    for rid, start in first.items():                     # everyone admitted earlier is done
        assert all(last[o] < start for o, s0 in first.items() if s0 < start)
    # batches of 3: the longest (9 tokens) holds the first batch: 9 steps, then 6, then 5
    assert len(engine.steps) == 9 + 6 + 5
    assert len(runs[False][0].steps) < len(engine.steps)


def _last(engine, rid):
    return max(s.index for s in engine.steps if rid in s.decode or
               rid in [r for r, _ in s.prefill])


def test_static_batching_must_be_a_bool(model):
    with pytest.raises(ValueError, match="static_batching"):
        LLMEngine(model, static_batching=1)


# ------------------------------------------------------------------ workload
def test_mixed_workload_is_reproducible_and_fits(pretrained):
    model, tok = pretrained
    a = mixed_workload(tok, 24, seed=3)
    b = mixed_workload(tok, 24, seed=3)
    assert a[0] == b[0] and a[2] == b[2]
    prompts, params, arrivals = a
    assert len(prompts) == len(params) == len(arrivals) == 24
    assert arrivals == sorted(arrivals) and arrivals[0] == 0
    for p, sp in zip(prompts, params):
        assert 1 <= len(p) and len(p) + sp.max_new_tokens <= model.config.max_position_embeddings
        assert sp.ignore_eos
    assert all(sp.max_new_tokens >= 40 for sp in params[3::4])
    with pytest.raises(ValueError, match="num_requests"):
        mixed_workload(tok, 0)


# ------------------------------------------------------------------ timers
def test_phase_timers_return_one_positive_time_each(model):
    assert all(t > 0 for t in time_prefill(model, [1, 8], repeats=2))
    assert all(t > 0 for t in time_decode(model, [1, 8], repeats=2))
    assert all(t > 0 for t in time_recompute(model, [1, 8], repeats=2))
    assert len(time_decode_batch(model, [1, 2, 4], context=4, repeats=2)) == 3
    with pytest.raises(ValueError, match="repeats"):
        best_time(lambda: None, 0)


def test_with_context_length_changes_no_number(model):
    longer = with_context_length(model, 256)
    ids = torch.randint(4, 500, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(longer(ids), model(ids), atol=1e-6)
        assert longer(torch.randint(4, 500, (1, 200))).shape[1] == 200


# ------------------------------------------------------------------ figures and widget
def test_figures_draw(model):
    figs = [plots.phase_times_plot([1, 2], [1e-3, 2e-3], [1, 2], [1e-3, 1e-3], [2e-3, 3e-3]),
            plots.decode_batch_plot([1, 2, 4], [1e-3, 1.1e-3, 1.3e-3]),
            plots.arithmetic_intensity_plot([1, 8], [1.0, 8.0], [1, 8], [1.0, 7.0], 300.0)]
    engine = LLMEngine(model, num_blocks=32, block_size=4, max_num_seqs=2)
    outs, arr = run_with_arrivals(engine, _prompts(3, [5]), SamplingParams(3, ignore_eos=True),
                                  [0, 0, 1])
    figs += [plots.serving_timeline(request_timeline(engine, arr, outs)),
             plots.batch_composition_plot(engine.steps),
             plots.batching_comparison_plot({"continuous": engine.metrics(),
                                             "static": engine.metrics()})]
    for f in figs:
        assert isinstance(f, matplotlib.figure.Figure) and f.get_figwidth() <= 9.5
    plt.close("all")
    with pytest.raises(ValueError):
        plots.phase_times_plot([1], [1e-3, 2e-3], [1], [1e-3], [1e-3])
    with pytest.raises(ValueError, match="ridge"):
        plots.arithmetic_intensity_plot([1], [1.0], [1], [1.0], 0)
    with pytest.raises(ValueError):
        plots.serving_timeline([])


def test_serving_panel_counts_by_hand(model, capsys):
    # 4 requests, 2 seats: each pair runs 1 prefill step + 3 decode steps, one after the other
    plots.serving_panel(model, list(range(4, 40)), batch_size=4, prompt_len=8, output_len=4,
                        max_num_seqs=2, block_size=4)
    text = capsys.readouterr().out
    assert "steps: 8, 2 with prefill" in text
    assert "decode rows per step: mean 2.00, max 2" in text
    assert "KV blocks: 12 (48 slots for 48 tokens, 0 unused)" in text
    assert "12 blocks, at most 6 in use at once" in text
    with pytest.raises(ValueError, match="prompt_len"):
        plots.serving_panel(model, list(range(4, 40)), prompt_len=0)
    plt.close("all")
    w = serving_explorer(model, list(range(4, 2000)))
    assert [c.description for c in w.children[:3]] == ["requests", "seats", "block"]


def test_timeline_table_lists_every_request(model):
    from tokenflow.viz import timeline_table
    engine = LLMEngine(model, num_blocks=32, block_size=4, max_num_seqs=1)
    outs, arr = run_with_arrivals(engine, _prompts(2, [5, 7]),
                                  SamplingParams(3, ignore_eos=True), [0, 0])
    rows = request_timeline(engine, arr, outs)
    lines = timeline_table(rows, outs).splitlines()
    # one seat: request 1 waits the 3 steps of request 0, then prefills (TTFT 4 steps)
    assert lines[1].split() == ["0", "5", "3", "0", "0", "1", "2"]
    assert lines[2].split() == ["1", "7", "3", "0", "3", "4", "5"]
    assert len(timeline_table(rows, outs, seconds=True).splitlines()) == 3
    with pytest.raises(ValueError):
        timeline_table(rows, outs[:1])


def test_serving_static_tables_count_by_hand(model):
    """serving_summary_table holds serving_counts' numbers: 4 requests of 8 + 4 tokens on 2
    seats with blocks of 4 run in two waves of 1 prefill + 3 decode steps (8 steps), 3 blocks
    each with no slot left over, 6 blocks busy at once; the explorer embeds every setting."""
    from tokenflow.viz import serving_static, serving_summary_table
    ids = list(range(4, 40))
    t = serving_summary_table(plots.serving_counts(model, ids, 4, 8, 4, 2, 4))
    assert dict(t.rows)["engine steps"] == 8 and dict(t.rows)["steps with a prefill"] == 2
    assert dict(t.rows)["KV slots (unused)"] == "48 (0)"
    assert dict(t.rows)["blocks in use at the busiest step"] == 6
    ex = serving_static(model, ids, controls={"requests": [2, 4], "seats": [2, 4],
                                              "block": [4]}, prompt_len=8, output_len=4)
    assert len(ex.fragments) == 4


def test_timeline_view_has_the_rows_of_timeline_table(model):
    from tokenflow.viz import timeline_table, timeline_view
    engine = LLMEngine(model, num_blocks=32, block_size=4, max_num_seqs=1)
    outs, arr = run_with_arrivals(engine, _prompts(2, [5, 7]),
                                  SamplingParams(3, ignore_eos=True), [0, 0])
    rows = request_timeline(engine, arr, outs)
    view = timeline_view(rows, outs)
    text = timeline_table(rows, outs).splitlines()
    assert [[str(c) for c in r] for r in view.rows] == [line.split() for line in text[1:]]
    assert view.rows[1] == [1, 7, 3, 0, 3, 4, 5]      # waits 3 steps behind request 0
