"""Chapter 05: prefill, decode and serving. Phase timings, decode batching, arithmetic
intensity, the engine's timeline and batch composition, with the serving explorer; its tables
are in :mod:`tokenflow.viz.serving_tables`.

Part of :mod:`tokenflow.viz`, the only package that draws; nothing below it imports it.
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from .lang import tr
from .style import column_figsize, MIN_FONT_PT
from tokenflow.analysis.trace import COLORS

_IMPORTED = set(globals())          # the names above are imported, not defined here


# --------------------------------------------------------------------- chapter 05 (F5)
_WAIT = "#c8c8c8"           # grey: a request waiting (queued, or not scheduled this step)


def _same_len(**lists) -> None:
    n = {len(v) for v in lists.values()}
    if len(n) != 1 or 0 in n:
        raise ValueError(f"{', '.join(lists)} must be non-empty and of the same length")


def _ms_panel(ax, xs, series, xlabel: str, title: str) -> None:
    """Draw ``series`` (``(seconds, style, colour, label)``) in ms against ``xs`` on ``ax``."""
    for seconds, style, colour, label in series:
        ax.plot(xs, [t * 1e3 for t in seconds], style, color=colour, label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("ms")
    ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=MIN_FONT_PT)


def phase_times_plot(lengths, prefill_s, contexts, cached_s, recompute_s, title: str = ""):
    """Two panels, times in ms: prefill time against prompt length (blue), and the time of
    the next token against the context length, one decode step with the KV cache (green)
    against running the whole sequence again without it (grey).

    Raises:
        ValueError: on empty lists or lists of different lengths.
    """
    _same_len(lengths=lengths, prefill_s=prefill_s)
    _same_len(contexts=contexts, cached_s=cached_s, recompute_s=recompute_s)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=column_figsize(9.5, 3.4))
    _ms_panel(a1, lengths, [(prefill_s, "o-", COLORS["hidden"], "prefill [1, S]")],
              "prompt length S (tokens)", "prefill: one pass over the prompt")
    _ms_panel(a2, contexts, [(recompute_s, "s--", "#777777", "no cache: recompute [1, n+1]"),
                             (cached_s, "o-", COLORS["token"], "decode step [1, 1] + cache")],
              "context length n (tokens already seen)", "next token: with vs without the KV cache")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def decode_batch_plot(batch_sizes, step_s, title: str = ""):
    """Decode step time (ms, left) and generated tokens per second (``B / step time``,
    right, green) against the batch size ``B``.

    Raises:
        ValueError: on empty lists or lists of different lengths.
    """
    _same_len(batch_sizes=batch_sizes, step_s=step_s)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=column_figsize(9.5, 3.4))
    a1.plot(batch_sizes, [t * 1e3 for t in step_s], "o-", color=COLORS["hidden"])
    a1.set_ylim(bottom=0)
    a1.set_ylabel("ms per decode step")
    a1.set_title("one step for the whole batch", fontsize=10)
    a2.plot(batch_sizes, [b / t for b, t in zip(batch_sizes, step_s)], "o-",
            color=COLORS["token"])
    a2.set_ylim(bottom=0)
    a2.set_ylabel("tokens / s")
    a2.set_title("throughput: B tokens per step", fontsize=10)
    for a in (a1, a2):
        a.set_xscale("log", base=2)
        a.set_xticks(batch_sizes, [str(b) for b in batch_sizes])
        a.set_xlabel("batch size B (sequences decoding together)")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def arithmetic_intensity_plot(prefill_tokens, prefill_ai, decode_batch, decode_ai,
                              ridge: float, ridge_label: str = "ridge point", title: str = ""):
    """Arithmetic intensity (FLOPs per byte moved) on log-log axes: prefill against the
    prompt length (blue), decode against the batch size (green), and the accelerator's
    ridge point (peak FLOP/s / memory bandwidth, dashed): below it a pass waits on memory
    (memory-bound), above it on arithmetic (compute-bound).

    Raises:
        ValueError: on empty or mismatched lists, or ``ridge <= 0``.
    """
    _same_len(prefill_tokens=prefill_tokens, prefill_ai=prefill_ai)
    _same_len(decode_batch=decode_batch, decode_ai=decode_ai)
    if ridge <= 0:
        raise ValueError(f"ridge must be > 0, got {ridge}")
    fig, ax = plt.subplots(figsize=column_figsize(7.5, 3.6))
    ax.plot(prefill_tokens, prefill_ai, "o-", color=COLORS["hidden"],
            label="prefill: S tokens of one prompt")
    ax.plot(decode_batch, decode_ai, "s-", color=COLORS["token"],
            label="decode: 1 token of each of B sequences")
    ax.axhline(ridge, color="black", ls="--", lw=1)
    ax.text(min(min(prefill_tokens), min(decode_batch)), ridge * 1.15, ridge_label,
            fontsize=MIN_FONT_PT)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("tokens per forward pass (S for prefill, B for decode)")
    ax.set_ylabel("FLOPs per byte")
    ax.legend(fontsize=MIN_FONT_PT, loc="lower right")
    ax.set_title(title or "arithmetic intensity of the two phases", fontsize=10)
    fig.tight_layout()
    return fig


def serving_timeline(timelines, title: str = "", max_steps: int | None = None):
    """One row per request, one cell per engine step: prefill (blue), decode (green),
    waiting (grey); blank before arrival and after the last token. ``timelines``: the
    :class:`tokenflow.serving.RequestTimeline` list of one run. A black tick marks each
    request's first token.

    Raises:
        ValueError: if ``timelines`` is empty.
    """
    if not timelines:
        raise ValueError("timelines must be a non-empty list of RequestTimeline")
    n = len(timelines)
    fig, ax = plt.subplots(figsize=column_figsize(9.5, 0.22 * n + 1.6))
    _draw_timeline(ax, timelines, max_steps)
    ax.set_title(title or "requests over engine steps", fontsize=10)
    fig.tight_layout()
    return fig


def _draw_timeline(ax, timelines, max_steps: int | None = None) -> None:
    """:func:`serving_timeline`'s rows drawn on ``ax``."""
    from matplotlib.patches import Patch
    colour = {"prefill": COLORS["hidden"], "decode": COLORS["token"], "wait": _WAIT}
    n = len(timelines)
    last = 0
    for row, r in enumerate(timelines):
        for state in colour:
            cells = [(i, 1) for i, s in r.states.items() if s == state]
            ax.broken_barh(cells, (row - 0.4, 0.8), color=colour[state], lw=0)
        if r.first_token_step is not None:
            ax.plot([r.first_token_step + 1] * 2, [row - 0.45, row + 0.45], color="black", lw=1)
        last = max([last] + [i + 1 for i in r.states])
    ax.set_xlim(0, max_steps or last)
    ax.set_ylim(n - 0.5, -0.5)
    ax.set_yticks(range(n), [str(r.request_id) for r in timelines], fontsize=MIN_FONT_PT)
    ax.set_ylabel("request")
    ax.set_xlabel("engine step")
    ax.legend(handles=[Patch(color=c, label=s) for s, c in colour.items()], fontsize=MIN_FONT_PT,
              loc="upper right", ncol=3)


