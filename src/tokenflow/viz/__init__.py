"""Presentation on top of the model: formatting helpers and tables (:mod:`.fmt`) and sliders
that work without a kernel (:mod:`.static`). Nothing in the model, cache, sampling or serving
code depends on this package (DESIGN.md section 2); matplotlib is imported only when a figure
is rendered.

    from tokenflow.viz import Table, precomputed_explorer, say, format_bytes, pad
"""
from .fmt import Table, display_width, format_bytes, pad, say
from .static import precomputed_explorer

__all__ = ["Table", "display_width", "format_bytes", "pad", "say", "precomputed_explorer"]
