"""Chapter 05's packed serving step: one step padded vs packed, whole runs padded vs packed,
preemptions marked.

* :func:`packed_step_figure`: one engine step two ways. Left, the ``[B, S]`` view: every chunk a
  row of ``input_ids [B, S_max]``, short rows left-padded (what the engine computed before
  packing). Right, the packed step: the same tokens end to end, ``input_ids [T]``, with the
  ``cu_seqlens_q`` boundaries; decode rows first, as the runner lays them out
  (:func:`tokenflow.serving.runner.prepare_packed`).
* :func:`mark_preemptions`: red crosses on a request timeline (``serving_timeline``) at the
  steps where a request lost its blocks; :func:`preemption_report` says the same in words.
* :func:`packing_table` / :func:`packing_summary`: the same workloads served padded and
  packed, positions computed and time, as a table and as one paragraph.

Part of :mod:`tokenflow.viz`, the only package that draws; nothing below it imports it.
matplotlib is imported when a figure is drawn.
"""
from __future__ import annotations

from .lang import tr
from .style import column_figsize, MIN_FONT_PT, text_on
from tokenflow.analysis.trace import COLORS

_IMPORTED = set(globals())          # the names above are imported, not defined here

_PAD = "#e6e6e6"            # light grey: a padded position
_PREEMPT = "#d62728"        # red: a preemption


def step_layout(step) -> list[tuple[object, int, str]]:
    """The chunks of one :class:`~tokenflow.serving.StepRecord` in the packed order: decode
    rows first, then prompt chunks, as ``(request_id, tokens, "decode" | "prefill")``."""
    return ([(rid, 1, "decode") for rid in step.decode] +
            [(rid, n, "prefill") for rid, n in step.prefill])


