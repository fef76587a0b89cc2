"""What the chapters open up, beside the forward path it explains.

``trace``        :class:`Trace`: the arrow actions of a forward pass, recorded through forward
                 hooks (:meth:`Trace.attach`); :func:`trace_shapes`
``attention``    :func:`attention_steps` (attention one named tensor per step) and
                 :func:`trace_attention_step` (those tensors for one block of a real pass)
``moe``          the reference router and MoE loop, :func:`load_stats`, :func:`expert_capacity`,
                 :func:`moe_inputs`
``logit_lens``   the residual stream read through the LM head at every depth

This package imports :mod:`tokenflow.model` (and :mod:`tokenflow.validate`) only, and the
model never imports it (checked by ``tests/test_layering.py``). The twins here are proven equal
to the forward path by the tests (``tests/test_attention_kv_cache.py``, ``tests/test_moe.py``).
"""
import sys

from .trace import COLORS, Trace, TraceEvent, trace_shapes
from .attention import attention_steps, trace_attention_step
from .moe import expert_capacity, load_stats, moe_inputs, moe_reference_loop, route_reference
from .logit_lens import answer_depth, logit_lens, token_rank

__all__ = ["Trace", "TraceEvent", "COLORS", "trace_shapes", "attention_steps",
           "trace_attention_step", "route_reference", "moe_reference_loop", "expert_capacity",
           "load_stats", "moe_inputs", "logit_lens", "token_rank", "answer_depth"]

OLD_PATHS = {
    "tokenflow.model.attention": ("attention_steps", "trace_attention_step"),
    "tokenflow.model.moe": ("route_reference", "moe_reference_loop", "expert_capacity",
                            "load_stats", "moe_inputs"),
}
"""Names that lived in the model's modules before they moved here; chapters and readers'
code still import them from there."""


def keep_old_paths() -> None:
    """Make every name of :data:`OLD_PATHS` importable from its old module too (the same
    object), without the model importing this package. Called by ``tokenflow/__init__.py``,
    which runs before any ``tokenflow.model`` import."""
    here = globals()
    for module, names in OLD_PATHS.items():
        for name in names:
            setattr(sys.modules[module], name, here[name])
