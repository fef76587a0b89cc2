"""Benchmark the MoE layer: vectorised dispatch/combine vs the token loop, and the
expert-parallel run's wall time split into compute and communication.

    .venv/bin/python benchmarks/bench_moe.py            # T=4096, E=64, K=6, H=256, I=128
    .venv/bin/python benchmarks/bench_moe.py --tokens 1024 --world-sizes 2

Prints ratios and seconds; nothing here is asserted by the test suite (speed depends on the
machine). Target: vectorised >= 5x faster than the loop at the default sizes.

1. Same router choices, same weights, one thread: ``MoE.dispatch_combine`` (sort the T*K pairs by
   expert, one matmul block per expert, index_add back) against ``moe_reference_loop`` (for each
   token, for each of its K experts, run the expert on one row).
2. ``run_expert_parallel`` with W processes (gloo over loopback): per rank, median over repeats
   of the seconds spent computing (route, sort, experts, combine) and inside the three
   all-to-alls (which also includes waiting for the slowest rank), plus the bytes sent. With
   more ranks than cores the processes also share cores, which inflates both columns.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from tokenflow import preset
from tokenflow.parallel.expert_parallel import run_expert_parallel
from tokenflow.model.moe import MoE, moe_reference_loop


def best_of(fn, repeats: int) -> float:
    """Smallest wall time in seconds of ``repeats`` calls of ``fn``."""
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--experts", type=int, default=64)
    p.add_argument("--top-k", type=int, default=6)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--intermediate", type=int, default=128,
                   help="expert width I (fine-grained experts are narrower than H)")
    p.add_argument("--world-sizes", type=int, nargs="*", default=[2, 4])
    p.add_argument("--ep-repeats", type=int, default=5)
    a = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = preset("tiny", hidden_size=a.hidden, num_experts=a.experts,
                 num_experts_per_tok=a.top_k, moe_intermediate_size=a.intermediate,
                 num_shared_experts=0)
    moe = MoE(cfg).eval()
    with torch.no_grad():
        moe.gate.weight.normal_(std=a.hidden ** -0.5)
    x = torch.randn(a.tokens, a.hidden)
    T, E, K, H = a.tokens, a.experts, a.top_k, a.hidden
    print(f"MoE layer: T={T} tokens, E={E} experts, K={K}, H={H}, I={a.intermediate}, "
          f"fp32, 1 thread")

    with torch.no_grad():
        idx, w, _ = moe.gate(x)
        fast_out = moe.dispatch_combine(x, idx, w)
        t_fast = best_of(lambda: moe.dispatch_combine(x, idx, w), 5)
        t0 = time.perf_counter()
        loop_out = moe_reference_loop(moe, x, idx, w)
        t_loop = time.perf_counter() - t0
    err = float((fast_out - loop_out).abs().max())
    print(f"  loop over tokens x experts : {t_loop:8.3f} s   ({T * K} expert calls on 1 row)")
    used = int((idx.reshape(-1).bincount(minlength=E) > 0).sum())
    print(f"  vectorised dispatch/combine: {t_fast:8.3f} s   ({used} expert calls on blocks)")
    print(f"  speed ratio loop / vectorised: {t_loop / t_fast:.1f}x  (target >= 5x); "
          f"max |difference| {err:.2e}")

    for W in a.world_sizes:
        if E % W:
            print(f"\nEP W={W}: skipped, {W} does not divide E={E}")
            continue
        t0 = time.perf_counter()
        res = run_expert_parallel(moe, x, W, repeats=a.ep_repeats + 1, timeout_s=300)
        wall = time.perf_counter() - t0
        with torch.no_grad():
            single = moe(x[None])[0]
        err = float((res.output - single).abs().max())
        print(f"\nEP W={W} ({res.backend}, {W} processes, 1 thread each, on {os.cpu_count()} "
              f"cores; {T // W} tokens per rank; median of {a.ep_repeats} runs after 1 warm-up; "
              f"whole launch {wall:.2f} s)")
        print("  rank  compute s  all-to-all s  comm share  dispatch MB sent  combine MB sent")
        for r in range(W):
            runs = [rep[r] for rep in res.repeats[1:]]
            comp = statistics.median(s.compute_s for s in runs)
            comm = statistics.median(s.comm_s for s in runs)
            s = runs[-1]
            print(f"  {r:4d}  {comp:9.4f}  {comm:12.4f}  {comm / (comp + comm):10.0%}  "
                  f"{s.dispatch_bytes_sent / 1e6:15.3f}  {s.combine_bytes_sent / 1e6:15.3f}")
        ok = all(s.dispatch_bytes_sent == s.dispatch_bytes_formula
                 and s.combine_bytes_sent == s.combine_bytes_formula for s in res.ranks)
        print(f"  bytes == formula on every rank: {ok}; max |EP - single process| {err:.2e}")


if __name__ == "__main__":
    main()
