"""ipywidgets controls shared by the chapters.

Each builder returns an ``ipywidgets`` object; its callback calls a plain function that the
chapter also calls in an ordinary cell, so the numbers shown are checked by nbval even
though widget output is not.
"""
from __future__ import annotations

import ipywidgets as widgets

__all__ = ["shape_controls"]


def shape_controls(batch=(1, 8, 1, 2), seq_len=(1, 64, 1, 5), experts=(2, 32, 2, 8)):
    """Sliders for batch size ``B``, sequence length ``S`` and expert count ``E``.

    Each argument is ``(min, max, step, value)``. Returns a dict of ``IntSlider`` named
    ``batch_size``, ``seq_len``, ``num_experts``.
    """
    def s(desc, spec):
        lo, hi, step, val = spec
        return widgets.IntSlider(value=val, min=lo, max=hi, step=step, description=desc,
                                 continuous_update=False)
    return {"batch_size": s("batch B", batch), "seq_len": s("seq len S", seq_len),
            "num_experts": s("experts E", experts)}


# --------------------------------------------------------------------- chapters 01-02 (F2)
# --------------------------------------------------------------------- chapter 03 (F3)
# --------------------------------------------------------------------- chapter 04 (F4)
