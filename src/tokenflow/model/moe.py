"""Mixture of experts: router (top-k), routed + shared experts, dispatch / combine.

T tokens (B*S), H hidden, E routed experts, K experts per token, I expert width, P = T*K pairs.
The router (路由 / gate 门控) scores each token's hidden state ``[H]`` against every expert
(专家) and keeps K; each chosen expert runs its SwiGLU FFN on it; combine adds the outputs back
at the token, weighted by the router (chapter 3). Two router families:

* ``softmax`` (Mixtral, arXiv:2401.04088 section 2.1; Qwen-MoE): the top-k of
  ``softmax(logits)``, renormalised if ``norm_topk_prob`` (Mixtral's ``softmax(TopK(.))``).
* ``sigmoid`` (DeepSeek-V3, arXiv:2412.19437 section 2.1.2): chosen by ``sigmoid(logits) +
  e_score_correction_bias``, weighted by the unbiased scores (renormalised if
  ``norm_topk_prob``) times ``routed_scaling_factor``.

Either may first keep the best ``topk_group`` of ``n_group`` expert groups, ranked by
``topk_method`` (HF ``DeepseekV3TopkRouter``, ``DeepseekV2TopkRouter``). Ties go to the lower
expert index (a stable sort), as in :func:`tokenflow.explain.moe.moe_reference_loop`. Shared
experts (DeepSeekMoE) see every token, unweighted.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tokenflow.validate import choice, integer, reads_free
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
    """Raise ``ValueError`` unless ``1 <= top_k <= num_experts`` (ints); ``name`` names it."""
    integer("num_experts", num_experts, 1)
    integer(name, top_k, 1, num_experts, hi_name="num_experts",
            above="a token cannot go to more experts than exist")


def _stable_topk(values: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the ``k`` largest of each row, largest first, ties to the lower index."""
    return values.sort(dim=-1, descending=True, stable=True).indices[..., :k]


