"""Chapter 05: paged KV memory as the block manager holds it. A block table (a request's
logical blocks -> physical blocks, shared prefix blocks with their reference counts) and the
KV slots a run used, paged against a contiguous reservation per request.

The picture follows PagedAttention (Kwon et al. 2023, arXiv:2309.06180, figures 6-8: block
tables; section 3: systems before it reserve one contiguous chunk of the maximum sequence
length per request). Everything is read from :class:`tokenflow.serving.BlockManager` and the
engine's :class:`tokenflow.serving.StepRecord` list; nothing here changes them.

Part of :mod:`tokenflow.viz`, the only package that draws; nothing below it imports it.
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from .style import column_figsize, MIN_FONT_PT
from tokenflow.analysis.trace import COLORS

_IMPORTED = set(globals())          # the names above are imported, not defined here

_WAIT = "#c8c8c8"


def block_table_rows(block_manager, requests) -> list[dict]:
    """One row per (request, logical block): ``request_id``, ``logical`` (block index in
    the request's token order), ``physical`` (block id in the pool), ``tokens`` (slots the
    request's tokens fill in it, 1 ... ``block_size``), ``ref_count`` (requests holding the
    block now) and ``shared`` (``ref_count > 1``).

    Args:
        block_manager: a :class:`tokenflow.serving.BlockManager`.
        requests: the requests to show, each with ``request_id``, ``block_table`` and
            ``num_tokens`` (e.g. the engine's running requests).

    Raises:
        ValueError: if ``requests`` is empty or one holds no blocks.
    """
    requests = list(requests)
    if not requests:
        raise ValueError("requests must hold at least one request with blocks")
    bs = block_manager.block_size
    rows = []
    for r in requests:
        if not r.block_table:
            raise ValueError(f"request {r.request_id!r} holds no blocks")
        for j, b in enumerate(r.block_table):
            ref = block_manager.blocks[b].ref_count
            rows.append(dict(request_id=r.request_id, logical=j, physical=b,
                             tokens=max(0, min(bs, r.num_tokens - j * bs)), ref_count=ref,
                             shared=ref > 1))
    return rows


def block_table_figure(block_manager, requests, title: str = ""):
    """The block tables of ``requests`` (:func:`block_table_rows`): each request's logical
    blocks in a row (tokens filled / slots), a line to the physical block that holds them,
    and the physical blocks in use in the bottom row with their reference counts; a block
    two or more requests share is drawn in the MoE colour. Raises as
    :func:`block_table_rows`."""
    from matplotlib.patches import Patch, Rectangle
    rows = block_table_rows(block_manager, requests)
    bs = block_manager.block_size
    ids = list(dict.fromkeys(r["request_id"] for r in rows))
    physical = sorted({r["physical"] for r in rows})
    ref = {r["physical"]: r["ref_count"] for r in rows}
    n_log = max(r["logical"] for r in rows) + 1
    width = max(n_log, len(physical))
    fig, ax = plt.subplots(figsize=column_figsize(9.5, 1.1 * len(ids) + 2.4))
    shared_c, own_c = COLORS["moe"], COLORS["hidden"]
    y_phys = -1.6
    for k, b in enumerate(physical):
        c = shared_c if ref[b] > 1 else own_c
        ax.add_patch(Rectangle((k, y_phys), 0.8, 0.7, color=c, zorder=2))
        ax.text(k + 0.4, y_phys + 0.35, f"#{b}", ha="center", va="center", fontsize=MIN_FONT_PT,
                color="black", zorder=3)
        ax.text(k + 0.4, y_phys - 0.25, f"ref {ref[b]}", ha="center", va="center",
                fontsize=MIN_FONT_PT)
    for i, rid in enumerate(ids):
        y = len(ids) - 1 - i
        ax.text(-0.2, y + 0.35, f"request {rid}", ha="right", va="center", fontsize=MIN_FONT_PT)
        for r in (r for r in rows if r["request_id"] == rid):
            x = r["logical"]
            c = shared_c if r["shared"] else own_c
            ax.add_patch(Rectangle((x, y), 0.8, 0.7, facecolor="white", edgecolor=c, lw=2,
                                   zorder=2))
            ax.text(x + 0.4, y + 0.35, f"L{x}: {r['tokens']}/{bs}", ha="center",
                    va="center", fontsize=MIN_FONT_PT, zorder=3)
            k = physical.index(r["physical"])
            ax.plot([x + 0.4, k + 0.4], [y, y_phys + 0.7], color=c, lw=0.8, zorder=1)
    ax.text(-0.2, y_phys + 0.35, "physical\nblocks", ha="right", va="center", fontsize=MIN_FONT_PT)
    ax.set_xlim(-1.6, width + 0.2)
    ax.set_ylim(y_phys - 0.6, len(ids) + 0.1)
    ax.axis("off")
    ax.legend(handles=[Patch(color=shared_c, label="shared prefix block (ref > 1)"),
                       Patch(color=own_c, label="a request's own block")],
              fontsize=MIN_FONT_PT, loc="upper right", bbox_to_anchor=(1.0, 1.12), ncol=2,
              frameon=False)
    ax.set_title(title or "block tables: logical blocks -> physical blocks", fontsize=10,
                 loc="left")
    fig.tight_layout()
    return fig


def kv_slot_usage(steps, timelines, num_blocks: int, block_size: int,
                  reserve_len: int) -> dict:
    """KV slots after every engine step of one run, three ways:

    * ``used``: slots holding a computed K/V (each running request's prompt chunks and decode
      tokens so far);
    * ``paged``: slots in the blocks the block manager has handed out
      (``(num_blocks - free blocks) * block_size``, from each :class:`StepRecord`);
    * ``contiguous``: ``reserve_len`` slots per running request, the one contiguous chunk of
      the longest sequence a request may reach that a server without paging reserves at
      admission (Kwon et al. 2023, section 3).

    A request runs from its first scheduled step to the step that gives its last token
    (``finish_step``; its slots are freed after it). The run must be without prefix caching
    (a shared block counts once in ``paged`` but once per request in ``used``).

    Args:
        steps: the engine's :class:`tokenflow.serving.StepRecord` list.
        timelines: :func:`tokenflow.serving.request_timeline` of the same run.
        num_blocks, block_size: the engine's pool (ints >= 1).
        reserve_len: slots a contiguous reservation sets aside per request (int >= 1).

    Returns:
        dict of per-step lists ``step``, ``running``, ``used``, ``paged``, ``contiguous``; the
        totals over the run in slot-steps ``used_total``, ``paged_total``,
        ``contiguous_total``; ``pool_slots`` and ``reserve_len``.

    Raises:
        ValueError: empty ``steps``, a bad size, or a step that preempts (a preempted request
            gives its slots back mid-run: measure a pool that needs no preemption).
    """
    for name, v in (("num_blocks", num_blocks), ("block_size", block_size),
                    ("reserve_len", reserve_len)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    if not steps:
        raise ValueError("steps must be a non-empty list of StepRecord")
    if any(s.preempted for s in steps):
        raise ValueError("the run preempted requests; measure a run without preemption")
    finish = {t.request_id: t.finish_step for t in timelines}
    held: dict = {}
    out = {k: [] for k in ("step", "running", "used", "paged", "contiguous")}
    for s in steps:
        for rid, n in s.prefill:
            held[rid] = held.get(rid, 0) + n
        for rid in s.decode:
            held[rid] = held.get(rid, 0) + 1
        running = [rid for rid in held if finish.get(rid) is None or finish[rid] > s.index]
        out["step"].append(s.index)
        out["running"].append(len(running))
        out["used"].append(sum(held[rid] for rid in running))
        out["paged"].append((num_blocks - s.num_free_blocks) * block_size)
        out["contiguous"].append(len(running) * reserve_len)
    for k in ("used", "paged", "contiguous"):
        out[f"{k}_total"] = sum(out[k])
    out["pool_slots"] = num_blocks * block_size
    out["reserve_len"] = reserve_len
    return out


def kv_slot_figure(usage: dict, title: str = ""):
    """:func:`kv_slot_usage` over the engine steps: the slots a contiguous reservation sets
    aside (grey), the slots in the handed-out blocks (blue) and the slots holding a K/V
    (green), with the run's totals in the legend."""
    x = usage["step"]
    fig, ax = plt.subplots(figsize=column_figsize(9.5, 3.4))
    tot = {k: usage[f"{k}_total"] for k in ("used", "paged", "contiguous")}
    ax.fill_between(x, usage["contiguous"], step="post", color=_WAIT,
                    label=f"contiguous reservation ({tot['used'] / tot['contiguous']:.0%} used)")
    ax.fill_between(x, usage["paged"], step="post", color=COLORS["hidden"], alpha=0.8,
                    label=f"paged: handed-out blocks ({tot['used'] / tot['paged']:.0%} used)")
    ax.fill_between(x, usage["used"], step="post", color=COLORS["token"],
                    label="slots holding a K/V")
    ax.set_xlabel("engine step")
    ax.set_ylabel("KV slots")
    ax.set_xlim(x[0], x[-1] + 1)
    ax.legend(fontsize=MIN_FONT_PT, loc="upper right")
    ax.set_title(title or "KV slots per step: reserved, allocated, used", fontsize=10)
    fig.tight_layout()
    return fig


def kv_slot_table(usage: dict):
    """The run's totals of :func:`kv_slot_usage` as a :class:`tokenflow.viz.Table`: per way
    of holding the cache, the slots at the busiest step, the slot-steps over the run, the
    share of them that holds a K/V, and the slot-steps wasted."""
    from .fmt import Table
    used = usage["used_total"]
    rows = [[name, max(usage[k]), usage[f"{k}_total"], used / usage[f"{k}_total"],
             usage[f"{k}_total"] - used]
            for name, k in (("contiguous reservation", "contiguous"),
                            ("paged blocks", "paged"), ("K/V written", "used"))]
    return Table(rows, ["KV memory", "slots, busiest step", "slot-steps", "share used",
                        "slot-steps unused"], digits=[0, 0, 0, 2, 0], align="<>>>>")


def block_table_sentence(block_manager, requests) -> str:
    """One sentence on :func:`block_table_rows`: requests, physical vs logical blocks, the
    shared blocks and their reference counts (one number when they all have the same)."""
    rows = block_table_rows(block_manager, requests)
    shared = sorted({r["physical"] for r in rows if r["shared"]})
    physical = len({r["physical"] for r in rows})
    text = (f"{len(requests)} requests hold {physical} physical blocks for {len(rows)} "
            f"logical ones")
    if not shared:
        return text + "; no block is shared."
    counts = [block_manager.blocks[b].ref_count for b in shared]
    if len(set(counts)) == 1:
        return text + f"; blocks {shared} are shared, reference count {counts[0]}."
    listed = ", ".join(map(str, counts[:-1])) + f" and {counts[-1]}"
    return text + f"; blocks {shared} are shared, reference counts {listed}."


def kv_slot_sentence(usage: dict) -> str:
    """The run's totals of :func:`kv_slot_usage` in words: how many times the slot-steps the
    K/V fills a contiguous reservation and the paged blocks hold, and the busiest step's
    reservation against the pool."""
    used, cont, paged = usage["used_total"], usage["contiguous_total"], usage["paged_total"]
    return (f"Over the run a contiguous reservation of {usage['reserve_len']} slots per request "
            f"would hold {cont / used:.1f}x the slot-steps the K/V fills ({used / cont:.0%} "
            f"used); the paged blocks hold {paged / used:.2f}x ({used / paged:.0%} used). At the "
            f"busiest step the reservation needs {max(usage['contiguous'])} slots, the pool has "
            f"{usage['pool_slots']}.")


# what this module defines (every public name after the imports)
__all__ = [n for n in globals() if not n.startswith("_") and n not in _IMPORTED]
