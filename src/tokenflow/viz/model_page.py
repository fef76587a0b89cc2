"""The simulator's model page: one model's token flow in two lenses, with its own numbers.

:func:`model_page` returns one HTML block (the bundled configs, the hardware presets and two
scripts inline) that works from ``file://`` with no kernel and no network: pick a bundled
model or paste a ``config.json``, set hardware, precision, batch, context and TP / EP, and the
page draws the serving pipeline around the model block lens with each number at its stage, and
computes memory per device and the prefill / decode roofline in the browser.

The browser code (``data/model_page_calc.js``) follows the Python definitions function by function:
:func:`tokenflow.config.hf_config.parse_hf_config`, :mod:`tokenflow.analysis.costmodel`,
:func:`tokenflow.analysis.roofline.roofline`. :func:`page_numbers` is what the page shows,
computed by those Python functions; ``tests/test_model_page.py`` runs the JavaScript under node
and requires the same values and the same printed text (:func:`fmt_si`, :func:`fmt_bytes`,
:func:`fmt_time`).

Against the two public tools that compute such numbers: from LLM-Viewer (Yuan et al. 2024,
arXiv:2402.16363; its roofline table per layer) the page takes each phase's arithmetic
intensity next to the hardware's ridge point, and weights + KV per device; it leaves out the
per-operator table and its quantization and FlashAttention switches. From InferSim
(tokens/GPU/s from FLOPs, bandwidths and MFU measured on kernels) it takes tokens/s per GPU
and DeepEP's two all-to-all modes (the roofline's prefill / decode paths); it leaves out the
measured MFU: the page is a bound at peak, and chapter 7 holds it against DeepSeek's
published throughput instead.
"""
from __future__ import annotations

import dataclasses
import json
from decimal import ROUND_HALF_UP, Decimal
from importlib import resources

_IMPORTED = set(globals())          # the names above are imported, not defined here

TINY_NAME = "tokenflow tiny (the book's model)"
"""The page's name for the book's own model (``load_pretrained``'s config)."""

PRECISIONS = {
    "bf16": dict(dtype="bf16", attention_dtype="bf16", bytes_per_param=2,
                 kv_bytes_per_element=2, dispatch_bytes_per_element=2,
                 combine_bytes_per_element=2),
    "fp8": dict(dtype="fp8", attention_dtype="bf16", bytes_per_param=1, kv_bytes_per_element=2,
                dispatch_bytes_per_element=1, combine_bytes_per_element=2),
}
"""The page's precision control as :func:`~tokenflow.analysis.roofline.roofline` arguments:
``bf16`` everywhere, or DeepSeek's service (FP8 weights and matrix multiplications, core
attention and KV cache in BF16, dispatch FP8, combine BF16: DeepSeek-V3/R1 Inference System
Overview, day 6 of open-infra-index, 2025)."""

MEMORY_FRACTION = 0.9
"""Share of device memory for weights + KV cache (:func:`~tokenflow.analysis.costmodel.
max_batch_size`'s default)."""


def _js(name: str) -> str:
    """A script of ``tokenflow/data``, ASCII only (other characters as ``\\uXXXX`` escapes,
    which occur only in its string literals): the page's Chinese text is not figure text, and
    scripts/build_fonts.py reads it from the file for the web font."""
    text = (resources.files("tokenflow") / "data" / name).read_text(encoding="utf-8")
    return text.encode("ascii", "backslashreplace").decode("ascii")


def page_tables() -> dict:
    """What the browser's config reader needs from :mod:`tokenflow.config.hf_config`, as data:
    families, the HF defaults per family, ignored names, GPT-2's renames, allowed top-k methods,
    RoPE defaults and types, activations."""
    from tokenflow.config import hf_config as h
    from tokenflow.model.ffn import ACTIVATIONS
    from tokenflow.model.rope import ROPE_TYPES
    return dict(families=list(h.FAMILIES), hf_defaults=h._HF_DEFAULTS,
                ignored=sorted(h._IGNORED), ignored_prefixes=list(h._IGNORED_PREFIXES),
                gpt2_names=h._GPT2_NAMES,
                family_topk_methods={k: list(v) for k, v in h._FAMILY_TOPK_METHODS.items()},
                default_rope={k: [v[0], v[1]] for k, v in h._DEFAULT_ROPE.items()},
                rope_types={k: list(v) for k, v in ROPE_TYPES.items()},
                activations=list(ACTIVATIONS))


