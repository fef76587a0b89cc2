"""MoE communication: the bytes expert parallelism moves.

Dispatch sends each (token, expert) pair's hidden state to the rank that owns the expert,
combine sends the expert output back (same size). Pairs whose expert lives on the token's own
rank stay local and cost nothing on the wire. Used by chapter 03 and checked there against
the bytes a real ``torch.distributed`` run sends (:mod:`tokenflow.parallel.expert_parallel`).
After ``config`` and ``ep_size`` every argument is keyword-only.
"""
from __future__ import annotations

from tokenflow import validate
from tokenflow.config import ModelConfig

from .params import _check_bytes, _check_count

__all__ = ["moe_a2a_bytes", "expected_remote_fraction", "moe_comm_bytes_per_token",
           "moe_a2a_table", "A2A_TABLE_COLUMNS", "A2A_PATHS", "num_moe_layers",
           "expected_nodes_per_token"]


def moe_a2a_bytes(tokens: int, top_k: int, hidden_size: int, bytes_per_element: float = 2,
                  local_pairs: int = 0) -> int:
    """Bytes one MoE all-to-all sends: ``(tokens * top_k - local_pairs) * hidden_size * bytes``.

    Dispatch sends this many bytes (hidden states out to the experts' ranks) and combine sends the
    same amount back (expert outputs), so one MoE layer moves it twice. ``local_pairs`` are the
    (token, expert) pairs whose expert is on the sending rank: they never leave it. Counts the
    hidden-state payload only (no routing metadata, no deduplication of a token sent to two
    experts on the same rank).

    Args:
        tokens: tokens on the sending rank (``B*S`` of its batch).
        top_k: K, experts per token.
        hidden_size: H.
        bytes_per_element: 2 for bf16, 1 for fp8, 4 for fp32.
        local_pairs: pairs that stay local, ``0 <= local_pairs <= tokens * top_k``.

    Returns:
        bytes (int).

    Raises:
        ValueError: negative or non-int counts, ``top_k < 1``, ``bytes_per_element <= 0``, or
            ``local_pairs`` outside ``[0, tokens*top_k]``.
    """
    _check_count("tokens", tokens, 0)
    _check_count("top_k", top_k, 1)
    _check_count("hidden_size", hidden_size, 1)
    _check_count("local_pairs", local_pairs, 0)
    _check_bytes(bytes_per_element)
    if local_pairs > tokens * top_k:
        raise ValueError(f"local_pairs must be <= tokens * top_k = {tokens * top_k}, "
                         f"got {local_pairs}")
    return int((tokens * top_k - local_pairs) * hidden_size * bytes_per_element)


def expected_remote_fraction(ep_size: int) -> float:
    """Share of (token, expert) pairs that leave their rank when experts are spread evenly over
    ``ep_size`` ranks and routing is uniform: ``(ep_size - 1) / ep_size`` (0 for EP=1).

    Raises:
        ValueError: if ``ep_size`` is not an int >= 1.
    """
    _check_count("ep_size", ep_size, 1)
    return (ep_size - 1) / ep_size


A2A_PATHS = ("hierarchical", "direct")
"""The two all-to-all paths of :func:`moe_comm_bytes_per_token` (DeepSeek-V3 report,
arXiv:2412.19437: ``"hierarchical"`` for training and prefill, section 3.4.1; ``"direct"`` for
decode, section 3.4.2)."""


