"""Figures of chapter 05's packed serving step: one step padded vs packed, preemptions marked.

* :func:`packed_step_figure`: one engine step two ways. Left, the seed's view: every chunk a
  row of ``input_ids [B, S_max]``, short rows left-padded (what the engine computed before
  packing). Right, the packed step: the same tokens end to end, ``input_ids [T]``, with the
  ``cu_seqlens_q`` boundaries; decode rows first, as the runner lays them out
  (:func:`tokenflow.serving.runner.prepare_packed`).
* :func:`mark_preemptions`: red crosses on a request timeline (``serving_timeline``) at the
  steps where a request lost its blocks.

Part of :mod:`tokenflow.viz`, the only package that draws; nothing below it imports it.
matplotlib is imported when a figure is drawn.
"""
from __future__ import annotations

from tokenflow.analysis.trace import COLORS

__all__ = ["step_layout", "packed_step_figure", "mark_preemptions"]

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
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 0.3 * B + 2.2),
                                      gridspec_kw=dict(width_ratios=[S, T]))
    for row, (rid, n, kind) in enumerate(chunks):               # [B, S_max], left-padded
        left.broken_barh([(0, S - n)], (row - 0.4, 0.8), color=_PAD, lw=0)
        left.broken_barh([(S - n, n)], (row - 0.4, 0.8), color=colour[kind], lw=0)
    left.set_ylim(B - 0.5, -0.5)
    left.set_yticks(range(B), [f"req {rid}" for rid, _, _ in chunks], fontsize=8)
    left.set_xlim(0, S)
    left.set_xlabel("position in the row (S)")
    left.set_title(f"padded: input_ids [B={B}, S_max={S}]\n{B * S} positions for {T} tokens",
                   fontsize=9)
    cu = [0]
    for rid, n, kind in chunks:                                  # [T], end to end
        right.broken_barh([(cu[-1], n)], (-0.4, 0.8), color=colour[kind], ec="white", lw=0.5)
        if n >= 0.06 * T:                                        # wide enough for its id
            right.text(cu[-1] + n / 2, 0, f"req {rid}", ha="center", va="center",
                       color="white", fontsize=8)
        cu.append(cu[-1] + n)
    right.set_ylim(-1.2, 0.6)
    right.set_yticks([])
    right.set_xlim(0, T)
    right.set_xticks(cu[:1] + cu[-2:] if len(cu) > 8 else cu)
    right.tick_params(labelsize=8)
    right.set_xlabel("token index in the step (T); ticks: cu_seqlens_q")
    shown = ", ".join(map(str, cu)) if len(cu) <= 12 else \
        ", ".join(map(str, cu[:6])) + ", ..., " + str(cu[-1])
    right.set_title(f"packed: input_ids [T={T}]\n{T} positions, cu_seqlens_q = [{shown}]",
                    fontsize=9)
    right.legend(handles=[Patch(color=colour["prefill"], label="prompt chunk"),
                          Patch(color=colour["decode"], label="decode row"),
                          Patch(color=_PAD, label="padding")],
                 loc="lower center", ncol=3, fontsize=8, frameon=False)
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
        ax.legend(handles=list(old) + handles[-1:], fontsize=9, loc="upper right", ncol=4)
    return len(marks)