def _tiny_hf() -> dict:
    """The book's tiny model as an HF-names dict (no ``model_type``: the parser's own format)."""
    from tokenflow.interop.checkpoint import load_model, _data_path
    c = load_model(_data_path("tiny.safetensors")).config
    keys = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "intermediate_size", "moe_intermediate_size",
            "num_experts", "num_experts_per_tok", "first_k_dense_replace",
            "norm_topk_prob", "max_position_embeddings", "rope_theta", "rms_norm_eps",
            "tie_word_embeddings", "hidden_act", "scoring_func", "topk_method")
    d = {k: getattr(c, k) for k in keys}
    d["n_shared_experts"] = c.num_shared_experts
    return d


def bundled_hf_configs() -> dict:
    """``name -> HF config dict`` of every model the page offers: each bundled reference
    (:func:`~tokenflow.analysis.costmodel.reference_hf_config`) and the book's tiny model."""
    from tokenflow.analysis.costmodel import reference_hf_config, reference_models
    out = {name: reference_hf_config(name) for name in reference_models()}
    out[TINY_NAME] = _tiny_hf()
    return out


def _hardware() -> dict:
    from tokenflow.analysis.roofline import HARDWARE
    return {k: dataclasses.asdict(v) for k, v in HARDWARE.items()}


def page_numbers(config, hw_name: str, precision: str, batch: int, context: int, tp: int,
                 ep: int) -> dict:
    """Every number the page shows for one setting, from the Python definitions: parameters
    (:func:`param_count`, :func:`active_param_count`), KV bytes per token, weights per device
    (:func:`weight_bytes_per_device`), the batch's KV cache (:func:`kv_cache_bytes`), whether
    both fit in ``0.9`` of the device memory and :func:`max_batch_size`, and for prefill and
    decode the :func:`~tokenflow.analysis.roofline.roofline` times, tokens/s and the binding
    resource (``compute``, ``memory``, ``scale_up`` = NVLink, ``scale_out`` = InfiniBand),
    the step's arithmetic intensity (FLOPs per byte of memory traffic) and the hardware's
    :func:`~tokenflow.analysis.roofline.ridge_point` at the weights' dtype.
    The all-to-all takes the roofline's default path per phase (decode direct over
    InfiniBand, prefill hierarchical) under the config's own group limit.

    Raises:
        ValueError: an unknown ``hw_name`` or ``precision``, and the errors of those functions
            (a ``tp`` / ``ep`` that does not split the heads / experts, counts < 1, a config
            with ``unsupported_fields``).
    """
    from tokenflow.analysis import costmodel as cm
    from tokenflow.analysis.roofline import Deployment, hardware, ridge_point, roofline
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {sorted(PRECISIONS)}, got {precision!r}")
    hw, p, c = hardware(hw_name), PRECISIONS[precision], config
    r = dict(moe_layers=cm.num_moe_layers(c),
             sliding_layers=sum(c.layer_is_sliding(i) for i in range(c.num_hidden_layers)),
             kv_bytes_per_token=cm.kv_cache_bytes_per_token(c, p["kv_bytes_per_element"]),
             params_total=cm.param_count(c), params_active=cm.active_param_count(c))
    w = cm.weight_bytes_per_device(c, tp_size=tp, ep_size=ep, bytes_per_param=p["bytes_per_param"])
    r.update(weights_tp=w["tensor_parallel"], weights_ep=w["expert_parallel"],
             weights_replicated=w["replicated"], weights=w["total"],
             kv_cache=cm.kv_cache_bytes(c, batch=batch, context_len=context,
                                       bytes_per_element=p["kv_bytes_per_element"], tp_size=tp))
    r["memory_used"] = r["weights"] + r["kv_cache"]
    r["memory_budget"] = MEMORY_FRACTION * hw.memory_bytes
    r["fits"] = r["memory_used"] <= r["memory_budget"]
    r["max_batch"] = cm.max_batch_size(c, context_len=context, device_memory_bytes=hw.memory_bytes,
                                       tp_size=tp, ep_size=ep, bytes_per_param=p["bytes_per_param"],
                                       kv_bytes_per_element=p["kv_bytes_per_element"],
                                       memory_fraction=MEMORY_FRACTION)
    for phase in ("prefill", "decode"):
        x = roofline(c, Deployment(hw, tp_size=tp, ep_size=ep, **p), phase=phase, batch=batch,
                     context_len=context)
        for k in ("compute_s", "memory_s", "comm_s", "scale_up_s", "scale_out_s", "step_s",
                  "tokens_per_s", "flops", "memory_bytes", "bound"):
            r[f"{phase}_{k}"] = x[k]
        r[f"{phase}_intensity"] = x["flops"] / x["memory_bytes"]
        link = "scale_out" if x["scale_out_s"] >= x["scale_up_s"] else "scale_up"
        r[f"{phase}_binding"] = link if x["bound"] == "comm" else x["bound"]
    r["ridge"] = ridge_point(hw, p["dtype"])
    return r


