"""Expert parallelism (专家并行): an MoE layer split over processes, dispatch and combine as
all-to-all on ``torch.distributed``.

Legend: W world size (ranks), r this rank, E experts, E_r = E/W experts per rank, T_r tokens on
rank r, K top-k, H hidden, P_r = T_r*K pairs made on rank r, R_r rows rank r's experts receive.

Rank ``r`` owns experts ``[r*E_r, (r+1)*E_r)``; the router and the shared experts are replicated
(every rank holds a copy and runs them on its own tokens). One MoE layer, on every rank at once
(the system view of chapter 3: local hidden states -> all-to-all dispatch -> remote expert
compute -> all-to-all combine -> back at the original token positions)::

    route            x [T_r,H] -> indices, weights [T_r,K]
    sort by expert   rows [P_r,H], grouped by expert, hence by destination rank
    exchange counts  all_to_all_single: counts [E] -> received counts [W, E_r]
    dispatch         all_to_all_single: rows [P_r,H] -> received rows [R_r,H]
    expert compute   each local expert on its received rows
    combine          all_to_all_single: outputs [R_r,H] -> back [P_r,H]
    weighted sum     out[token] += weight * row (+ shared experts)   -> [T_r,H]

Bytes a rank sends (hidden-state payload): dispatch ``(P_r - local) * H * b`` and combine
``(R_r - local) * H * b``, where ``local`` rows go to the rank's own experts and never touch the
wire (:func:`tokenflow.analysis.costmodel.moe_a2a_bytes`). With EP=1 everything is local: no
traffic.

Run it three ways:

* in-process helpers on any initialised process group: :func:`ep_forward`
  (:mod:`tokenflow.parallel.ep_layer`, re-exported here);
* spawned local processes (what the chapter and the tests do): :func:`run_expert_parallel`
  (gloo on CPU over loopback; a ``TCPStore`` on a free port chosen by the OS);
* ``torchrun --nproc-per-node 4 -m tokenflow.parallel.expert_parallel`` (or ``python -m
  tokenflow.parallel.expert_parallel --nproc 4``, which spawns the processes itself). NCCL is used
  when every rank has its own GPU, gloo otherwise.

References: GShard (Lepikhin et al. 2020, arXiv:2006.16668) expressed MoE dispatch and combine
as all-to-all; DeepSeek-V3 (arXiv:2412.19437, sections 2.1.2, 3.2.2 and 3.4) describes a
production version with node-limited routing and communication overlapped with compute.
"""
from __future__ import annotations

import argparse
import os
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from tokenflow.config import ModelConfig, preset
from tokenflow.explain.moe import load_stats
from tokenflow.model.moe import MoE, check_top_k, route
from .ep_layer import (EPRankStats, ExpertShard, check_world_size, ep_forward, expert_owner,
                       traffic_matrix)

__all__ = ["expert_owner", "ExpertShard", "EPRankStats", "EPResult", "ep_forward",
           "run_expert_parallel", "start_worker_server", "traffic_matrix", "simulate_routing",
           "demo_moe", "main"]


# ----------------------------------------------------------------------------- spawn
@dataclass
class EPResult:
    """Result of :func:`run_expert_parallel`.

    Attributes:
        output: ``[T, H]`` MoE output of all tokens in their original order (rank 0's tokens
            first).
        ranks: one :class:`EPRankStats` per rank.
        splits: tokens per rank.
        backend: ``"gloo"`` or ``"nccl"``.
    """

    output: torch.Tensor
    ranks: list[EPRankStats]
    splits: list[int]
    backend: str
    repeats: list[list[EPRankStats]] = field(default_factory=list)

    @property
    def traffic(self) -> torch.Tensor:
        """``[W, W]`` rows dispatched from rank i (row) to rank j (column)."""
        return torch.tensor([s.sent_rows for s in self.ranks])

    def table(self) -> str:
        """Per-rank rows and bytes as a fixed-width text table (no timings: deterministic)."""
        head = ("rank", "tokens", "experts", "rows out", "local", "rows in", "dispatch B",
                "formula", "combine B", "formula")
        rows = [head]
        for s in self.ranks:
            rows.append((str(s.rank), str(s.tokens),
                         f"{s.local_experts[0]}-{s.local_experts[-1]}",
                         str(sum(s.sent_rows)), str(s.local_rows), str(sum(s.recv_rows)),
                         f"{s.dispatch_bytes_sent:,}", f"{s.dispatch_bytes_formula:,}",
                         f"{s.combine_bytes_sent:,}", f"{s.combine_bytes_formula:,}"))
        w = [max(len(r[c]) for r in rows) for c in range(len(head))]
        return "\n".join("  ".join(cell.rjust(wi) for cell, wi in zip(r, w)) for r in rows)