def moe_comm_bytes_per_token(config: ModelConfig, ep_size: int | None = None, *,
                             dispatch_bytes_per_element: float = 2,
                             combine_bytes_per_element: float = 2,
                             gpus_per_node: int | None = None,
                             max_nodes_per_token: int | None = None,
                             path: str = "hierarchical") -> dict:
    """All-to-all bytes one token causes in one MoE layer: dispatch ``K * H * b_dispatch`` plus
    combine ``K * H * b_combine``, times the remote fraction.

    Args:
        config: a config with ``num_experts >= 1`` (e.g. ``reference_config("DeepSeek-V3")``).
        ep_size: expert-parallel ranks. ``None``: every pair crosses the network (upper
            bound); otherwise :func:`expected_remote_fraction` (uniform routing).
        dispatch_bytes_per_element, combine_bytes_per_element: element sizes of the two
            directions (bf16: 2; a deployment may dispatch in fp8: 1).
        gpus_per_node: with ``ep_size``, split the traffic into ``scale_out`` (InfiniBand,
            between nodes) and ``scale_up`` (NVLink, inside a node) along ``path``.
        max_nodes_per_token: node-limited routing (V3 report section 2.1.2, a training
            device: a token's experts on at most this many nodes); ``None``: the config's own
            limit, group-limited routing (``topk_group`` of ``n_group`` groups) if it has one.
            Only the hierarchical path depends on it.
        path: ``"hierarchical"`` (V3 report section 3.4.1, training and prefill, DeepEP's
            normal kernels): a token's hidden state crosses InfiniBand once per remote *node*
            it reaches (:func:`expected_nodes_per_token`, ``n``; ``n * (N-1)/N`` of them
            remote for ``N = ep_size / gpus_per_node`` nodes), then is forwarded over NVLink
            to the ``K * (G-1)/G`` pairs not on the GPU where the copy lands.
            ``"direct"`` (section 3.4.2, decode: "direct point-to-point transfers over IB";
            DeepEP's low-latency kernels, pure RDMA): every pair off the token's GPU,
            ``K * (ep_size-1)/ep_size``, crosses InfiniBand, nothing goes over NVLink. On one
            node (``ep_size <= gpus_per_node``) both paths are NVLink only. Expected values
            under uniform routing, not a schedule.

    Returns:
        dict with ``dispatch``, ``combine``, ``total`` (bytes per token per MoE layer) and
        ``remote_fraction``. With ``gpus_per_node`` also ``scale_out`` and ``scale_up``
        (dispatch + combine bytes over each link, per token per MoE layer), the same split
        per direction (``scale_out_dispatch``, ``scale_out_combine``, ``scale_up_dispatch``,
        ``scale_up_combine``), ``nodes_per_token`` (expected) and ``path``; then
        ``dispatch``, ``combine`` and ``total`` are the sums over both links.

    Raises:
        ValueError: dense config, bad ``ep_size``, element sizes or ``path``.
    """
    if config.num_experts < 1:
        raise ValueError(f"config must be an MoE config (num_experts >= 1), got "
                         f"num_experts={config.num_experts}")
    validate.choice("path", path, A2A_PATHS)
    _check_bytes(dispatch_bytes_per_element)
    _check_bytes(combine_bytes_per_element)
    f = 1.0 if ep_size is None else expected_remote_fraction(ep_size)
    pair = config.num_experts_per_tok * config.hidden_size
    d = pair * dispatch_bytes_per_element * f
    c = pair * combine_bytes_per_element * f
    out = {"dispatch": d, "combine": c, "total": d + c, "remote_fraction": f}
    if gpus_per_node is not None:
        links = _link_elements(config, ep_size, gpus_per_node, max_nodes_per_token, path)
        for link in ("scale_out", "scale_up"):
            out[f"{link}_dispatch"] = links[link] * dispatch_bytes_per_element
            out[f"{link}_combine"] = links[link] * combine_bytes_per_element
            out[link] = out[f"{link}_dispatch"] + out[f"{link}_combine"]
        out["nodes_per_token"] = links["nodes_per_token"]
        out["path"] = path
        out["dispatch"] = out["scale_out_dispatch"] + out["scale_up_dispatch"]
        out["combine"] = out["scale_out_combine"] + out["scale_up_combine"]
        out["total"] = out["scale_out"] + out["scale_up"]
    return out


def _check_node_layout(ep_size, G: int) -> None:
    _check_count("gpus_per_node", G, 1)
    if ep_size is None or ep_size % G and G % ep_size:
        raise ValueError(f"ep_size ({ep_size}) must be a multiple or divisor of "
                         f"gpus_per_node ({G})")


