"""``torch.compile`` on the 92M dense model in our engine: measured, then dropped.

    .venv/bin/python benchmarks/try_compile.py [--pairs 2] [--threads 1]

The 48 peer requests (:func:`tokenflow.serving.peer.peer_workload`) through
:func:`tokenflow.serving.peer.run_ours` three ways, alternating in one run: eager; each decoder
layer's FFN compiled (``torch.compile(layer.mlp, dynamic=True)``: no cache inside, one graph);
the whole decoder layer compiled (the cache write is a graph break), without and with
Inductor's ``freezing``. Inside ``torch.compile``, :func:`tokenflow.model.linear.linear` is
``F.linear`` (Inductor lowers it itself). The first run of each
compiled variant is timed apart (it compiles). Prints tokens per second, the ratio to eager and
whether the greedy tokens equal eager's. benchmarks/README.md quotes a run.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch
import torch._inductor.config

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_vllm import build_model  # noqa: E402

from tokenflow.serving.peer import PEER_ENGINE_ARGS, peer_workload, run_ours  # noqa: E402


def variants(model):
    """``{name: (model, freezing)}``: eager; each FFN compiled; each decoder layer compiled;
    each decoder layer compiled with Inductor's ``freezing`` (weights become constants, which
    lets it pre-pack them for oneDNN itself). Deep copies of ``model``."""
    ffn, layer, frozen = (copy.deepcopy(model) for _ in range(3))
    for block in ffn.layers:
        block.mlp = torch.compile(block.mlp, dynamic=True)
    for m in (layer, frozen):
        for i, block in enumerate(m.layers):
            m.layers[i] = torch.compile(block, dynamic=True)
    return {"eager": (model, False), "ffn compiled": (ffn, False),
            "layer compiled": (layer, False), "layer compiled, freezing": (frozen, True)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    model, tok = build_model("dense-92m")
    prompts, news = peer_workload(tok)
    runs = variants(model)
    tokens, first = {}, {}
    with torch.inference_mode():
        for name, (m, freezing) in runs.items():
            torch._inductor.config.freezing = freezing   # read when the first call compiles
            t = time.perf_counter()
            r = run_ours(m, prompts, news, **PEER_ENGINE_ARGS)
            first[name] = time.perf_counter() - t
            tokens[name] = [o["token_ids"] for o in r["outputs"]]
        rates = {name: [] for name in runs}
        for i in range(a.pairs):
            order = [(name, m) for name, (m, _) in runs.items()]
            for name, m in (order if i % 2 == 0 else order[::-1]):
                r = run_ours(m, prompts, news, **PEER_ENGINE_ARGS)
                new = sum(len(o["token_ids"]) for o in r["outputs"])
                rates[name].append(new / r["wall_s"])
    eager = statistics.median(rates["eager"])
    for name in runs:
        med = statistics.median(rates[name])
        same = sum(x == y for x, y in zip(tokens[name], tokens["eager"]))
        print(f"{name:26s} {med:6.1f} tok/s  {med / eager:.2f}x eager  first run "
              f"{first[name]:5.1f} s  tokens equal to eager on {same}/{len(prompts)}")


if __name__ == "__main__":
    main()
