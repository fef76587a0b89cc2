"""Benchmark prefill vs decode and the serving engine (issue F5), on the shared model.

    .venv/bin/python benchmarks/bench_serving.py            # about a minute on one core
    .venv/bin/python benchmarks/bench_serving.py --requests 12 --repeats 10

Prints three ratios, each measured in this one run (nothing here is asserted by the tests).
Times are the best of the repeats (:mod:`tokenflow.inference.phases`, the timers chapter 05 plots).

1. Decode step time with the KV cache at context 1024 / at context 64 (target <= 2.0): a
   decode step reads the cache, so it grows with the context, but for a small model the
   fixed per-step work dominates (:func:`tokenflow.inference.phases.time_decode`).
2. Cached decode vs full recompute at context 512 (target >= 5x): the next token's logits
   from one decode step on a filled cache, against running all 513 tokens again without one
   (:func:`tokenflow.inference.phases.time_recompute`).
3. Continuous vs static batching throughput (target >= 1.5x) on a mixed workload (prompts of
   8-64 tokens; most requests want 8-24 new tokens, one in four wants 96-128): seconds to
   serve all requests with :class:`tokenflow.serving.LLMEngine` (``max_num_seqs`` seats
   refilled as requests finish) against the same engine with ``static_batching=True`` (a new
   batch is admitted only when the running one has finished). Same seats, token budget and
   KV storage (paged; ``--kv-storage contiguous`` for the other).

The shared model is ``load_pretrained()`` with ``max_position_embeddings`` raised to 2048
(:func:`tokenflow.inference.phases.with_context_length`: the RoPE table only, no weight), so contexts
of 1024 fit.
"""
from __future__ import annotations

import argparse
import time

import torch

from _common import machine
from tokenflow import load_pretrained
from tokenflow.inference.phases import time_decode, time_recompute, with_context_length
from tokenflow.serving import LLMEngine, SamplingParams

MAX_POS = 2048


def workload(n: int, seed: int = 0) -> tuple[list[list[int]], list[int]]:
    """``n`` prompts (8-64 tokens) and their ``max_new_tokens`` (a long one every 4th)."""
    g = torch.Generator().manual_seed(seed)
    rand = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=g))   # noqa: E731
    prompts = [torch.randint(4, 512, (rand(8, 64),), generator=g).tolist() for _ in range(n)]
    new = [rand(96, 128) if i % 4 == 3 else rand(8, 24) for i in range(n)]
    return prompts, new


def serve(model, prompts, new, batch: int, kv_storage: str = "paged",
          static_batching: bool = False) -> tuple[float, dict]:
    """Seconds to serve all requests with the engine (``batch`` seats, ``kv_storage``
    ``"paged"`` or ``"contiguous"``, continuous or static batching), and its metrics."""
    engine = LLMEngine(model, num_blocks=256, block_size=16, max_num_seqs=batch,
                       max_num_batched_tokens=256, kv_storage=kv_storage,
                       static_batching=static_batching)
    params = [SamplingParams(n, ignore_eos=True) for n in new]
    t = time.perf_counter()
    outs = engine.run(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - t
    assert [len(o.output_token_ids) for o in outs] == new
    return seconds, engine.metrics()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=24)
    p.add_argument("--batch", type=int, default=8, help="max_num_seqs / static batch size")
    p.add_argument("--repeats", type=int, default=30, help="timed decode steps per context")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--kv-storage", default="paged", choices=["paged", "contiguous"],
                   help="the engine's KV storage for ratio 3")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    print(machine().replace("torch.set_num_threads(2)", f"torch.set_num_threads({a.threads})"))
    model = with_context_length(load_pretrained()[0], MAX_POS)

    t64, t1024 = time_decode(model, [64, 1024], repeats=a.repeats)
    print(f"1. decode step with cache: context 64 {t64 * 1e3:.3f} ms, context 1024 "
          f"{t1024 * 1e3:.3f} ms; ratio 1024/64 = {t1024 / t64:.2f} (target <= 2.0)")

    (cached,), (full,) = time_decode(model, [512], repeats=a.repeats), \
        time_recompute(model, [512], repeats=10)
    print(f"2. context 512: cached decode {cached * 1e3:.3f} ms, full recompute "
          f"{full * 1e3:.3f} ms; ratio = {full / cached:.1f}x (target >= 5x)")

    prompts, new = workload(a.requests)
    serve(model, prompts[:2], new[:2], a.batch, a.kv_storage)               # warm-up
    t_static, ms = serve(model, prompts, new, a.batch, a.kv_storage, static_batching=True)
    t_cont, m = serve(model, prompts, new, a.batch, a.kv_storage)
    tokens = sum(new)
    print(f"3. {a.requests} requests, {tokens} new tokens, {a.batch} seats, {a.kv_storage} "
          f"KV: static {tokens / t_static:.0f} tok/s ({t_static:.2f} s), continuous "
          f"{tokens / t_cont:.0f} tok/s ({t_cont:.2f} s); ratio = {t_static / t_cont:.2f}x "
          f"(target >= 1.5x)")
    print(f"   engine: {m['num_steps']} steps (static {ms['num_steps']}), mean TTFT "
          f"{m['mean_ttft_s'] * 1e3:.0f} ms, mean TPOT {m['mean_tpot_s'] * 1e3:.1f} ms, mean e2e {m['mean_e2e_s']:.2f} s, "
          f"{m['num_preemptions']} preemptions")


if __name__ == "__main__":
    main()
