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


# Benchmark-only configs: the book's tiny preset with DeepSeek-V3's attention and routing in
# miniature (multi-head latent attention with a query LoRA, sigmoid router with a correction
# bias and expert groups, one shared expert, a dense first layer), run against
# DeepseekV3ForCausalLM. Same field names as DeepSeek-V3's config.json.
EXTRA = {"tiny-mla": ("tiny", dict(num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=32,
                                   qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
                                   head_dim=8, scoring_func="sigmoid", norm_topk_prob=True,
                                   routed_scaling_factor=2.5, n_group=4, topk_group=2))}


def build_pair(name: str, seed: int = 0, hf: bool = True, ours: bool = True):
    """``(ours, hf)`` of preset ``name`` (a :data:`tokenflow.PRESETS` name or one of
    :data:`EXTRA`) with identical random weights (fp32, eval mode).

    Weights are drawn wider than the default init (std 0.08) so that greedy decoding does not
    sit on near-ties. Either side can be skipped (``None``) for the memory subprocesses.
    """
    base, overrides = EXTRA.get(name, (name, {}))
    cfg = preset(base, max_position_embeddings=MAX_POS, **overrides)
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