def packed_step_figure(step, title: str = ""):
    """One engine step padded (left, ``[B, S_max]``) and packed (right, ``[T]``).

    Args:
        step: a :class:`~tokenflow.serving.StepRecord` with at least one chunk.
        title: figure title (default: the step index).

    Returns:
        the matplotlib Figure.

    Raises:
        ValueError: a step without chunks.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    chunks = step_layout(step)
    if not chunks:
        raise ValueError("step must hold at least one chunk (prefill or decode)")
    colour = {"prefill": COLORS["hidden"], "decode": COLORS["token"]}
    B, S, T = len(chunks), max(n for _, n, _ in chunks), sum(n for _, n, _ in chunks)
    fig, (left, right) = plt.subplots(1, 2, figsize=column_figsize(10, 0.3 * B + 2.2),
                                      gridspec_kw=dict(width_ratios=[S, T]))
    for row, (rid, n, kind) in enumerate(chunks):               # [B, S_max], left-padded
        left.broken_barh([(0, S - n)], (row - 0.4, 0.8), color=_PAD, lw=0)
        left.broken_barh([(S - n, n)], (row - 0.4, 0.8), color=colour[kind], lw=0)
    left.set_ylim(B - 0.5, -0.5)
    left.set_yticks(range(B), [f"req {rid}" for rid, _, _ in chunks], fontsize=MIN_FONT_PT)
    left.set_xlim(0, S)
    left.set_xlabel("position in the row (S)")
    left.set_title(f"padded: input_ids [B={B}, S_max={S}]\n{B * S} positions for {T} tokens",
                   fontsize=MIN_FONT_PT)
    cu = [0]
    for rid, n, kind in chunks:                                  # [T], end to end
        right.broken_barh([(cu[-1], n)], (-0.4, 0.8), color=colour[kind], ec="white", lw=0.5)
        if n >= 0.06 * T:                                        # wide enough for its id
            right.text(cu[-1] + n / 2, 0, f"req {rid}", ha="center", va="center",
                       color=text_on(colour[kind]), fontsize=MIN_FONT_PT)
        cu.append(cu[-1] + n)
    right.set_ylim(-1.2, 0.6)
    right.set_yticks([])
    right.set_xlim(0, T)
    right.set_xticks(cu[:1] + cu[-2:] if len(cu) > 8 else cu)
    right.tick_params(labelsize=MIN_FONT_PT)
    right.set_xlabel("token index in the step (T); ticks: cu_seqlens_q")
    shown = ", ".join(map(str, cu)) if len(cu) <= 12 else \
        ", ".join(map(str, cu[:6])) + ", ..., " + str(cu[-1])
    right.set_title(f"packed: input_ids [T={T}]\n{T} positions, cu_seqlens_q = [{shown}]",
                    fontsize=MIN_FONT_PT)
    right.legend(handles=[Patch(color=colour["prefill"], label="prompt chunk"),
                          Patch(color=colour["decode"], label="decode row"),
                          Patch(color=_PAD, label="padding")],
                 loc="lower center", ncol=3, fontsize=MIN_FONT_PT, frameon=False)
    fig.suptitle(title or f"engine step {step.index}", fontsize=10)
    fig.tight_layout()
    return fig


def mark_preemptions(fig, timelines, steps) -> int:
    """Draw a red cross on ``fig`` (a ``serving_timeline`` of ``timelines``) at each step
    that preempted a request, in that request's row; the recompute shows after it as
    prefill again. Returns the number of crosses drawn.

    Args:
        fig: the Figure ``serving_timeline(timelines)`` returned.
        timelines: its :class:`~tokenflow.serving.RequestTimeline` list (row order).
        steps: the engine's :class:`~tokenflow.serving.StepRecord` list.
    """
    ax = fig.axes[0]
    row = {t.request_id: i for i, t in enumerate(timelines)}
    marks = [(s.index + 0.5, row[rid]) for s in steps for rid in s.preempted if rid in row]
    if marks:
        xs, ys = zip(*marks)
        ax.scatter(xs, ys, marker="x", s=60, color=_PREEMPT, lw=2, zorder=5,
                   label="preempted")
        handles, labels = ax.get_legend_handles_labels()
        legend = ax.get_legend()
        old = legend.legend_handles if legend is not None else []
        ax.legend(handles=list(old) + handles[-1:], fontsize=MIN_FONT_PT, loc="upper right", ncol=4)
    return len(marks)


def _packing_rows(engines: dict) -> list[list]:
    """The rows of :func:`packing_table` (see there for ``engines``)."""
    works = list(dict.fromkeys(w for w, _ in engines))
    missing = [(w, lay) for w in works for lay in ("padded", "paged") if (w, lay) not in engines]
    if not works or missing or len(engines) != 2 * len(works):
        raise ValueError("engines must map (workload, 'padded') and (workload, 'paged') for each "
                         f"workload and nothing else; missing {missing}, keys {list(engines)}")
    rows = []
    for work in works:
        real = sum(s.num_tokens for s in engines[work, "paged"].steps)
        if real == 0:
            raise ValueError(f"the paged run of {work!r} scheduled no tokens")
        for name, layout in (("padded", "padded"), ("packed", "paged")):
            steps = engines[work, layout].steps
            pos = sum(s.num_positions for s in steps)
            t = sum(s.seconds for s in steps)                     # = engine.metrics()["elapsed_s"]
            chunk_s = sum(s.seconds for s in steps if s.prefill)  # steps with a prompt chunk
            rows.append([work, name, real, pos, pos / real, t * 1e3, chunk_s * 1e3,
                         (t - chunk_s) * 1e3])
    return rows


def packing_table(engines: dict):
    """The same workloads served padded and packed, as a :class:`tokenflow.viz.Table`: per
    workload a ``padded`` and a ``packed`` row with the scheduled tokens (of the packed run),
    the positions the forward computed (``StepRecord.num_positions``) and their ratio (2
    decimals), then the total ms, the ms of the steps that carry a prompt chunk and the ms of
    the decode-only steps (no decimals; measured, so they change from run to run).

    Args:
        engines: ``{(workload, "padded"): engine, (workload, "paged"): engine, ...}``: two
            :class:`tokenflow.serving.LLMEngine` runs per workload name (``kv_storage``
            ``"padded"`` and ``"paged"``), each having served the workload; rows follow the
            workloads' first appearance in ``engines``.

    Raises:
        ValueError: if a workload lacks one of the two runs, a key has another layout, or a
            packed run scheduled no tokens.
    """
    from .fmt import Table
    return Table(_packing_rows(engines), ["workload", "layout", "tokens", "positions",
                                          "per token", "ms", "ms: chunk steps",
                                          "ms: decode-only"],
                 digits=[0, 0, 0, 0, 2, 0, 0, 0], align="<<>>>>>>")


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def packing_summary(engines: dict, labels: dict | None = None) -> str:
    """One paragraph on :func:`packing_table`'s runs: the positions the padded runs computed
    per scheduled token (1 decimal) on each workload, and what the packed runs computed over
    all workloads (2 decimals); the time ratio padded / packed per workload, and the same
    ratio for the steps that carry a prompt chunk alone (2 decimals).

    Args:
        engines: as :func:`packing_table`.
        labels: ``{workload: words}`` naming each workload in the text (default: its name).

    Raises:
        ValueError: as :func:`packing_table`; if a packed run took no time or had no step
            with a prompt chunk.
    """
    rows = _packing_rows(engines)
    works = [r[0] for r in rows[::2]]
    label = {w: (labels or {}).get(w, w) for w in works}
    if any(r[5] <= 0 or r[6] <= 0 for r in rows[1::2]):
        raise ValueError("every packed run must take time and have a step with a prompt chunk")
    padded = {w: (sum(s.num_positions for s in engines[w, "padded"].steps) /
                  sum(s.num_tokens for s in engines[w, "padded"].steps)) for w in works}
    packed = sum(r[3] for r in rows[1::2]) / sum(r[2] for r in rows[1::2])
    time = {r_pad[0]: r_pad[5] / r_pack[5] for r_pad, r_pack in zip(rows[::2], rows[1::2])}
    chunk = [r_pad[6] / r_pack[6] for r_pad, r_pack in zip(rows[::2], rows[1::2])]
    waste = [f"{padded[works[0]]:.1f}x the scheduled tokens on {label[works[0]]}"]
    waste += [f"{padded[w]:.1f}x on {label[w]}" for w in works[1:]]
    return (f"Padding computed {_and(waste)}; packing computes {packed:.2f}x. Time, padded / "
            f"packed: {', '.join(f'{time[w]:.2f}x on {label[w]}' for w in works)}. Steps that "
            f"carry a prompt chunk alone: {_and([f'{c:.2f}x' for c in chunk])}.")


def preemption_report(steps, prompts) -> str:
    """Text, two lines per preemption in ``steps``: the step at which the request was
    preempted (its blocks freed), then the step that admitted it again and the tokens it
    recomputed there (its prompt plus the tokens it had generated; 1 if it came back as a
    decode row), or that no later step admitted it. ``"no request was preempted"`` if none was.

    Args:
        steps: an engine's :class:`~tokenflow.serving.StepRecord` list, in step order.
        prompts: the prompts' token ids, indexed by request id (for the prompt lengths).

    Raises:
        ValueError: if a preempted request id does not index ``prompts``.
    """
    lines = []
    for pos, s in enumerate(steps):
        for rid in s.preempted:
            try:
                prompt_len = len(prompts[rid])
            except (IndexError, KeyError, TypeError):
                raise ValueError(f"request id {rid!r} does not index prompts") from None
            back = next((b for b in steps[pos + 1:]
                         if rid in b.decode or any(r == rid for r, _ in b.prefill)), None)
            lines.append(tr(f"step {s.index}: request {rid} preempted (its blocks freed)"))
            lines.append(tr("no later step admitted it again" if back is None else
                            f"step {back.index}: admitted again, "
                            f"{dict(back.prefill).get(rid, 1)} tokens recomputed (prompt "
                            f"{prompt_len} + the tokens it had generated)"))
    return "\n".join(lines) or tr("no request was preempted")


# what this module defines (every public name after the imports)
__all__ = [n for n in globals() if not n.startswith("_") and n not in _IMPORTED]
