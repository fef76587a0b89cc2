"""The dense feed-forward network: SwiGLU, as in Llama / Mixtral / DeepSeek experts.

``FFN(x) = down_proj(act(gate_proj(x)) * up_proj(x))`` with ``act = silu`` (SwiGLU; Shazeer
2020, "GLU Variants Improve Transformer", arXiv:2002.05202; Llama's ``LlamaMLP``) or another
activation of :data:`ACTIVATIONS` (HF ``hidden_act``: GELU gives GeGLU, ReLU ReGLU). Shapes:
``x [..., H] -> [..., H]`` through an intermediate width ``I``. FLOPs per token:
``2 * 3 * H * I`` (three matmuls).
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
"""``hidden_act`` names (``transformers``' ``ACT2FN`` keys) -> function: ``silu`` (SiLU),
``gelu`` (exact, erf), ``gelu_new`` and ``gelu_pytorch_tanh`` (the tanh approximation
``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``; HF writes the first out, the second
calls ``F.gelu(approximate="tanh")``: equal to float rounding), ``relu``."""


def activation(hidden_act: str):
    """The function of :data:`ACTIVATIONS` named ``hidden_act``.

    Raises:
        ValueError: ``hidden_act`` is not one of them (the message lists them).
    """
    if not isinstance(hidden_act, str) or hidden_act not in ACTIVATIONS:
        raise ValueError(f"hidden_act must be one of {sorted(ACTIVATIONS)}, got {hidden_act!r}")
    return ACTIVATIONS[hidden_act]


class FFN(PackedWeights, nn.Module):
    """Gated feed-forward ``[..., H] -> [..., H]`` (SwiGLU with the default ``silu``).

    Args:
        hidden_size: H.
        intermediate_size: I, the width of the gate/up projections.
        hidden_act: the activation on the gate, a key of :data:`ACTIVATIONS`.

    Raises:
        ValueError: if either size is < 1, or ``hidden_act`` is not in :data:`ACTIVATIONS`.
    """

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
        """``gate_proj`` and ``up_proj`` as one ``[2I, H]`` matrix (gate rows first, HF's
        ``gate_up_proj`` layout): :func:`tokenflow.model.fused.packed_rows`, one copy of the
        weights. Inference only (no gradient reaches the projections through it)."""
        return packed_rows(self, "gate_up", linear_weights(self, ("gate_proj", "up_proj")))
