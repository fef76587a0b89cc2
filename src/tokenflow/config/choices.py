"""The values a :class:`~tokenflow.config.ModelConfig` field may take (one list per field,
read by the config's checks and by the HF config parser)."""
from __future__ import annotations

__all__ = ["SCORING_FUNCS", "TOPK_METHODS", "HIDDEN_ACTS", "ROPE_TYPES", "NORM_TYPES",
           "POSITION_TYPES", "LAYER_TYPES"]

SCORING_FUNCS = ("softmax", "sigmoid")
TOPK_METHODS = ("greedy", "group_limited_greedy", "noaux_tc")
"""``topk_method`` values (how group-limited routing ranks expert groups; DeepSeek's names)."""
HIDDEN_ACTS = ("silu", "gelu", "gelu_new", "gelu_pytorch_tanh", "relu")
"""``hidden_act`` values the model runs (``transformers``' ``ACT2FN`` keys; the functions are
:data:`tokenflow.model.ffn.ACTIVATIONS`)."""
ROPE_TYPES = {"default": (), "linear": ("factor",),
              "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                         "original_max_position_embeddings"),
              "yarn": ("original_max_position_embeddings",)}
"""Supported ``rope_type`` values and the keys each needs in ``config.rope_scaling``
(:mod:`tokenflow.model.rope` computes them)."""
NORM_TYPES = ("rmsnorm", "layernorm")
POSITION_TYPES = ("rope", "absolute")
LAYER_TYPES = ("full_attention", "sliding_attention")
