"""One MoE layer split over ranks: which rank owns which experts, and one rank's forward
(route -> all-to-all dispatch -> its experts -> all-to-all combine), on any initialised
process group. :mod:`tokenflow.parallel.expert_parallel` describes the algorithm and spawns
the ranks.

Legend: W world size (ranks), r this rank, E experts, E_r = E/W experts per rank, T_r tokens on
rank r, K top-k, H hidden, P_r = T_r*K pairs made on rank r, R_r rows rank r's experts receive.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from tokenflow.model.moe import MoE, combine, dispatch, run_experts

__all__ = ["expert_owner", "traffic_matrix", "ExpertShard", "EPRankStats", "ep_forward"]


# ----------------------------------------------------------------------------- placement
def check_world_size(num_experts: int, world_size: int) -> None:
    """Raise ``ValueError`` unless ``world_size`` is an int >= 1 that divides ``num_experts``."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
    if num_experts % world_size:
        raise ValueError(f"world_size ({world_size}) must divide num_experts ({num_experts}): "
                         f"each rank holds num_experts / world_size experts")


def expert_owner(num_experts: int, world_size: int) -> torch.Tensor:
    """``[E]`` int64: the rank that owns each expert (contiguous blocks of ``E/W``).

    Raises:
        ValueError: if ``world_size < 1`` or it does not divide ``num_experts``.
    """
    check_world_size(num_experts, world_size)
    return torch.arange(num_experts) // (num_experts // world_size)


def traffic_matrix(indices: torch.Tensor, token_rank: torch.Tensor, num_experts: int,
                   world_size: int) -> torch.Tensor:
    """``[W, W]`` int64: entry ``[i, j]`` = (token, expert) pairs that rank ``i`` dispatches to
    rank ``j`` (the diagonal stays local). Combine sends the transpose back.

    Args:
        indices: ``[T, K]`` router choices of all tokens.
        token_rank: ``[T]`` the rank each token lives on.
        num_experts, world_size: E and W (W must divide E).

    Raises:
        ValueError: shape mismatch, ranks outside ``[0, W)``, or W not dividing E.
    """
    owner = expert_owner(num_experts, world_size)
    if indices.dim() != 2 or token_rank.shape != (indices.shape[0],):
        raise ValueError(f"token_rank must have shape [T={indices.shape[0]}], "
                         f"got {list(token_rank.shape)}")
    if token_rank.numel() and (int(token_rank.min()) < 0 or int(token_rank.max()) >= world_size):
        raise ValueError(f"token_rank must be in [0, world_size={world_size})")
    src = token_rank[:, None].expand_as(indices).reshape(-1)              # [T*K]
    dst = owner[indices.reshape(-1)]                                      # [T*K]
    return torch.bincount(src * world_size + dst,
                          minlength=world_size * world_size).view(world_size, world_size)


class ExpertShard:
    """What one rank holds of an :class:`~tokenflow.model.moe.MoE`: the (replicated) router and
    shared experts, and only its ``E/W`` local experts.

    Attributes: ``gate``, ``local_experts`` (list), ``shared_experts`` (or None), ``rank``,
    ``world_size``, ``num_experts``, ``first_expert`` (global id of ``local_experts[0]``).
    """

    def __init__(self, moe: MoE, rank: int, world_size: int):
        check_world_size(moe.num_experts, world_size)
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
        n = moe.num_experts // world_size
        self.gate = moe.gate
        self.shared_experts = moe.shared_experts
        self.local_experts = [moe.experts[i] for i in range(rank * n, (rank + 1) * n)]
        self.rank, self.world_size, self.num_experts = rank, world_size, moe.num_experts
        self.first_expert = rank * n

    def to(self, device) -> "ExpertShard":
        """Move the held modules to ``device``; returns self."""
        for m in [self.gate, self.shared_experts, *self.local_experts]:
            if m is not None:
                m.to(device)
        return self


# ----------------------------------------------------------------------------- one rank
@dataclass
class EPRankStats:
    """What one rank did in one expert-parallel MoE forward.

    Rows are (token, expert) pairs; bytes are hidden-state payload (``rows * H * element_size``).

    Attributes:
        rank, world_size: this rank and W.
        tokens: T_r, tokens this rank routed.
        local_experts: global ids of the experts this rank owns.
        sent_rows: ``[W]`` rows dispatched to each rank (entry ``rank`` stays local).
        recv_rows: ``[W]`` rows received from each rank for the local experts.
        local_rows: rows that never left this rank.
        dispatch_bytes_sent, combine_bytes_sent: bytes sent to *other* ranks by the dispatch and
            combine all-to-all (measured from the split sizes handed to ``all_to_all_single``).
        dispatch_bytes_formula, combine_bytes_formula: the same from
            :func:`tokenflow.analysis.costmodel.moe_a2a_bytes` (``(T_r*K - local) * H * b`` and
            ``(R_r - local) * H * b``).
        count_bytes_sent: bytes of the count exchange sent to other ranks (``(W-1) * E_r * 8``).
        hidden_size, element_size, top_k: H, bytes per element, K.
        compute_s, comm_s: wall seconds in local work (route, sort, experts, combine, shared)
            and in the three all-to-alls (includes waiting for slower ranks).
    """

    rank: int
    world_size: int
    tokens: int
    top_k: int
    hidden_size: int
    element_size: int
    local_experts: list[int]
    sent_rows: list[int]
    recv_rows: list[int]
    local_rows: int
    dispatch_bytes_sent: int
    combine_bytes_sent: int
    dispatch_bytes_formula: int
    combine_bytes_formula: int
    count_bytes_sent: int
    compute_s: float = 0.0
    comm_s: float = 0.0

    def to_dict(self, timings: bool = False) -> dict:
        """Plain dict; without ``timings`` the (non-deterministic) seconds are left out."""
        d = asdict(self)
        if not timings:
            d.pop("compute_s"), d.pop("comm_s")
        return d


