"""Ours vs Hugging Face transformers on the same weights and inputs, side by side in one run.

    .venv/bin/python benchmarks/bench_vs_hf.py            # full run (~4-5 min on 2 cores)
    .venv/bin/python benchmarks/bench_vs_hf.py --quick    # tiny preset only, fewer repeats
    .venv/bin/python benchmarks/bench_vs_hf.py --presets small-moe --memory '' --pairs 9

Measures, for each preset (``tiny``: the book's MoE model, mapped onto Qwen2MoeForCausalLM;
``tiny-dense``: the same without MoE, Llama; ``tiny-mla``: the tiny MoE with DeepSeek-V3's
multi-head latent attention and sigmoid group routing, DeepseekV3ForCausalLM (``_common.EXTRA``);
``small-moe``: hidden 512, 8 layers, Mixtral; ``small-dense``: the same, dense, Llama; random
weights, ``max_position_embeddings`` raised to 2048 so that 1024-token prompts fit):

* decode: new tokens/s of greedy ``generate`` (ours: ``tokenflow.inference.generate``; HF:
  ``model.generate(do_sample=False)``, default DynamicCache, SDPA attention, default experts
  backend), batch 1 and 8, 16-token prompt, 128 new tokens (EOS disabled on both sides);
  ``B * 128 / wall seconds`` including the short prefill. Target: ours >= 1.5x HF at batch 1,
  >= 1.2x at batch 8.
* prefill: prompt tokens/s of one forward over a 128- and a 1024-token prompt (batch 1) that
  fills the KV cache and returns the last position's logits (ours: ``tokenflow.prefill``;
  HF: ``model(ids, use_cache=True, logits_to_keep=1)``). Target: ours >= 1.0x HF.
* floor: seconds per batch-1 decode step spent in the matrix products alone (each weight
  matrix a token touches, nothing else; the faster of the separate and the packed q/k/v and
  gate/up layouts): no implementation can go below it, so
  ``HF step / floor`` is the best ratio reachable with zero overhead. Reported: each side's
  batch-1 step (best run's seconds / 128) as a multiple of the floor. Target for
  ``small-moe`` and ``small-dense``: ours <= 1.5x the floor.
* memory (presets in ``--memory``, default tiny and small-moe): peak RSS of one batch-8,
  128-token generate, each side in its own fresh process (``benchmarks/_mem_run.py``; method
  in its docstring).

Timing: ``torch.set_num_threads(2)`` for both (``--threads``); one warm-up call each, then
the two sides alternate (ours, HF, ours, HF...), garbage collector off during each call.
Throughputs are each side's best run; the ratio is the median over the pairs of HF time / our
time (a pair runs back to back under the same background load), printed with its spread: the
range and the interquartile range of the pair ratios. The closing table repeats, per preset,
the median ratios and the batch-1 step as a multiple of the floor.
Equal outputs are asserted before timing (greedy ids identical, prefill logits within 1e-4).
"""
from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import THREADS, build_pair, machine, median, timeit  # noqa: E402
from statistics import quantiles  # noqa: E402

from tokenflow import KVCache, generate, prefill  # noqa: E402

PROMPT, NEW = 16, 128
# glibc: allocations >= 64 KiB always come from (and go back to) mmap, so RSS follows the live
# tensors instead of the allocator's history (the default threshold adapts to freed chunks).
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}


def _alternate(fa, fb, repeats: int) -> dict:
    """Time ``fa`` and ``fb`` alternately, ``repeats`` pairs (the caller has run each once
    already: warm-up), with the garbage collector off during each call."""
    ta, tb = [], []
    for _ in range(repeats):
        for f, out in ((fa, ta), (fb, tb)):
            gc.collect()
            gc.disable()
            try:
                out += timeit(f, 1)
            finally:
                gc.enable()
    return {"ours": ta, "hf": tb}


def _row(what: str, n: int, t: dict, target: float, unit: str) -> dict:
    """Throughputs from each side's best time; the ratio is the median over the pairs of
    ``HF time / our time`` (the two runs of a pair ran back to back, under the same load from
    other processes, so their ratio is steadier than a ratio of two independent medians)."""
    pair = sorted(h / o for o, h in zip(t["ours"], t["hf"]))
    q1, _, q3 = quantiles(pair, n=4) if len(pair) > 1 else (pair[0],) * 3
    return {"what": what, "ours": n / min(t["ours"]), "hf": n / min(t["hf"]),
            "ratio": median(pair), "ratio_min": pair[0], "ratio_max": pair[-1],
            "ratio_q1": q1, "ratio_q3": q3,
            "target": target, "unit": unit, "repeats": len(pair),
            "ours_s": t["ours"], "hf_s": t["hf"]}


