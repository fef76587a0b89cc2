"""Mixture of experts: router (top-k), routed + shared experts, dispatch / combine.

Legend: T tokens (B*S), H hidden, E routed experts, K experts per token (top-k), I expert width.

What is routed is the token's hidden state ``[H]``: the router scores it against every
expert, keeps ``K`` of ``E``, each chosen expert runs its own SwiGLU FFN on it, and combine
adds the expert outputs back at the token's position, weighted by the router
(algorithm view of the seed, section 4). Two router families:

* ``softmax`` (Mixtral, arXiv:2401.04088 section 2.1; Qwen-MoE): ``p = softmax(logits)``,
  keep the top-k, optionally renormalise them to sum to 1 (``norm_topk_prob``).
* ``sigmoid`` (DeepSeek-V3, arXiv:2412.19437 section 2.1.2): ``s = sigmoid(logits)``;
  *selection* uses ``s + e_score_correction_bias`` (the auxiliary-loss-free balancing bias),
  optionally restricted to the best ``topk_group`` of ``n_group`` expert groups (a group
  scores the sum of its top-2 biased scores); the *weights* are the unbiased ``s`` of the
  chosen experts, renormalised if ``norm_topk_prob``, times ``routed_scaling_factor``.

Shared experts (DeepSeekMoE) see every token and are added unweighted.
"""
from __future__ import annotations

import torch
from torch import nn

from .config import ModelConfig
from .ffn import FFN

__all__ = ["Router", "MoE", "load_stats", "switch_balance_loss"]


class Router(nn.Module):
    """Scores each token against each expert and picks ``K`` of ``E``.

    Parameters: ``weight [E, H]`` (HF ``gate.weight``); buffer
    ``e_score_correction_bias [E]`` (used by the sigmoid family for selection only).
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.num_experts = config.num_experts
        self.top_k = config.num_experts_per_tok
        self.scoring_func = config.scoring_func
        self.norm_topk_prob = config.norm_topk_prob
        self.routed_scaling_factor = config.routed_scaling_factor
        self.n_group = config.n_group
        self.topk_group = config.topk_group
        self.weight = nn.Parameter(torch.empty(config.num_experts, config.hidden_size))
        nn.init.normal_(self.weight, std=0.02)
        self.register_buffer("e_score_correction_bias", torch.zeros(config.num_experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Route tokens.

        Args:
            x: ``[T, H]`` hidden states.

        Returns:
            ``(indices [T,K] int64, weights [T,K] float32, logits [T,E] float32)``. Indices
            are ordered by decreasing selection score.
        """
        logits = x.float() @ self.weight.float().t()                     # [T, E]
        if self.scoring_func == "softmax":
            scores = logits.softmax(dim=-1)                               # [T, E]
            choice = scores
        else:
            scores = logits.sigmoid()                                     # [T, E]
            choice = scores + self.e_score_correction_bias                # [T, E]
        if self.n_group > 1:
            T = x.shape[0]
            grouped = choice.view(T, self.n_group, -1)                    # [T, G, E/G]
            group_scores = grouped.topk(min(2, grouped.shape[-1]), dim=-1).values.sum(-1)
            keep = group_scores.topk(self.topk_group, dim=-1).indices     # [T, topk_group]
            group_mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, keep, True)
            choice = choice.masked_fill(~group_mask[:, :, None].expand_as(grouped)
                                        .reshape(T, -1), float("-inf"))
        indices = choice.topk(self.top_k, dim=-1).indices                 # [T, K]
        weights = scores.gather(1, indices)                               # [T, K]
        if self.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        weights = weights * self.routed_scaling_factor
        return indices, weights, logits