def _device_for(backend: str, rank: int) -> torch.device:
    return torch.device(f"cuda:{rank % torch.cuda.device_count()}") if backend == "nccl" \
        else torch.device("cpu")


def _worker(rank: int, world_size: int, port: int, workdir: str, backend: str,
            timeout_s: float, repeats: int) -> None:
    """Body of one spawned rank: join the group, rebuild the MoE, run, save stats/output.
    Its stdout/stderr go to ``rank{r}.log`` in ``workdir`` (shown if the run fails), so library
    warnings of the workers never mix into the caller's (e.g. a notebook's) output."""
    log = os.open(os.path.join(workdir, f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.environ.update(_loopback_env())                 # one thread; gloo over loopback only
    torch.set_num_threads(1)
    payload = torch.load(os.path.join(workdir, "payload.pt"), weights_only=True)
    store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False,
                          timeout=timedelta(seconds=timeout_s))
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=timeout_s))
    try:
        device = _device_for(backend, rank)
        moe = MoE(ModelConfig.from_dict(payload["config"]))
        moe.load_state_dict(payload["state_dict"])
        moe.gate.top_k = payload["top_k"]
        moe.eval()
        shard = ExpertShard(moe, rank, world_size).to(device)
        del moe
        x = payload["chunks"][rank].to(device)
        runs = []
        for _ in range(repeats):
            out, stats = ep_forward(shard, x)
            runs.append(stats.to_dict(timings=True))
        torch.save({"output": out.cpu(), "stats": runs},
                   os.path.join(workdir, f"rank{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _loopback_env() -> dict:
    env = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    try:
        names = {n for _, n in socket.if_nameindex()}
    except OSError:                                    # pragma: no cover
        names = set()
    for lo in ("lo", "lo0"):
        if lo in names:
            env["GLOO_SOCKET_IFNAME"] = lo             # gloo talks over loopback only
            break
    return env


def start_worker_server() -> bool:
    """Start the forkserver helper process now, without waiting for it.

    It imports torch and this module in the background (a few seconds), so that a later
    :func:`run_expert_parallel` forks its ranks at once. Call it early, e.g. at the top of a
    notebook. Returns False (and does nothing) where the platform has no ``forkserver``.
    """
    import multiprocessing
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return False
    from multiprocessing import forkserver
    forkserver.set_forkserver_preload(["tokenflow.parallel.expert_parallel"])
    forkserver.ensure_running()
    return True


def _logs(workdir: str, world_size: int, tail: int = 2000) -> str:
    parts = []
    for r in range(world_size):
        try:
            with open(os.path.join(workdir, f"rank{r}.log"), encoding="utf-8",
                      errors="replace") as f:
                text = f.read()[-tail:].strip()
        except OSError:
            continue
        if text:
            parts.append(f"\n--- rank {r} log ---\n{text}")
    return "".join(parts)


def _forkserver_preload() -> list[str]:
    """Modules the forkserver imports once. Not this module when it is itself the main
    program (``python -m tokenflow.parallel.expert_parallel``): each rank re-runs the main module as
    ``__mp_main__``, and a preloaded copy would make runpy warn once per rank."""
    import sys
    main_spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return [] if getattr(main_spec, "name", None) == "tokenflow.parallel.expert_parallel" \
        else ["tokenflow.parallel.expert_parallel"]


def run_expert_parallel(moe: MoE, x: torch.Tensor, world_size: int, *,
                        splits: list[int] | None = None, backend: str | None = None,
                        timeout_s: float = 60.0, repeats: int = 1,
                        start_method: str | None = None) -> EPResult:
    """Run ``moe`` expert-parallel over ``world_size`` freshly spawned local processes.

    Every rank rebuilds the same MoE (config + state dict of ``moe``, so the expert weights
    are exactly those of the single-process module), keeps its ``E/W`` experts, takes its slice
    of ``x`` and runs :func:`ep_forward`. The processes meet through a ``TCPStore`` that this
    process serves on ``127.0.0.1`` at a port the OS picks (no port guessing, loopback only);
    each worker uses one thread.

    Start method: ``"forkserver"`` (default where the platform has it): Python starts one clean
    helper process that imports torch once, and every rank of every run is forked from it, so
    a run costs well under a second after the first, and no rank inherits a parent's threads.
    ``"spawn"``: a fresh interpreter (and torch import) per rank.

    Calling it from a script: with either start method every rank re-imports the calling
    script's main module (as ``__mp_main__``), so a script must call this function under an
    ``if __name__ == "__main__":`` guard, as for any ``multiprocessing`` program; without it
    the ranks would try to start ranks of their own and fail. Notebooks and
    ``python -m tokenflow.parallel.expert_parallel`` need nothing.

    Args:
        moe: the :class:`~tokenflow.model.moe.MoE` to distribute (its ``config`` is used).
        x: ``[T, H]`` (or ``[B, S, H]``, flattened) tokens of all ranks.
        world_size: W >= 1, must divide ``moe.num_experts``.
        splits: tokens per rank (sum ``T``; zeros allowed); default ``torch.tensor_split``.
        backend: ``"gloo"`` (CPU) or ``"nccl"`` (one GPU per rank); default: NCCL if there are
            at least W GPUs, else gloo.
        timeout_s: wall-clock limit in seconds for the whole run (and for each collective).
        repeats: run the forward this many times in each process (for benchmarks); the
            stats of every repeat are in ``EPResult.repeats``.
        start_method: ``"forkserver"`` or ``"spawn"`` (see above).

    Returns:
        :class:`EPResult` (output ``[T, H]`` on CPU, per-rank stats).

    Raises:
        ValueError: bad ``world_size`` / ``splits`` / shapes / ``backend``.
        TimeoutError: if the processes do not finish within ``timeout_s`` (they are killed).
        RuntimeError: if a worker fails (its traceback is included).
    """
    x, splits, backend, start_method = _run_arguments(moe, x, world_size, splits, backend,
                                                      repeats, start_method)
    payload = {"config": moe.config.to_dict(),
               "state_dict": {k: v.detach().cpu() for k, v in moe.state_dict().items()},
               "top_k": int(moe.gate.top_k),
               "chunks": [c.clone() for c in torch.split(x, splits)]}
    results = _spawn_ranks(payload, world_size, backend, timeout_s, repeats, start_method)
    H = x.shape[1]
    output = torch.cat([r["output"] for r in results]) if x.shape[0] else x.new_zeros(0, H)
    repeats_stats = [[EPRankStats(**res["stats"][i]) for res in results] for i in range(repeats)]
    return EPResult(output=output, ranks=repeats_stats[-1], splits=splits, backend=backend,
                    repeats=repeats_stats)


def _run_arguments(moe, x, world_size, splits, backend, repeats, start_method):
    """:func:`run_expert_parallel`'s checks: ``(x [T, H] on CPU, splits, backend,
    start_method)``, the defaults filled in."""
    import torch.multiprocessing as mp
    check_world_size(moe.num_experts, world_size)
    H = moe.gate.weight.shape[1]
    if x.shape[-1] != H or x.dim() not in (2, 3):
        raise ValueError(f"x must have shape [T, H] or [B, S, H] with H={H}, got {list(x.shape)}")
    x = x.detach().reshape(-1, H).cpu()
    T = x.shape[0]
    if splits is None:
        splits = [c.shape[0] for c in torch.tensor_split(x, world_size)]
    splits = [int(s) for s in splits]
    if len(splits) != world_size or any(s < 0 for s in splits) or sum(splits) != T:
        raise ValueError(f"splits must be {world_size} non-negative ints summing to T={T}, "
                         f"got {splits}")
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() and \
            torch.cuda.device_count() >= world_size else "gloo"
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an int >= 1, got {repeats!r}")
    check_top_k(moe.gate.top_k, moe.num_experts)
    if start_method is None:
        start_method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
    if start_method not in ("forkserver", "spawn"):
        raise ValueError(f"start_method must be 'forkserver' or 'spawn', got {start_method!r}")
    return x, splits, backend, start_method


def _spawn_ranks(payload: dict, world_size: int, backend: str, timeout_s: float, repeats: int,
                 start_method: str) -> list[dict]:
    """Start ``world_size`` ranks on ``payload`` (saved to a temporary folder they read), wait
    for them within ``timeout_s`` and return each rank's saved result; the processes and the
    folder are gone afterwards, whatever happened."""
    import torch.multiprocessing as mp
    workdir = tempfile.mkdtemp(prefix="tokenflow-ep-")
    store = None
    ctx = None
    try:
        torch.save(payload, os.path.join(workdir, "payload.pt"))
        store = dist.TCPStore("127.0.0.1", 0, world_size, is_master=True,
                              wait_for_workers=False, timeout=timedelta(seconds=timeout_s))
        if start_method == "forkserver":
            mp.set_forkserver_preload(_forkserver_preload())
        ctx = mp.start_processes(_worker, nprocs=world_size, join=False,
                                 start_method=start_method,
                                 args=(world_size, store.port, workdir, backend,
                                       float(timeout_s), repeats))
        deadline = time.monotonic() + timeout_s
        try:
            while not ctx.join(timeout=0.2):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"expert-parallel run with world_size={world_size} did "
                                       f"not finish within timeout_s={timeout_s}")
        except mp.ProcessRaisedException as exc:
            raise RuntimeError(f"an expert-parallel worker failed:\n{exc}"
                               f"{_logs(workdir, world_size)}") from None
        except mp.ProcessExitedException as exc:
            raise RuntimeError(f"an expert-parallel worker died: {exc}"
                               f"{_logs(workdir, world_size)}") from None
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}{_logs(workdir, world_size)}") from None
        return [torch.load(os.path.join(workdir, f"rank{r}.pt"), weights_only=True)
                for r in range(world_size)]
    finally:
        if ctx is not None:
            for p in ctx.processes:                    # only the processes we started
                if p.is_alive():
                    p.terminate()
                    p.join(5)
                    if p.is_alive():
                        p.kill()
                        p.join(5)
        del store
        shutil.rmtree(workdir, ignore_errors=True)