def bench_decode(ours, hf, batch: int, repeats: int, target: float) -> dict:
    g = torch.Generator().manual_seed(batch)
    ids = torch.randint(3, ours.config.vocab_size, (batch, PROMPT), generator=g)

    def run_ours():
        return generate(ours, ids, max_new_tokens=NEW, stop_at_eos=False)

    def run_hf():
        with torch.inference_mode():
            return hf.generate(ids, max_new_tokens=NEW, do_sample=False)

    a, b = run_ours(), run_hf()
    assert torch.equal(a, b), "greedy ids differ between ours and HF"
    return _row(f"decode b{batch}", batch * NEW, _alternate(run_ours, run_hf, repeats),
                target, "new tok/s")


def bench_prefill(ours, hf, length: int, repeats: int) -> dict:
    g = torch.Generator().manual_seed(length)
    ids = torch.randint(3, ours.config.vocab_size, (1, length), generator=g)

    def run_ours():
        return prefill(ours, ids, KVCache(ours.config, 1, length + 1))

    def run_hf():
        with torch.inference_mode():
            return hf(ids, use_cache=True, logits_to_keep=1).logits[:, -1]

    d = (run_ours() - run_hf()).abs().max().item()
    assert d <= 1e-4, f"prefill logits differ by {d}"
    return _row(f"prefill {length}", length, _alternate(run_ours, run_hf, repeats), 1.0,
                "prompt tok/s")


def bench_floor(ours, repeats: int = 10) -> float:
    """Seconds per batch-1 decode step spent in the matrix products alone: one ``F.linear``
    per weight matrix a token touches (attention q/k/v/o, or MLA's q / kv_a / kv_b / o; the dense
    FFN, or the router, K routed experts and the shared expert of an MoE layer; the LM head), in a
    tight loop with nothing else. Both implementations must read these weights for every new token,
    so no implementation can beat this floor; ``HF step / floor`` bounds the possible speed-up.
    Timed in two layouts, the separate matrices and the packed ones (q/k/v as one matrix,
    each FFN's gate/up as one, as ``tokenflow.model.fused`` runs them): the floor is the faster."""
    import torch.nn.functional as F
    separate, packed = [], []
    for layer in ours.layers:
        a = layer.self_attn
        if ours.config.is_mla:          # q (LoRA) / kv_a / kv_b / o: every matrix, once
            mats = [p for p in a.parameters() if p.dim() == 2]
            separate += mats
            packed += mats
        else:
            separate += [a.q_proj.weight, a.k_proj.weight, a.v_proj.weight, a.o_proj.weight]
            with torch.no_grad():                    # the model's own packed matrix
                packed += [a.qkv_weight(), a.o_proj.weight]
        m = layer.mlp
        ffns = ([m] if not layer.is_moe else
                list(m.experts)[:m.top_k] + ([m.shared_experts] if m.shared_experts else []))
        if layer.is_moe:
            separate.append(m.gate.weight)
            packed.append(m.gate.weight)
        for f in ffns:
            separate += [f.gate_proj.weight, f.up_proj.weight, f.down_proj.weight]
            with torch.no_grad():
                packed += [f.gate_up_weight(), f.down_proj.weight]
    separate.append(ours.lm_head.weight)
    packed.append(ours.lm_head.weight)
    xs = {w.shape[1]: torch.randn(1, w.shape[1]) for w in separate}

    def step(ws):
        for w in ws:
            F.linear(xs[w.shape[1]], w)

    with torch.inference_mode():
        best = []
        for ws in (separate, packed):
            step(ws)
            best.append(min(timeit(lambda: step(ws), repeats)))
        return min(best)


def bench_memory(name: str, batch: int = 8) -> dict:
    res = {}
    for impl in ("ours", "hf"):
        out = subprocess.run([sys.executable, str(HERE / "_mem_run.py"), impl, name,
                              str(batch), str(NEW)], capture_output=True, text=True,
                             check=True, timeout=600, env={**os.environ, **MALLOC_ENV})
        res[impl] = json.loads(out.stdout.strip().splitlines()[-1])
    return {"what": f"memory b{batch} generate", "ours_peak": res["ours"]["peak_mib"],
            "hf_peak": res["hf"]["peak_mib"], "ours_run": res["ours"]["run_mib"],
            "hf_run": res["hf"]["run_mib"]}


