"""Where a decode step spends its time: a ``torch.profiler`` table of ``decode_step``.

    .venv/bin/python benchmarks/profile_decode.py small-moe --batch 1
    .venv/bin/python benchmarks/profile_decode.py tiny --batch 8 --rows 15

Builds the preset with the benchmark's random weights (``_common.build_pair``), fills a KV
cache with a 16-token prompt, warms up, then profiles ``--steps`` decode steps (CPU
activities, ``torch.set_num_threads(2)`` unless ``--threads``) and prints the ops sorted by self CPU
time, per step (totals divided by the number of steps), plus the step's wall time and the share of
it spent inside matrix products (``aten::mm`` / ``addmm`` / ``bmm`` / ``_grouped_mm``).

``--split`` adds a profiler-free split of the unprofiled step: the wall time of every
``F.linear`` call inside the step (each call timed with ``perf_counter``), the same calls on the
same weights back to back in a loop (the benchmark's floor for this step), and the rest of the
step (norms, RoPE, cache writes, SDPA, routing, Python). The MoE's grouped products
(``torch._grouped_mm``, batch > 1) count as "rest".
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import THREADS, build_pair  # noqa: E402

from tokenflow import KVCache, decode_step, prefill  # noqa: E402

MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::_grouped_mm", "aten::matmul")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("preset")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rows", type=int, default=20, help="table rows to print")
    ap.add_argument("--threads", type=int, default=THREADS,
                    help="torch threads (1 is steadier on a busy machine)")
    ap.add_argument("--split", action="store_true",
                    help="also time the step's F.linear calls inside the step vs back to back")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, _ = build_pair(args.preset, hf=False)
    ids = torch.randint(3, model.config.vocab_size, (args.batch, 16),
                        generator=torch.Generator().manual_seed(0))
    cache = KVCache(model.config, args.batch, 16 + 4 * args.steps + 8)
    tok = prefill(model, ids, cache).argmax(-1)
    for _ in range(args.steps):                                           # warm-up
        tok = decode_step(model, tok, cache).argmax(-1)
    t = time.perf_counter()
    for _ in range(args.steps):
        tok = decode_step(model, tok, cache).argmax(-1)
    wall = (time.perf_counter() - t) / args.steps
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(args.steps):
            tok = decode_step(model, tok, cache).argmax(-1)
    if args.split:
        print(linear_split(model, tok, cache, args.steps))
    events = prof.key_averages()
    mm = sum(e.self_cpu_time_total for e in events if e.key in MATMUL_OPS) / args.steps
    ops = sum(e.count for e in events) / args.steps
    print(
        f"# {args.preset}, batch {args.batch}, {args.threads} thread(s): "
        f"decode step {wall * 1e3:.2f} ms (unprofiled), "
        f"{ops:.0f} profiled ops/step, matrix products {mm / 1e3:.2f} ms/step"
    )
    print("| op | calls/step | self CPU ms/step | share |")
    print("|---|---:|---:|---:|")
    total = sum(e.self_cpu_time_total for e in events)
    rows = sorted(events, key=lambda e: -e.self_cpu_time_total)[:args.rows]
    for e in rows:
        print(f"| {e.key} | {e.count / args.steps:.0f} | "
              f"{e.self_cpu_time_total / args.steps / 1e3:.3f} | "
              f"{100 * e.self_cpu_time_total / total:.0f}% |")


def linear_split(model, tok, cache, steps: int) -> str:
    """One line: a decode step's ``F.linear`` time inside the step, the same calls back to back,
    and the rest of the step (best of ``steps`` steps each, milliseconds)."""
    real, calls = F.linear, []

    def timed(x, w, b=None):
        t = time.perf_counter()
        y = real(x, w, b)
        calls.append((time.perf_counter() - t, x, w))
        return y
    best = None
    F.linear = timed                                  # nn.Linear and our modules call F.linear
    try:
        for _ in range(steps):
            calls.clear()
            t = time.perf_counter()
            tok = decode_step(model, tok, cache).argmax(-1)
            step, inside = time.perf_counter() - t, sum(c[0] for c in calls)
            if best is None or step < best[0]:
                best = (step, inside, [(x, w) for _, x, w in calls])
    finally:
        F.linear = real
    step, inside, xw = best
    loop = []
    with torch.inference_mode():
        for _ in range(steps):
            t = time.perf_counter()
            for x, w in xw:
                real(x, w)
            loop.append(time.perf_counter() - t)
    return (f"# split of the best step ({step * 1e3:.2f} ms): {len(xw)} F.linear calls "
            f"{inside * 1e3:.2f} ms inside the step, {min(loop) * 1e3:.2f} ms back to back; "
            f"the rest {(step - inside) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
