"""Mixture of experts: router (top-k), routed + shared experts, dispatch / combine.

Legend: T tokens (B*S), H hidden, E routed experts, K experts per token (top-k), I expert width,
P = T*K (token, expert) pairs.

What is routed is the token's hidden state ``[H]``: the router (路由 / gate 门控) scores it against
every expert (专家), keeps ``K`` of ``E``, each chosen expert runs its own SwiGLU FFN on it, and
combine adds the expert outputs back at the token's position, weighted by the router
(the algorithm view of chapter 3). Two router families:

* ``softmax`` (Mixtral, arXiv:2401.04088 section 2.1; Qwen-MoE): ``p = softmax(logits)``,
  keep the top-k, optionally renormalise them to sum to 1 (``norm_topk_prob``; Mixtral's
  ``softmax(TopK(logits))`` is the same thing).
* ``sigmoid`` (DeepSeek-V3, arXiv:2412.19437 section 2.1.2): ``s = sigmoid(logits)``;
  *selection* uses ``s + e_score_correction_bias`` (the auxiliary-loss-free balancing bias);
  the *weights* are the unbiased ``s`` of the chosen experts, renormalised if
  ``norm_topk_prob``, times ``routed_scaling_factor``.

Either family may restrict the choice to the best ``topk_group`` of ``n_group`` expert groups
first; ``topk_method`` says how a group is ranked (HF's ``DeepseekV2TopkRouter`` and
``DeepseekV3TopkRouter``): ``"noaux_tc"`` (DeepSeek-V3) by the sum of its 2 best selection
scores, ``"group_limited_greedy"`` (DeepSeek-V2) by its best one, ``"greedy"`` ignores the
groups (DeepSeek-V2-Lite).

Ties are broken towards the lower expert index (a stable sort), in the vectorised router and in
the reference loop alike, so both always pick the same experts.

Shared experts (DeepSeekMoE) see every token and are added unweighted.

Ways to run the routed experts, proven equal by the tests (:meth:`MoE.routed_experts` picks
the fastest; all add the same products in the same order): :meth:`MoE.dispatch_combine`
(:func:`dispatch` -> :func:`run_experts` -> :func:`combine`: the chapter's pair, and what
:mod:`tokenflow.parallel.expert_parallel` sends over all-to-all), :meth:`MoE.grouped_experts`
(two grouped matrix products over the experts' stacked weights, HF's ``grouped_mm`` backend: no
loop over experts, no host sync) and :meth:`MoE.one_token_experts` (batch-1 decode, no sort).
The obvious loop, token by token, is :func:`tokenflow.explain.moe.moe_reference_loop`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tokenflow.validate import integer, reads_free
from tokenflow.config import SCORING_FUNCS, TOPK_METHODS, ModelConfig
from .ffn import FFN, activation
from .fused import PackedWeights, linear_weights, packed_rows

__all__ = ["Router", "MoE", "route", "check_top_k", "Dispatch", "dispatch", "run_experts",
           "combine", "switch_balance_loss"]

# Grouped matrix product (torch >= 2.10 public; older: the private op; None: not available).
_grouped_mm = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)
_GROUPED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)            # what it accepts


# ----------------------------------------------------------------------------- routing
def check_top_k(top_k, num_experts, name: str = "top_k") -> None:
    """Raise ``ValueError`` unless ``1 <= top_k <= num_experts`` (both ints, ``num_experts >= 1``).

    ``name`` is the argument name used in the message (e.g. ``num_experts_per_tok``).
    """
    integer("num_experts", num_experts, 1)
    integer(name, top_k, 1, num_experts, hi_name="num_experts",
            above="a token cannot go to more experts than exist")


def _check_groups(num_experts: int, top_k: int, n_group: int, topk_group: int) -> None:
    if n_group < 1 or num_experts % n_group:
        raise ValueError(f"n_group ({n_group}) must be >= 1 and divide num_experts ({num_experts})")
    if not 1 <= topk_group <= n_group:
        raise ValueError(f"topk_group must be in [1, n_group={n_group}], got {topk_group}")
    if n_group > 1 and topk_group * (num_experts // n_group) < top_k:
        raise ValueError(f"topk_group * (num_experts // n_group) = "
                         f"{topk_group * (num_experts // n_group)} must be >= top_k = {top_k}")


def _stable_topk(values: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the ``k`` largest entries of each row, largest first; on ties the lower
    index wins (a stable descending sort; ``torch.topk`` does not promise an order)."""
    return values.sort(dim=-1, descending=True, stable=True).indices[..., :k]


