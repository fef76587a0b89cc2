"""Ours vs vLLM's CPU build on the same requests, alternating in one run.

    make vllm                                              # once
    .venv/bin/python benchmarks/bench_vllm.py              # the book's model, 1 and 2 threads
    .venv/bin/python benchmarks/bench_vllm.py --pairs 5 --json benchmarks/latest.json
    .venv/bin/python benchmarks/bench_vllm.py --model dense-92m --threads 1

For each thread count vLLM is started once (its startup timed apart), both engines run the
workload once to warm up, then ``--pairs`` times each, alternating which goes first. Both get
:func:`tokenflow.serving.peer.peer_workload` (48 requests, prompts 4-100 tokens with shared
openings, 8-24 new tokens, greedy, EOS ignored) with the same engine settings
(:data:`~tokenflow.serving.peer.PEER_ENGINE_ARGS`), fp32. Measured per run: throughput (new
tokens / wall seconds), mean TTFT and TPOT over the requests, and CPU seconds of each engine's
whole process tree (vLLM runs a front end, an engine core and a worker). vLLM's processes
busy-poll for a while after each batch: before our run starts, the benchmark waits until they
use under 5% of a core, so that they do not take our cores. Every run's tokens are compared
with the first vLLM run's. ``--json`` stores the run under ``"vllm"`` (other keys kept), which
``scripts/bench_table.py`` turns into book/benchmarks.md's vLLM table.

``--model dense-92m``: a random Llama-shaped model (hidden 1,024, 16 heads of 64, 4 KV heads,
intermediate 2,816, 8 layers, vocab 888; 92M parameters, seeded), built here, nothing stored.

Threads: two OpenMP threads on two cores are fast while nothing else runs and collapse when
another process keeps a core busy (libgomp's threads spin at the end of each parallel region;
``OMP_WAIT_POLICY=PASSIVE`` sleeps at once and trades the opposite way): see
benchmarks/README.md. Run this on a quiet machine; the JSON records the load average before and
after, and ``--omp-wait-policy`` sets our process's policy.
"""
from __future__ import annotations

import os
import sys

# `--omp-wait-policy PASSIVE|ACTIVE` sets our process's OpenMP wait policy; it is read once,
# when torch loads its OpenMP runtime, so it is set before `import torch`. vLLM's processes are
# started without it (their defaults). Without the flag, libgomp's default (threads spin a
# while at the end of each parallel region, then sleep).
if "--omp-wait-policy" in sys.argv:
    os.environ["OMP_WAIT_POLICY"] = sys.argv[sys.argv.index("--omp-wait-policy") + 1]

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import psutil  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine  # noqa: E402

from tokenflow import TokenFlowModel, load_pretrained, preset  # noqa: E402
from tokenflow.interop import save_hf_checkpoint  # noqa: E402
from tokenflow.interop.vllm_peer import VLLMProcess  # noqa: E402
from tokenflow.serving.peer import (PEER_ENGINE_ARGS, compare_runs, peer_workload,  # noqa: E402
                                    run_ours)

TARGETS = {"tiny": {1: 1.5, 2: 1.0}, "dense-92m": {1: 0.8, 2: 0.8}}
"""Our throughput / vLLM's wanted, per model and thread count."""


def build_model(name: str):
    """``(model, tokenizer)``: the shipped model, or the random 92M dense model."""
    model, tok = load_pretrained()
    if name == "tiny":
        return model, tok
    cfg = preset("tiny-dense", hidden_size=1024, num_attention_heads=16, num_key_value_heads=4,
                 head_dim=64, intermediate_size=2816, num_hidden_layers=8, vocab_size=888,
                 pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                 eos_token_id=tok.eos_token_id)
    cfg = dataclasses.replace(cfg, name="dense-92m")
    torch.manual_seed(0)
    m = TokenFlowModel(cfg).eval()
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.02)
    return m, tok


def tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` and all its descendants so far."""
    try:
        root = psutil.Process(pid)
        procs = [root] + root.children(recursive=True)
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def settle(pid: int, below: float = 0.05, window: float = 0.25, limit: float = 10.0) -> float:
    """Wait until the process tree of ``pid`` uses under ``below`` of a core over a
    ``window``-second window (at most ``limit`` seconds). Returns the seconds waited."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < limit:
        a = tree_cpu(pid)
        time.sleep(window)
        if tree_cpu(pid) - a < below * window:
            break
    return time.perf_counter() - t0


def summarize(run: dict, cpu_s: float) -> dict:
    """Throughput, mean TTFT / TPOT (seconds) and CPU seconds of one engine run."""
    outs = run["outputs"]
    new = sum(len(o["token_ids"]) for o in outs)
    mean = lambda k: statistics.fmean(o[k] for o in outs if o[k] is not None)  # noqa: E731
    return {"tok_s": new / run["wall_s"], "wall_s": run["wall_s"], "ttft_s": mean("ttft_s"),
            "tpot_s": mean("tpot_s"), "cpu_s": cpu_s}


def bench_threads(model, folder: Path, prompts, news, threads: int, pairs: int,
                  targets: dict) -> dict:
    """One thread count: start vLLM, warm both, ``pairs`` alternating pairs."""
    torch.set_num_threads(threads)
    settings = dict(PEER_ENGINE_ARGS, max_model_len=model.config.max_position_embeddings,
                    threads=threads)
    me = psutil.Process()
    ours_policy = os.environ.pop("OMP_WAIT_POLICY", None)     # vLLM starts with its defaults
    try:
        peer = VLLMProcess(folder, settings)
    finally:
        if ours_policy is not None:
            os.environ["OMP_WAIT_POLICY"] = ours_policy
    with peer:
        def vllm_run():
            c = tree_cpu(peer.proc.pid)
            r = peer.run(prompts, news)
            cpu = tree_cpu(peer.proc.pid) - c
            settle(peer.proc.pid)
            return r, cpu

        def ours_run():
            c = sum(me.cpu_times()[:2])
            r = run_ours(model, prompts, news, **PEER_ENGINE_ARGS)
            return r, sum(me.cpu_times()[:2]) - c

        reference, _ = vllm_run()                                  # warm-up, both
        ours_run()
        rows, same = {"ours": [], "vllm": []}, True
        for i in range(pairs):
            order = (("vllm", vllm_run), ("ours", ours_run))
            for name, fn in (order if i % 2 == 0 else order[::-1]):
                r, cpu = fn()
                c = compare_runs(r["outputs"], reference["outputs"])
                same &= c["identical_requests"] == c["num_requests"]
                rows[name].append(summarize(r, cpu))
        startup = peer.startup_s
    ratios = [o["tok_s"] / v["tok_s"] for o, v in zip(rows["ours"], rows["vllm"])]
    med = lambda name, k: statistics.median(r[k] for r in rows[name])  # noqa: E731
    target = targets.get(threads)
    return {"threads": threads, "vllm_startup_s": startup, "identical": same,
            "ratio": statistics.median(ratios), "ratio_min": min(ratios),
            "ratio_max": max(ratios), "ratios": ratios, "target": target,
            "met": bool(same and target is not None and statistics.median(ratios) >= target),
            **{f"{name}_{k}": med(name, k) for name in rows
               for k in ("tok_s", "ttft_s", "tpot_s", "cpu_s")}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--model", choices=["tiny", "dense-92m"], default="tiny")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--omp-wait-policy", choices=["PASSIVE", "ACTIVE"], default=None,
                   help="OpenMP wait policy of our process (default: libgomp's own)")
    a = p.parse_args()
    model, tok = build_model(a.model)
    prompts, news = peer_workload(tok)
    load_before, started = os.getloadavg()[0], time.strftime("%H:%M UTC", time.gmtime())
    runs = []
    with tempfile.TemporaryDirectory() as d:
        folder = save_hf_checkpoint(model, Path(d) / a.model, tokenizer=tok)
        for t in a.threads:
            r = bench_threads(model, folder, prompts, news, t, a.pairs, TARGETS[a.model])
            runs.append(r)
            print(f"{t} thread(s): ours {r['ours_tok_s']:.0f} tok/s, vLLM {r['vllm_tok_s']:.0f} "
                  f"tok/s, ours/vLLM {r['ratio']:.2f}x ({r['ratio_min']:.2f}-{r['ratio_max']:.2f}"
                  f"), target >= {r['target']}x: {'met' if r['met'] else 'missed'}; tokens "
                  f"identical: {r['identical']}; TTFT {r['ours_ttft_s'] * 1e3:.0f} / "
                  f"{r['vllm_ttft_s'] * 1e3:.0f} ms, TPOT {r['ours_tpot_s'] * 1e3:.1f} / "
                  f"{r['vllm_tpot_s'] * 1e3:.1f} ms, CPU s {r['ours_cpu_s']:.2f} / "
                  f"{r['vllm_cpu_s']:.2f}, vLLM startup {r['vllm_startup_s']:.0f} s", flush=True)
    cpu = machine(max(a.threads)).split(", torch.set_num_threads")[0]
    result = {"model": a.model, "machine": cpu,
              "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default"),
              "date": time.strftime("%Y-%m-%d"), "started": started, "pairs": a.pairs,
              "load_before": load_before, "load_after": os.getloadavg()[0],
              "requests": len(prompts), "new_tokens": sum(news), "runs": runs}
    print(f"load average {result['load_before']:.2f} -> {result['load_after']:.2f}")
    if a.json:
        data = json.loads(a.json.read_text(encoding="utf-8")) if a.json.exists() else {}
        data.setdefault("vllm", {})[a.model] = result
        a.json.write_text(json.dumps(data, indent=1), encoding="utf-8")
        print(f"wrote {a.json} ['vllm']['{a.model}']")


if __name__ == "__main__":
    main()
