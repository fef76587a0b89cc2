"""The MoE layer opened up: the reference loops, the load statistics, the input capture.

* :func:`route_reference` and :func:`moe_reference_loop`: the router and the layer written
  the obvious way (token by token, expert by expert), which the tests prove equal to
  :func:`tokenflow.model.moe.route` and :class:`tokenflow.model.moe.MoE`;
* :func:`expert_capacity` and :func:`load_stats`: how evenly the router spreads the tokens,
  and what a capacity-limited MoE would drop;
* :func:`moe_inputs`: what one MoE layer received and returned in a forward pass.
"""
from __future__ import annotations

import math
from fractions import Fraction

import torch

from tokenflow.model.moe import MoE, Router, check_top_k
from tokenflow.validate import index, integer, number

__all__ = ["route_reference", "moe_reference_loop", "expert_capacity", "load_stats",
           "moe_inputs"]


def route_reference(router: Router, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The router written the obvious way: one token at a time, experts chosen by Python's
    ``sorted`` on ``(-score, expert)``. Slow; used by the tests and the chapter to check
    :func:`route`.

    Args:
        router: a :class:`Router`.
        x: ``[T, H]``.

    Returns:
        ``(indices [T,K] int64, weights [T,K] float32)``.

    Raises:
        ValueError: if ``x`` is not ``[T, H]`` or ``router.top_k`` is outside ``[1, E]``.
    """
    if x.dim() != 2 or x.shape[1] != router.weight.shape[1]:
        raise ValueError(f"x must have shape [T, H={router.weight.shape[1]}], got {list(x.shape)}")
    E, K = router.weight.shape[0], router.top_k
    check_top_k(K, E)
    G = router.n_group
    per_group = E // G
    all_idx, all_w = [], []
    for t in range(x.shape[0]):
        logits = (x[t:t + 1].float() @ router.weight.float().t())[0]           # [E]
        if router.scoring_func == "softmax":
            scores = logits.softmax(-1).tolist()
            choice = list(scores)
        else:
            scores = logits.sigmoid().tolist()
            bias = router.e_score_correction_bias.float().tolist()
            choice = [s + b for s, b in zip(scores, bias)]
        allowed = list(range(E))
        if G > 1 and router.topk_method != "greedy":
            best = 2 if router.topk_method == "noaux_tc" else 1
            group_score = [sum(sorted(choice[g * per_group:(g + 1) * per_group],
                                      reverse=True)[:best]) for g in range(G)]
            best_groups = sorted(range(G), key=lambda g: (-group_score[g], g))[:router.topk_group]
            allowed = [e for e in range(E) if e // per_group in best_groups]
        chosen = sorted(allowed, key=lambda e: (-choice[e], e))[:K]
        w = [scores[e] for e in chosen]                                         # unbiased
        if router.norm_topk_prob:
            total = sum(w)
            w = [v / (total + 1e-20) for v in w]
        all_idx.append(chosen)
        all_w.append([v * router.routed_scaling_factor for v in w])
    return (torch.tensor(all_idx, dtype=torch.int64).view(-1, K),
            torch.tensor(all_w, dtype=torch.float32).view(-1, K))



def moe_reference_loop(moe: MoE, x: torch.Tensor, indices: torch.Tensor | None = None,
                       weights: torch.Tensor | None = None) -> torch.Tensor:
    """The obvious way to run an MoE layer: for each token, for each of its K experts,
    ``out[t] += w[t,k] * expert(x[t])``; then add the shared experts.

    Args:
        moe: an :class:`MoE`.
        x: ``[T, H]`` or ``[B, S, H]``.
        indices, weights: ``[T, K]`` router choices; if omitted they come from
            :func:`route_reference` (so routing is checked too).

    Returns:
        the MoE output, shaped like ``x``.

    Raises:
        ValueError: if ``x`` is not ``[..., H]`` or only one of ``indices`` / ``weights`` is given.
    """
    H = moe.gate.weight.shape[1]
    if x.dim() not in (2, 3) or x.shape[-1] != H:
        raise ValueError(f"x must have shape [T, H] or [B, S, H] with H={H}, got {list(x.shape)}")
    if (indices is None) != (weights is None):
        raise ValueError("give both indices and weights, or neither")
    flat = x.reshape(-1, H)                                               # [T, H]
    if indices is None:
        indices, weights = route_reference(moe.gate, flat)                # [T, K] x2
    out = torch.zeros_like(flat)                                          # [T, H]
    for t in range(flat.shape[0]):
        for k in range(indices.shape[1]):
            e = int(indices[t, k])
            out[t] += weights[t, k].to(flat.dtype) * moe.experts[e](flat[t])   # [H]
        if moe.shared_experts is not None:
            out[t] += moe.shared_experts(flat[t])                         # [H]
    return out.view_as(x)


def expert_capacity(num_tokens: int, num_experts: int, top_k: int,
                    capacity_factor: float = 1.0) -> int:
    """Rows an expert accepts in a capacity-limited MoE:
    ``ceil(capacity_factor * num_tokens * top_k / num_experts)``.

    GShard (arXiv:2006.16668) and Switch Transformer (arXiv:2101.03961, section
    2.2: "expert capacity = tokens per batch / number of experts x capacity factor") drop the
    pairs beyond it; DeepSeek-V3 drops none (arXiv:2412.19437, section 2.1.2, "No
    Token-Dropping"), so there it is only a yardstick for imbalance.

    Raises:
        ValueError: ``num_tokens < 0``, bad ``top_k`` / ``num_experts``, ``capacity_factor <= 0``.
    """
    integer("num_tokens", num_tokens, 0)
    check_top_k(top_k, num_experts)
    number("capacity_factor", capacity_factor, 0, lo_open=True)
    exact = Fraction(str(capacity_factor)) * num_tokens * top_k / num_experts   # no 2.0000001
    return math.ceil(exact)


def load_stats(indices: torch.Tensor, num_experts: int,
               capacity_factor: float | None = None) -> dict:
    """Tokens per expert and load imbalance for router choices ``indices [T,K]``.

    Returns:
        dict with

        * ``counts`` ``[E]`` int64: (token, expert) pairs each expert received;
        * ``fraction`` ``[E]``: share of the ``T*K`` pairs;
        * ``mean``: ``T*K/E``, the count of a perfectly balanced expert;
        * ``imbalance``: max count / mean count (1.0 is perfectly even; ``imbalance - 1`` is
          the "MaxVio" of the auxiliary-loss-free balancing paper, arXiv:2408.15664);
        * ``cv``: standard deviation / mean of the counts;
        * with ``capacity_factor``: ``capacity`` (:func:`expert_capacity`), ``capacity_used``
          ``[E]`` (count / capacity), ``overflow`` ``[E]`` (pairs beyond capacity),
          ``dropped`` (their total) and ``dropped_fraction`` (of ``T*K``): what a
          capacity-limited MoE (GShard / Switch) would drop.

    Raises:
        ValueError: ``indices`` not ``[T, K]``, ``num_experts < 1``, an index outside
            ``[0, num_experts)``, ``K > num_experts`` or ``capacity_factor <= 0``.
    """
    integer("num_experts", num_experts, 1)
    if indices.dim() != 2:
        raise ValueError(f"indices must have shape [T, K], got {list(indices.shape)}")
    T, K = indices.shape
    if K > num_experts:
        raise ValueError(f"indices has K={K} columns but num_experts={num_experts}: "
                         f"top_k must be in [1, num_experts]")
    if indices.numel() and (indices.min() < 0 or indices.max() >= num_experts):
        raise ValueError(f"indices must be in [0, num_experts={num_experts})")
    counts = torch.bincount(indices.reshape(-1), minlength=num_experts)   # [E]
    total = T * K
    mean = total / num_experts
    cf = counts.float()
    out = {"counts": counts,
           "fraction": cf / max(total, 1),
           "mean": mean,
           "imbalance": int(counts.max()) / mean if total else 1.0,
           "cv": float(cf.std(correction=0) / mean) if total else 0.0}
    if capacity_factor is not None:
        cap = expert_capacity(T, num_experts, max(K, 1), capacity_factor) if K else 0
        overflow = (counts - cap).clamp(min=0)
        out.update(capacity=cap,
                   capacity_used=cf / max(cap, 1),
                   overflow=overflow,
                   dropped=int(overflow.sum()),
                   dropped_fraction=float(overflow.sum()) / max(total, 1))
    return out



@torch.no_grad()
def moe_inputs(model, input_ids: torch.Tensor, layer_idx: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Run ``model`` on ``input_ids`` and capture what MoE layer ``layer_idx`` received and
    returned (its input is the post-attention RMSNorm of the residual stream).

    Args:
        model: a :class:`~tokenflow.model.transformer.TokenFlowModel`.
        input_ids: ``[B, S]``.
        layer_idx: a layer whose ``mlp`` is an :class:`MoE`.

    Returns:
        ``(x [B,S,H], out [B,S,H])``.

    Raises:
        ValueError: if ``layer_idx`` is out of range or that layer is dense.
    """
    index("layer_idx", layer_idx, len(model.layers), "num_hidden_layers")
    mlp = model.layers[layer_idx].mlp
    if not isinstance(mlp, MoE):
        raise ValueError(f"layer_idx {layer_idx} is a dense FFN layer, not MoE")
    seen = {}

    def hook(module, args, output):
        seen["x"], seen["out"] = args[0].detach(), output.detach()

    handle = mlp.register_forward_hook(hook)
    try:
        model(input_ids)
    finally:
        handle.remove()
    return seen["x"], seen["out"]
