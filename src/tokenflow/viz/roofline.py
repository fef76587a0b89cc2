"""Chapter 07: the simulator's lenses and the roofline. Lens bars, roofline summaries against
published hardware, with their tables and explorers.

Part of :mod:`tokenflow.viz`, the only package that draws; nothing below it imports it.
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from .style import column_figsize, MIN_FONT_PT, text_on
from tokenflow.analysis.trace import COLORS

_IMPORTED = set(globals())          # the names above are imported, not defined here

_LENS_COLOURS = {
    "request queue": "#9e9e9e", "prefill": COLORS["hidden"], "KV cache": "#8fb8ee",
    "decode loop": COLORS["token"], "sampling": "#1b6b2d", "response": "#b7d9bf",
    "embedding": "#1f4f99", "attention": COLORS["hidden"], "FFN / MoE": COLORS["moe"],
    "norm": "#cfe0f7", "LM head": COLORS["token"], "other": "#dddddd"}


def lens_bars(pipeline: dict, blocks: dict, title: str = ""):
    """Two stacked horizontal bars of the same run: the pipeline lens (``pipeline``: stage ->
    seconds, as :meth:`tokenflow.analysis.lenses.LensProfile.pipeline`) above the block lens
    (``blocks``: module class -> seconds). Segments in milliseconds, labelled when wide
    enough, the narrower ones numbered above the bar (neighbours whose numbers would overlap
    share one label, ``3-4``) and listed in a legend below the axis;
    blue = hidden-state flow, yellow = MoE, green = token and decode loop.

    Raises:
        ValueError: an empty lens or a negative value.
    """
    for name, lens in (("pipeline", pipeline), ("blocks", blocks)):
        if not lens or min(lens.values()) < 0:
            raise ValueError(f"{name} must map at least one part to seconds >= 0")
    from matplotlib.patches import Patch
    fig, ax = plt.subplots(figsize=column_figsize(9.5, 4.4))
    total = max(sum(pipeline.values()), sum(blocks.values())) * 1e3
    keyed = []                                  # segments too narrow for their label: numbered
    numbered = {}                               # bar -> [first, last, x0, x1] per segment
    for y, lens in ((1, pipeline), (0, blocks)):
        left, numbers = 0.0, numbered.setdefault(y, [])
        for part, s in lens.items():
            ms = s * 1e3
            colour = _LENS_COLOURS.get(part, "#cccccc")
            ax.barh(y, ms, left=left, color=colour, edgecolor="white", height=0.6)
            if ms > 0.12 * total:
                ax.text(left + ms / 2, y, f"{part}\n{ms:.0f} ms", ha="center", va="center",
                        fontsize=MIN_FONT_PT, color=text_on(colour))
            elif ms > 0:
                keyed.append((part, ms, colour))
                numbers.append([len(keyed), len(keyed), left, left + ms])
            left += ms
    rows = (len(keyed) + 1) // 2                # legend rows under the x-axis label
    if keyed:
        fig.legend([Patch(color=c) for _, _, c in keyed],
                   [f"{i}: {part} {ms:.0f} ms" for i, (part, ms, _) in enumerate(keyed, 1)],
                   fontsize=MIN_FONT_PT, loc="lower center", ncol=2, frameon=False)
    ax.set_yticks([1, 0], ["pipeline lens", "block lens"])
    ax.set_xlabel("milliseconds of engine step time (the same steps in both bars)")
    ax.set_xlim(0, total * 1.01)
    ax.set_ylim(-0.45, 1.65)
    ax.set_title(title or "one engine run, two lenses")
    fig.tight_layout(rect=(0, min(0.06 * rows, 0.45), 1, 1))
    for y, numbers in numbered.items():         # placed where the final layout draws them
        _number_segments(fig, ax, y + 0.32, numbers)
    return fig


def _number_segments(fig, ax, y: float, numbers: list) -> None:
    """Write the numbers of a bar's narrow segments above it at height ``y`` (data units):
    ``numbers`` holds ``[first, last, x0, x1]`` per segment (milliseconds), left to right.
    Neighbours whose numbers would overlap, or come closer than half a text height, share one
    label, ``3-4``, centred over them."""
    renderer = fig.canvas.get_renderer()
    drawn = []                                  # (first, last, x0, x1, text) left to right
    for first, last, x0, x1 in numbers:
        while True:
            text = ax.text((x0 + x1) / 2, y, str(first) if first == last else f"{first}-{last}",
                           ha="center", va="bottom", fontsize=MIN_FONT_PT)
            gap = MIN_FONT_PT / 72 * fig.dpi / 2           # half a text height between them
            if not drawn or not text.get_window_extent(renderer).padded(gap).overlaps(
                    drawn[-1][4].get_window_extent(renderer)):
                break
            text.remove()                       # merge with the label to its left
            first, _, x0, _, previous = drawn.pop()
            previous.remove()
        drawn.append((first, last, x0, x1, text))


def roofline_summary(config, hw_name: str = "H800", phase: str = "decode", batch: int = 64,
                     context_len: int = 4096, ep_size: int = 32, dtype: str = "fp8",
                     bytes_per_param: float = 1, kv_bytes_per_element: float = 2,
                     max_nodes_per_token: int | None = None,
                     attention_dtype: str | None = "bf16") -> dict:
    """Roofline of one step on one device (:func:`tokenflow.analysis.roofline.roofline`, tensor
    parallel 1 as in DeepSeek's DP attention) for a hardware preset, with the memory the step
    needs: ``weights + KV`` bytes (:mod:`tokenflow.analysis.costmodel`: this device's weights and
    the batch's KV cache). The defaults are DeepSeek's V3/R1 service (day-6 note of its
    open-infra-index): matrix multiplies at the ``dtype`` (FP8) peak, the attention core at the
    ``attention_dtype`` (BF16) peak, FP8 weights, BF16 cache; the all-to-all takes the path
    of the phase (decode direct over InfiniBand, prefill InfiniBand-then-NVLink under the
    config's group limit; ``max_nodes_per_token`` imposes a node limit instead).

    Returns:
        dict: the :func:`~tokenflow.analysis.roofline.roofline` result plus ``hw`` (the
        :class:`~tokenflow.analysis.roofline.HardwareSpec`), ``memory_needed`` (bytes), ``fits``
        (bool) and the arguments.

    Raises:
        ValueError: as :func:`~tokenflow.analysis.roofline.hardware` and
            :func:`~tokenflow.analysis.roofline.roofline` (e.g. ``ep_size`` not dividing the
            experts).
    """
    from tokenflow.analysis.costmodel import kv_cache_bytes, weight_bytes_per_device
    from tokenflow.analysis.roofline import Deployment, hardware, roofline
    hw = hardware(hw_name)
    r = roofline(config, Deployment(hw, ep_size=ep_size, dtype=dtype,
                                    attention_dtype=attention_dtype,
                                    bytes_per_param=bytes_per_param,
                                    kv_bytes_per_element=kv_bytes_per_element,
                                    max_nodes_per_token=max_nodes_per_token),
                 phase=phase, batch=batch, context_len=context_len)
    mem = weight_bytes_per_device(config, ep_size=ep_size,
                                  bytes_per_param=bytes_per_param)["total"] + \
        kv_cache_bytes(config, batch=batch, context_len=context_len,
                       bytes_per_element=kv_bytes_per_element)
    return dict(r, hw=hw, memory_needed=mem, fits=mem <= hw.memory_bytes, config=config,
                phase=phase, batch=batch, context_len=context_len, ep_size=ep_size,
                dtype=dtype, attention_dtype=attention_dtype or dtype)


def _dtypes(r: dict) -> str:
    """``"fp8"``, or ``"fp8, attention bf16"`` when the attention core runs in another dtype."""
    a = r.get("attention_dtype", r["dtype"])
    return r["dtype"] if a == r["dtype"] else f"{r['dtype']}, attention {a}"


def roofline_bars(summary: dict):
    """The three times of a :func:`roofline_summary` as horizontal bars, with the roofline
    step time (the largest) dashed."""
    r, hw = summary, summary["hw"]
    fig, ax = plt.subplots(figsize=column_figsize(7.5, 2.2))
    names = ["compute", "memory", "communication"]
    vals = [r[k] * 1e3 for k in ("compute_s", "memory_s", "comm_s")]
    ax.barh(names, vals, color=[COLORS["hidden"], "#8fb8ee", COLORS["moe"]])
    ax.axvline(r["step_s"] * 1e3, color="black", lw=1, ls="--")
    ax.invert_yaxis()
    ax.set_xlabel("ms per step (dashed: the roofline step time, the largest)")
    ax.set_title(f"{r['config'].name}, {r['phase']} on one {hw.name}", fontsize=10)
    fig.tight_layout()
    return fig


def roofline_panel(config, hw_name: str = "H800", phase: str = "decode", batch: int = 64,
                   context_len: int = 4096, ep_size: int = 32, dtype: str = "fp8",
                   bytes_per_param: float = 1, kv_bytes_per_element: float = 2,
                   max_nodes_per_token: int | None = None, attention_dtype: str | None = "bf16"):
    """Print :func:`roofline_summary` (same arguments: the three times, the bound, tokens/s
    per device and the memory the step needs) and draw :func:`roofline_bars`.

    Raises:
        ValueError: as :func:`roofline_summary`.
    """
    r = roofline_summary(config, hw_name, phase, batch, context_len, ep_size, dtype,
                         bytes_per_param, kv_bytes_per_element, max_nodes_per_token,
                         attention_dtype)
    hw, mem = r["hw"], r["memory_needed"]
    print(f"{config.name} on {hw.name}, {phase}, batch {batch}, context {context_len:,}, "
          f"EP{ep_size}, {_dtypes(r)}")
    print(f"  compute {r['compute_s'] * 1e3:.2f} ms, memory {r['memory_s'] * 1e3:.2f} ms, "
          f"communication {r['comm_s'] * 1e3:.2f} ms -> {r['bound']}-bound")
    print(f"  {r['tokens_per_s']:,.0f} tokens/s per device; weights + KV "
          f"{mem / 1e9:.1f} GB of {hw.memory_bytes / 1e9:.0f} GB"
          + ("" if r["fits"] else "  (does not fit)"))
    return roofline_bars(r)


def roofline_table(summary: dict):
    """A :func:`tokenflow.viz.roofline_summary` as a :class:`tokenflow.viz.Table`: the three
    times (ms), which bounds the step, tokens/s per device, and the memory it needs."""
    from .fmt import Table
    r = summary
    gb = r["memory_needed"] / 1e9
    rows = [("compute", r["compute_s"] * 1e3), ("memory", r["memory_s"] * 1e3),
            ("communication", r["comm_s"] * 1e3)]
    rows = [(n, ms, "<- bound" if n.startswith(r["bound"]) else "") for n, ms in rows]
    rows += [("tokens/s per device", round(r["tokens_per_s"]), ""),
             ("weights + KV (GB)", round(gb, 1),
              f"of {r['hw'].memory_bytes / 1e9:.0f}" + ("" if r["fits"] else ": does not fit"))]
    return Table(rows, ["", "ms per step", ""], align="<><", digits=2,
                 title=f"{r['config'].name} on {r['hw'].name}, {r['phase']}, batch "
                       f"{r['batch']}, context {r['context_len']:,}, EP{r['ep_size']}, "
                       f"{_dtypes(r)}")


def roofline_explorer(config, hw_names=("H800", "H200"), batch=(1, 8, 64, 256),
                      ep_size=(8, 32, 256), context_len: int = 4096, phase: str = "decode",
                      default: dict | None = None, live: bool = True, **kw):
    """:func:`roofline_table` for one hardware preset, batch per device and expert-parallel
    size of the given values, at one context length and phase (``kw``: the other arguments of
    :func:`tokenflow.viz.roofline_summary`), through :func:`tokenflow.viz.explore`; starts at
    H800, batch 64, EP32 where the grid has them. Raises as ``roofline_summary``."""
    from .static import default_in, explore
    controls = {"hardware": list(hw_names), "batch": list(batch), "EP": list(ep_size)}
    return explore(
        lambda hardware, batch, EP: roofline_table(roofline_summary(
            config, hardware, phase, batch, context_len, EP, **kw)),
        controls, live=live,
        default=default or default_in(controls, {"hardware": "H800", "batch": 64, "EP": 32}),
        title=f"{config.name}, {phase}, context {context_len:,}: one step on one GPU",
        live_below=True)


def roofline_static(*args, **kw):
    """:func:`roofline_explorer` precomputed (``live=False``): works without a kernel."""
    return roofline_explorer(*args, live=False, **kw)


# what this module defines (every public name after the imports)
__all__ = [n for n in globals() if not n.startswith("_") and n not in _IMPORTED]
