"""Shared helpers of the benchmarks: build ours and HF's model with the same weights, time
a callable, describe the machine. Not a benchmark by itself."""
from __future__ import annotations

import os
import platform
import statistics
import time

import torch

from tokenflow import TokenFlowModel, preset

# Long prompts (1024) need more RoPE positions than the book's tiny preset has (128);
# max_position_embeddings changes no weight, only the length of the RoPE table.
MAX_POS = 2048
THREADS = 2


def build_pair(name: str, seed: int = 0, hf: bool = True, ours: bool = True):
    """``(ours, hf)`` of preset ``name`` with identical random weights (fp32, eval mode).

    Weights are drawn wider than the default init (std 0.08) so that greedy decoding does not
    sit on near-ties. Either side can be skipped (``None``) for the memory subprocesses.
    """
    cfg = preset(name, max_position_embeddings=MAX_POS)
    torch.manual_seed(seed)
    model = TokenFlowModel(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.08)
    hf_model = None
    if hf:
        from tokenflow.interop import to_hf_model
        hf_model = to_hf_model(model)
        hf_model.generation_config.eos_token_id = None        # always run the full length
        hf_model.generation_config.pad_token_id = cfg.pad_token_id
    return (model if ours else None), hf_model


def timeit(fn, repeats: int) -> list[float]:
    """Wall-clock seconds of ``repeats`` calls of ``fn()``."""
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def machine(threads: int = THREADS) -> str:
    """One line: CPU model, cores, threads used, torch and transformers versions."""
    cpu = platform.processor() or "cpu"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    import transformers
    return (f"{cpu}, {os.cpu_count()} cores, torch.set_num_threads({threads}); "
            f"Python {platform.python_version()}, torch {torch.__version__}, "
            f"transformers {transformers.__version__}")