def _a2a(out: torch.Tensor, inp: torch.Tensor, out_splits, in_splits, group) -> None:
    dist.all_to_all_single(out, inp, out_splits, in_splits, group=group)


@torch.no_grad()
def ep_forward(shard: ExpertShard, x: torch.Tensor, group=None
               ) -> tuple[torch.Tensor, EPRankStats]:
    """One expert-parallel MoE forward on this rank (call it on every rank of ``group``).

    Args:
        shard: this rank's :class:`ExpertShard` (``shard.rank`` must be this rank).
        x: ``[T_r, H]`` this rank's tokens (``T_r`` may differ between ranks, even be 0).
        group: the process group (default: the world).

    Returns:
        ``(out [T_r, H], stats)``: the MoE output for this rank's tokens, in their order, equal
        to a single-process :class:`~tokenflow.model.moe.MoE` on the same rows; and
        :class:`EPRankStats`.

    Raises:
        ValueError: if ``x`` is not ``[T_r, H]`` or the shard does not match the group.
    """
    from tokenflow.analysis.costmodel import moe_a2a_bytes
    W, r = dist.get_world_size(group), dist.get_rank(group)
    if (shard.world_size, shard.rank) != (W, r):
        raise ValueError(f"shard is for rank {shard.rank} of {shard.world_size}, "
                         f"but this is rank {r} of {W}")
    H = shard.gate.weight.shape[1]
    if x.dim() != 2 or x.shape[1] != H:
        raise ValueError(f"x must have shape [T, H={H}], got {list(x.shape)}")
    E, E_r = shard.num_experts, shard.num_experts // W
    g = shard.gate
    comm = 0.0
    t0 = time.perf_counter()

    # route and group this rank's (token, expert) pairs by expert = by destination rank
    indices, weights, _ = g(x)                                          # [T_r, K] x2
    K = indices.shape[1]
    d = dispatch(x, indices, weights, E)                                  # hidden [P_r, H]
    send_counts = d.counts.to(x.device)                                   # [E]
    send_rows = send_counts.view(W, E_r).sum(1).tolist()                  # [W]

    # 1. exchange counts: rank j receives, from every rank, its counts for j's experts
    t = time.perf_counter()
    recv_counts = torch.empty_like(send_counts)                           # [W*E_r]
    _a2a(recv_counts, send_counts, None, None, group)
    comm += time.perf_counter() - t
    recv_counts = recv_counts.view(W, E_r)                                # [W, E_r]
    recv_rows = recv_counts.sum(1).tolist()                               # [W]

    # 2. dispatch: hidden states to the experts' ranks
    t = time.perf_counter()
    recv_x = x.new_empty(sum(recv_rows), H)                               # [R_r, H]
    _a2a(recv_x, d.hidden, recv_rows, send_rows, group)
    comm += time.perf_counter() - t

    # 3. expert compute: received rows are grouped by source rank, then by expert
    local_id = torch.arange(E_r, device=x.device).repeat(W)               # [W*E_r]
    row_expert = local_id.repeat_interleave(recv_counts.reshape(-1))      # [R_r]
    order = row_expert.argsort(stable=True)                               # [R_r]
    y_sorted = run_experts(shard.local_experts, recv_x[order],
                           recv_counts.sum(0))                            # [R_r, H]
    y = torch.empty_like(y_sorted)
    y[order] = y_sorted                                                   # [R_r, H]

    # 4. combine: outputs back to the tokens' ranks, in the order they were sent
    t = time.perf_counter()
    back = torch.empty_like(d.hidden)                                     # [P_r, H]
    _a2a(back, y, send_rows, recv_rows, group)
    comm += time.perf_counter() - t

    out = combine(back, d)                                                # [T_r, H]
    if shard.shared_experts is not None:
        out = out + shard.shared_experts(x)                               # [T_r, H]
    total = time.perf_counter() - t0

    b = x.element_size()
    local = send_rows[r]
    stats = EPRankStats(
        rank=r, world_size=W, tokens=x.shape[0], top_k=K, hidden_size=H, element_size=b,
        local_experts=list(range(shard.first_expert, shard.first_expert + E_r)),
        sent_rows=send_rows, recv_rows=recv_rows, local_rows=local,
        dispatch_bytes_sent=(sum(send_rows) - local) * H * b,
        combine_bytes_sent=(sum(recv_rows) - local) * H * b,
        dispatch_bytes_formula=moe_a2a_bytes(x.shape[0], K, H, b, local_pairs=local),
        combine_bytes_formula=moe_a2a_bytes(sum(recv_rows), 1, H, b, local_pairs=local),
        count_bytes_sent=(W - 1) * E_r * send_counts.element_size(),
        compute_s=total - comm, comm_s=comm)
    return out, stats