_PREFIXES = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def _sig3(v: float) -> str:
    a = abs(v)
    d = 0 if a >= 99.95 else 1 if a >= 9.995 else 2 if a >= 0.9995 else 3
    return str(Decimal(v).quantize(Decimal(1).scaleb(-d), rounding=ROUND_HALF_UP))


def fmt_si(x: float, unit: str = "") -> str:
    """A number as the page prints it: 3 significant digits and an SI prefix (``"37.4 GB"``,
    ``"1.23 k"``); JavaScript's ``toFixed`` rounding (half away from zero on the exact double)."""
    if x == 0:
        return f"0 {unit}"
    for scale, p in _PREFIXES:
        if abs(x) >= scale * 0.9995:
            return f"{_sig3(x / scale)} {p}{unit}"
    return f"{_sig3(x)} {unit}"


_BINARY = ((2**50, "PiB"), (2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"))


def fmt_bytes(x: float) -> str:
    """Bytes as the page prints them: 3 significant digits and a binary unit, as the rest of
    the book (``70272 -> "68.6 KiB"``, ``80e9 -> "74.5 GiB"``); rounding as :func:`fmt_si`."""
    if x == 0:
        return "0 B"
    for scale, u in _BINARY:
        if abs(x) >= scale * 0.9995:
            return f"{_sig3(x / scale)} {u}"
    return f"{_sig3(x)} B"


def fmt_time(s: float) -> str:
    """Seconds as the page prints them: ``s``, ``ms`` or ``µs`` with 3 significant digits."""
    if s == 0:
        return "0 s"
    if s >= 0.9995:
        return f"{_sig3(s)} s"
    if s >= 0.0009995:
        return f"{_sig3(s * 1e3)} ms"
    return f"{_sig3(s * 1e6)} \u00b5s"


_CSS = """
.tf-model-page{font-size:.9rem;line-height:1.35;max-width:100%}
.tf-mp-forms,.tf-mp-note,.tf-mp-msg{overflow-wrap:anywhere}
.tf-mp-controls{display:flex;flex-wrap:wrap;gap:.4rem .9rem;margin:.3rem 0}
.tf-mp-ctl{display:flex;flex-direction:column;font-size:.8rem;max-width:100%}
.tf-mp-ctl select,.tf-mp-ctl input{font-size:.9rem;max-width:100%}
.tf-mp-ctl input{width:7rem}
.tf-mp-paste textarea{width:100%;box-sizing:border-box;font-family:monospace;font-size:.8rem}
.tf-mp-msg.tf-mp-error{color:#b00020;font-weight:600;margin:.3rem 0}
.tf-mp-msg.tf-mp-unsupported{color:#8a5a00;margin:.3rem 0}
.tf-mp-pipeline,.tf-mp-block{border:2px solid #4a78b5;border-radius:8px;padding:.4rem;
  margin:.5rem 0}
.tf-mp-block{border:2px dashed #c08a1e;background:rgba(192,138,30,.05)}
.tf-mp-caption{font-weight:600;margin:.2rem 0 .3rem}
.tf-mp-row{display:flex;flex-wrap:wrap;align-items:stretch;gap:.2rem}
.tf-mp-stage{border:1px solid #999;border-radius:6px;padding:.25rem .4rem;min-width:5.5rem;
  flex:1 1 6rem;background:rgba(127,127,127,.06)}
.tf-mp-title{font-weight:600;font-size:.85rem}
.tf-mp-line{font-size:.8rem}
.tf-mp-arrow{display:flex;flex-direction:column;align-items:center;justify-content:center;
  font-size:.75rem;color:#666}
.tf-mp-layers{border:1px solid #c08a1e;border-radius:6px;padding:.25rem;flex:3 1 14rem}
.tf-mp-num{font-weight:600;white-space:nowrap;font-variant-numeric:tabular-nums}
@media print{.tf-mp-num{white-space:normal;overflow-wrap:anywhere}}
.tf-mp-params{margin:.1rem 0 .3rem}
.tf-mp-scroll{overflow-x:auto;max-width:100%}
.tf-mp-table{border-collapse:collapse;min-width:34rem;font-size:.8rem;margin:.2rem 0}
.tf-mp-table td,.tf-mp-table th{border:1px solid #ccc;padding:.15rem .35rem;text-align:left}
.tf-mp-forms,.tf-mp-note{font-size:.78rem;margin:.3rem 0}
"""


class ModelPage:
    """The page as one HTML block (``_repr_html_``); ``default`` is the model shown first."""

    def __init__(self, default: str = "DeepSeek-V3", hardware: str = "H800",
                 precision: str = "fp8", batch: int = 64, context: int = 4096, tp: int = 1,
                 ep: int = 32):
        configs = bundled_hf_configs()
        if default not in configs:
            raise ValueError(f"default must be one of {sorted(configs)}, got {default!r}")
        if hardware not in _hardware():
            raise ValueError(f"hardware must be one of {sorted(_hardware())}, got {hardware!r}")
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {sorted(PRECISIONS)}, "
                             f"got {precision!r}")
        from tokenflow.analysis.costmodel import reference_models
        refs = reference_models()
        self.data = dict(
            models=configs, tables=page_tables(), hardware=_hardware(),
            sources={n: refs[n]["config_source"] for n in refs},
            default=dict(model=default, hardware=hardware, precision=precision, batch=batch,
                         context=context, tp=tp, ep=ep))

    def summary_table(self):
        """The default setting's numbers at their stages as a :class:`~tokenflow.viz.Table`
        (what the page shows before its script runs, and chapter 7's slide). A config the cost
        model cannot count gives its shapes only."""
        from tokenflow.config import ModelConfig
        from tokenflow.config.hf_config import parse_hf_config
        from .fmt import Table
        d = self.data["default"]
        c = ModelConfig(**parse_hf_config(self.data["models"][d["model"]],
                                          allow_unsupported=True))
        moe = sum(c.layer_is_moe(i) for i in range(c.num_hidden_layers))
        ffn = (f"{c.num_experts_per_tok} of {c.num_experts} routed"
               + (f" + {c.num_shared_experts} shared" if c.num_shared_experts else "")
               + f"; {moe} MoE + {c.num_hidden_layers - moe} dense layers"
               if c.num_experts else f"dense FFN, I = {c.intermediate_size:,}")
        rows = [["block: embedding -> every layer", "hidden_size H", f"{c.hidden_size:,}"],
                ["block: FFN / MoE", "experts per token", ffn],
                ["block: LM head -> pipeline: sampling", "vocab logits", f"{c.vocab_size:,}"]]
        if not c.unsupported_fields:
            r = page_numbers(c, d["hardware"], d["precision"], d["batch"], d["context"],
                             d["tp"], d["ep"])
            names = {"scale_out": "InfiniBand", "scale_up": "NVLink"}
            rows[1:1] = [["block: attention + KV", "KV bytes per token",
                          fmt_bytes(r["kv_bytes_per_token"])]]
            rows += [["whole model", "parameters total / active per token",
                      f"{fmt_si(r['params_total'])} / {fmt_si(r['params_active'])}"],
                     ["pipeline: KV cache", f"{d['batch']} x {d['context']:,} tokens per GPU",
                      fmt_bytes(r["kv_cache"])],
                     ["per GPU", "weights + KV / memory for them",
                      f"{fmt_bytes(r['memory_used'])} / {fmt_bytes(r['memory_budget'])}"]]
            rows += [[f"pipeline: {ph if ph == 'prefill' else 'decode loop'}",
                      "roofline tokens/s per GPU, binding",
                      f"{fmt_si(r[ph + '_tokens_per_s'], 'tok/s')}, "
                      f"{names.get(r[ph + '_binding'], r[ph + '_binding'])}"]
                     for ph in ("prefill", "decode")]
        return Table(rows, ["stage", "number", "value"],
                     title=f"{d['model']} on the model page ({d['hardware']}, "
                           f"{d['precision']}, TP{d['tp']}, EP{d['ep']})")

    def __repr__(self) -> str:
        return f"ModelPage(default={self.data['default']['model']!r})"

    def _repr_html_(self) -> str:
        data = json.dumps(self.data, sort_keys=True).replace("</", "<\\/")
        return ('<div class="tf-model-page">'
                f'<style>{_CSS}</style>'
                f'<div class="tf-mp-static">{self.summary_table()._repr_html_()}</div>'
                f'<script type="application/json" class="tf-mp-data">{data}</script>'
                f'<script>{_js("model_page_calc.js")}</script>'
                f'<script>{_js("model_page.js")}</script></div>')


def model_page(default: str = "DeepSeek-V3", **settings) -> ModelPage:
    """The model page (see the module docstring); ``settings``: ``hardware`` (``"H100"``,
    ``"H200"``, ``"H800"``), ``precision`` (``"bf16"``, ``"fp8"``), ``batch``, ``context``,
    ``tp``, ``ep``: the controls' first setting.

    Raises:
        ValueError: an unknown model, hardware or precision.
    """
    return ModelPage(default, **settings)


# what this module defines (every public name after the imports)
__all__ = [n for n in globals() if not n.startswith("_") and n not in _IMPORTED]
