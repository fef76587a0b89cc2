"""Packed weights: several ``Linear`` weights stored back to back in one tensor (speed only).

A decode step multiplies one token's hidden state by every weight matrix of the model. On a
CPU each matrix product costs a fixed overhead on top of reading the weights, so reading the
Q, K and V projections as **one** ``[nh*D + 2*nkv*D, H]`` matrix (and an FFN's gate and up
projections as one ``[2I, H]`` matrix) does the same arithmetic with fewer, larger products:
what vLLM's ``QKVParallelLinear`` / ``MergedColumnParallelLinear`` and HF's
``Qwen2MoeExperts.gate_up_proj`` do.

The modules keep their separate, named ``q_proj`` / ``k_proj`` / ``v_proj`` (and ``gate_proj``
/ ``up_proj``) ``Linear`` layers: that is what the chapters show and what checkpoints and
:mod:`tokenflow.interop` name. :func:`packed_rows` moves their weights into one tensor and
makes each ``Linear.weight`` a view of its block of rows, so there is still **one copy** of
every weight: in-place updates (``load_state_dict``, an optimiser step) change the packed
tensor too. A weight that was replaced since (``model.to(dtype)``,
``load_state_dict(assign=True)``) has a new data pointer; the next call notices and packs
again.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

__all__ = ["packed_rows", "linear_weights", "PackedWeights"]


def linear_weights(owner: nn.Module, names: Sequence[str]) -> tuple[torch.Tensor, ...]:
    """The ``weight`` of each named ``Linear`` child of ``owner``, in order: what
    ``(owner.q_proj.weight, owner.k_proj.weight, ...)`` returns, read from the modules'
    registries directly. Speed only: ``nn.Module.__getattr__`` costs about a microsecond per
    call on the 2-core CPUs this book targets, and a decode step would pay it twice per packed
    weight, per layer, per token.

    Raises:
        KeyError: a name that is not a child module of ``owner``, or a child without a
            registered ``weight``.
    """
    mods = owner._modules
    return tuple(mods[n]._parameters["weight"] for n in names)


def _back_to_back(weights: Sequence[torch.Tensor]) -> bool:
    """True if ``weights`` are contiguous blocks that follow each other in one storage."""
    first = weights[0]
    storage = first.untyped_storage().data_ptr()
    for a, b in zip(weights, weights[1:]):
        if b.untyped_storage().data_ptr() != storage or \
                a.data_ptr() + a.nbytes != b.data_ptr():
            return False
    return all(w.is_contiguous() and w.dtype == first.dtype and w.device == first.device
               for w in weights)


def packed_rows(owner: nn.Module, key: str, weights: Sequence[torch.Tensor]) -> torch.Tensor:
    """The 2-D ``weights`` stacked along their rows, ``[sum of rows, cols]``, without a copy.

    The first call (and any call after a weight was replaced) copies the weights into one new
    tensor and points each weight's ``.data`` at its block of rows; later calls return that
    tensor (cached on ``owner`` under ``key``, checked against the weights' data pointers).
    Weights that already lie back to back in one storage (an expert's gate and up projections
    inside :meth:`tokenflow.model.moe.MoE.stacked_weights`) are viewed, not moved.

    Use it only without autograd (inference): the packed tensor is not connected to the
    ``Parameter`` objects in the autograd graph, so gradients would not reach them. The
    modules call their separate projections when gradients are on.

    Args:
        owner: the module that caches the packed tensor (``owner._packed[key]``).
        key: which packed tensor of ``owner`` (``"qkv"``, ``"gate_up"``, ...).
        weights: ``[rows_i, cols]`` tensors (``Linear.weight``), same ``cols``, dtype, device.

    Returns:
        ``[sum_i rows_i, cols]`` tensor whose row blocks are the weights, in order.

    Raises:
        ValueError: if ``weights`` is empty, not all 2-D, or their ``cols``, dtypes or
            devices differ.
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
    """Mixin for a module that caches :func:`packed_rows` results: ``model.to(...)``,
    ``.half()``, ``.cuda()`` replace the weights, so the cache is dropped first (otherwise it
    would keep the old tensors alive until the next forward packs again)."""

    def _apply(self, fn, recurse=True):
        self.__dict__.pop("_packed", None)
        return super()._apply(fn, recurse)
