"""Benchmark prefill vs decode and the serving engine (issues F5, F13), on the shared model.

    .venv/bin/python benchmarks/bench_serving.py            # about 4 minutes on one core
    .venv/bin/python benchmarks/bench_serving.py --pairs 5 --no-hf
    .venv/bin/python benchmarks/bench_serving.py --quick --pairs 5   # 4 and 5, mixed only (~1 min)
    .venv/bin/python benchmarks/bench_serving.py --pairs 5 --json benchmarks/latest.json

Prints each ratio measured in this one run (nothing here is asserted by the tests). Single
times are the best of the repeats (:mod:`tokenflow.inference.phases`, the timers chapter 05 plots);
engine comparisons are **paired**: the two sides alternate (A, B, A, B, ...) and the ratio is
the median over the pairs of B's time / A's time, so background load hits both alike.
``--json PATH`` stores the run under the key ``"serving"`` of that JSON file (other keys kept;
``scripts/bench_table.py`` renders it into ``book/benchmarks.md``): the machine, the load
average before and after, and per measure its value, every pair's ratio, target and whether
it was met.

1. Decode step time with the KV cache at context 1024 / at context 64 (target <= 2.0):
   :func:`tokenflow.inference.phases.time_decode`, batch 1.
2. Cached decode vs full recompute at context 512 (target >= 5x): one decode step on a filled
   cache against running all 513 tokens again without one.
3. Continuous vs static batching (target >= 1.5x) on the mixed workload: the engine with its
   ``max_num_seqs`` seats refilled as requests finish, against ``static_batching=True``.
4. Packing (target: positions computed / real tokens = 1.00; packed >= 1.5x the padded
   engine on the mixed workload, more on the long one). The engine's packed step against
   the step it replaced: every scheduled chunk left-padded to the longest into one
   ``input_ids [B, S_max]`` (``kv_storage="padded"``, :class:`tokenflow.serving.PaddedKVStorage`,
   kept for this comparison and chapter 05's).
   Both run on the mixed workload (24 requests, prompts of 8-64 tokens, 8-24 new tokens,
   one in four 96-128) and on a long-prompt one (8 requests, prompts of 500-1,000 tokens
   prefilled in chunks of the 256-token budget, 16-32 new tokens).
5. The peer (target: ours >= 1.5x, identical greedy outputs): the same model exported with
   :func:`tokenflow.interop.save_hf_checkpoint` and served by transformers' continuous
   batching (``generate_batch``'s manager, ``attn_implementation="paged|sdpa"``: paged
   attention over SDPA). Same requests (each with its own ``max_new_tokens``, added to the
   manager one by one), same block size (16; HF's ``page_size``), blocks (1,024), token
   budget (256; ``max_batch_tokens``) and seats (8; ``max_requests_per_batch``), greedy, EOS
   off. The manager's setup and warm-up are not timed. Its loop runs in a background
   thread; ``--threads 1`` (the default) is the fair setting on this CPU build (with 2
   threads, ops called from a non-main thread were about 10x slower).

The shared model is ``load_pretrained()`` with ``max_position_embeddings`` raised to 2048
(:func:`tokenflow.inference.phases.with_context_length`: the RoPE table only, no weight), so
contexts of 1,024 fit.
"""
from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import logging
import os
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import torch

from _common import machine
from tokenflow import load_pretrained
from tokenflow.inference.phases import time_decode, time_recompute, with_context_length
from tokenflow.serving import LLMEngine, SamplingParams

MAX_POS = 2048
SETTINGS = dict(num_blocks=1024, block_size=16, max_num_seqs=8, max_num_batched_tokens=256)


def _rand(g):
    return lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=g))


def workload(n: int = 24, seed: int = 0) -> tuple[list[list[int]], list[int]]:
    """Mixed: ``n`` prompts (8-64 tokens) and their ``max_new_tokens`` (8-24; 96-128 for
    every 4th)."""
    g = torch.Generator().manual_seed(seed)
    rand = _rand(g)
    prompts = [torch.randint(4, 512, (rand(8, 64),), generator=g).tolist() for _ in range(n)]
    new = [rand(96, 128) if i % 4 == 3 else rand(8, 24) for i in range(n)]
    return prompts, new


def long_workload(n: int = 8, seed: int = 1) -> tuple[list[list[int]], list[int]]:
    """Long prompts: ``n`` prompts of 500-1,000 tokens, 16-32 new tokens each."""
    g = torch.Generator().manual_seed(seed)
    rand = _rand(g)
    prompts = [torch.randint(4, 512, (rand(500, 1000),), generator=g).tolist() for _ in range(n)]
    return prompts, [rand(16, 32) for _ in range(n)]