def expected_nodes_per_token(config: ModelConfig, ep_size: int, *, gpus_per_node: int = 8,
                             max_nodes_per_token: int | None = None) -> float:
    """Expected number of distinct nodes one token's ``K`` experts sit on.

    Layout: ``N = max(ep_size // gpus_per_node, 1)`` nodes, experts in order, expert ``e`` on
    node ``e * N // E`` (whole groups of ``E / N`` when ``N`` divides ``E``). Routing: uniform
    over what the limit allows, ``K`` distinct experts. The limit: ``max_nodes_per_token = M``
    (node-limited routing, V3 report section 2.1.2) picks ``M`` nodes; else the config's
    group-limited routing (``n_group > 1``; DeepSeek-V3 ``n_group=8, topk_group=4``, HF
    ``DeepseekV3TopkRouter``) picks ``topk_group`` groups of ``E / n_group`` experts;
    else all ``E``. For each allowed set of ``s`` experts, a node holding ``c`` of them is
    reached with probability ``1 - C(s-c, K) / C(s, K)``; the result averages over every
    allowed set, equally likely. A limit of 4 nodes or groups is an upper bound on nodes only
    when a group fits one node; the expectation is below it.

    Raises:
        ValueError: a dense config, ``ep_size`` not tiling ``gpus_per_node``, a limit < 1, or
            a limit that leaves fewer than ``K`` experts.
    """
    from itertools import combinations
    from math import comb
    if config.num_experts < 1:
        raise ValueError(f"config must be an MoE config (num_experts >= 1), got "
                         f"num_experts={config.num_experts}")
    _check_count("ep_size", ep_size, 1)
    _check_node_layout(ep_size, gpus_per_node)
    E, K = config.num_experts, config.num_experts_per_tok
    N = max(ep_size // gpus_per_node, 1)
    node = [e * N // E for e in range(E)]
    if max_nodes_per_token is not None:
        _check_count("max_nodes_per_token", max_nodes_per_token, 1)
    if max_nodes_per_token is not None and max_nodes_per_token < N:
        units = [[e for e in range(E) if node[e] == j] for j in range(N)]
        pick = max_nodes_per_token
    elif max_nodes_per_token is None and config.n_group > 1 and config.topk_group < config.n_group:
        size = E // config.n_group
        units = [list(range(g * size, (g + 1) * size)) for g in range(config.n_group)]
        pick = config.topk_group
    else:
        units, pick = [list(range(E))], 1
    total, sets = 0.0, 0
    for chosen in combinations(range(len(units)), pick):
        held: dict = {}
        for u in chosen:
            for e in units[u]:
                held[node[e]] = held.get(node[e], 0) + 1
        s = sum(held.values())
        if s < K:
            raise ValueError(f"the routing limit leaves {s} experts, fewer than "
                             f"num_experts_per_tok ({K})")
        total += sum(1 - comb(s - n, K) / comb(s, K) for n in held.values())
        sets += 1
    return total / sets


def _link_elements(config: ModelConfig, ep_size, G: int, M, path: str) -> dict:
    """Elements one token sends over each link in one direction (:func:`moe_comm_bytes_per_token`
    with ``gpus_per_node``): ``scale_out`` (InfiniBand) and ``scale_up`` (NVLink)."""
    _check_node_layout(ep_size, G)
    N, K, H = max(ep_size // G, 1), config.num_experts_per_tok, config.hidden_size
    n = expected_nodes_per_token(config, ep_size, gpus_per_node=G, max_nodes_per_token=M)
    if path == "direct" and N > 1:
        return {"nodes_per_token": n, "scale_out": K * (ep_size - 1) / ep_size * H,
                "scale_up": 0.0}
    G_used = min(G, ep_size)
    return {"nodes_per_token": n, "scale_out": n * (N - 1) / N * H,
            "scale_up": K * (G_used - 1) / G_used * H}


A2A_TABLE_COLUMNS = ["routing", "link", "dispatch KiB", "combine KiB", "total KiB"]
"""Column names of :func:`moe_a2a_table`."""


def moe_a2a_table(config: ModelConfig, ep_size: int, *, gpus_per_node: int = 8,
                  max_nodes_per_token: int | None = None, dispatch_bytes_per_element: float = 1,
                  combine_bytes_per_element: float = 2) -> list:
    """The book's one table of all-to-all bytes per token and MoE layer (KiB = 1,024 bytes),
    every row from :func:`moe_comm_bytes_per_token`, so the numbers of chapters 03, 07 and 08
    reconcile. Rows, top to bottom:

    1. flat, every (token, expert) pair remote, bf16 both ways (the upper bound);
    2. the same with the deployment's element sizes (DeepSeek's day-6 note: dispatch FP8,
       combine BF16; arguments ``dispatch_bytes_per_element``, ``combine_bytes_per_element``);
    3. flat over ``ep_size`` ranks, uniform routing (pairs on the token's own rank stay);
    4-6. the hierarchical path (prefill, V3 report section 3.4.1), ``gpus_per_node`` GPUs
       per node, no routing limit: InfiniBand, NVLink, both;
    7-9. the same under the routing limit: ``max_nodes_per_token`` nodes if given, else the
       config's group limit (``topk_group`` of ``n_group``; omitted when it has none);
    10. the direct path (decode, section 3.4.2): every pair off the token's GPU over
       InfiniBand.

    Returns:
        list of rows ``[routing, link, dispatch KiB, combine KiB, total KiB]``
        (:data:`A2A_TABLE_COLUMNS`).

    Raises:
        ValueError: as :func:`moe_comm_bytes_per_token`.
    """
    bd, bc = dispatch_bytes_per_element, combine_bytes_per_element
    sizes = dict(dispatch_bytes_per_element=bd, combine_bytes_per_element=bc)
    rows = []

    def add(routing, link, m, prefix=""):
        d, c = (m[f"{prefix}dispatch"], m[f"{prefix}combine"])
        rows.append([routing, link, d / 2**10, c / 2**10, (d + c) / 2**10])

    add("flat, all remote, bf16", "any", moe_comm_bytes_per_token(config))
    name = {1: "fp8", 2: "bf16", 4: "fp32"}
    add(f"flat, all remote, {name.get(bd, f'{bd} B')} dispatch, "
        f"{name.get(bc, f'{bc} B')} combine", "any",
        moe_comm_bytes_per_token(config, **sizes))
    add(f"flat, EP{ep_size}, uniform", "any", moe_comm_bytes_per_token(config, ep_size, **sizes))
    unlimited = config.replace(n_group=1, topk_group=1)
    cases = [(unlimited, None, "no routing limit")]
    if max_nodes_per_token is not None:
        cases.append((config, max_nodes_per_token, f"at most {max_nodes_per_token} nodes"))
    elif config.n_group > 1 and config.topk_group < config.n_group:
        cases.append((config, None, f"{config.topk_group} of {config.n_group} groups"))
    for cfg, M, label in cases:
        m = moe_comm_bytes_per_token(cfg, ep_size, **sizes, gpus_per_node=gpus_per_node,
                                     max_nodes_per_token=M)
        routing = f"EP{ep_size}, {gpus_per_node} GPUs/node, hierarchical, {label}"
        add(routing, "InfiniBand", m, "scale_out_")
        add(routing, "NVLink", m, "scale_up_")
        add(routing, "both", m)
    m = moe_comm_bytes_per_token(config, ep_size, **sizes, gpus_per_node=gpus_per_node,
                                 path="direct")
    add(f"EP{ep_size}, {gpus_per_node} GPUs/node, direct (decode)", "InfiniBand", m,
        "scale_out_")
    return rows


def num_moe_layers(config: ModelConfig) -> int:
    """Number of decoder blocks whose feed-forward is MoE (``config.layer_is_moe``)."""
    return sum(config.layer_is_moe(i) for i in range(config.num_hidden_layers))