def route(x: torch.Tensor, weight: torch.Tensor, top_k: int, *, scoring_func: str = "softmax",
          norm_topk_prob: bool = True, routed_scaling_factor: float = 1.0, n_group: int = 1,
          topk_group: int = 1, bias: torch.Tensor | None = None,
          topk_method: str = "noaux_tc") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Choose ``top_k`` experts per token and their weights: checks the arguments once, then
    computes what :class:`Router` computes.

    ``x [T, H]`` (scored in float32); ``weight [E, H]`` (HF ``gate.weight``); ``bias [E]``
    selection-only (sigmoid family). ``n_group=1``: no group limit; else groups are ranked by
    their 2 best scores summed (``"noaux_tc"``), their best (``"group_limited_greedy"``) or
    not at all (``"greedy"``).

    Returns ``(indices [T,K] int64, weights [T,K] float32, logits [T,E] float32)``, indices in
    decreasing selection score.

    Raises ``ValueError``: bad shapes, ``top_k`` outside ``[1, E]``, unknown ``scoring_func`` or
    ``topk_method``, inconsistent ``n_group`` / ``topk_group``, ``bias`` not ``[E]``.
    """
    if x.dim() != 2:
        raise ValueError(f"x must have shape [T, H], got {list(x.shape)}")
    if weight.dim() != 2 or weight.shape[1] != x.shape[1]:
        raise ValueError(f"weight must have shape [E, H={x.shape[1]}], got {list(weight.shape)}")
    E = weight.shape[0]
    check_top_k(top_k, E)
    choice("scoring_func", scoring_func, SCORING_FUNCS)
    choice("topk_method", topk_method, TOPK_METHODS)
    if n_group < 1 or E % n_group:
        raise ValueError(f"n_group ({n_group}) must be >= 1 and divide num_experts ({E})")
    integer("topk_group", topk_group, 1, n_group, hi_name="n_group")
    if n_group > 1 and topk_group * (E // n_group) < top_k:
        raise ValueError(f"topk_group * (num_experts // n_group) = "
                         f"{topk_group * (E // n_group)} must be >= top_k = {top_k}")
    if bias is not None and tuple(bias.shape) != (E,):
        raise ValueError(f"bias must have shape [E={E}], got {list(bias.shape)}")
    return _route(x, weight, top_k, scoring_func, norm_topk_prob, routed_scaling_factor,
                  n_group, topk_group, bias, topk_method)


def _route(x, weight, top_k, scoring_func, norm_topk_prob, routed_scaling_factor, n_group,
           topk_group, bias, topk_method):
    """:func:`route` without its checks (the forward path: the config was checked)."""
    T, E = x.shape[0], weight.shape[0]
    logits = F.linear(x.float(), weight.float())                          # [T, E]
    if scoring_func == "softmax":
        scores = logits.softmax(dim=-1)                                   # [T, E]
        select = scores                                                   # [T, E]
    else:
        scores = logits.sigmoid()                                         # [T, E]
        select = scores if bias is None else scores + bias.float()        # [T, E]
    if n_group > 1 and topk_method != "greedy":
        grouped = select.view(T, n_group, E // n_group)                   # [T, G, E/G]
        if topk_method == "noaux_tc":
            best2 = grouped.topk(min(2, E // n_group), dim=-1).values     # [T, G, 2]
            group_scores = best2.sum(-1)                                  # [T, G]
        else:
            group_scores = grouped.max(dim=-1).values                     # [T, G]
        keep = _stable_topk(group_scores, topk_group)                     # [T, topk_group]
        dropped = torch.ones_like(group_scores, dtype=torch.bool).scatter_(1, keep, False)
        select = grouped.masked_fill(dropped[..., None], float("-inf")).view(T, E)  # [T, E]
    indices = _stable_topk(select, top_k)                                 # [T, K]
    weights = scores.gather(1, indices)                                   # [T, K] unbiased
    if norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)   # [T, K]
    if routed_scaling_factor != 1.0:                                      # x * 1.0 == x
        weights = weights * routed_scaling_factor                         # [T, K]
    return indices, weights, logits


class Router(nn.Module):
    """``x [T, H] -> (indices [T,K], weights [T,K], logits [T,E])``, as :func:`route`.

    ``weight [E, H]`` (HF ``gate.weight``), buffer ``e_score_correction_bias [E]``; the
    routing fields of the config as attributes (``top_k``, ``scoring_func``, ...), trusted.
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
        bias = self.e_score_correction_bias if self.scoring_func == "sigmoid" else None
        return _route(x, self.weight, self.top_k, self.scoring_func, self.norm_topk_prob,
                      self.routed_scaling_factor, self.n_group, self.topk_group, bias,
                      self.topk_method)


# ----------------------------------------------------------------------------- dispatch
@dataclass
class Dispatch:
    """The ``P`` (token, expert) pairs grouped by expert: ``hidden [P, H]`` (copies of token
    rows, expert 0's block first), ``token [P]`` (where combine puts each row back),
    ``expert [P]`` (non-decreasing), ``weight [P]`` float32, ``counts [E]`` (rows per expert),
    ``num_tokens`` T."""

    hidden: torch.Tensor
    token: torch.Tensor
    expert: torch.Tensor
    weight: torch.Tensor
    counts: torch.Tensor
    num_tokens: int


def dispatch(x: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor,
             num_experts: int) -> Dispatch:
    """Copy each token's row ``x [T, H]`` once per chosen expert (``indices``, ``weights``
    ``[T, K]``) and group the copies by expert (stable: token order within an expert).

    Raises ``ValueError``: shape mismatch, or (CPU tensors only,
    :func:`tokenflow.validate.reads_free`) an index outside ``[0, num_experts)``.
    """
    if x.dim() != 2:
        raise ValueError(f"x must have shape [T, H], got {list(x.shape)}")
    if indices.dim() != 2 or indices.shape[0] != x.shape[0]:
        raise ValueError(f"indices must have shape [T={x.shape[0]}, K], got {list(indices.shape)}")
    if weights.shape != indices.shape:
        raise ValueError(f"weights must have the shape of indices {list(indices.shape)}, "
                         f"got {list(weights.shape)}")
    integer("num_experts", num_experts, 1)
    if indices.numel() and reads_free(indices) and \
            (int(indices.min()) < 0 or int(indices.max()) >= num_experts):
        raise ValueError(f"indices must be in [0, num_experts={num_experts})")
    return _dispatch(x, indices, weights, num_experts)


