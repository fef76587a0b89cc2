"""Chapter 05 as tables: served workloads, engine steps, per-request timelines and runs side
by side, in engine steps (the same on every machine) or in measured milliseconds.

Part of :mod:`tokenflow.viz`, the only package that draws; nothing below it imports it.
"""
from __future__ import annotations

from .lang import tr
from .serving import _lengths_text

_IMPORTED = set(globals())          # the names above are imported, not defined here


def _timeline_rows(timelines, outputs, seconds: bool):
    """Headers and rows shared by :func:`timeline_table` and :func:`timeline_view`."""
    out = {o.request_id: o for o in outputs}
    if {r.request_id for r in timelines} - set(out):
        raise ValueError("timelines and outputs must describe the same requests")
    ms = lambda v: None if v is None else v * 1e3                      # noqa: E731
    if seconds:
        headers = ["id", "prompt", "new", "TTFT ms", "TPOT ms", "e2e ms"]
    else:
        headers = ["id", "prompt", "new", "arrives", "waits", "TTFT steps", "done at"]
    rows = []
    for r in timelines:
        o = out[r.request_id]
        head = [r.request_id, len(o.prompt_token_ids), len(o.output_token_ids)]
        rows.append(head + ([ms(o.ttft), ms(o.tpot), ms(o.e2e_latency)] if seconds else
                            [r.arrival, r.count("wait"), r.ttft_steps, r.finish_step]))
    return headers, rows


def timeline_table(timelines, outputs, seconds: bool = False) -> str:
    """One line per request of a served workload: prompt and generated tokens, then either
    step counts from its :class:`tokenflow.serving.RequestTimeline` (arrival step, steps
    waiting, time to first token in steps, last step), or, with ``seconds=True``, the
    measured TTFT, TPOT and end-to-end latency of its ``RequestOutput`` in ms (these vary
    from run to run). Plain text; :func:`timeline_view` gives the same rows as a table.

    Raises:
        ValueError: if the two lists do not hold the same request ids.
    """
    headers, rows = _timeline_rows(timelines, outputs, seconds)
    widths = [max(len(h), 4) if i else 3 for i, h in enumerate(headers)]
    cell = lambda v: "-" if v is None else f"{v:.1f}" if isinstance(v, float) else str(v)  # noqa
    return "\n".join(" ".join(f"{cell(v):>{w}}" for v, w in zip(r, widths))
                     for r in [headers] + rows)


def timeline_view(timelines, outputs, seconds: bool = False):
    """:func:`timeline_table`'s rows as a :class:`tokenflow.viz.Table` (HTML in the book),
    times in ms with 1 decimal.

    Raises:
        ValueError: if the two lists do not hold the same request ids.
    """
    from .fmt import Table
    headers, rows = _timeline_rows(timelines, outputs, seconds)
    title = ("measured per request (ms; they change from run to run)" if seconds else
             "per request, in engine steps (the same on every machine)")
    return Table(rows, headers, digits=1, title=title)


def serving_summary_table(counts: dict):
    """The counts of :func:`tokenflow.viz.serving_counts` as a two-column
    :class:`tokenflow.viz.Table` (what a served batch took: steps, decode rows, KV blocks)."""
    from .fmt import Table
    c = counts
    rows = [("engine steps", c["steps"]), ("steps with a prefill", c["prefill_steps"]),
            ("decode rows per step, mean", round(c["mean_rows"], 2)),
            ("decode rows per step, max", c["max_rows"]),
            ("KV blocks", sum(c["blocks"])),
            ("KV slots (unused)", f"{sum(c['slots'])} ({c['unused_slots']})"),
            ("blocks in the pool", c["pool_blocks"]),
            ("blocks in use at the busiest step", c["peak_blocks"])]
    return Table(rows, ["", "count"], align="<>",
                 title=f"{_lengths_text(c)}, seats: {c['max_num_seqs']}, "
                       f"block size {c['block_size']}")


