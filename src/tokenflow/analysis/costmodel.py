"""Back-of-envelope costs for real configs, in one namespace: parameters, KV bytes and memory,
FLOPs and bytes per forward pass, MoE communication, and the bundled real-model configs.

The formulas live in four modules, each readable on its own; this module re-exports them, so
``costmodel.param_count`` and ``from tokenflow.analysis.costmodel import forward_bytes`` work:

- :mod:`~tokenflow.analysis.params`: :func:`param_breakdown`, :func:`active_param_count`, ...;
- :mod:`~tokenflow.analysis.memory`: :func:`kv_cache_bytes`, :func:`weight_bytes_per_device`,
  :func:`max_batch_size`, ...;
- :mod:`~tokenflow.analysis.forward`: :func:`forward_flops`, :func:`forward_bytes`, ..., all
  taking ``(config, *, batch, new_tokens, cached_tokens)``;
- :mod:`~tokenflow.analysis.moe_comm`: :func:`moe_comm_bytes_per_token`, :func:`moe_a2a_table`.

Time on hardware: :mod:`tokenflow.analysis.roofline`.
"""
from __future__ import annotations

from tokenflow.config import ModelConfig

from . import forward as _forward
from . import memory as _memory
from . import moe_comm as _moe_comm
from . import params as _params
from .forward import *  # noqa: F401,F403
from .memory import *  # noqa: F401,F403
from .memory import _kv_share  # noqa: F401
from .moe_comm import *  # noqa: F401,F403
from .params import *  # noqa: F401,F403
from .params import _check_bytes, _check_count, _check_countable, _norm_params  # noqa: F401

__all__ = [*_params.__all__, *_memory.__all__, *_forward.__all__, *_moe_comm.__all__,
           "reference_models", "reference_config", "reference_value_unverified",
           "reference_hf_config"]


def reference_models() -> dict:
    """The real-model configs bundled in ``src/tokenflow/data/models.json`` (each entry names
    its sources and marks what is unverified; :func:`reference_value_unverified` reads those
    marks per value)."""
    import json
    from importlib import resources
    return json.loads((resources.files("tokenflow") / "data" / "models.json")
                      .read_text(encoding="utf-8"))["models"]


def reference_value_unverified(name: str, field: str) -> bool:
    """Whether ``models.json`` flags one value of a bundled config as unverified, in either of
    the two ways it does: for the whole entry (its ``config_source`` says so, e.g.
    DeepSeek-V4-Pro, known only from third-party copies), or for the value itself (an
    annotated value such as GPT-3's ``vocab_size``, ``"50257 (GPT-2 BPE; unverified:
    from secondary summaries)"``). A table that says where each value comes from must ask per
    value: the entry's sources alone miss the second kind.

    Raises:
        ValueError: ``name`` is not bundled, or ``field`` is not in its config.
    """
    models = reference_models()
    if name not in models:
        raise ValueError(f"name must be one of {sorted(models)}, got {name!r}")
    config = models[name]["config"]
    if field not in config:
        raise ValueError(f"field must be one of {sorted(config)} for {name}, got {field!r}")
    return any("UNVERIFIED" in str(text).upper()
               for text in (" ".join(models[name]["config_source"]), config[field]))


def reference_config(name: str) -> ModelConfig:
    """A :class:`ModelConfig` for a bundled real model (``"DeepSeek-V3"``, ``"Mixtral-8x7B"``,
    ``"Llama-3-8B"``, ``"DeepSeek-V4-Pro"``, ``"DeepSeek-V4-Flash"``, ``"GPT-3-175B"``).

    Values the reference gives as annotated text (e.g. ``"2.5 (one secondary copy only -
    unverified)"``) are read as their leading number or boolean. Read with
    ``from_hf_config(..., allow_unsupported=True)``: DeepSeek-V4's fields we cannot express
    (``o_groups``, ``compress_rates``, ``scoring_func 'sqrtsoftplus'``, ...) land in
    ``unsupported_fields``, so its shapes and routing sizes are usable but every count
    refuses. GPT-3 has no ``model_type`` in the file and is read as ``gpt2``
    (:data:`_REFERENCE_FAMILY`). Fine for shapes and counts, not for running.

    Raises:
        ValueError: if ``name`` is not bundled.
    """
    return ModelConfig.from_hf_config(reference_hf_config(name), allow_unsupported=True,
                                      name=name)


def reference_hf_config(name: str) -> dict:
    """The HF ``config.json`` dict :func:`reference_config` reads for a bundled model: the
    ``models.json`` entry's config with annotated text values read as their leading number or
    boolean (text without one is left out) and ``model_type`` from :data:`_REFERENCE_FAMILY`
    where the entry has none.

    Raises:
        ValueError: if ``name`` is not bundled.
    """
    models = reference_models()
    if name not in models:
        raise ValueError(f"name must be one of {sorted(models)}, got {name!r}")
    import re
    hf = {}
    for k, v in models[name]["config"].items():
        if isinstance(v, str) and k != "scoring_func":
            m = re.match(r"\s*(True|False|[0-9.]+)", v)
            if not m:
                continue
            v = {"True": True, "False": False}.get(m.group(1)) if m.group(1) in (
                "True", "False") else (float(m.group(1)) if "." in m.group(1) else int(m.group(1)))
        hf[k] = v
    hf.setdefault("model_type", _REFERENCE_FAMILY.get(name))
    return hf


_REFERENCE_FAMILY = {"GPT-3-175B": "gpt2"}
"""``model_type`` of reference entries that do not carry one: GPT-3 uses GPT-2's
architecture (Brown et al. 2020, section 2.1: "the same model and architecture as GPT-2", with
alternating dense and locally banded sparse attention, which changes no parameter count)."""
