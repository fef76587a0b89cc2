"""The dense FFN ``down_proj(act(gate_proj(x)) * up_proj(x))``, ``[..., H] -> [..., H]``
through width ``I``: SwiGLU with ``silu`` (arXiv:2002.05202; HF ``LlamaMLP``), GeGLU / ReGLU
with another ``hidden_act``.
"""
from __future__ import annotations

import torch
from torch import nn
import torch.nn.functional as F

from tokenflow.config import HIDDEN_ACTS
from .fused import PackedWeights, linear_weights, packed_rows
from .linear import linear

__all__ = ["FFN", "ACTIVATIONS", "activation"]


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


ACTIVATIONS = dict(zip(HIDDEN_ACTS, (F.silu, F.gelu, _gelu_tanh, _gelu_tanh, F.relu), strict=True))
"""HF ``ACT2FN`` names -> function; ``gelu_new`` and ``gelu_pytorch_tanh`` are both the tanh
approximation (equal to float rounding)."""


def activation(hidden_act: str):
    """:data:`ACTIVATIONS` ``[hidden_act]``; ``ValueError`` (listing them) for another name."""
    if not isinstance(hidden_act, str) or hidden_act not in ACTIVATIONS:
        raise ValueError(f"hidden_act must be one of {sorted(ACTIVATIONS)}, got {hidden_act!r}")
    return ACTIVATIONS[hidden_act]


class FFN(PackedWeights, nn.Module):
    """Gated FFN ``H -> I -> H``. Raises ``ValueError``: a size < 1, an unknown ``hidden_act``."""

    def __init__(self, hidden_size: int, intermediate_size: int, hidden_act: str = "silu"):
        super().__init__()
        if hidden_size < 1 or intermediate_size < 1:
            raise ValueError(f"hidden_size and intermediate_size must be >= 1, got "
                             f"{hidden_size}, {intermediate_size}")
        self.hidden_act = hidden_act
        self.act_fn = activation(hidden_act)
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)  # [I, H]
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)    # [I, H]
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)  # [H, I]
        self.gate_up_weight()              # one copy of gate/up weights, packed (fused.py)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [..., H] -> [..., H]``."""
        if torch.is_grad_enabled():
            return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
        # Inference: gate and up as one [2I, H] product (tokenflow.model.fused; same values).
        gate_up = linear(x, self.gate_up_weight())                       # [..., 2I]
        gate, up = gate_up.chunk(2, dim=-1)                              # [..., I] each
        return linear(self.act_fn(gate) * up, self.down_proj.weight)

    def gate_up_weight(self) -> torch.Tensor:
        """``gate_proj``, ``up_proj`` as one ``[2I, H]`` matrix (HF's ``gate_up_proj``), packed."""
        return packed_rows(self, "gate_up", linear_weights(self, ("gate_proj", "up_proj")))
