"""What several test files share: small random models, an attention the FLOP counter sees, and
the import of a ``scripts/`` file as a module.

Import it as ``from helpers import random_model`` (pytest puts ``tests/`` on ``sys.path``);
``conftest.py`` keeps only fixtures and pytest hooks.
"""
from __future__ import annotations

import contextlib
import importlib.util
import math
import re
import sys
from pathlib import Path

import torch

from tokenflow import TokenFlowModel, preset

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


# The CPU environment conftest.py gives every kernel nbval starts (see the comment there).
NBVAL_KERNEL_ENV = {"ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "1",
                    "MKL_NUM_THREADS": "1"}


def load_script(name: str, module_name: str | None = None):
    """``scripts/<name>.py`` imported as a module, registered in ``sys.modules`` under
    ``module_name`` (default ``name``; its dataclasses need the registration)."""
    module_name = module_name or name
    spec = importlib.util.spec_from_file_location(module_name, SCRIPTS / f"{name}.py")
    sys.modules[module_name] = module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def random_model(seed: int = 0, **overrides) -> TokenFlowModel:
    """An untrained model of the tiny preset with some fields changed, eval mode."""
    torch.manual_seed(seed)
    cfg = preset("tiny", **overrides)
    return TokenFlowModel(cfg).eval()


def wide_random_model(seed: int = 0, **overrides) -> TokenFlowModel:
    """:func:`random_model` (with ``overrides`` of the tiny preset) with matrices drawn wider
    (std 0.08) than the default init, so greedy decoding makes clear choices (no near-ties
    that batching could flip)."""
    m = random_model(seed=seed, **overrides)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.08)
    return m


def _explicit_sdpa(q, k, v, mask, enable_gqa=False, scale=None):
    """``softmax(q k^T * scale + mask) v`` as two matrix products, K/V heads repeated for
    the query heads that share them (what SDPA computes)."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-1, -2)) * scale
    return scores.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v


@contextlib.contextmanager
def explicit_attention():
    """Inside the block, the model's attention runs as explicit ``q @ k^T`` and
    ``weights @ v`` products instead of SDPA, so torch's ``FlopCounterMode`` (which has no
    formula for the CPU SDPA kernels) counts every FLOP of the forward pass."""
    import tokenflow.model.attention as attention
    import tokenflow.model.mla as mla
    saved = attention._sdpa, mla._sdpa
    attention._sdpa = mla._sdpa = _explicit_sdpa
    try:
        yield
    finally:
        attention._sdpa, mla._sdpa = saved


# A Chinese measure word written twice ("888 个个 logits", "3 次 次"): what a translation
# template gives when it translates its own output again. 一个个 (one by one) is a word.
DOUBLED_MEASURE = re.compile(r"(?<!一)([个次块条组对项位倍张份段])\s*\1")


def doubled_measure_words(text: str) -> list[str]:
    """Each doubled measure word in ``text`` (empty if none)."""
    return [m.group(0) for m in DOUBLED_MEASURE.finditer(text)]
