"""Benchmark prefill vs decode and the serving engine (issue F5), on the shared model.

    .venv/bin/python benchmarks/bench_serving.py            # about a minute on one core
    .venv/bin/python benchmarks/bench_serving.py --requests 12 --repeats 10

Prints three ratios, each measured in this one run (nothing here is asserted by the tests):

1. Decode step time with the KV cache at context 1024 / at context 64 (target <= 2.0): a
   decode step reads the cache, so it grows with the context, but for a small model the
   fixed per-step work dominates.
2. Cached decode vs full recompute at context 512 (target >= 5x): the next token's logits
   from one decode step on a filled cache, against running all 513 tokens again without one.
3. Continuous vs static batching throughput (target >= 1.5x) on a mixed workload (prompts of
   8-64 tokens; most requests want 8-24 new tokens, one in four wants 96-128): generated
   tokens per second of :class:`tokenflow.serving.LLMEngine` (``max_num_seqs`` seats refilled
   as requests finish; paged KV storage, ``--kv-storage contiguous`` for the other) against static batching (``generate`` on left-padded groups of
   ``max_num_seqs`` requests in arrival order, each group running until its longest request
   is done; only the tokens the requests asked for are counted).

The shared model is ``load_pretrained()`` with ``max_position_embeddings`` raised to 2048
(that changes the length of the RoPE table only, no weight), so contexts of 1024 fit.
"""
from __future__ import annotations

import argparse
import time

import torch

from _common import machine, median, timeit
from tokenflow import KVCache, TokenFlowModel, decode_step, generate, load_pretrained, prefill
from tokenflow.serving import LLMEngine, SamplingParams

MAX_POS = 2048


def shared_model() -> TokenFlowModel:
    """The book's trained model with a 2048-position RoPE table, eval mode."""
    small, _ = load_pretrained()
    model = TokenFlowModel(small.config.replace(max_position_embeddings=MAX_POS))
    model.load_state_dict(small.state_dict())
    return model.eval()


def decode_time(model, context: int, steps: int) -> float:
    """Median seconds of one cached decode step after a ``context``-token prefill."""
    g = torch.Generator().manual_seed(context)
    ids = torch.randint(4, model.config.vocab_size, (1, context), generator=g)
    cache = KVCache(model.config, 1, context + steps + 1)
    prefill(model, ids, cache)
    nxt = ids[:, -1:]
    return median(timeit(lambda: decode_step(model, nxt, cache), steps))


@torch.inference_mode()
def recompute_time(model, context: int, repeats: int) -> float:
    """Median seconds to get the next token's logits by running ``context + 1`` tokens
    through the model without a cache."""
    ids = torch.randint(4, model.config.vocab_size, (1, context + 1),
                        generator=torch.Generator().manual_seed(1))
    return median(timeit(lambda: model(ids, logits_to_keep=1), repeats))


def workload(n: int, seed: int = 0) -> tuple[list[list[int]], list[int]]:
    """``n`` prompts (8-64 tokens) and their ``max_new_tokens`` (a long one every 4th)."""
    g = torch.Generator().manual_seed(seed)
    rand = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=g))   # noqa: E731
    prompts = [torch.randint(4, 512, (rand(8, 64),), generator=g).tolist() for _ in range(n)]
    new = [rand(96, 128) if i % 4 == 3 else rand(8, 24) for i in range(n)]
    return prompts, new


def static_batching(model, prompts, new, batch: int) -> float:
    """Seconds to serve all requests in fixed groups of ``batch`` with ``generate``."""
    t = time.perf_counter()
    for i in range(0, len(prompts), batch):
        group = prompts[i:i + batch]
        S = max(len(p) for p in group)
        ids = torch.tensor([[0] * (S - len(p)) + p for p in group])          # [B, S]
        mask = torch.tensor([[0] * (S - len(p)) + [1] * len(p) for p in group])
        generate(model, ids, max(new[i:i + batch]), attention_mask=mask, stop_at_eos=False)
    return time.perf_counter() - t


def continuous_batching(model, prompts, new, batch: int, kv_storage: str = "paged"
                        ) -> tuple[float, dict]:
    """Seconds to serve all requests with the engine (``batch`` seats, ``kv_storage``
    ``"paged"`` or ``"contiguous"``), and its metrics."""
    engine = LLMEngine(model, num_blocks=256, block_size=16, max_num_seqs=batch,
                       max_num_batched_tokens=256, kv_storage=kv_storage)
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
    model = shared_model()

    t64, t1024 = decode_time(model, 64, a.repeats), decode_time(model, 1024, a.repeats)
    print(f"1. decode step with cache: context 64 {t64 * 1e3:.3f} ms, context 1024 "
          f"{t1024 * 1e3:.3f} ms; ratio 1024/64 = {t1024 / t64:.2f} (target <= 2.0)")

    cached, full = decode_time(model, 512, a.repeats), recompute_time(model, 512, 10)
    print(f"2. context 512: cached decode {cached * 1e3:.3f} ms, full recompute "
          f"{full * 1e3:.3f} ms; ratio = {full / cached:.1f}x (target >= 5x)")

    prompts, new = workload(a.requests)
    continuous_batching(model, prompts[:2], new[:2], a.batch, a.kv_storage)   # warm-up
    t_static = static_batching(model, prompts, new, a.batch)
    t_cont, m = continuous_batching(model, prompts, new, a.batch, a.kv_storage)
    tokens = sum(new)
    print(f"3. {a.requests} requests, {tokens} new tokens, {a.batch} seats, {a.kv_storage} "
          f"KV: static "
          f"{tokens / t_static:.0f} tok/s ({t_static:.2f} s), continuous "
          f"{tokens / t_cont:.0f} tok/s ({t_cont:.2f} s); ratio = {t_static / t_cont:.2f}x "
          f"(target >= 1.5x)")
    print(f"   engine: {m['num_steps']} steps, mean TTFT {m['mean_ttft_s'] * 1e3:.0f} ms, "
          f"mean TPOT {m['mean_tpot_s'] * 1e3:.1f} ms, mean e2e {m['mean_e2e_s']:.2f} s, "
          f"{m['num_preemptions']} preemptions")


if __name__ == "__main__":
    main()