def _dispatch(x, indices, weights, num_experts) -> Dispatch:
    """:func:`dispatch` without its checks (the forward path)."""
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
    """Run expert ``e`` once on its block of ``counts[e]`` rows of ``hidden [P, H]`` (grouped
    as :func:`dispatch` returns them); ``[P, H]`` out, row for row.

    Raises ``ValueError``: ``len(counts) != len(experts)`` or the counts do not sum to ``P``.
    """
    counts = counts.tolist() if isinstance(counts, torch.Tensor) else list(counts)
    if len(counts) != len(experts):
        raise ValueError(f"counts must have one entry per expert ({len(experts)}), "
                         f"got {len(counts)}")
    if sum(counts) != hidden.shape[0]:
        raise ValueError(f"counts must sum to the number of rows {hidden.shape[0]}, "
                         f"got {sum(counts)}")
    return _run_experts(experts, hidden, counts)


def _run_experts(experts, hidden: torch.Tensor, counts: list) -> torch.Tensor:
    out = torch.empty_like(hidden)                                        # [P, H]
    begin = 0
    for e, n in enumerate(counts):
        if n:
            out[begin:begin + n] = experts[e](hidden[begin:begin + n])    # [n, H]
        begin += n
    return out


def combine(expert_out: torch.Tensor, d: Dispatch) -> torch.Tensor:
    """``out[token[p]] += weight[p] * expert_out[p]``: ``expert_out [P, H]`` in the row order
    of ``d`` back to ``[T, H]`` in token order.

    Raises ``ValueError``: ``expert_out`` does not have ``P`` rows.
    """
    if expert_out.dim() != 2 or expert_out.shape[0] != d.token.shape[0]:
        raise ValueError(f"expert_out must have shape [P={d.token.shape[0]}, H], "
                         f"got {list(expert_out.shape)}")
    return _combine(expert_out, d)


def _combine(expert_out: torch.Tensor, d: Dispatch) -> torch.Tensor:
    out = expert_out.new_zeros(d.num_tokens, expert_out.shape[1])         # [T, H]
    return out.index_add_(0, d.token, expert_out * d.weight.to(expert_out.dtype)[:, None])


