"""Packed weights: ``Linear`` weights back to back in one tensor, so q/k/v (or gate/up) are
one matrix product instead of three (speed only; vLLM's ``QKVParallelLinear`` /
``MergedColumnParallelLinear``, HF's ``Qwen2MoeExperts.gate_up_proj``). The named ``q_proj``,
... layers stay (chapters, checkpoints): each weight becomes a view of its rows, one copy.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

__all__ = ["packed_rows", "linear_weights", "PackedWeights"]


def linear_weights(owner: nn.Module, names: Sequence[str]) -> tuple[torch.Tensor, ...]:
    """``(owner.q_proj.weight, ...)`` for ``names``, read from the registries (skips
    ``nn.Module.__getattr__``, about 1 us a call). Raises ``KeyError`` for a missing name."""
    mods = owner._modules
    return tuple(mods[n]._parameters["weight"] for n in names)


def _back_to_back(weights: Sequence[torch.Tensor]) -> bool:
    """True if ``weights`` are contiguous blocks one after another in one storage."""
    first = weights[0]
    storage = first.untyped_storage().data_ptr()
    for a, b in zip(weights, weights[1:]):
        if b.untyped_storage().data_ptr() != storage or \
                a.data_ptr() + a.nbytes != b.data_ptr():
            return False
    return all(w.is_contiguous() and w.dtype == first.dtype and w.device == first.device
               for w in weights)


def packed_rows(owner: nn.Module, key: str, weights: Sequence[torch.Tensor]) -> torch.Tensor:
    """``weights [rows_i, cols]`` stacked, ``[sum rows_i, cols]``, cached as
    ``owner._packed[key]``. The first call (or one after a weight was replaced: its data
    pointer moved) copies them into one tensor and points each ``.data`` at its rows (weights
    already back to back are viewed). Inference only: no gradient reaches the ``Parameter``.

    Raises ``ValueError``: empty, not 2-D, or ``cols``, dtypes or devices differ.
    """
    cache = owner.__dict__.setdefault("_packed", {})
    hit = cache.get(key)
    if hit is not None and hit[0] == tuple(map(torch.Tensor.data_ptr, weights)):
        return hit[1]
    if not weights or any(w.dim() != 2 for w in weights):
        raise ValueError(f"weights must be a non-empty sequence of 2-D tensors, got shapes "
                         f"{[list(w.shape) for w in weights]}")
    cols, dtype, device = weights[0].shape[1], weights[0].dtype, weights[0].device
    if any(w.shape[1] != cols or w.dtype != dtype or w.device != device for w in weights):
        raise ValueError("weights must share their number of columns, dtype and device, got "
                         f"{[(list(w.shape), w.dtype, str(w.device)) for w in weights]}")
    rows = sum(w.shape[0] for w in weights)
    # The packed tensor is of the weights' kind: plain tensors stay plain even when packed
    # during generation (so the model can still be trained or updated in place afterwards);
    # a model built under inference_mode has inference tensors and gets one.
    with torch.inference_mode(weights[0].is_inference()), torch.no_grad():
        if _back_to_back(weights):
            first = weights[0]
            packed = torch.empty(0, dtype=dtype, device=device)
            packed.set_(first.untyped_storage(), first.storage_offset(), (rows, cols))
        else:
            packed = torch.cat([w.detach() for w in weights])             # [rows, cols]
            begin = 0
            for w in weights:
                w.data = packed[begin:begin + w.shape[0]]
                begin += w.shape[0]
    cache[key] = (tuple(map(torch.Tensor.data_ptr, weights)), packed)
    return packed


class PackedWeights:
    """Mixin: ``.to(...)``, ``.half()``, ... drop the :func:`packed_rows` cache (which would
    keep the old tensors alive)."""

    def _apply(self, fn, recurse=True):
        self.__dict__.pop("_packed", None)
        return super()._apply(fn, recurse)
