"""``linear(x, weight)``: ``F.linear`` without bias, large fp32 CPU weights pre-packed.

``F.linear`` (MKL ``sgemm``) re-packs the weight on every call, which costs a decode step more
than its arithmetic. As vLLM's CPU backend (``create_onednn_mm``,
``dispatch_cpu_unquantized_gemm`` in ``vllm/model_executor/layers/utils.py``), the first
inference call packs a large weight for oneDNN (``torch.ops.mkldnn._reorder_linear_weight``),
a second copy rebuilt when the weight changes (data pointer or version); later calls use
``_linear_pointwise``. Small weights, gradients, other devices or dtypes and ``torch.compile``
take ``F.linear`` (equal to float32 rounding, tested).
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