def workload_summary(tokenizer, prompts, params, arrival_steps, examples=(0, 1, 3),
                     tail_chars: int = 30, max_arrivals: int = 12) -> str:
    """Text describing a served workload (:func:`tokenflow.serving.mixed_workload`): for each
    request index in ``examples``, a line with its prompt tokens, its ``max_new_tokens`` and
    the step it arrives at, then ``   ...`` and the last ``tail_chars`` characters of its
    decoded prompt; then the range and total of the prompt and new tokens over all requests,
    and the first ``max_arrivals`` arrival steps (`` ...`` after them when there are more).

    Args:
        tokenizer: anything with ``decode(ids) -> str``.
        prompts: one list of token ids per request.
        params: one :class:`tokenflow.serving.SamplingParams` per request.
        arrival_steps: one int per request, the engine step it arrives before.
        examples: indices of the requests to show one by one.
        tail_chars: characters of each example prompt's end to show (>= 1).
        max_arrivals: arrival steps to list (>= 1).

    Raises:
        ValueError: empty or mismatched lists, an example index out of range, or
            ``tail_chars`` / ``max_arrivals`` < 1.
    """
    n = len(prompts)
    if n == 0 or len(params) != n or len(arrival_steps) != n:
        raise ValueError(f"prompts, params and arrival_steps must be non-empty and of one "
                         f"length, got {n}, {len(params)}, {len(arrival_steps)}")
    if any(not -n <= i < n for i in examples):
        raise ValueError(f"examples must be request indices in [0, {n - 1}], got {examples!r}")
    if tail_chars < 1 or max_arrivals < 1:
        raise ValueError(f"tail_chars and max_arrivals must be >= 1, got {tail_chars}, "
                         f"{max_arrivals}")
    lines = []
    for i in examples:
        lines.append(tr(f"request {i}: {len(prompts[i])} prompt tokens, "
                        f"{params[i].max_new_tokens} new, arrives at step {arrival_steps[i]}"))
        lines.append(f"   ...{tokenizer.decode(prompts[i])[-tail_chars:]}")
    lens, news = [len(p) for p in prompts], [p.max_new_tokens for p in params]
    lines.append(tr(f"prompt tokens {min(lens)}-{max(lens)} (total {sum(lens)}), new tokens "
                    f"{min(news)}-{max(news)} (total {sum(news)})"))
    more = " ..." if n > max_arrivals else ""
    lines.append(tr(f"arrival steps {arrival_steps[0]}-{arrival_steps[-1]}: "
                    f"{list(arrival_steps[:max_arrivals])}{more}"))
    return "\n".join(lines)


def step_table(steps, title: str | None = None):
    """Engine steps as a :class:`tokenflow.viz.Table`, one row per
    :class:`tokenflow.serving.StepRecord`: its index, its prompt chunks as
    ``request:tokens`` (comma-separated; ``-`` when it has none), its decode rows, the tokens
    it scheduled and the KV blocks free after it.

    Raises:
        ValueError: if ``steps`` is empty.
    """
    from .fmt import Table
    if not steps:
        raise ValueError("steps must be a non-empty list of StepRecord")
    rows = [[s.index, ", ".join(f"{rid}:{n}" for rid, n in s.prefill) or "-", len(s.decode),
             s.num_tokens, s.num_free_blocks] for s in steps]
    return Table(rows, ["step", "prefill (request: tokens)", "decode rows", "tokens",
                        "free blocks"], title=title)


def batching_table(runs: dict):
    """Counts of served runs side by side (steps, not seconds: the same on every machine), as
    a :class:`tokenflow.viz.Table` with one row per run: engine steps, generated tokens per
    step, decode rows per step (over the steps that decode), and the mean time to first
    token in steps (over the requests that produced one; empty if none did).

    Args:
        runs: ``{name: (engine, timelines)}``: an :class:`tokenflow.serving.LLMEngine` that
            has served its requests and the :func:`tokenflow.serving.request_timeline` of
            that run.

    Raises:
        ValueError: if ``runs`` is empty, or a run has no steps or no decode step.
    """
    from .fmt import Table
    if not runs:
        raise ValueError("runs must map at least one name to (engine, timelines)")
    rows = []
    for name, (eng, timelines) in runs.items():
        dec = [len(s.decode) for s in eng.steps if s.decode]
        if not dec:
            raise ValueError(f"run {name!r} has no decode step")
        gen = sum(len(o.output_token_ids) for o in eng.outputs.values())
        ttft = [r.ttft_steps for r in timelines if r.ttft_steps is not None]
        rows.append([name, len(eng.steps), gen / len(eng.steps), sum(dec) / len(dec),
                     sum(ttft) / len(ttft) if ttft else None])
    return Table(rows, ["batching", "steps", "tokens per step", "decode rows per step",
                        "mean TTFT (steps)"], digits=[0, 0, 2, 2, 1])


def batching_times_table(results: dict):
    """Measured speed of served runs (``results``: ``{name: engine.metrics()}``, as for
    :func:`batching_comparison_plot`) as a :class:`tokenflow.viz.Table`: throughput in
    generated tokens/s (no decimals), mean time to first token and mean end-to-end latency
    in ms (1 decimal; empty when the metric is None).

    Raises:
        ValueError: if ``results`` is empty or a metrics dict lacks ``throughput_tok_s``,
            ``mean_ttft_s`` or ``mean_e2e_s``.
    """
    from .fmt import Table
    if not results:
        raise ValueError("results must map at least one name to engine metrics")
    keys = ("throughput_tok_s", "mean_ttft_s", "mean_e2e_s")
    for name, r in results.items():
        missing = [k for k in keys if k not in r]
        if missing:
            raise ValueError(f"results[{name!r}] lacks {missing}: pass engine.metrics()")
    def ms(seconds):
        return None if seconds is None else seconds * 1e3
    return Table([[n, r["throughput_tok_s"], ms(r["mean_ttft_s"]), ms(r["mean_e2e_s"])]
                  for n, r in results.items()],
                 ["batching", "tokens/s", "mean TTFT ms", "mean end-to-end ms"],
                 digits=[0, 0, 1, 1])


# what this module defines (every public name after the imports)
__all__ = [n for n in globals() if not n.startswith("_") and n not in _IMPORTED]