# ----------------------------------------------------------------------------- the module
class MoE(PackedWeights, nn.Module):
    """Sparse feed-forward ``[B,S,H] -> [B,S,H]``: ``gate`` (:class:`Router`), ``E`` routed
    SwiGLU ``experts[i]`` of width ``moe_intermediate_size`` and ``shared_experts`` (one SwiGLU
    ``num_shared_experts`` times as wide, as DeepSeek fuses them, or ``None``); HF names.
    ``config`` is kept (the expert-parallel ranks rebuild copies from it). The routed experts'
    weights live in :meth:`stacked_weights`, each ``experts[i]`` weight a view of its slice.
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

    def stacked_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``gate_up [E, 2I, H]`` (gate rows, then up rows) and ``down [E, H, I]``, HF's layout
        (``Qwen2MoeExperts``, ``MixtralExperts``), one copy (:func:`~.fused.packed_rows`);
        stacked again when a weight was replaced (``.to``, ``load_state_dict(assign=True)``)."""
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
    # Three equal ways (tested: they add the same products in the same order), each
    # ``x [T, H]``, ``indices, weights [T, K]`` (trusted) -> the routed part ``[T, H]``.
    def dispatch_combine(self, x: torch.Tensor, indices: torch.Tensor,
                         weights: torch.Tensor) -> torch.Tensor:
        """:func:`dispatch` -> :func:`run_experts` -> :func:`combine`, each expert once on its
        block (what :mod:`tokenflow.parallel.expert_parallel` sends over all-to-all)."""
        d = _dispatch(x, indices, weights, self.num_experts)              # hidden [T*K, H]
        expert_out = _run_experts(self.experts, d.hidden, d.counts.tolist())  # [T*K, H]
        return _combine(expert_out, d)                                    # [T, H]

    def grouped_experts(self, x: torch.Tensor, indices: torch.Tensor,
                        weights: torch.Tensor) -> torch.Tensor:
        """Every expert at once: two grouped matrix products over :meth:`stacked_weights`
        (``offs``: where each expert's rows end), HF's ``grouped_mm`` backend; no loop over
        experts, no host sync. Inference only (no gradient reaches the experts)."""
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
        """One token (``T = 1``): ``sum_k w_k * expert_k(x)`` in expert order, as
        :func:`combine` adds; reads the K ids on the host (``tolist``)."""
        out = None
        for e, w in sorted(zip(indices[0].tolist(), weights[0].tolist())):
            y = self.experts[e](x) * w                                     # [1, H]
            out = y if out is None else out + y
        return out

    def routed_experts(self, x: torch.Tensor, indices: torch.Tensor,
                       weights: torch.Tensor) -> torch.Tensor:
        """The fastest equal way: :meth:`dispatch_combine` with gradients on (the experts'
        weights get theirs) or no grouped product for the dtype; :meth:`one_token_experts`
        for one token on the CPU; else :meth:`grouped_experts`."""
        T = x.shape[0]
        if (torch.is_grad_enabled() or _grouped_mm is None or T == 0
                or x.dtype not in _GROUPED_DTYPES):
            return self.dispatch_combine(x, indices, weights)
        if T == 1 and x.device.type == "cpu":
            return self.one_token_experts(x, indices, weights)
        return self.grouped_experts(x, indices, weights)

    def forward(self, x: torch.Tensor, token_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``x [B,S,H] -> [B,S,H]``. In training mode also sets ``self.aux_loss``
        (:func:`switch_balance_loss`) over the real tokens: ``token_mask [B,S]`` 1 real, 0
        padding (``None``: all real; checked by the model's ``forward``)."""
        B, S, H = x.shape
        flat = x.reshape(B * S, H)                                        # [T, H]
        indices, weights, logits = self.gate(flat)                        # [T, K] x2, [T, E]
        if self.training:
            self.aux_loss = _balance_loss(
                logits, indices, self.num_experts,
                None if token_mask is None else token_mask.reshape(B * S))
        out = self.routed_experts(flat, indices, weights)                 # [T, H]
        if self.shared_experts is not None:
            out = out + self.shared_experts(flat)
        return out.view(B, S, H)


def _check_token_mask(token_mask, shape: tuple, dims: str) -> None:
    """Raise ``ValueError`` unless ``token_mask`` is an integer or bool tensor of ``shape``
    (named ``dims``), of 0/1 with a 1 (values checked on the CPU only: ``reads_free``)."""
    if not isinstance(token_mask, torch.Tensor) or tuple(token_mask.shape) != tuple(shape) \
            or token_mask.is_floating_point() or (reads_free(token_mask) and (
                (token_mask != 0) & (token_mask != 1)).any()):
        got = (f"{list(token_mask.shape)} {token_mask.dtype}"
               if isinstance(token_mask, torch.Tensor) else type(token_mask).__name__)
        raise ValueError(f"token_mask must be a [{dims}] = {list(shape)} integer or bool tensor "
                         f"of 0/1, got {got}")
    if reads_free(token_mask) and not token_mask.any():
        raise ValueError("token_mask marks no real token: the load-balancing loss needs one")


def switch_balance_loss(logits: torch.Tensor, indices: torch.Tensor, num_experts: int,
                        token_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Training's load-balancing loss ``E * sum_e f_e * P_e``: ``f_e`` the share of
    assignments to expert ``e``, ``P_e`` its mean router probability (Switch Transformer,
    arXiv:2101.03961, eq. 4); 1.0 when balanced. ``logits [T, E]``, ``indices [T, K]``;
    ``token_mask [T]`` 1 real, 0 padding: padding counts in neither (as HF's Mixtral
    ``load_balancing_loss_func``), so padding does not change a sentence's loss.

    Raises ``ValueError``: ``token_mask`` not ``[T]`` of 0/1, or it marks no real token.
    """
    if token_mask is not None:
        _check_token_mask(token_mask, (logits.shape[0],), "T")
    return _balance_loss(logits, indices, num_experts, token_mask)


def _balance_loss(logits, indices, num_experts, token_mask):
    if token_mask is not None:
        real = token_mask.to(torch.bool)                                  # [T]
        logits, indices = logits[real], indices[real]
    f = torch.bincount(indices.reshape(-1), minlength=num_experts).float()
    P = logits.softmax(dim=-1).mean(dim=0)
    return num_experts * (f / f.sum() * P).sum()
