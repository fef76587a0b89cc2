"""The dense feed-forward network: SwiGLU, as in Llama / Mixtral / DeepSeek experts.

``FFN(x) = down_proj(silu(gate_proj(x)) * up_proj(x))`` (Shazeer 2020, "GLU Variants Improve
Transformer", arXiv:2002.05202; Llama's ``LlamaMLP``). Shapes: ``x [..., H] -> [..., H]``
through an intermediate width ``I``. FLOPs per token: ``2 * 3 * H * I`` (three matmuls).
"""
from __future__ import annotations

import torch
from torch import nn
import torch.nn.functional as F

from .fused import PackedWeights, linear_weights, packed_rows

__all__ = ["FFN"]


class FFN(PackedWeights, nn.Module):
    """SwiGLU feed-forward ``[..., H] -> [..., H]``.

    Args:
        hidden_size: H.
        intermediate_size: I, the width of the gate/up projections.

    Raises:
        ValueError: if either size is < 1.
    """

    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        if hidden_size < 1 or intermediate_size < 1:
            raise ValueError(f"hidden_size and intermediate_size must be >= 1, got "
                             f"{hidden_size}, {intermediate_size}")
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)  # [I, H]
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)    # [I, H]
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)  # [H, I]
        self.gate_up_weight()              # one copy of gate/up weights, packed (fused.py)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [..., H] -> [..., H]``."""
        if torch.is_grad_enabled():
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        # Inference: gate and up as one [2I, H] product (tokenflow.model.fused; same values).
        gate_up = F.linear(x, self.gate_up_weight())                     # [..., 2I]
        gate, up = gate_up.chunk(2, dim=-1)                              # [..., I] each
        return self.down_proj(F.silu(gate) * up)

    def gate_up_weight(self) -> torch.Tensor:
        """``gate_proj`` and ``up_proj`` as one ``[2I, H]`` matrix (gate rows first, HF's
        ``gate_up_proj`` layout): :func:`tokenflow.model.fused.packed_rows`, one copy of the
        weights. Inference only (no gradient reaches the projections through it)."""
        return packed_rows(self, "gate_up", linear_weights(self, ("gate_proj", "up_proj")))