class MoE(nn.Module):
    """Sparse feed-forward ``[B,S,H] -> [B,S,H]``: router, ``E`` routed SwiGLU experts of
    width ``moe_intermediate_size``, and ``num_shared_experts`` shared experts (fused into
    one SwiGLU of width ``num_shared_experts * moe_intermediate_size``, as DeepSeek does).
    """

    def __init__(self, config: ModelConfig, layer_idx: int = 0):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_experts = config.num_experts
        self.top_k = config.num_experts_per_tok
        self.gate = Router(config)
        self.experts = nn.ModuleList(FFN(config.hidden_size, config.moe_intermediate_size)
                                     for _ in range(config.num_experts))
        self.shared_experts = (FFN(config.hidden_size,
                                   config.moe_intermediate_size * config.num_shared_experts)
                               if config.num_shared_experts > 0 else None)

    def dispatch_combine(self, x: torch.Tensor, indices: torch.Tensor,
                         weights: torch.Tensor) -> torch.Tensor:
        """Vectorised dispatch -> expert compute -> combine.

        Sorts the ``T*K`` (token, expert) pairs by expert, runs each expert once on its
        contiguous block of hidden states, scales by the router weight and scatter-adds
        the results back to the token positions.

        Args:
            x: ``[T, H]``; indices, weights: ``[T, K]``.

        Returns:
            ``[T, H]``: the routed part of the MoE output.
        """
        T, H = x.shape
        flat_expert = indices.reshape(-1)                                 # [T*K]
        order = flat_expert.argsort(stable=True)                          # [T*K]
        token_of = order // self.top_k                                    # [T*K]
        counts = torch.bincount(flat_expert, minlength=self.num_experts).tolist()  # [E]
        routed_x = x[token_of]                                            # [T*K, H] dispatch
        routed_w = weights.reshape(-1)[order].to(x.dtype)[:, None]        # [T*K, 1]
        out = torch.zeros_like(x)                                         # [T, H]
        pieces = []
        begin = 0
        for e, n in enumerate(counts):
            if n:
                pieces.append(self.experts[e](routed_x[begin:begin + n]))  # [n, H]
            begin += n
        expert_out = torch.cat(pieces) * routed_w                         # [T*K, H]
        out.index_add_(0, token_of, expert_out)                           # combine
        return out

    def forward(self, x: torch.Tensor, trace=None) -> torch.Tensor:
        """``x [B,S,H] -> [B,S,H]``; records ``route top-k`` and ``dispatch/combine``."""
        B, S, H = x.shape
        flat = x.reshape(B * S, H)                                        # [T, H]
        indices, weights, logits = self.gate(flat)                        # [T, K] x2, [T, E]
        if self.training:
            self.aux_loss = switch_balance_loss(logits, indices, self.num_experts)
        out = self.dispatch_combine(flat, indices, weights)               # [T, H]
        if self.shared_experts is not None:
            out = out + self.shared_experts(flat)
        out = out.view(B, S, H)
        if trace is not None:
            where = f"layer {self.layer_idx} MoE"
            trace.record("route top-k", where, flat, indices,
                         note=f"{self.top_k} of {self.num_experts} experts per token")
            trace.record("dispatch/combine", where, flat, out,
                         note=f"{B * S * self.top_k} (token, expert) pairs, weighted sum back")
            if trace.keep_tensors:
                trace.router[self.layer_idx] = {"indices": indices.detach(),
                                                "weights": weights.detach(),
                                                "logits": logits.detach()}
        return out


def switch_balance_loss(logits: torch.Tensor, indices: torch.Tensor, num_experts: int
                        ) -> torch.Tensor:
    """Load-balancing auxiliary loss used only in training: ``E * sum_e f_e * P_e``, with
    ``f_e`` the share of assignments to expert ``e`` and ``P_e`` its mean router probability
    (Switch Transformer, Fedus et al. 2021, arXiv:2101.03961, eq. 4). 1.0 when balanced.
    """
    f = torch.bincount(indices.reshape(-1), minlength=num_experts).float()
    f = f / f.sum()
    P = logits.softmax(dim=-1).mean(dim=0)
    return num_experts * (f * P).sum()


def load_stats(indices: torch.Tensor, num_experts: int) -> dict:
    """Tokens per expert and load imbalance for router choices ``indices [T,K]``.

    Returns:
        dict with ``counts`` (``[E]`` int64), ``fraction`` (``[E]``, share of the ``T*K``
        assignments), ``imbalance`` (max count / mean count; 1.0 is perfectly even).

    Raises:
        ValueError: if ``num_experts < 1`` or an index is outside ``[0, num_experts)``.
    """
    if num_experts < 1:
        raise ValueError(f"num_experts must be >= 1, got {num_experts}")
    if indices.numel() and (indices.min() < 0 or indices.max() >= num_experts):
        raise ValueError(f"indices must be in [0, num_experts={num_experts})")
    counts = torch.bincount(indices.reshape(-1), minlength=num_experts)
    total = counts.sum().clamp(min=1)
    mean = counts.float().mean().clamp(min=1e-12)
    return {"counts": counts, "fraction": counts.float() / total,
            "imbalance": float(counts.max().float() / mean) if counts.numel() else 1.0}
