"""``linear(x, weight)``: ``F.linear`` without bias, with large CPU weights pre-packed.

A CPU GEMM kernel reads the weight in its own blocked layout. ``F.linear`` on a plain
``[N, K]`` fp32 weight (MKL's ``sgemm``) re-packs the weight into that layout on every call;
with a few rows of input (a decode step: one row per sequence) the re-packing costs more than
the arithmetic, and the step runs at a fraction of the memory bandwidth. vLLM's CPU backend
packs each weight once, at load time, for oneDNN (``create_onednn_mm`` in
``vllm/model_executor/layers/utils.py``, ``dispatch_cpu_unquantized_gemm``). Here the same is
done lazily: the first inference call with a large fp32 CPU weight packs it with PyTorch's
oneDNN reorder (``torch.ops.mkldnn._reorder_linear_weight``) and later calls multiply with the
packed copy (``torch.ops.mkldnn._linear_pointwise``).

The packed copy is a second copy of the weight (the module keeps its plain weight: views,
checkpoints and training use it). It is rebuilt when the weight is replaced or changed in
place (its data pointer or version counter moved). Small weights (under
:data:`PACK_MIN_NUMEL` values) stay on ``F.linear``: a oneDNN call costs tens of
microseconds more than MKL's, which is more than a small matrix product takes. With gradients
on, on other devices or dtypes, and inside ``torch.compile`` (Inductor lowers ``F.linear``
itself and cannot take the packed copy as an input), it is ``F.linear``. Values agree with
``F.linear`` to float32 rounding (the kernels sum in another order; tested).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["linear", "PACK_MIN_NUMEL"]

PACK_MIN_NUMEL = 1 << 20
"""Weights with at least this many values (4 MB in fp32) are pre-packed on CPU."""

_CAN_PACK = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn,
                                                             "_linear_pointwise")


def _version(weight: torch.Tensor):
    try:
        return weight._version
    except RuntimeError:                  # an inference tensor has no version counter
        return None


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x [..., K] @ weight [N, K]^T -> [..., N]`` (``F.linear(x, weight)``, no bias)."""
    if not (_CAN_PACK and weight.numel() >= PACK_MIN_NUMEL and weight.device.type == "cpu"
            and weight.dtype == torch.float32 and x.dtype == torch.float32
            and not torch.is_grad_enabled() and not torch.compiler.is_compiling()):
        return F.linear(x, weight)
    key = (weight.data_ptr(), _version(weight))
    hit = getattr(weight, "_tf_packed", None)
    if hit is None or hit[0] != key:
        hit = (key, torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None))
        weight._tf_packed = hit
    return torch.ops.mkldnn._linear_pointwise(x, hit[1], None, "none", [], "")
