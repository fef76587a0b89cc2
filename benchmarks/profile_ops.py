"""Where a serving step's time goes, per op class, against each class's floor.

    .venv/bin/python benchmarks/profile_ops.py                      # 92M dense + the book's model
    .venv/bin/python benchmarks/profile_ops.py --models dense-92m --threads 1 2
    .venv/bin/python benchmarks/profile_ops.py --json benchmarks/latest.json   # stores ["ops"]

For each model (``dense-92m``, the random 92M Llama-shaped model of ``bench_vllm.py``, and
``tiny``, the book's model) the engine runs the 48 peer requests
(:func:`tokenflow.serving.peer.peer_workload`, :data:`~tokenflow.serving.peer.PEER_ENGINE_ARGS`)
twice: once to find a **prefill-heavy step** (the first step, which fills the 256-token budget
with prompt chunks) and a **decode-only step** (the first one with the most decode rows and
no prompt chunk), then ``--repeats`` times under ``torch.profiler`` at those two steps (the
engine is deterministic, so the same steps come back). Every op class is a
``record_function`` label put around the code that does it (the wrappers are installed here,
the library is unchanged): ``tokenflow.model.linear.linear`` and ``F.linear`` (every
projection and the LM head), the paged cache's
write + block gather, the per-sequence attention split (``attend_each``) and SDPA inside it,
RMSNorm, RoPE (tables and rotation), the MoE block's own ops (router, dispatch/combine),
sampling, building the packed step, the scheduler. A label's time is the CPU time of the
aten ops under it (its kernels); what is left of the step's wall time is Python (the
interpreter, module calls, op dispatch).

**Floors** (the time the op would take at this machine's limits): FLOPs / the measured fp32
GEMM peak (``torch.mm`` of ``[256, 1024] x [1024, 2816]``, the best of several runs at the
thread count), and bytes / the measured memory bandwidth (a 256 MB ``copy_``, read + write
counted). A class's floor is the larger of its two (roofline). FLOPs and bytes are counted
from the step's shapes: linear ``2 T x params`` and the weights' bytes; SDPA ``4 nh D`` per
(query, key) pair and the K/V it reads; the gather reads and writes each gathered slot and
writes each new entry; norms, RoPE and elementwise ops their tensors' bytes. Results are
medians over the repeats. Never part of the test run.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_vllm import build_model  # noqa: E402

import tokenflow.model.attention as attention_mod  # noqa: E402
import tokenflow.model.ffn as ffn_mod  # noqa: E402
import tokenflow.model.transformer as transformer_mod  # noqa: E402
import tokenflow.serving.paged_runner as paged_runner_mod  # noqa: E402
import tokenflow.serving.runner as runner_mod  # noqa: E402
from tokenflow.model.kv_cache import PackedCacheStep  # noqa: E402
from tokenflow.model.moe import MoE  # noqa: E402
from tokenflow.model.norm import RMSNorm  # noqa: E402
from tokenflow.serving import LLMEngine, SamplingParams  # noqa: E402
from tokenflow.serving.paged_kv_cache import PagedKVCache  # noqa: E402
from tokenflow.serving.peer import PEER_ENGINE_ARGS, peer_workload  # noqa: E402
from tokenflow.serving.scheduler import Scheduler  # noqa: E402

CLASSES = ("linear (GEMM)", "attention: SDPA", "attention: split + cat",
           "KV write + block gather", "RMSNorm", "RoPE", "MoE routing + dispatch",
           "elementwise (SiLU*up, residual, embedding)", "sampling", "packed step build",
           "scheduler + engine", "Python (interpreter, dispatch)")
"""The op classes of the table, in order."""


# ------------------------------------------------------------------ the machine's limits
def measure_peak(threads: int) -> dict:
    """``{"gflops": fp32 GEMM peak, "gbs": memory bandwidth GB/s}`` at ``threads``."""
    torch.set_num_threads(threads)
    a, b = torch.randn(256, 1024), torch.randn(1024, 2816)
    best = float("inf")
    for _ in range(7):
        t = time.perf_counter()
        for _ in range(10):
            torch.mm(a, b)
        best = min(best, (time.perf_counter() - t) / 10)
    x, y = torch.empty(64 * 2**20), torch.empty(64 * 2**20)       # 256 MB each
    x.fill_(1.0)
    y.copy_(x)
    bw = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        y.copy_(x)
        bw = min(bw, time.perf_counter() - t)
    return {"gflops": 2 * 256 * 1024 * 2816 / best / 1e9, "gbs": 2 * x.nbytes / bw / 1e9}


# ------------------------------------------------------------------ labels around the code
def _label(name: str, fn):
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with record_function("tf::" + name):
            return fn(*args, **kwargs)
    return wrapped


def install_labels() -> None:
    """Wrap the code of each op class in a ``record_function`` label (this process only)."""
    F.linear = _label("linear (GEMM)", F.linear)                 # nn.Linear calls F.linear
    for mod in (attention_mod, ffn_mod):                          # tokenflow.model.linear
        mod.linear = _label("linear (GEMM)", mod.linear)
    attention_mod._sdpa = _label("attention: SDPA", attention_mod._sdpa)
    attention_mod.apply_rope = _label("RoPE", attention_mod.apply_rope)
    rot = transformer_mod.RotaryEmbedding
    rot.forward = _label("RoPE", rot.forward)
    PackedCacheStep.attend_each = _label("attention: split + cat", PackedCacheStep.attend_each)
    PagedKVCache._update_packed = _label("KV write + block gather", PagedKVCache._update_packed)
    RMSNorm.forward = _label("RMSNorm", RMSNorm.forward)
    MoE.forward = _label("MoE routing + dispatch", MoE.forward)
    runner_mod.sample_requests = _label("sampling", runner_mod.sample_requests)
    paged_runner_mod.prepare_packed = _label("packed step build",
                                             paged_runner_mod.prepare_packed)
    Scheduler.schedule = _label("scheduler + engine", Scheduler.schedule)
    Scheduler.update = _label("scheduler + engine", Scheduler.update)


HOST = ("sampling", "packed step build", "scheduler + engine")
"""Labels around host code (Python bookkeeping): their whole wall time is theirs."""


def split_step(events, wall_us: float) -> dict:
    """Microseconds per op class of one profiled step: aten self time under each label,
    the forward's unlabelled ops as elementwise, the rest of the wall time as Python."""
    out = dict.fromkeys(CLASSES, 0.0)
    for e in events:
        labels, p = [], e.cpu_parent
        while p is not None:
            if p.name.startswith("tf::"):
                labels.append(p.name[4:])
            p = p.cpu_parent
        if any(x in HOST for x in labels):
            continue                                        # inside a host label: counted
        if e.name.startswith("tf::"):
            if e.name[4:] in HOST:
                out[e.name[4:]] += e.cpu_time_total           # host code: its wall time
            continue
        if e.cpu_parent is not None and not e.cpu_parent.name.startswith("tf::"):
            continue                                        # counted in its parent op
        if e.name.startswith("ProfilerStep"):
            continue
        label = labels[0] if labels else "elementwise (SiLU*up, residual, embedding)"
        out[label] += e.cpu_time_total                       # a top aten op, inclusive
    out["Python (interpreter, dispatch)"] = max(0.0, wall_us - sum(out.values()))
    return out