def route(x: torch.Tensor, weight: torch.Tensor, top_k: int, *, scoring_func: str = "softmax",
          norm_topk_prob: bool = True, routed_scaling_factor: float = 1.0, n_group: int = 1,
          topk_group: int = 1, bias: torch.Tensor | None = None,
          topk_method: str = "noaux_tc") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Choose ``top_k`` experts per token and their weights (vectorised).

    Args:
        x: ``[T, H]`` hidden states (any float dtype; scored in float32).
        weight: ``[E, H]`` router weight (HF ``gate.weight``).
        top_k: K, experts per token, ``1 <= K <= E``.
        scoring_func: ``"softmax"`` (Mixtral, arXiv:2401.04088 section 2.1) or ``"sigmoid"``
            (DeepSeek-V3, arXiv:2412.19437 section 2.1.2).
        norm_topk_prob: renormalise the K chosen weights to sum to 1.
        routed_scaling_factor: multiplies the final weights (DeepSeek-V3: 2.5).
        n_group, topk_group: group-limited routing: keep only the ``topk_group`` best of
            ``n_group`` equal groups of experts, then pick K among them. ``n_group=1``
            disables it.
        bias: ``[E]`` selection-only bias (``e_score_correction_bias``); added to the sigmoid
            scores to *choose* experts, never to the weights. Ignored for softmax.
        topk_method: how groups are ranked (``config.TOPK_METHODS``): ``"noaux_tc"`` by
            the sum of a group's 2 best selection scores (HF ``DeepseekV3TopkRouter``),
            ``"group_limited_greedy"`` by its best score, ``"greedy"`` not at all: the
            groups are ignored (both HF ``DeepseekV2TopkRouter``).

    Returns:
        ``(indices [T,K] int64, weights [T,K] float32, logits [T,E] float32)``; indices are in
        decreasing selection score, ties to the lower expert index.

    Raises:
        ValueError: bad shapes, ``top_k`` outside ``[1, E]``, unknown ``scoring_func`` or
            ``topk_method``, inconsistent ``n_group`` / ``topk_group``, ``bias`` not ``[E]``.
    """
    if x.dim() != 2:
        raise ValueError(f"x must have shape [T, H], got {list(x.shape)}")
    if weight.dim() != 2 or weight.shape[1] != x.shape[1]:
        raise ValueError(f"weight must have shape [E, H={x.shape[1]}], got {list(weight.shape)}")
    E = weight.shape[0]
    check_top_k(top_k, E)
    if scoring_func not in SCORING_FUNCS:
        raise ValueError(f"scoring_func must be one of {SCORING_FUNCS}, got {scoring_func!r}")
    if topk_method not in TOPK_METHODS:
        raise ValueError(f"topk_method must be one of {TOPK_METHODS}, got {topk_method!r}")
    _check_groups(E, top_k, n_group, topk_group)
    if bias is not None and tuple(bias.shape) != (E,):
        raise ValueError(f"bias must have shape [E={E}], got {list(bias.shape)}")
    T = x.shape[0]
    logits = F.linear(x.float(), weight.float())                          # [T, E]
    if scoring_func == "softmax":
        scores = logits.softmax(dim=-1)                                   # [T, E]
        choice = scores                                                   # [T, E]
    else:
        scores = logits.sigmoid()                                         # [T, E]
        choice = scores if bias is None else scores + bias.float()        # [T, E]
    if n_group > 1 and topk_method != "greedy":
        grouped = choice.view(T, n_group, E // n_group)                   # [T, G, E/G]
        if topk_method == "noaux_tc":
            best2 = grouped.topk(min(2, E // n_group), dim=-1).values     # [T, G, 2]
            group_scores = best2.sum(-1)                                  # [T, G]
        else:
            group_scores = grouped.max(dim=-1).values                     # [T, G]
        keep = _stable_topk(group_scores, topk_group)                     # [T, topk_group]
        dropped = torch.ones_like(group_scores, dtype=torch.bool).scatter_(1, keep, False)
        choice = grouped.masked_fill(dropped[..., None], float("-inf")).view(T, E)  # [T, E]
    indices = _stable_topk(choice, top_k)                                 # [T, K]
    weights = scores.gather(1, indices)                                   # [T, K] unbiased
    if norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)   # [T, K]
    if routed_scaling_factor != 1.0:                                      # x * 1.0 == x
        weights = weights * routed_scaling_factor                         # [T, K]
    return indices, weights, logits


class Router(nn.Module):
    """Scores each token against each expert and picks ``K`` of ``E`` (see :func:`route`).

    Parameters: ``weight [E, H]`` (HF ``gate.weight``); buffer
    ``e_score_correction_bias [E]`` (used by the sigmoid family for selection only).
    Attributes mirror the config: ``top_k``, ``scoring_func``, ``norm_topk_prob``,
    ``routed_scaling_factor``, ``n_group``, ``topk_group``, ``topk_method``.
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
        self.topk_method = config.topk_method
        self.weight = nn.Parameter(torch.empty(config.num_experts, config.hidden_size))
        nn.init.normal_(self.weight, std=0.02)
        self.register_buffer("e_score_correction_bias", torch.zeros(config.num_experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Route tokens.

        Args:
            x: ``[T, H]`` hidden states.

        Returns:
            ``(indices [T,K] int64, weights [T,K] float32, logits [T,E] float32)``. Indices
            are ordered by decreasing selection score (ties: lower expert index first).

        Raises:
            ValueError: from :func:`route` (e.g. ``top_k`` changed to more than ``E``).
        """
        return route(x, self.weight, self.top_k, scoring_func=self.scoring_func,
                     norm_topk_prob=self.norm_topk_prob,
                     routed_scaling_factor=self.routed_scaling_factor, n_group=self.n_group,
                     topk_group=self.topk_group, topk_method=self.topk_method,
                     bias=self.e_score_correction_bias if self.scoring_func == "sigmoid" else None)


# ----------------------------------------------------------------------------- dispatch
@dataclass
class Dispatch:
    """The ``P = T*K`` (token, expert) pairs, grouped by expert: what dispatch sends.

    Attributes:
        hidden: ``[P, H]`` the routed hidden states (copies of token rows), expert 0's block
            first, then expert 1's...
        token: ``[P]`` int64, the token each row came from (where combine puts it back).
        expert: ``[P]`` int64, non-decreasing, the expert each row goes to.
        weight: ``[P]`` float32, the router weight of the pair.
        counts: ``[E]`` int64, rows per expert (the sizes of the blocks).
        num_tokens: T.
    """

    hidden: torch.Tensor
    token: torch.Tensor
    expert: torch.Tensor
    weight: torch.Tensor
    counts: torch.Tensor
    num_tokens: int


def dispatch(x: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor,
             num_experts: int) -> Dispatch:
    """Dispatch: copy each token's hidden state once per chosen expert and group the copies by
    expert (a stable sort, so within an expert rows keep token order).

    Args:
        x: ``[T, H]``; indices: ``[T, K]`` int64 in ``[0, num_experts)``; weights: ``[T, K]``.
        num_experts: E.

    Returns:
        a :class:`Dispatch` with ``hidden [T*K, H]``.

    Raises:
        ValueError: shape mismatch, or (for CPU tensors, where reading them costs no device
            synchronisation: :func:`tokenflow.validate.reads_free`) an index outside
            ``[0, num_experts)``.
    """
    if x.dim() != 2:
        raise ValueError(f"x must have shape [T, H], got {list(x.shape)}")
    if indices.dim() != 2 or indices.shape[0] != x.shape[0]:
        raise ValueError(f"indices must have shape [T={x.shape[0]}, K], got {list(indices.shape)}")
    if weights.shape != indices.shape:
        raise ValueError(f"weights must have the shape of indices {list(indices.shape)}, "
                         f"got {list(weights.shape)}")
    if num_experts < 1:
        raise ValueError(f"num_experts must be >= 1, got {num_experts}")
    if indices.numel() and reads_free(indices) and \
            (int(indices.min()) < 0 or int(indices.max()) >= num_experts):
        raise ValueError(f"indices must be in [0, num_experts={num_experts})")
    K = indices.shape[1]
    flat_expert = indices.reshape(-1)                                     # [P]
    order = flat_expert.argsort(stable=True)                              # [P]
    token = order // K                                                    # [P]
    return Dispatch(hidden=x[token],                                      # [P, H]
                    token=token,
                    expert=flat_expert[order],                            # [P]
                    weight=weights.reshape(-1)[order].float(),            # [P]
                    counts=torch.bincount(flat_expert, minlength=num_experts),  # [E]
                    num_tokens=x.shape[0])


def run_experts(experts, hidden: torch.Tensor, counts) -> torch.Tensor:
    """Expert compute: run expert ``e`` once on its block of ``counts[e]`` rows.

    Args:
        experts: a sequence of ``E`` modules ``[n, H] -> [n, H]``.
        hidden: ``[P, H]`` rows grouped by expert (as :func:`dispatch` returns them).
        counts: ``[E]`` rows per expert (tensor or list), summing to ``P``.

    Returns:
        ``[P, H]`` expert outputs, row for row.

    Raises:
        ValueError: if ``len(counts) != len(experts)`` or the counts do not sum to ``P``.
    """
    counts = counts.tolist() if isinstance(counts, torch.Tensor) else list(counts)
    if len(counts) != len(experts):
        raise ValueError(f"counts must have one entry per expert ({len(experts)}), "
                         f"got {len(counts)}")
    if sum(counts) != hidden.shape[0]:
        raise ValueError(f"counts must sum to the number of rows {hidden.shape[0]}, "
                         f"got {sum(counts)}")
    out = torch.empty_like(hidden)                                        # [P, H]
    begin = 0
    for e, n in enumerate(counts):
        if n:
            out[begin:begin + n] = experts[e](hidden[begin:begin + n])    # [n, H]
        begin += n
    return out


def combine(expert_out: torch.Tensor, d: Dispatch) -> torch.Tensor:
    """Combine: weight each expert output by its router weight and add it back at its token's
    position: ``out[token[p]] += weight[p] * expert_out[p]``.

    Args:
        expert_out: ``[P, H]`` in the row order of ``d``.
        d: the :class:`Dispatch` the rows came from.

    Returns:
        ``[T, H]``, in the original token order.

    Raises:
        ValueError: if ``expert_out`` does not have ``P`` rows.
    """
    if expert_out.dim() != 2 or expert_out.shape[0] != d.token.shape[0]:
        raise ValueError(f"expert_out must have shape [P={d.token.shape[0]}, H], "
                         f"got {list(expert_out.shape)}")
    out = expert_out.new_zeros(d.num_tokens, expert_out.shape[1])         # [T, H]
    out.index_add_(0, d.token, expert_out * d.weight.to(expert_out.dtype)[:, None])
    return out


# ----------------------------------------------------------------------------- the module
class MoE(PackedWeights, nn.Module):
    """Sparse feed-forward ``[B,S,H] -> [B,S,H]``: router, ``E`` routed SwiGLU experts of
    width ``moe_intermediate_size``, and ``num_shared_experts`` shared experts (fused into
    one SwiGLU of width ``num_shared_experts * moe_intermediate_size``, as DeepSeek does).

    Submodules (HF names): ``gate`` (:class:`Router`), ``experts[i]`` (:class:`FFN` with
    ``gate_proj / up_proj / down_proj``), ``shared_experts`` (:class:`FFN` or ``None``).
    ``config`` keeps the :class:`ModelConfig` it was built from (so copies can be rebuilt,
    e.g. on the ranks of :mod:`tokenflow.parallel.expert_parallel`).

    The routed experts' weights live in two stacked tensors (see :meth:`stacked_weights`);
    each ``experts[i]`` Linear weight is a view of its slice, so there is one copy.
    """

    def __init__(self, config: ModelConfig, layer_idx: int = 0):
        super().__init__()
        if config.num_experts < 1:
            raise ValueError(f"num_experts must be >= 1 for an MoE layer, got {config.num_experts}")
        self.config = config
        self.layer_idx = layer_idx
        self.num_experts = config.num_experts
        self.top_k = config.num_experts_per_tok
        self.gate = Router(config)
        self.act_fn = activation(config.hidden_act)
        self.experts = nn.ModuleList(FFN(config.hidden_size, config.moe_intermediate_size,
                                         config.hidden_act)
                                     for _ in range(config.num_experts))
        self.shared_experts = (FFN(config.hidden_size,
                                   config.moe_intermediate_size * config.num_shared_experts,
                                   config.hidden_act)
                               if config.num_shared_experts > 0 else None)
        self.stacked_weights()             # one copy of the expert weights, stacked

    # ------------------------------------------------------------- stacked expert weights
    def stacked_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The routed experts' weights in HF's layout (``Qwen2MoeExperts``, ``MixtralExperts``):
        ``gate_up [E, 2I, H]`` (expert ``e``'s ``gate_proj`` rows, then its ``up_proj`` rows)
        and ``down [E, H, I]``.

        One copy of the weights (:func:`tokenflow.model.fused.packed_rows`): stacking moves them
        into these two tensors and makes each ``experts[e].gate_proj.weight`` (and up, down) a
        view of its slice, so in-place updates (``load_state_dict``, an optimiser step) show
        in both. If a weight was replaced since (``.to(dtype)``,
        ``load_state_dict(assign=True)``, a new expert module), this call notices (the views'
        data pointers changed) and stacks again.
        """
        ws = [linear_weights(f, ("gate_proj", "up_proj", "down_proj")) for f in self.experts]
        E, (H, I) = len(ws), ws[0][2].shape
        before = self.__dict__.get("_packed", {}).get("gate_up")
        gate_up = packed_rows(self, "gate_up", [w for g, u, _ in ws for w in (g, u)])  # [E*2I, H]
        down = packed_rows(self, "down", [d for _, _, d in ws])                        # [E*H, I]
        if self._packed["gate_up"] is not before:      # stacked again: the experts' own
            for f in self.experts:                     # packed gate_up views are stale
                f.__dict__.pop("_packed", None)
        return gate_up.view(E, 2 * I, H), down.view(E, H, I)

    # ------------------------------------------------------------- ways to run the experts
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

        Raises:
            ValueError: from :func:`dispatch` (shapes, indices outside ``[0, E)``).
        """
        d = dispatch(x, indices, weights, self.num_experts)               # hidden [T*K, H]
        expert_out = run_experts(self.experts, d.hidden, d.counts)        # [T*K, H]
        return combine(expert_out, d)                                     # [T, H]

    def grouped_experts(self, x: torch.Tensor, indices: torch.Tensor,
                        weights: torch.Tensor) -> torch.Tensor:
        """:meth:`dispatch_combine` with every expert at once: sort the pairs by expert, then
        one grouped matrix product for all experts' gate and up projections and one for their
        down projections, over :meth:`stacked_weights` (``offs``: where each expert's block
        of rows ends). No loop over experts and no host sync: what HF's ``grouped_mm``
        experts backend does. Inference only (the stacked tensors carry no gradient).

        Args:
            x: ``[T, H]``; indices, weights: ``[T, K]`` from the router (not checked).

        Returns:
            ``[T, H]``: the routed part of the MoE output.
        """
        gate_up, down = self.stacked_weights()                            # [E,2I,H], [E,H,I]
        T, K = indices.shape
        I = down.shape[2]
        flat_expert = indices.reshape(-1)                                 # [P]
        order = flat_expert.argsort(stable=True)                          # [P]
        token = order // K                                                # [P]
        offs = torch.bincount(flat_expert, minlength=self.num_experts).cumsum(
            0, dtype=torch.int32)                                         # [E] block ends
        h = _grouped_mm(x[token], gate_up.transpose(1, 2), offs=offs)     # [P, 2I]
        h = self.act_fn(h[:, :I]) * h[:, I:]                              # [P, I]
        y = _grouped_mm(h, down.transpose(1, 2), offs=offs)               # [P, H]
        y = y * weights.reshape(-1)[order].to(y.dtype)[:, None]           # [P, H]
        return x.new_zeros(T, x.shape[1]).index_add_(0, token, y)         # [T, H]

    def one_token_experts(self, x: torch.Tensor, indices: torch.Tensor,
                          weights: torch.Tensor) -> torch.Tensor:
        """A single token (batch-1 decode): run its ``K`` experts one after the other and add
        ``w_k * expert_k(x)``, in expert order (the order :func:`combine` adds them in).
        Reads the ``K`` expert ids and weights on the host (``tolist``; on the CPU a plain
        read, not a wait for a device).

        Args:
            x: ``[1, H]``; indices, weights: ``[1, K]`` from the router (not checked).

        Returns:
            ``[1, H]``: the routed part of the MoE output.
        """
        out = None
        for e, w in sorted(zip(indices[0].tolist(), weights[0].tolist())):
            y = self.experts[e](x) * w                                     # [1, H]
            out = y if out is None else out + y
        return out

    def routed_experts(self, x: torch.Tensor, indices: torch.Tensor,
                       weights: torch.Tensor) -> torch.Tensor:
        """The routed part ``[T, H]`` by the fastest equal path: :meth:`dispatch_combine`
        when gradients are on (training: per-expert weights get their gradients), there is
        no grouped matrix product or it does not take the dtype (float64);
        :meth:`one_token_experts` for one token on the CPU (for large experts, one
        matrix-vector product per chosen expert beats the grouped kernel); else
        :meth:`grouped_experts`."""
        T = x.shape[0]
        if (torch.is_grad_enabled() or _grouped_mm is None or T == 0
                or x.dtype not in _GROUPED_DTYPES):
            return self.dispatch_combine(x, indices, weights)
        if T == 1 and x.device.type == "cpu":
            return self.one_token_experts(x, indices, weights)
        return self.grouped_experts(x, indices, weights)

    def forward(self, x: torch.Tensor, token_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``x [B,S,H] -> [B,S,H]``.

        In training mode it also sets ``self.aux_loss`` (:func:`switch_balance_loss`) from
        the router statistics of the real tokens only.

        Args:
            x: ``[B,S,H]`` the post-attention RMSNorm of the residual stream.
            token_mask: ``[B,S]`` 1 (or True) for real tokens, 0 for padding, in any place
                (left or right); ``None``: all real. Only the auxiliary loss reads it (every
                token is still routed and computed, as padding is in a real batch).

        Raises:
            ValueError: in training mode, ``token_mask`` not ``[B, S]`` of 0/1; from
                :func:`route` (e.g. ``gate.top_k`` changed to more than ``E``).
        """
        B, S, H = x.shape
        flat = x.reshape(B * S, H)                                        # [T, H]
        indices, weights, logits = self.gate(flat)                        # [T, K] x2, [T, E]
        if self.training:
            _check_token_mask(token_mask, B, S)
            self.aux_loss = switch_balance_loss(
                logits, indices, self.num_experts,
                None if token_mask is None else token_mask.reshape(B * S))
        out = self.routed_experts(flat, indices, weights)                 # [T, H]
        if self.shared_experts is not None:
            out = out + self.shared_experts(flat)
        return out.view(B, S, H)


def _check_token_mask(token_mask, B: int, S: int) -> None:
    """The training-only check of the load-balancing loss's ``token_mask``: ``[B, S]``."""
    if token_mask is not None and (not isinstance(token_mask, torch.Tensor)
                                   or tuple(token_mask.shape) != (B, S)):
        got = (list(token_mask.shape) if isinstance(token_mask, torch.Tensor)
               else type(token_mask).__name__)
        raise ValueError(f"token_mask must be a [B, S] = [{B}, {S}] tensor, got {got}")


def switch_balance_loss(logits: torch.Tensor, indices: torch.Tensor, num_experts: int,
                        token_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Load-balancing auxiliary loss used only in training: ``E * sum_e f_e * P_e``, with
    ``f_e`` the share of assignments to expert ``e`` and ``P_e`` its mean router probability
    (Switch Transformer, Fedus et al. 2021, arXiv:2101.03961, eq. 4). 1.0 when balanced.

    Args:
        logits: ``[T, E]`` router logits.
        indices: ``[T, K]`` chosen experts.
        num_experts: ``E``.
        token_mask: ``[T]`` 1 (True) for real tokens, 0 for padding; ``None``: all real.
            Padding counts in neither ``f_e`` nor ``P_e`` (as HF's Mixtral
            ``load_balancing_loss_func`` does with its attention mask), so a sentence gives
            the same loss however much padding its batch adds.

    Raises:
        ValueError: ``token_mask`` not ``[T]`` of 0/1, or it marks no real token.
    """
    if token_mask is None:
        f = torch.bincount(indices.reshape(-1), minlength=num_experts).float()
        f = f / f.sum()
        P = logits.softmax(dim=-1).mean(dim=0)
        return num_experts * (f * P).sum()
    T = logits.shape[0]
    if tuple(token_mask.shape) != (T,) or token_mask.is_floating_point() \
            or ((token_mask != 0) & (token_mask != 1)).any():
        raise ValueError(f"token_mask must be a [T={T}] integer or bool tensor of 0/1, "
                         f"got {list(token_mask.shape)} {token_mask.dtype}")
    real = token_mask.to(torch.bool)
    n = int(real.sum())
    if n == 0:
        raise ValueError("token_mask marks no real token: the load-balancing loss needs one")
    K = indices.shape[1]
    f = torch.bincount(indices[real].reshape(-1), minlength=num_experts).float() / (n * K)
    P = logits[real].softmax(dim=-1).mean(dim=0)
    return num_experts * (f * P).sum()