def serve(model, prompts, new, padded: bool = False, static_batching: bool = False):
    """Serve the requests (greedy, EOS off). Returns ``(seconds, output ids, engine)``."""
    engine = LLMEngine(model, static_batching=static_batching,
                       kv_storage="padded" if padded else "paged", **SETTINGS)
    params = [SamplingParams(n, ignore_eos=True) for n in new]
    gc.disable()
    t = time.perf_counter()
    outs = engine.run(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - t
    gc.enable()
    assert [len(o.output_token_ids) for o in outs] == new
    return seconds, [o.output_token_ids for o in outs], engine


def hf_model(model):
    """``model`` exported with ``save_hf_checkpoint`` and loaded by transformers with paged
    attention over SDPA (fp32, eval)."""
    from transformers import AutoModelForCausalLM
    from tokenflow.interop import save_hf_checkpoint
    folder = tempfile.mkdtemp(prefix="bench_serving_hf_")
    save_hf_checkpoint(model, folder)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                   # "paged|sdpa" is deprecated
        return AutoModelForCausalLM.from_pretrained(folder, attn_implementation="paged|sdpa",
                                                    dtype=torch.float32).eval()


def serve_hf(hf, prompts, new):
    """The same requests through transformers' continuous-batching manager. Returns
    ``(seconds, output ids)``; setup and warm-up are not timed."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig
    cb = ContinuousBatchingConfig(page_size=SETTINGS["block_size"],
                                  num_blocks=SETTINGS["num_blocks"],
                                  max_batch_tokens=SETTINGS["max_num_batched_tokens"],
                                  max_requests_per_batch=SETTINGS["max_num_seqs"])
    gen = GenerationConfig(do_sample=False, eos_token_id=-1, pad_token_id=0,
                           max_new_tokens=max(new))
    with hf.continuous_batching_context_manager(generation_config=gen, block=True,
                                                timeout=60, continuous_batching_config=cb) as m:
        gc.disable()
        t = time.perf_counter()
        ids = [m.add_request(p, max_new_tokens=n) for p, n in zip(prompts, new)]
        done = {}
        while len(done) < len(ids):
            r = m.get_result(timeout=1)
            if r is not None and r.is_finished():
                done[r.request_id] = r.generated_tokens
        seconds = time.perf_counter() - t
        gc.enable()
    return seconds, [list(done[i]) for i in ids]


def paired(run_a, run_b, pairs: int) -> tuple[list, float, float, list, list]:
    """Alternate ``run_a()`` and ``run_b()`` (each returns ``(seconds, outputs)``).

    Returns ``(b/a of each pair, best a seconds, best b seconds, a's outputs, b's outputs)``.
    """
    ta, tb, ratios = [], [], []
    for _ in range(pairs):
        (a, out_a), (b, out_b) = run_a(), run_b()
        ta.append(a)
        tb.append(b)
        ratios.append(b / a)
    return ratios, min(ta), min(tb), out_a, out_b


def row(what: str, value: float, target: str, met: bool, text: str,
        ratios: list | None = None, **extra) -> dict:
    """One measure of the closing table (and of ``--json``): ``value`` (a ratio), ``text``
    (how the table prints it), ``target`` (as the table prints it) and whether it was
    ``met``; ``ratios``: the ratio of every pair, when the measure is paired."""
    r = dict(what=what, value=value, text=text, target=target, met=bool(met), **extra)
    if ratios is not None:
        r.update(ratios=ratios, ratio_min=min(ratios), ratio_max=max(ratios))
    return r


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=30, help="timed decode steps per context")
    p.add_argument("--pairs", type=int, default=3, help="alternating pairs per comparison")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-hf", action="store_true", help="skip the transformers comparison")
    p.add_argument("--quick", action="store_true",
                   help="only the packing and transformers comparisons (4, 5), mixed workload")
    p.add_argument("--json", type=Path,
                   help="also store the results under the key 'serving' of this JSON file")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    started, load_before = dt.datetime.now(dt.timezone.utc), os.getloadavg()
    print(f"{machine(a.threads)}; load average (1 min) {load_before[0]:.2f}")
    model = with_context_length(load_pretrained()[0], MAX_POS)
    rows = []

    work = {"mixed": workload(), "long": long_workload()}
    serve(model, work["mixed"][0][:2], work["mixed"][1][:2])                  # warm-up
    if a.quick:
        del work["long"]
    else:
        _phases_and_batching(model, work["mixed"], a, rows)
    _packing_and_peer(model, work, a, rows)
    load_after = os.getloadavg()
    print(f"\n| measure ({a.threads} thread{'s' * (a.threads > 1)}) | this run | target |")
    print("|---|---:|---|")
    for r in rows:
        print(f"| {r['what']} | {r['text']} | {r['target']}{' (met)' * r['met']} |")
    print(f"load average (1 min) {load_before[0]:.2f} before, {load_after[0]:.2f} after")
    if a.json:
        data = json.loads(a.json.read_text(encoding="utf-8")) if a.json.exists() else {}
        data["serving"] = dict(
            machine=machine(a.threads),
            date=started.strftime("%Y-%m-%d"),
            started=started.strftime("%H:%M UTC"),
            threads=a.threads,
            pairs=a.pairs,
            quick=a.quick,
            load_before=load_before[0],
            load_after=load_after[0],
            rows=rows,
        )
        a.json.write_text(json.dumps(data, indent=1), encoding="utf-8")


def _phases_and_batching(model, mixed, a, rows: list) -> None:
    """Sections 1-3 of the module docstring."""
    t64, t1024 = time_decode(model, [64, 1024], repeats=a.repeats)
    print(f"1. decode step with cache: context 64 {t64 * 1e3:.3f} ms, context 1024 "
          f"{t1024 * 1e3:.3f} ms; ratio 1024/64 = {t1024 / t64:.2f} (target <= 2.0)")
    rows.append(row("decode step 1024 / 64 context", t1024 / t64, "<= 2.0",
                    t1024 / t64 <= 2.0, f"{t1024 / t64:.2f}"))

    (cached,), (full,) = time_decode(model, [512], repeats=a.repeats), \
        time_recompute(model, [512], repeats=10)
    print(f"2. context 512: cached decode {cached * 1e3:.3f} ms, full recompute "
          f"{full * 1e3:.3f} ms; ratio = {full / cached:.1f}x (target >= 5x)")
    rows.append(row("cached vs recompute, context 512", full / cached, ">= 5x",
                    full / cached >= 5, f"{full / cached:.1f}x"))

    prompts, new = mixed
    ratios, t_cont, t_static, _, _ = paired(lambda: serve(model, prompts, new)[:2],
                                            lambda: serve(model, prompts, new,
                                                          static_batching=True)[:2], a.pairs)
    r = statistics.median(ratios)
    print(f"3. mixed workload, {sum(new)} new tokens, continuous {sum(new) / t_cont:.0f} "
          f"tok/s, static {sum(new) / t_static:.0f} tok/s; ratio = {r:.2f}x (target >= 1.5x)")
    rows.append(row("continuous vs static batching (mixed)", r, ">= 1.5x", r >= 1.5,
                    f"{r:.2f}x", ratios))


def _packing_and_peer(model, work: dict, a, rows: list) -> None:
    """Sections 4 and 5 of the module docstring, on each workload of ``work``."""
    packing = {}
    for name, (prompts, new) in work.items():
        _, _, packed = serve(model, prompts, new)
        _, _, padded = serve(model, prompts, new, padded=True)
        real = sum(s.num_tokens for s in packed.steps)
        pos = [sum(s.num_positions for s in e.steps) / real for e in (packed, padded)]
        decode_only = sum(not s.prefill for s in packed.steps)
        ratios, t_pk, t_pd, out_pk, out_pd = paired(
            lambda: serve(model, prompts, new)[:2],
            lambda: serve(model, prompts, new, padded=True)[:2], a.pairs)
        assert out_pk == out_pd, "packed and padded steps gave different greedy tokens"
        r = packing[name] = statistics.median(ratios)
        print(f"4. {name}: {len(prompts)} requests, {real} scheduled tokens, "
              f"{len(packed.steps)} steps ({decode_only} decode-only); positions computed / "
              f"real tokens: packed {pos[0]:.2f}, padded {pos[1]:.2f}; packed "
              f"{sum(new) / t_pk:.0f} tok/s, padded {sum(new) / t_pd:.0f} tok/s; ratio "
              f"= {r:.2f}x; same greedy tokens")
        rows.append(row(f"positions computed / real tokens ({name})", pos[0], "1.00",
                        round(pos[0], 2) == 1.0, f"{pos[0]:.2f} (padded {pos[1]:.2f})",
                        padded=pos[1]))
        met = r >= 1.5 if name == "mixed" else r > packing.get("mixed", float("inf"))
        rows.append(row(f"packed vs padded engine ({name})", r,
                        ">= 1.5x" if name == "mixed" else "> mixed", met, f"{r:.2f}x", ratios,
                        steps=len(packed.steps), decode_only_steps=decode_only,
                        tok_s=sum(new) / t_pk, padded_tok_s=sum(new) / t_pd))

    if not a.no_hf:
        logging.getLogger("ContinuousBatchingLogger").setLevel(logging.ERROR)
        hf = hf_model(model)
        for name, (prompts, new) in work.items():
            serve_hf(hf, prompts[:2], new[:2])                                 # warm-up
            ratios, t_ours, t_hf, out_ours, out_hf = paired(
                lambda: serve(model, prompts, new)[:2], lambda: serve_hf(hf, prompts, new),
                a.pairs)
            r, same = statistics.median(ratios), out_ours == out_hf
            print(f"5. {name}: ours {sum(new) / t_ours:.0f} tok/s, transformers "
                  f"generate_batch {sum(new) / t_hf:.0f} tok/s; ratio = {r:.2f}x (target "
                  f">= 1.5x); greedy outputs {'identical' if same else 'DIFFERENT'}")
            rows.append(row(f"ours vs transformers generate_batch ({name})", r, ">= 1.5x",
                            r >= 1.5 and same,
                            f"{r:.2f}x" + ("" if same else " (outputs differ)"), ratios,
                            same_outputs=same, tok_s=sum(new) / t_ours,
                            hf_tok_s=sum(new) / t_hf))


if __name__ == "__main__":
    main()
