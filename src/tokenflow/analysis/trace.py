"""Record the arrow actions of one forward pass: what happened, to which shapes.

Chapter 0 names six arrow actions; the trace records each where the code performs it:

========================  ==========================================  ==========
action                    where                                       colour
========================  ==========================================  ==========
``lookup``                embedding: ids ``[B,S] -> [B,S,H]``         blue
``write KV`` / ``read KV``  attention of every block                  blue
``route top-k``           MoE router of every MoE block               yellow
``dispatch/combine``      MoE experts of every MoE block              yellow
``FFN``                   dense feed-forward blocks                   blue
``project vocab``         LM head ``[B,S,H] -> [B,S,V]``              blue
``sample``                sampling ``[B,V] -> [B]``                   green
========================  ==========================================  ==========

Pass ``Trace()`` as ``trace=`` to the model (or to ``generate``); it records data only:
:func:`tokenflow.viz.trace_table` shows the events as a table.
With ``keep_tensors=True`` it also keeps (detached) tensors that the chapters plot:
``hidden_states`` (the residual stream after the embedding and after each block),
``attention_weights`` (per layer ``[B, n_heads, S_q, S_k]``), ``router`` (per MoE layer,
indices and weights ``[T, K]``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["Trace", "TraceEvent", "COLORS", "trace_shapes"]

COLORS = {"hidden": "#3b7dd8", "moe": "#e0b000", "token": "#2e9e44"}
"""The book's colour code: blue = hidden-state flow, yellow = MoE, green = generated token."""

_ACTION_COLOR = {"lookup": "hidden", "write KV": "hidden", "read KV": "hidden",
                 "FFN": "hidden", "route top-k": "moe", "dispatch/combine": "moe",
                 "project vocab": "hidden", "sample": "token"}


def _shape(x) -> tuple:
    return tuple(x.shape) if isinstance(x, torch.Tensor) else tuple(x)


@dataclass
class TraceEvent:
    """One arrow action.

    Attributes:
        action: one of ``lookup``, ``write KV``, ``read KV``, ``route top-k``,
            ``dispatch/combine``, ``FFN``, ``project vocab``, ``sample``.
        where: the module that did it, e.g. ``"layer 1 attention"``.
        in_shape, out_shape: tensor shapes (tuples of ints).
        nbytes: bytes of the output tensor (or of the KV read, for ``read KV``).
        note: a short human explanation (e.g. ``"[B,S] -> [B,S,H]"``).
    """

    action: str
    where: str
    in_shape: tuple
    out_shape: tuple
    nbytes: int = 0
    note: str = ""

    @property
    def color(self) -> str:
        """The colour-code group of the action: ``hidden``, ``moe`` or ``token``."""
        return _ACTION_COLOR.get(self.action, "hidden")


@dataclass
class Trace:
    """Collects :class:`TraceEvent` rows (and optionally tensors) during forward passes.

    Args:
        keep_tensors: also keep hidden states, attention weights and router choices
            (costs memory; meant for the tiny model).
    """

    keep_tensors: bool = False
    events: list[TraceEvent] = field(default_factory=list)
    hidden_states: list[torch.Tensor] = field(default_factory=list)
    attention_weights: dict[int, torch.Tensor] = field(default_factory=dict)
    router: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)

    def record(self, action: str, where: str, inp, out, nbytes: int | None = None,
               note: str = "") -> None:
        """Append one event; ``inp``/``out`` are tensors or shapes."""
        if nbytes is None:
            nbytes = out.nbytes if isinstance(out, torch.Tensor) else 0
        self.events.append(TraceEvent(action, where, _shape(inp), _shape(out), int(nbytes), note))

    def actions(self) -> list[str]:
        """The action names in order."""
        return [e.action for e in self.events]

    def clear(self) -> None:
        """Forget all events and tensors."""
        self.events.clear()
        self.hidden_states.clear()
        self.attention_weights.clear()
        self.router.clear()

    def __repr__(self) -> str:
        actions = ", ".join(dict.fromkeys(self.actions()))
        return f"Trace({len(self.events)} events: {actions})"


def trace_shapes(config, batch_size: int, seq_len: int, num_experts: int | None = None,
                 num_experts_per_tok: int | None = None, seed: int = 0) -> Trace:
    """Trace one prefill of random token ids through an untrained model of ``config``
    (optionally with another expert count), to watch the shapes change with ``B``, ``S``
    and ``E``. Weights are random: only the shapes mean anything.

    Args:
        config: a :class:`~tokenflow.model.config.ModelConfig` (e.g. ``model.config``).
        batch_size: B >= 1. seq_len: S in ``[1, max_position_embeddings]``.
        num_experts: E (>= 1) to use instead of ``config.num_experts``.
        num_experts_per_tok: K, default ``min(config.num_experts_per_tok, E)``.

    Returns:
        the :class:`Trace` of the forward pass (with a KV cache of capacity ``S``).

    Raises:
        ValueError: on out-of-range ``batch_size``, ``seq_len`` or expert counts.
    """
    from tokenflow.model.kv_cache import KVCache
    from tokenflow.model.transformer import TokenFlowModel
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    if not isinstance(seq_len, int) or not 1 <= seq_len <= config.max_position_embeddings:
        raise ValueError(f"seq_len must be in [1, {config.max_position_embeddings}], "
                         f"got {seq_len!r}")
    changes = {}
    if num_experts is not None:
        if not isinstance(num_experts, int) or num_experts < 1:
            raise ValueError(f"num_experts must be an int >= 1, got {num_experts!r}")
        changes["num_experts"] = num_experts
        changes["num_experts_per_tok"] = min(config.num_experts_per_tok or 1, num_experts)
        changes["n_group"], changes["topk_group"] = 1, 1
    if num_experts_per_tok is not None:
        changes["num_experts_per_tok"] = num_experts_per_tok
    cfg = config.replace(**changes) if changes else config
    torch.manual_seed(seed)
    model = TokenFlowModel(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (batch_size, seq_len))
    trace = Trace()
    with torch.inference_mode():
        model(ids, kv_cache=KVCache(cfg, batch_size, seq_len), trace=trace)
    return trace
