"""Argument checks at the entry points: one phrasing for every field error.

The entry points (``ModelConfig``, ``generate``, ``SamplingParams``, ``from_hf_config``, the
cost-model functions, ``TokenFlowModel.forward`` for ids a caller passes) call these once;
the forward path behind them trusts its inputs. Each function returns the value it accepted
(as a plain Python type) so a caller can write ``n = integer("n", n, 1)``.

Errors name the argument and the allowed range:

- a wrong type raises :class:`ArgTypeError`, a ``TypeError`` that is also a ``ValueError``
  (as numpy's ``AxisError`` is both an ``IndexError`` and a ``ValueError``), so a caller
  catching either gets it;
- a value out of range raises ``ValueError``.

This module imports nothing else from tokenflow: every layer may use it.
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Collection

import torch

__all__ = ["ArgTypeError", "integer", "index", "number", "boolean", "choice", "token_id_list",
           "token_id_tensor", "reads_free"]


class ArgTypeError(TypeError, ValueError):
    """An argument of the wrong type (a ``TypeError`` that is also a ``ValueError``)."""


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _range(lo, hi, hi_name: str | None, lo_open: bool = False, hi_open: bool = False) -> str:
    """``>= lo``, ``<= hi``, ``in [lo, name=hi]`` or ``in (lo, hi)`` as the message says it."""
    top = f"{hi_name}={hi}" if hi_name else f"{hi}"
    if hi is None:
        return f"> {lo}" if lo_open else f">= {lo}"
    if lo is None:
        return f"< {top}" if hi_open else f"<= {top}"
    return f"in {'(' if lo_open else '['}{lo}, {top}{')' if hi_open else ']'}"


def integer(name: str, v, lo: int | None = None, hi: int | None = None, *,
            none: bool = False, hi_name: str | None = None, above: str = "") -> int | None:
    """``v`` as a plain int in ``[lo, hi]`` (either bound optional; numpy integers accepted;
    bools, floats and strings refused). ``none=True`` lets ``None`` through; ``hi_name``
    names the upper bound in the message (``top_k must be in [1, num_experts=4]``); ``above``
    is added to it, in parentheses, when ``v > hi`` (why the bound exists).

    Raises:
        ArgTypeError: ``v`` is not an int.
        ValueError: ``v`` is outside ``[lo, hi]``.
    """
    if v is None and none:
        return None
    if not _is_int(v):
        raise ArgTypeError(f"{name} must be an int{' or None' if none else ''}, "
                           f"got {type(v).__name__} {v!r}")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        why = f" ({above})" if above and hi is not None and v > hi else ""
        raise ValueError(f"{name} must be {_range(lo, hi, hi_name)}, got {int(v)}{why}")
    return int(v)


def index(name: str, v, size: int, size_name: str) -> int:
    """``v`` as a plain int in ``[0, size)``: ``layer_idx must be an int in [0,
    num_hidden_layers=3), got 3``. A non-int is reported the same way (an
    :class:`ArgTypeError`, which is also a ``ValueError``)."""
    if not _is_int(v) or not 0 <= v < size:
        err = ValueError if _is_int(v) else ArgTypeError
        raise err(f"{name} must be an int in [0, {size_name}={size}), got {v!r}")
    return int(v)


def number(name: str, v, lo: float | None = None, hi: float | None = None, *,
           lo_open: bool = False, hi_open: bool = False, none: bool = False) -> float | None:
    """``v`` as a finite real number in the given range (``lo_open``: ``> lo`` instead of
    ``>= lo``; likewise ``hi_open``). Ints and floats accepted, bools refused.

    Raises:
        ArgTypeError: ``v`` is not a real number.
        ValueError: NaN, infinite or outside the range.
    """
    if v is None and none:
        return None
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise ArgTypeError(f"{name} must be a number{' or None' if none else ''}, "
                           f"got {type(v).__name__} {v!r}")
    if not math.isfinite(v) or (lo is not None and (v <= lo if lo_open else v < lo)) or \
            (hi is not None and (v >= hi if hi_open else v > hi)):
        rng = _range(lo, hi, None, lo_open, hi_open) if (lo, hi) != (None, None) else ""
        what = rng if lo is not None and hi is not None else f"a finite number {rng}".rstrip()
        raise ValueError(f"{name} must be {what}, got {v}")
    return v


def boolean(name: str, v) -> bool:
    """``v`` as a plain bool (``numpy.bool_`` accepted; ints and strings refused).

    Raises:
        ArgTypeError: ``v`` is not a bool.
    """
    if isinstance(v, bool) or (type(v).__module__ == "numpy" and
                               type(v).__name__ in ("bool", "bool_")):
        return bool(v)
    raise ArgTypeError(f"{name} must be a bool, got {type(v).__name__} {v!r}")


def choice(name: str, v, choices: Collection):
    """``v`` itself if it is one of ``choices``.

    Raises:
        ValueError: ``v`` is not one of them (the message lists them).
    """
    try:
        ok = v in choices
    except TypeError:                                  # an unhashable v against a set
        ok = False
    if not ok:
        listed = sorted(choices) if isinstance(choices, (set, frozenset, dict)) else \
            tuple(choices)
        raise ValueError(f"{name} must be one of {listed}, got {v!r}")
    return v


def token_id_list(name: str, ids, vocab_size: int) -> tuple[int, ...]:
    """An id or a list / tuple of ids, each in ``[0, vocab_size)``, as a tuple of ints
    (numpy integers accepted; bools refused).

    Raises:
        ArgTypeError: not an int or a list / tuple of ints.
        ValueError: an id outside ``[0, vocab_size)``.
    """
    many = isinstance(ids, (list, tuple))
    for t in ids if many else (ids,):
        if not _is_int(t):
            raise ArgTypeError(f"{name} must be an int in [0, vocab_size) or a list of them, "
                               f"got {ids!r}")
        if not 0 <= t < vocab_size:
            raise ValueError(f"{name} must be in [0, vocab_size={vocab_size}), got {int(t)}")
    return tuple(int(t) for t in ids) if many else (int(ids),)


def reads_free(t: torch.Tensor) -> bool:
    """True when reading ``t``'s values on the host costs no device synchronisation (it
    lives in CPU memory). Checks of tensor *values* (an id range, a 0/1 mask) run only then:
    on an accelerator each would stall the stream once per forward pass, so there the
    kernels' own bounds checks (``nn.Embedding``'s index assert) are what catches a bad id."""
    return t.device.type == "cpu"


def token_id_tensor(name: str, ids, vocab_size: int, dims: int = 2) -> torch.Tensor:
    """Check an integer id tensor of ``dims`` dimensions (``[B, S]`` or ``[T]``), every size
    >= 1 and, when :func:`reads_free`, every id in ``[0, vocab_size)``; return it.

    Raises:
        ArgTypeError: not an int32 / int64 tensor.
        ValueError: wrong number of dimensions, an empty one, or an id out of range.
    """
    if not isinstance(ids, torch.Tensor):
        raise ArgTypeError(f"{name} must be a torch.Tensor, got {type(ids).__name__}")
    if ids.dtype not in (torch.int64, torch.int32):
        raise ArgTypeError(f"{name} must be an integer tensor (int64), got {ids.dtype}")
    if ids.dim() != dims or 0 in ids.shape:
        want = "[B, S] with B, S >= 1" if dims == 2 else f"{dims} dimensions, each >= 1"
        raise ValueError(f"{name} must have shape {want}, got {list(ids.shape)}")
    if not reads_free(ids):
        return ids
    lo, hi = (int(t) for t in torch.aminmax(ids))                         # one pass
    if lo < 0 or hi >= vocab_size:
        raise ValueError(f"{name} must be in [0, vocab_size={vocab_size}), "
                         f"found token id {lo if lo < 0 else hi}")
    return ids