def batch_composition_plot(steps, title: str = ""):
    """What each engine step computed, from its :class:`tokenflow.serving.StepRecord` list:
    top, requests in the step (prefill rows blue, decode rows green, stacked); bottom,
    tokens computed (prompt tokens blue, decode tokens green).

    Raises:
        ValueError: if ``steps`` is empty.
    """
    if not steps:
        raise ValueError("steps must be a non-empty list of StepRecord")
    x = [s.index for s in steps]
    n_pre = [len(s.prefill) for s in steps]
    n_dec = [len(s.decode) for s in steps]
    t_pre = [sum(n for _, n in s.prefill) for s in steps]
    fig, (a1, a2) = plt.subplots(2, 1, figsize=column_figsize(9.5, 4.4), sharex=True)
    for ax, pre, dec, what in ((a1, n_pre, n_dec, "requests"), (a2, t_pre, n_dec, "tokens")):
        ax.bar(x, pre, width=1.0, color=COLORS["hidden"], label=f"prefill {what}")
        ax.bar(x, dec, width=1.0, bottom=pre, color=COLORS["token"], label=f"decode {what}")
        ax.set_ylabel(f"{what} in step")
        ax.legend(fontsize=MIN_FONT_PT, loc="upper right")
    a2.set_xlabel("engine step")
    a1.set_title(title or "batch composition per step", fontsize=10)
    fig.tight_layout()
    return fig