def bench_preset(name: str, pairs: int | None, quick: bool, memory: bool) -> tuple[list, list]:
    """Every measure of one preset: ``(rows, memory rows)``; prints as it goes."""
    ours, hf = build_pair(name)
    big = ours.config.hidden_size >= 256
    rep = pairs or (3 if quick else (4 if big else 7))
    print(f"\n## {name}: HF {type(hf).__name__}, attention={hf.config._attn_implementation}"
          f", experts={getattr(hf.config, '_experts_implementation', None) or '-'}; "
          f"{rep} alternating pairs", flush=True)
    rows = []
    for r in (bench_decode(ours, hf, 1, rep, 1.5), bench_decode(ours, hf, 8, rep, 1.2),
              bench_prefill(ours, hf, 128, 3 * rep), bench_prefill(ours, hf, 1024, rep)):
        r["preset"] = name
        rows.append(r)
        ok = "ok" if r["ratio"] >= r["target"] else "MISSED"
        print(f"{r['what']:<13} ours {r['ours']:9.1f}  HF {r['hf']:9.1f} {r['unit']:<12}"
              f" ratio {r['ratio']:5.2f}x (pairs {r['ratio_min']:.2f}-{r['ratio_max']:.2f}, "
              f"middle half {r['ratio_q1']:.2f}-{r['ratio_q3']:.2f}; target >= {r['target']}x: "
              f"{ok})", flush=True)
    floor = bench_floor(ours)
    b1 = rows[0]
    b1.update(floor_ms=floor * 1e3, ours_ms=1e3 / b1["ours"], hf_ms=1e3 / b1["hf"])
    b1.update(ours_floors=b1["ours_ms"] / b1["floor_ms"], hf_floors=b1["hf_ms"] / b1["floor_ms"])
    print(f"decode b1 step: ours {b1['ours_ms']:.2f} ms = {b1['ours_floors']:.2f}x the floor, "
          f"HF {b1['hf_ms']:.2f} ms = {b1['hf_floors']:.2f}x; matmuls alone (floor) "
          f"{b1['floor_ms']:.2f} ms", flush=True)
    mems = []
    if memory:
        m = bench_memory(name)
        m["preset"] = name
        mems.append(m)
        print(f"{m['what']}: peak RSS ours {m['ours_peak']:.0f} MiB, HF {m['hf_peak']:.0f} "
              f"MiB; growth during the run ours +{m['ours_run']:.1f} MiB, "
              f"HF +{m['hf_run']:.1f} MiB", flush=True)
    return rows, mems


def print_tables(rows: list, mems: list) -> None:
    """The closing tables: every row, then one line per preset (median ratios, spreads,
    batch-1 step in floors)."""
    print("\n| preset | measure | ours | HF | ours/HF (median of pairs) | spread of pairs "
          "(min-max; middle half) | target |")
    print("|---|---|---:|---:|---:|---|---|")
    for r in rows:
        print(f"| {r['preset']} | {r['what']} ({r['unit']}) | {r['ours']:.0f} | {r['hf']:.0f} "
              f"| **{r['ratio']:.2f}x** | {r['ratio_min']:.2f}-{r['ratio_max']:.2f}; "
              f"{r['ratio_q1']:.2f}-{r['ratio_q3']:.2f} | >= {r['target']}x |")
    for m in mems:
        print(f"| {m['preset']} | peak RSS, b8 generate (MiB) | {m['ours_peak']:.0f} | "
              f"{m['hf_peak']:.0f} | {m['ours_peak'] / m['hf_peak']:.2f}x | | lower is better |")
        print(f"| {m['preset']} | RSS growth during that run (MiB) | {m['ours_run']:.1f} | "
              f"{m['hf_run']:.1f} | | | lower is better |")
    print("\n| preset | decode b1 | decode b8 | prefill 128 | prefill 1024 | b1 step ours / floor "
          "| HF / floor | floor ms |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name in dict.fromkeys(r["preset"] for r in rows):
        rs = [r for r in rows if r["preset"] == name]
        cells = " | ".join(f"{r['ratio']:.2f}x ({r['ratio_min']:.2f}-{r['ratio_max']:.2f})"
                           for r in rs)
        b1 = rs[0]
        print(f"| {name} | {cells} | {b1['ours_floors']:.2f}x | {b1['hf_floors']:.2f}x "
              f"| {b1['floor_ms']:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny preset only, 3 repeats")
    ap.add_argument("--presets", default="tiny,tiny-dense,tiny-mla,small-moe,small-dense")
    ap.add_argument("--memory", default="tiny,small-moe",
                    help="presets whose peak RSS is measured ('' for none)")
    ap.add_argument("--pairs", type=int, help="alternating pairs per measure (default 7 for "
                    "the tiny presets, 4 for the small ones; prefill 128 runs 3x as many)")
    ap.add_argument("--threads", type=int, default=THREADS, help="torch threads (default 2)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    presets = ["tiny"] if args.quick else args.presets.split(",")
    print(f"# ours vs HF transformers, {dt.date.today().isoformat()}")
    print(f"# {machine(args.threads)}", flush=True)
    rows, mems = [], []
    for name in presets:
        r, m = bench_preset(name, args.pairs, args.quick, name in args.memory.split(","))
        rows += r
        mems += m
    print_tables(rows, mems)
    if args.json:                      # other keys of the file (bench_serving's) are kept
        data = json.loads(args.json.read_text()) if args.json.exists() else {}
        data.update({"machine": machine(args.threads), "date": dt.date.today().isoformat(),
                     "rows": rows, "memory": mems})
        args.json.write_text(json.dumps(data, indent=1))


if __name__ == "__main__":
    main()