# ------------------------------------------------------------------ FLOPs and bytes
def floors(model, chunks: list[tuple[int, int]], num_sampled: int, peak: dict) -> dict:
    """Floor seconds per op class of a step whose sequences have ``(new, cached)`` tokens."""
    c = model.config
    H, D, nh, nkv, layers, bs = (c.hidden_size, c.head_dim, c.num_attention_heads,
                                 c.num_key_value_heads, c.num_hidden_layers,
                                 PEER_ENGINE_ARGS["block_size"])
    T = sum(q for q, _ in chunks)
    lin = [m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)
           and "lm_head" not in n and "experts" not in n and "gate" != n.split(".")[-1]]
    dense_params = sum(m.weight.numel() for m in lin)
    if getattr(c, "num_experts", 0):                                # MoE: the experts a token uses
        per_expert = sum(p.numel() for n, p in model.named_parameters()
                         if "experts" in n) / (layers * c.num_experts)
        dense_params += layers * per_expert * min(c.num_experts_per_tok * T, c.num_experts) / T
    weight_bytes = 4 * dense_params + 4 * c.vocab_size * H
    flops_lin = 2 * T * dense_params + 2 * num_sampled * H * c.vocab_size
    ctx = [(q, q + k) for q, k in chunks]
    reads = [-(-L // bs) * bs for _, L in ctx]
    f_sdpa = layers * sum(4 * nh * D * q * L for q, L in ctx)
    b_sdpa = layers * 4 * sum(2 * nkv * D * L + 2 * nh * D * q for q, L in ctx)
    b_kv = layers * 4 * 2 * nkv * D * (2 * sum(reads) + T)
    b_norm = 4 * H * 2 * (2 * layers * T + num_sampled)
    b_rope = layers * 4 * 2 * (nh + nkv) * D * T * 2
    inter = getattr(c, "intermediate_size", H)
    b_elem = layers * 4 * T * (3 * inter + 2 * 3 * H)
    roof = lambda f, b: max(f / (peak["gflops"] * 1e9), b / (peak["gbs"] * 1e9))  # noqa: E731
    return {"linear (GEMM)": roof(flops_lin, weight_bytes), "attention: SDPA": roof(f_sdpa, b_sdpa),
            "KV write + block gather": roof(0, b_kv), "RMSNorm": roof(0, b_norm),
            "RoPE": roof(0, b_rope), "elementwise (SiLU*up, residual, embedding)": roof(0, b_elem)}


# ------------------------------------------------------------------ the two steps
def find_steps(model, prompts, news) -> tuple[int, int]:
    """Indices of the prefill-heavy step and of the widest decode-only step."""
    eng = make_engine(model, prompts, news)
    while eng.has_unfinished():
        eng.step()
    decode = [s for s in eng.steps if not s.prefill]
    widest = max(len(s.decode) for s in decode)
    return 0, next(s.index for s in decode if len(s.decode) == widest)


def make_engine(model, prompts, news) -> LLMEngine:
    eng = LLMEngine(model, enable_prefix_caching=True, **PEER_ENGINE_ARGS)
    for p, n in zip(prompts, news):
        eng.add_request(p, SamplingParams(max_new_tokens=n, ignore_eos=True, logprobs=0))
    return eng


def profile_steps(model, prompts, news, which: tuple[int, int]) -> dict:
    """One engine run; the two chosen steps profiled. ``{kind: {class: us, ...}}``."""
    eng, out = make_engine(model, prompts, news), {}
    names = {which[0]: "prefill", which[1]: "decode"}
    while eng.has_unfinished():
        i = len(eng.steps)
        if i not in names:
            eng.step()
            continue
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            t = time.perf_counter()
            eng.step()
            wall = (time.perf_counter() - t) * 1e6
        s = eng.steps[-1]
        out[names[i]] = {"wall_us": wall, "us": split_step(prof.events(), wall),
                         "num_sampled": len(s.sampled), "num_tokens": s.num_tokens}
        if i == max(which):
            break
    return out


def context_lengths(model, prompts, news, which) -> dict:
    """``(new, cached)`` per sequence of the two steps (from a run with a recording hook)."""
    eng, seen = make_engine(model, prompts, news), {}
    orig = eng.runner.execute

    def execute(plan):
        if len(eng.steps) in which:
            seen[len(eng.steps)] = [(c.num_tokens, c.start) for c in plan.chunks]
        return orig(plan)
    eng.runner.execute = execute
    while eng.has_unfinished() and len(eng.steps) <= max(which):
        eng.step()
    return seen


def run_model(name: str, threads: int, repeats: int, peak: dict) -> dict:
    torch.set_num_threads(threads)
    model, tok = build_model(name)
    prompts, news = peer_workload(tok)
    which = find_steps(model, prompts, news)
    ctx = context_lengths(model, prompts, news, which)
    install_labels()
    runs = [profile_steps(model, prompts, news, which) for _ in range(repeats)]
    result = {}
    for kind, idx in zip(("prefill", "decode"), which):
        us = {k: statistics.median(r[kind]["us"][k] for r in runs) for k in CLASSES}
        wall = statistics.median(r[kind]["wall_us"] for r in runs)
        fl = floors(model, ctx[idx], runs[0][kind]["num_sampled"], peak)
        result[kind] = {"step": idx, "num_tokens": runs[0][kind]["num_tokens"],
                        "num_seqs": len(ctx[idx]), "wall_ms": wall / 1e3,
                        "ms": {k: v / 1e3 for k, v in us.items()},
                        "floor_ms": {k: v * 1e3 for k, v in fl.items()}}
    return result


def print_table(name: str, threads: int, r: dict) -> None:
    print(f"\n{name}, {threads} thread(s): prefill step {r['prefill']['step']} "
          f"({r['prefill']['num_tokens']} tokens, {r['prefill']['num_seqs']} seqs, "
          f"{r['prefill']['wall_ms']:.1f} ms); decode step {r['decode']['step']} "
          f"({r['decode']['num_seqs']} seqs, {r['decode']['wall_ms']:.1f} ms)")
    print(f"{'op class':44s} {'prefill ms':>10s} {'floor':>7s} {'x':>6s}   "
          f"{'decode ms':>9s} {'floor':>7s} {'x':>6s}")
    for k in CLASSES:
        cells = []
        for kind in ("prefill", "decode"):
            ms, fl = r[kind]["ms"][k], r[kind]["floor_ms"].get(k)
            x = f"{ms / fl:6.1f}" if fl else "     -"
            cells.append(f"{ms:10.2f} {fl if fl else 0:7.2f} {x}")
        print(f"{k:44s} {cells[0]}   {cells[1]}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["dense-92m", "tiny"])
    p.add_argument("--threads", type=int, nargs="+", default=[1])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args()
    result = {"date": time.strftime("%Y-%m-%d"), "load_before": os.getloadavg()[0],
              "torch": torch.__version__, "peak": {}, "models": {}}
    for t in a.threads:
        peak = measure_peak(t)
        result["peak"][t] = peak
        print(f"{t} thread(s): fp32 GEMM peak {peak['gflops']:.0f} GFLOP/s, "
              f"memory bandwidth {peak['gbs']:.1f} GB/s", flush=True)
        for m in a.models:
            r = run_model(m, t, a.repeats, peak)
            result["models"].setdefault(m, {})[t] = r
            print_table(m, t, r)
    result["load_after"] = os.getloadavg()[0]
    print(f"\nload average {result['load_before']:.2f} -> {result['load_after']:.2f}")
    if a.json:
        data = json.loads(a.json.read_text(encoding="utf-8")) if a.json.exists() else {}
        data["ops"] = result
        a.json.write_text(json.dumps(data, indent=1), encoding="utf-8")
        print(f"wrote {a.json} ['ops']")


if __name__ == "__main__":
    main()
