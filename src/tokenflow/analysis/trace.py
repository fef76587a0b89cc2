"""The trace lives in :mod:`tokenflow.explain.trace`; these names stay importable from here."""
from tokenflow.explain.trace import COLORS, Trace, TraceEvent, trace_shapes

__all__ = ["Trace", "TraceEvent", "COLORS", "trace_shapes"]