def batching_comparison_plot(results: dict, title: str = ""):
    """Bars per scheduling mode (``results``: ``{name: engine.metrics()}``): throughput
    (generated tokens/s), mean time to first token and mean end-to-end latency (ms).

    Raises:
        ValueError: if ``results`` is empty.
    """
    if not results:
        raise ValueError("results must map at least one mode name to engine metrics")
    names = list(results)
    panels = [("throughput_tok_s", "tokens / s", 1), ("mean_ttft_s", "mean TTFT (ms)", 1e3),
              ("mean_e2e_s", "mean end-to-end (ms)", 1e3)]
    colours = [COLORS["token"], "#777777", COLORS["hidden"], COLORS["moe"]]
    fig, axes = plt.subplots(1, 3, figsize=column_figsize(9.5, 3.0))
    for ax, (key, label, scale) in zip(axes, panels):
        vals = [results[n][key] * scale for n in names]
        ax.bar(names, vals, color=colours[:len(names)])
        for i, v in enumerate(vals):
            ax.text(i, v, f"{v:,.0f}", ha="center", va="bottom", fontsize=MIN_FONT_PT)
        ax.set_ylim(0, 1.2 * max(vals))
        ax.set_title(label, fontsize=10)
        ax.tick_params(axis="x", labelsize=MIN_FONT_PT)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def serving_counts(model, token_ids: list[int], batch_size: int = 8, prompt_len: int = 16,
                   output_len: int = 16, max_num_seqs: int = 4, block_size: int = 16,
                   length_step: int = 0) -> dict:
    """Serve ``batch_size`` requests (consecutive slices of ``token_ids``, so no two share a
    prefix) of ``output_len`` generated tokens each, all arriving at once, with
    :class:`tokenflow.serving.LLMEngine`, and count what happened (steps and KV blocks; no
    times, so the counts are the same on every machine). Request ``i`` has
    ``prompt_len - (i % 4) * length_step`` prompt tokens (at least 1): with a ``length_step``
    the lengths differ and a block size that does not divide them leaves slots unused.

    Returns:
        dict: ``steps``, ``prefill_steps``, ``mean_rows`` / ``max_rows`` (decode rows per
        step with decode); per request the lists ``tokens`` (prompt + output), ``blocks`` and
        ``slots`` (``blocks * block_size``); ``unused_slots`` (their total minus the tokens'),
        ``pool_blocks``, ``peak_blocks`` (most in use at once), ``timelines``
        (:class:`tokenflow.serving.RequestTimeline` list) and the arguments.

    Raises:
        ValueError: a setting outside its range (the message names it), or ``token_ids``
            too short or ``prompt_len + output_len`` past the model's positions.
    """
    from tokenflow.serving import (
        LLMEngine,
        SamplingParams,
        request_timeline,
        run_with_arrivals,
    )
    for name, v, lo in (("batch_size", batch_size, 1), ("prompt_len", prompt_len, 1),
                        ("output_len", output_len, 1), ("max_num_seqs", max_num_seqs, 1),
                        ("block_size", block_size, 1), ("length_step", length_step, 0)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")
    if prompt_len + output_len > model.config.max_position_embeddings:
        raise ValueError(f"prompt_len + output_len must be <= max_position_embeddings="
                         f"{model.config.max_position_embeddings}, "
                         f"got {prompt_len + output_len}")
    if len(token_ids) < batch_size * prompt_len:
        raise ValueError(f"token_ids must hold batch_size * prompt_len = "
                         f"{batch_size * prompt_len} ids, got {len(token_ids)}")
    lens = [max(1, prompt_len - (i % 4) * length_step) for i in range(batch_size)]
    tokens = [n + output_len for n in lens]
    blocks = [-(-t // block_size) for t in tokens]
    engine = LLMEngine(model, num_blocks=sum(blocks), block_size=block_size,
                       max_num_seqs=max_num_seqs, max_num_batched_tokens=1024,
                       enable_prefix_caching=False)
    prompts = [list(token_ids[i * prompt_len:i * prompt_len + n]) for i, n in enumerate(lens)]
    _, arrivals = run_with_arrivals(engine, prompts, SamplingParams(output_len, ignore_eos=True),
                                    [0] * batch_size)
    steps = engine.steps
    dec = [len(s.decode) for s in steps if s.decode]
    return dict(batch_size=batch_size, prompt_len=prompt_len, output_len=output_len,
                max_num_seqs=max_num_seqs, block_size=block_size, length_step=length_step,
                steps=len(steps), prefill_steps=sum(bool(s.prefill) for s in steps),
                mean_rows=sum(dec) / max(len(dec), 1), max_rows=max(dec, default=0),
                tokens=tokens, blocks=blocks, slots=[b * block_size for b in blocks],
                unused_slots=sum(blocks) * block_size - sum(tokens),
                pool_blocks=engine.block_manager.num_blocks,
                peak_blocks=engine.block_manager.num_blocks
                - min(s.num_free_blocks for s in steps),
                timelines=request_timeline(engine, arrivals))


def _lengths_text(c: dict) -> str:
    lens = sorted({t - c["output_len"] for t in c["tokens"]}, reverse=True)
    return (f"{c['batch_size']} requests x ({'/'.join(map(str, lens))} prompt + "
            f"{c['output_len']} new tokens)")


def serving_panel(model, token_ids: list[int], batch_size: int = 8, prompt_len: int = 16,
                  output_len: int = 16, max_num_seqs: int = 4, block_size: int = 16,
                  length_step: int = 0):
    """Print the step and KV-block counts of :func:`serving_counts` (same arguments) and
    draw :func:`serving_view`. Counts only (no times), so the printed text is the same
    on every machine.

    Raises:
        ValueError: as :func:`serving_counts`.
    """
    c = serving_counts(model, token_ids, batch_size, prompt_len, output_len, max_num_seqs,
                       block_size, length_step)
    print(f"{_lengths_text(c)}, max_num_seqs={max_num_seqs}, block_size={block_size}")
    print(f"  steps: {c['steps']}, {c['prefill_steps']} with prefill; decode rows per step: "
          f"mean {c['mean_rows']:.2f}, max {c['max_rows']}")
    print(f"  KV blocks: {sum(c['blocks'])} ({sum(c['slots'])} slots for {sum(c['tokens'])} "
          f"tokens, {c['unused_slots']} unused)")
    print(f"  pool: {c['pool_blocks']} blocks, at most {c['peak_blocks']} in use at once")
    return serving_view(c)


def serving_view(counts: dict):
    """What :func:`serving_counts` served, as one figure: top, the requests over the engine
    steps (:func:`serving_timeline`'s rows); bottom, each request's KV slots, those its
    tokens fill (green) and those its last block leaves unused (grey), with the totals."""
    c = counts
    n = c["batch_size"]
    fig, (a1, a2) = plt.subplots(2, 1, figsize=column_figsize(9.5, 0.12 * n + 3.6),
                                 gridspec_kw={"height_ratios": [0.4 + 0.06 * n, 1]})
    _draw_timeline(a1, c["timelines"])
    a1.set_title(f"{_lengths_text(c)}: {c['steps']} steps on {c['max_num_seqs']} seats",
                 fontsize=10)
    x = range(n)
    a2.bar(x, c["tokens"], color=COLORS["token"], label="slots holding a token")
    a2.bar(x, [s - t for s, t in zip(c["slots"], c["tokens"])], bottom=c["tokens"],
           color=_WAIT, label="unused slots of the last block")
    a2.set_xticks(list(x), [str(t.request_id) for t in c["timelines"]], fontsize=MIN_FONT_PT)
    a2.set_xlabel("request")
    a2.set_ylabel("KV slots")
    a2.set_ylim(0, 1.35 * max(c["slots"]))
    a2.legend(fontsize=MIN_FONT_PT, loc="upper right", ncol=2)
    a2.set_title(f"block size {c['block_size']}: {sum(c['blocks'])} blocks, "
                 f"{c['unused_slots']} of {sum(c['slots'])} slots unused", fontsize=10)
    fig.tight_layout()
    return fig


SERVING_CONTROLS = {"requests": [4, 8, 16], "seats": [1, 2, 4], "block": [4, 16]}
"""The chapter's serving explorer grid: requests arriving together, ``max_num_seqs``, block
size."""


def serving_explorer(model, token_ids: list[int], controls: dict | None = None,
                     prompt_len: int = 16, output_len: int = 9, length_step: int = 3,
                     default: dict | None = None, live: bool = True):
    """:func:`serving_view` of :func:`serving_counts` (the timeline of the requests over the
    engine steps and each request's KV slots, filled and unused) for one setting of
    :data:`SERVING_CONTROLS` (the requests arriving together, the seats ``max_num_seqs`` and
    the KV block size; ``controls`` replaces it): request ``i`` has
    ``prompt_len - (i % 4) * length_step`` prompt tokens and ``output_len`` new ones, so a
    block size that does not divide the lengths leaves slots unused. Through
    :func:`tokenflow.viz.explore`; starts at 8 requests, 4 seats, blocks of 16 where the grid
    has them. Raises as :func:`tokenflow.viz.serving_counts`."""
    from .static import default_in, explore

    def show(requests, seats, block):
        return serving_view(serving_counts(model, token_ids, requests, prompt_len, output_len,
                                           seats, block, length_step))
    controls = controls or SERVING_CONTROLS
    return explore(show, controls, live=live,
                   default=default or default_in(controls, {"requests": 8, "seats": 4,
                                                            "block": 16}),
                   title=f"serving: prompts of {prompt_len} tokens and shorter, "
                         f"{output_len} new tokens each", live_below=True)


def serving_static(*args, **kw):
    """:func:`serving_explorer` precomputed (``live=False``): works without a kernel."""
    return serving_explorer(*args, live=False, **kw)


# --------------------------------------------------------------------- chapter 08: chunks
def chunked_prefill_time_plot(runs: dict, long_id, decode_id=0, title: str = ""):
    """Chunked prefill on a time axis: one lane per run (``runs``: ``{budget: engine}``, the
    engines that served the same requests), each engine step a bar as long as its measured
    time, laid end to end from the first step: blue when it carries a prompt chunk of request
    ``long_id``, green when it only decodes. Above each lane a tick marks every token request
    ``decode_id`` got (a decoding request gets one per step), so a gap between ticks is a
    stall in its stream; the lane's label gives the longest step that decoded. A black bar
    marks ``long_id``'s first token.

    Raises:
        ValueError: if ``runs`` is empty or a run has no step.
    """
    from matplotlib.patches import Patch
    if not runs:
        raise ValueError("runs must map at least one budget to an engine")
    fig, ax = plt.subplots(figsize=column_figsize(9.5, 0.9 * len(runs) + 1.5))
    labels = []
    for row, (budget, eng) in enumerate(runs.items()):
        if not eng.steps:
            raise ValueError(f"run {budget!r} has no step")
        t, first, ticks = 0.0, None, []
        for s in eng.steps:
            ms = s.seconds * 1e3
            chunk = any(rid == long_id for rid, _ in s.prefill)
            ax.broken_barh([(t, ms)], (row - 0.3, 0.6), lw=0,
                           facecolor=COLORS["hidden"] if chunk else COLORS["token"])
            if first is None and long_id in s.sampled:
                first = t + ms
            if decode_id in s.sampled:
                ticks.append(t + ms)
            t += ms
        ax.plot(ticks, [row - 0.4] * len(ticks), "|", color="black", ms=7, mew=1)
        if first is not None:
            ax.plot([first] * 2, [row - 0.32, row + 0.32], color="black", lw=2.5)
        worst = max((s.seconds for s in eng.steps if s.decode), default=0.0) * 1e3
        labels.append(f"budget {budget:,}\nlongest decode step {worst:.0f} ms")
    ax.set_yticks(range(len(runs)), labels, fontsize=MIN_FONT_PT)
    ax.set_ylim(len(runs) + 0.7, -0.7)              # room for the legend below the lanes
    ax.set_xlabel("time since the first step (ms, this CPU)")
    ax.legend(handles=[Patch(color=COLORS["hidden"], label=f"step with a chunk of request "
                             f"{long_id}'s prompt"),
                       Patch(color=COLORS["token"], label="decode-only step"),
                       plt.Line2D([], [], color="black", marker="|", ls="", ms=7,
                                  label=f"a token of request {decode_id}")],
              fontsize=MIN_FONT_PT, loc="lower right", ncol=2)
    ax.set_title(title or "engine steps on a time axis: the decode stall", fontsize=10)
    fig.tight_layout()
    return fig


def chunked_prefill_sentence(runs: dict, long_id, baseline) -> str:
    """One sentence comparing measured runs against the ``baseline`` budget (``runs``:
    ``{budget: engine}``): per budget, whether ``long_id``'s first token came sooner or later
    in milliseconds and by how much, and the longest decode step, so that prose comparing the
    runs says what this run measured.

    Raises:
        ValueError: if ``baseline`` is not a key of ``runs`` or ``long_id`` got no token.
    """
    if baseline not in runs:
        raise ValueError(f"baseline must be one of {list(runs)}, got {baseline!r}")

    def ttft(eng):
        o = eng.outputs.get(long_id)
        if o is None or o.ttft is None:
            raise ValueError(f"request {long_id!r} got no first token in every run")
        return o.ttft * 1e3

    def worst(eng):
        return max((s.seconds for s in eng.steps if s.decode), default=0.0) * 1e3
    base = runs[baseline]
    parts = []
    for budget, eng in runs.items():
        if budget == baseline:
            continue
        d = ttft(eng) - ttft(base)
        word = "sooner" if d < 0 else "later"
        parts.append(tr(f"with budget {budget:,} it came {abs(d):.1f} ms {word} "
                        f"({ttft(eng):.1f} ms) and the longest decode step took "
                        f"{worst(eng):.0f} ms"))
    return tr(f"Measured in this run: without chunking (budget {baseline:,}) request "
              f"{long_id}'s first token came {ttft(base):.1f} ms after its arrival and the "
              f"longest decode step took {worst(base):.0f} ms; " + tr("; ").join(parts) + ".")


# what this module defines (every public name after the imports)
__all__ = [n for n in globals() if not n.startswith("_") and n not in _IMPORTED]