# ----------------------------------------------------------------------------- what-if
def simulate_routing(num_experts: int = 8, top_k: int = 2, batch_size: int = 1,
                     seq_len: int = 16, *, world_size: int = 1, hidden_size: int = 7168,
                     bytes_per_element: float = 2, capacity_factor: float = 1.25,
                     router_dim: int = 64, seed: int = 0) -> dict:
    """Route ``batch_size * seq_len`` random tokens with a random softmax router and report
    load and all-to-all volume (the chapter's widget; no model weights involved).

    Tokens are split evenly over ``world_size`` ranks in order, experts in contiguous blocks.
    The router scores ``router_dim``-wide random hidden states; the bytes are computed as if the
    hidden states had ``hidden_size`` elements of ``bytes_per_element`` bytes (default
    DeepSeek-V3-sized: 7168 in bf16).

    Returns:
        dict: ``tokens``, ``counts`` (``[E]`` list), ``imbalance``, ``capacity``, ``dropped``
        (from :func:`tokenflow.explain.moe.load_stats`), ``traffic`` (``[W, W]`` list),
        ``local_pairs``, ``remote_pairs``, ``dispatch_bytes`` and ``combine_bytes`` (all ranks
        together), ``uniform_bytes`` (what uniform routing would send per direction).

    Raises:
        ValueError: ``top_k`` outside ``[1, num_experts]``, ``world_size`` not dividing
            ``num_experts``, sizes < 1.
    """
    from tokenflow.analysis.costmodel import expected_remote_fraction, moe_a2a_bytes
    check_top_k(top_k, num_experts)
    for name, v in (("batch_size", batch_size), ("seq_len", seq_len),
                    ("hidden_size", hidden_size), ("router_dim", router_dim)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    check_world_size(num_experts, world_size)
    g = torch.Generator().manual_seed(seed)
    T = batch_size * seq_len
    x = torch.randn(T, router_dim, generator=g)                           # [T, h]
    w = torch.randn(num_experts, router_dim, generator=g) / router_dim ** 0.5   # [E, h]
    indices, _, _ = route(x, w, top_k)                                    # [T, K]
    st = load_stats(indices, num_experts, capacity_factor)
    token_rank = torch.arange(T) * world_size // T                        # [T] even split
    traffic = traffic_matrix(indices, token_rank, num_experts, world_size)  # [W, W]
    local = int(traffic.diagonal().sum())
    sent = moe_a2a_bytes(T, top_k, hidden_size, bytes_per_element, local_pairs=local)
    return {"tokens": T, "counts": st["counts"].tolist(), "imbalance": st["imbalance"],
            "capacity": st["capacity"], "dropped": st["dropped"],
            "traffic": traffic.tolist(), "local_pairs": local, "remote_pairs": T * top_k - local,
            "dispatch_bytes": sent, "combine_bytes": sent,
            "uniform_bytes": T * top_k * hidden_size * bytes_per_element
            * expected_remote_fraction(world_size)}


# ----------------------------------------------------------------------------- CLI
def demo_moe(source: str = "random", *, num_experts: int = 8, top_k: int = 2,
             hidden_size: int = 64, scoring_func: str = "softmax", seed: int = 0,
             layer_idx: int = 1) -> MoE:
    """The MoE the command line distributes: ``"pretrained"`` (layer ``layer_idx`` of the
    shipped tiny model) or ``"random"`` (a fresh random MoE of the tiny preset's shape with the
    given ``num_experts``, ``top_k``, ``hidden_size``, ``scoring_func``, weights from ``seed``; the
    sigmoid family also gets a random selection bias and 2 expert groups).

    Raises:
        ValueError: unknown ``source`` or invalid sizes.
    """
    if source == "pretrained":
        from tokenflow.interop.checkpoint import load_pretrained
        model, _ = load_pretrained()
        mlp = model.layers[layer_idx].mlp
        if not isinstance(mlp, MoE):
            raise ValueError(f"layer_idx {layer_idx} of the pretrained model is not MoE")
        return mlp.eval()
    if source != "random":
        raise ValueError(f"source must be 'random' or 'pretrained', got {source!r}")
    check_top_k(top_k, num_experts)
    extra = dict(n_group=2, topk_group=2 if top_k > num_experts // 2 else 1,
                 routed_scaling_factor=2.5) \
        if scoring_func == "sigmoid" and num_experts % 2 == 0 else {}
    cfg = preset("tiny", hidden_size=hidden_size, num_attention_heads=4, num_key_value_heads=2,
                 num_experts=num_experts, num_experts_per_tok=top_k,
                 scoring_func=scoring_func, **extra)
    torch.manual_seed(seed)
    moe = MoE(cfg, layer_idx=0).eval()
    with torch.no_grad():
        moe.gate.weight.normal_(std=1.0 / hidden_size ** 0.5)
        if scoring_func == "sigmoid":
            moe.gate.e_score_correction_bias.normal_(std=0.1)
    return moe


def _demo_inputs(moe: MoE, tokens: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + 1)
    return torch.randn(tokens, moe.gate.weight.shape[1], generator=g)


EP_TOL = 1e-5
"""Absolute tolerance of the EP-vs-one-process check in the command line report: the experts'
outputs are summed in another order on each rank (float32 rounding, ~1e-7 here)."""


def _report(result_out: torch.Tensor, ref: torch.Tensor, stats: list[EPRankStats]) -> str:
    # a claim with its tolerance, not the difference's digits (they change with the CPU)
    ok_out = torch.allclose(result_out, ref, rtol=0.0, atol=EP_TOL)
    res = EPResult(result_out, stats, [s.tokens for s in stats], "")
    ok = all(s.dispatch_bytes_sent == s.dispatch_bytes_formula
             and s.combine_bytes_sent == s.combine_bytes_formula for s in stats)
    return (f"{res.table()}\n"
            f"EP vs single process: allclose(atol={EP_TOL:g}): {ok_out}\n"
            f"bytes match (T_r*K - local)*H*b and (R_r - local)*H*b on every rank: {ok}")


def main(argv: list[str] | None = None) -> None:
    """Command line: ``torchrun --nproc-per-node N -m tokenflow.parallel.expert_parallel
    [options]`` or ``python -m tokenflow.parallel.expert_parallel --nproc N [options]``. Prints
    per-rank rows and bytes, the formula check and the largest difference to the single-process
    MoE."""
    p = argparse.ArgumentParser(prog="python -m tokenflow.parallel.expert_parallel",
                                description=main.__doc__)
    p.add_argument("--nproc", type=int, default=2, help="processes to spawn (without torchrun)")
    p.add_argument("--source", choices=("random", "pretrained"), default="random")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--scoring", choices=("softmax", "sigmoid"), default="softmax")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", choices=("gloo", "nccl"), default=None)
    a = p.parse_args(argv)
    moe = demo_moe(a.source, num_experts=a.experts, top_k=a.top_k, hidden_size=a.hidden,
                   scoring_func=a.scoring, seed=a.seed)
    x = _demo_inputs(moe, a.tokens, a.seed)
    with torch.no_grad():
        ref = moe(x[None])[0]                                             # [T, H]

    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:               # under torchrun
        W = int(os.environ["WORLD_SIZE"])
        backend = a.backend or ("nccl" if torch.cuda.is_available()
                                and torch.cuda.device_count() >= int(
                                    os.environ.get("LOCAL_WORLD_SIZE", W)) else "gloo")
        torch.set_num_threads(1)
        dist.init_process_group(backend, timeout=timedelta(seconds=120))
        try:
            r = dist.get_rank()
            device = _device_for(backend, int(os.environ.get("LOCAL_RANK", r)))
            shard = ExpertShard(moe, r, W).to(device)
            chunks = torch.tensor_split(x, W)
            out, stats = ep_forward(shard, chunks[r].to(device))
            gathered: list = [None] * W
            dist.all_gather_object(gathered, (out.cpu(), stats))
            if r == 0:
                full = torch.cat([o for o, _ in gathered])
                print(f"torchrun: {W} ranks, backend {backend}, {a.tokens} tokens, "
                      f"{moe.num_experts} experts, top-{moe.gate.top_k}")
                print(_report(full, ref, [s for _, s in gathered]))
        finally:
            dist.destroy_process_group()
        return

    res = run_expert_parallel(moe, x, a.nproc, backend=a.backend)
    print(f"spawned {a.nproc} processes, backend {res.backend}, {a.tokens} tokens, "
          f"{moe.num_experts} experts, top-{moe.gate.top_k}")
    print(_report(res.output, ref, res.ranks))


if __name__ == "__main__":
    main()
