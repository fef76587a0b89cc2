"""The model page's browser arithmetic (src/tokenflow/data/model_page_calc.js) against the
Python definitions it follows: run under node on every bundled config and on random valid
configs across the controls, the values must agree (relative 1e-9) and so must every printed
number (the page's 3 significant digits)."""
from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
from importlib import resources

import pytest

from tokenflow.model.config import ModelConfig
from tokenflow.model.hf_config import parse_hf_config
from tokenflow.viz.model_page import (PRECISIONS, bundled_hf_configs, fmt_bytes, fmt_si, fmt_time,
                                      model_page, page_numbers, page_tables)

# node comes with npm, which `make test` needs anyway (its widget-js step; under CI the
# Makefile installs Debian's nodejs + npm)
NODE = shutil.which("node") or shutil.which("nodejs")
CALC = resources.files("tokenflow") / "data" / "model_page_calc.js"
HARDWARE = ("H100", "H200", "H800")
# the ModelConfig fields the counts read
FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
          "num_key_value_heads", "head_dim", "intermediate_size", "moe_intermediate_size",
          "num_experts", "num_experts_per_tok", "num_shared_experts", "first_k_dense_replace",
          "moe_layer_freq", "n_group", "topk_group", "max_position_embeddings",
          "tie_word_embeddings", "gated_mlp", "mlp_bias", "norm_type", "position_embedding_type",
          "attention_bias", "attention_out_bias", "qk_norm", "attention_sinks",
          "sliding_window", "layer_types", "router_bias", "shared_expert_gate", "q_lora_rank",
          "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim",
          "num_nextn_predict_layers", "unsupported_fields")

_RUNNER = r"""
const TF = require(process.env.TF_CALC);
const inp = JSON.parse(require("fs").readFileSync(0, "utf8"));
TF.T = inp.tables;
const out = inp.cases.map(function (k) {
  try {
    const kw = TF.parseHF(k.hf, inp.tables);
    const c = TF.checkConfig(Object.assign({}, kw));
    const r = {fields: c};
    if (k.settings) {
      r.numbers = TF.numbers(c, inp.hardware[k.settings.hw], k.settings);
      r.printed = {};
      for (const key in r.numbers) {
        const v = r.numbers[key];
        if (typeof v !== "number") continue;
        r.printed[key] = key.endsWith("_s") ? TF.fmtTime(v) : TF.fmtSI(v, "");
      }
    }
    return r;
  } catch (e) { return {error: String(e.message)}; }
});
process.stdout.write(JSON.stringify(out));
"""


def run_js(cases: list) -> list:
    """Each case ``{"hf": dict, "settings": dict | None}`` through the page's JavaScript."""
    from tokenflow.viz.model_page import _hardware
    assert NODE, "node is needed (make widget-js installs nodejs in CI)"
    inp = json.dumps(dict(tables=page_tables(), hardware=_hardware(), cases=cases))
    res = subprocess.run([NODE, "-e", _RUNNER], input=inp, capture_output=True, text=True,
                         timeout=300, env={**os.environ, "TF_CALC": str(CALC)})
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def _close(a, b) -> bool:
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (a, b)):
        return a == b
    return abs(a - b) <= 1e-9 * max(abs(a), abs(b)) or a == b


def _check_case(hf: dict, js: dict, s: dict | None, where: str) -> int:
    """Compare one JS result with Python; returns how many numbers were compared."""
    c = ModelConfig(**parse_hf_config(hf, allow_unsupported=True))
    assert "error" not in js, f"{where}: JS raised {js.get('error')}"
    for f in FIELDS:
        py, got = getattr(c, f), js["fields"].get(f)
        py = list(py) if isinstance(py, tuple) else py
        assert _close(py, got), f"{where}: field {f}: Python {py!r}, JS {got!r}"
    if s is None:
        return 0
    py = page_numbers(c, s["hw"], s["precision"], s["batch"], s["context"], s["tp"], s["ep"])
    n = 0
    for k, v in py.items():
        assert _close(v, js["numbers"][k]), f"{where} {s}: {k}: Python {v!r}, JS " \
            f"{js['numbers'][k]!r}"
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            text = fmt_time(v) if k.endswith("_s") else fmt_si(v, "")
            assert text == js["printed"][k], f"{where} {s}: {k} printed {js['printed'][k]!r}, " \
                f"Python prints {text!r}"
            n += 1
    return n


def _settings(rng: random.Random, c: ModelConfig) -> dict:
    """A random setting of the page's controls that the Python functions accept for ``c``."""
    tps = [t for t in (1, 2, 4, 8, 16) if c.num_attention_heads % t == 0 and (
        c.is_mla or c.num_key_value_heads % t == 0 or t % c.num_key_value_heads == 0)]
    eps = [e for e in (1, 2, 4, 8, 16, 32, 64, 128, 256)
           if (c.num_experts == 0 or c.num_experts % e == 0) and (e % 8 == 0 or 8 % e == 0)]
    return dict(hw=rng.choice(HARDWARE), precision=rng.choice(sorted(PRECISIONS)),
                batch=rng.choice([1, 2, 8, 32, 64, 128, 256, 1024]),
                context=rng.choice([1, 2, 17, 512, 4096, 4989, 32768, 131072]),
                tp=rng.choice(tps), ep=rng.choice(eps if c.num_experts else [1]))


def test_every_bundled_config_reads_and_counts_as_in_python():
    rng = random.Random(0)
    cases, where = [], []
    for name, hf in bundled_hf_configs().items():
        kw = parse_hf_config(hf, allow_unsupported=True)
        c = ModelConfig(**kw)
        for _ in range(1 if kw["unsupported_fields"] else 12):
            cases.append(dict(hf=hf, settings=None if kw["unsupported_fields"] else
                              _settings(rng, c)))
            where.append(name)
    res = run_js(cases)
    compared = sum(_check_case(k["hf"], r, k["settings"], w)
                   for k, r, w in zip(cases, res, where))
    assert compared > 1000


def test_the_tiny_entry_is_the_books_model():
    from tokenflow.analysis.costmodel import param_count
    from tokenflow.interop.checkpoint import _data_path, load_model
    from tokenflow.viz.model_page import TINY_NAME
    c = ModelConfig(**parse_hf_config(bundled_hf_configs()[TINY_NAME]))
    assert param_count(c) == sum(p.numel() for p in load_model(
        _data_path("tiny.safetensors")).parameters())


def _random_hf(rng: random.Random) -> dict:
    """A random valid HF config of a random family the parser reads."""
    mt = rng.choice(["llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe",
                     "deepseek_v3", "gpt_oss", "gpt2"])
    nh = rng.choice([4, 8, 16, 32, 64, 128])
    nkv = rng.choice([d for d in (1, 2, 4, 8, nh) if nh % d == 0])
    D = rng.choice([64, 128])
    H = rng.choice([256, 1024, 2048, 4096, 7168])
    L = rng.randint(1, 64)
    d = dict(model_type=mt, vocab_size=rng.randint(1000, 260000), hidden_size=H,
             num_hidden_layers=L, num_attention_heads=nh, num_key_value_heads=nkv,
             head_dim=D, intermediate_size=rng.choice([512, 2048, 11008, 18432]),
             tie_word_embeddings=rng.random() < 0.3)
    if mt == "gpt2":
        return dict(model_type="gpt2", vocab_size=d["vocab_size"], n_embd=nh * D, n_layer=L,
                    n_head=nh, n_positions=rng.choice([1024, 2048]))
    if mt in ("mistral", "mixtral", "gpt_oss") and rng.random() < 0.6:
        d["sliding_window"] = rng.choice([128, 4096])
    if mt in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe") and rng.random() < 0.4:
        d.update(use_sliding_window=True, sliding_window=rng.choice([512, 4096]),
                 max_window_layers=rng.randint(0, L))
    if mt in ("mixtral", "gpt_oss"):
        d["num_local_experts"] = rng.choice([8, 16, 32, 128])
        d["num_experts_per_tok"] = rng.choice([1, 2, 4])
    if mt in ("qwen2_moe", "qwen3_moe"):
        E = rng.choice([8, 60, 64, 128])
        d.update(num_experts=E, num_experts_per_tok=rng.choice([1, 2, 4, 8]),
                 moe_intermediate_size=rng.choice([256, 768, 1408]))
        d["mlp_only_layers"] = list(range(rng.randint(0, min(2, L - 1))))
        if mt == "qwen2_moe":
            d["shared_expert_intermediate_size"] = d["moe_intermediate_size"] * rng.choice(
                [0, 1, 4])
    if mt == "deepseek_v3":
        E = rng.choice([64, 256])
        ng = rng.choice([1, 8])
        d = dict(d, n_routed_experts=E, num_experts_per_tok=rng.choice([6, 8]),
                 n_shared_experts=rng.choice([0, 1, 2]), n_group=ng,
                 topk_group=rng.choice([1, 4]) if ng > 1 else 1,
                 moe_intermediate_size=rng.choice([1024, 2048]),
                 first_k_dense_replace=rng.randint(0, min(3, L)),
                 kv_lora_rank=rng.choice([256, 512]), q_lora_rank=rng.choice([None, 1536]),
                 qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128)
        d.pop("head_dim")
        d.pop("num_key_value_heads")
        if d["topk_group"] * (E // ng) < d["num_experts_per_tok"]:
            d["topk_group"] = ng
    return d


def test_hundreds_of_random_configs_and_settings_agree():
    rng = random.Random(36)
    cases = []
    while len(cases) < 400:
        hf = _random_hf(rng)
        try:
            c = ModelConfig.from_hf_config(hf)
        except ValueError:
            continue
        cases.append(dict(hf=hf, settings=_settings(rng, c)))
    res = run_js(cases)
    compared = sum(_check_case(k["hf"], r, k["settings"], k["hf"]["model_type"])
                   for k, r in zip(cases, res))
    assert compared > 400 * 20


@pytest.mark.parametrize("hf, field", [
    ({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
      "num_hidden_layers": 2, "vocab_size": 100, "intermediate_size": 128,
      "my_new_router": 3}, "my_new_router"),
    ({"model_type": "deepseek_v3", "scoring_func": "sqrtsoftplus"}, "scoring_func"),
])
def test_fields_it_cannot_express_are_listed_by_both(hf, field):
    py = parse_hf_config(hf, allow_unsupported=True)["unsupported_fields"]
    js = run_js([dict(hf=hf, settings=None)])[0]["fields"]["unsupported_fields"]
    assert field in py and list(py) == js


@pytest.mark.parametrize("hf, words", [
    ({"model_type": "bert"}, "model_type 'bert'"),
    ({"hidden_size": 64, "num_attention_heads": 4, "vocab_size": 10}, "num_hidden_layers"),
    ({"model_type": "llama", "hidden_size": 60, "num_attention_heads": 8, "num_hidden_layers": 2,
      "vocab_size": 100}, "head_dim"),
    ({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
      "num_key_value_heads": 3, "num_hidden_layers": 2, "vocab_size": 100},
     "num_key_value_heads"),
])
def test_configs_it_cannot_read_get_a_message_naming_the_field(hf, words):
    r = run_js([dict(hf=hf, settings=dict(hw="H800", precision="bf16", batch=1, context=8,
                                          tp=1, ep=1))])[0]
    assert words in r["error"]
    with pytest.raises((ValueError, TypeError, KeyError)):
        ModelConfig.from_hf_config(hf)


def test_a_change_on_one_side_fails(monkeypatch):
    """The harness can fail: a Python side that counts one more norm per layer disagrees."""
    from tokenflow.analysis import params
    hf = bundled_hf_configs()["Llama-3-8B"]
    s = dict(hw="H800", precision="bf16", batch=8, context=4096, tp=1, ep=1)
    js = run_js([dict(hf=hf, settings=s)])[0]
    real = params._norm_params
    monkeypatch.setattr(params, "_norm_params", lambda c, w: real(c, w) + 1)
    with pytest.raises(AssertionError, match="params_total"):
        _check_case(hf, js, s, "Llama-3-8B")


def test_fmt_si_keeps_three_significant_digits():
    assert [fmt_si(x, "B") for x in (0, 999.4, 999.6, 1234, 37.44e9, 1.0e15)] == \
        ["0 B", "999 B", "1.00 kB", "1.23 kB", "37.4 GB", "1.00 PB"]
    assert [fmt_time(x) for x in (2.5, 0.0123, 4.2e-5)] == ["2.50 s", "12.3 ms", "42.0 \u00b5s"]


def test_the_page_embeds_every_bundled_model_and_both_scripts():
    page = model_page()._repr_html_()
    for name in bundled_hf_configs():
        assert json.dumps(name) in page
    assert "TokenflowModelCalc" in page and "TokenflowModelPage" in page
    with pytest.raises(ValueError, match="default"):
        model_page("GPT-5")


# Unit boundaries, where rounding to 3 significant digits moves a number to the next unit.
_TIME_EDGES = [(0.9994, "999 ms"), (0.9996, "1.00 s"), (0.0009994, "999 \u00b5s"),
               (0.0009996, "1.00 ms"), (0.0123, "12.3 ms"), (9.9996e-7, "1.00 \u00b5s"),
               (0.0, "0 s"), (1234.5, "1235 s")]
_SI_EDGES = [(999.4, "999 B"), (999.6, "1.00 kB"), (999_449.0, "999 kB"),
             (999_600.0, "1.00 MB"), (0.0, "0 B")]


@pytest.mark.skipif(not NODE, reason="node is needed")
def test_units_switch_where_rounding_reaches_1000_in_js_and_python():
    """Just under a unit boundary a value prints in the smaller unit; from where its 3-digit
    rounding reaches 1000 it prints as 1.00 of the next unit, in the page and in Python."""
    js = (f"const TF = require(process.env.TF_CALC);"
          f"process.stdout.write(JSON.stringify([{[v for v, _ in _TIME_EDGES]}.map(TF.fmtTime),"
          f"{[v for v, _ in _SI_EDGES]}.map(v => TF.fmtSI(v, 'B'))]));")
    res = subprocess.run([NODE, "-e", js], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "TF_CALC": str(CALC)})
    assert res.returncode == 0, res.stderr
    times, sis = json.loads(res.stdout)
    assert times == [want for _, want in _TIME_EDGES]
    assert sis == [want for _, want in _SI_EDGES]
    assert [fmt_time(v) for v, _ in _TIME_EDGES] == [want for _, want in _TIME_EDGES]
    assert [fmt_si(v, "B") for v, _ in _SI_EDGES] == [want for _, want in _SI_EDGES]


# Bytes print in binary units, as everywhere else in the book: 70,272 B (Llama-3-8B's KV bytes
# per token) is 68.625 KiB, 229,376 B (224 KiB exactly) is what chapter 3's figure shows.
_BYTE_EDGES = [(0.0, "0 B"), (999.0, "999 B"), (70_272.0, "68.6 KiB"), (229_376.0, "224 KiB"),
               (1023.4, "1023 B"), (1023.6, "1.00 KiB"), (80e9, "74.5 GiB"),
               (2.0**30, "1.00 GiB")]


def test_fmt_bytes_uses_binary_units_in_python_and_js():
    assert [fmt_bytes(v) for v, _ in _BYTE_EDGES] == [want for _, want in _BYTE_EDGES]
    if not NODE:
        pytest.skip("node is needed for the page's half")
    js = (f"const TF = require(process.env.TF_CALC);"
          f"process.stdout.write(JSON.stringify({[v for v, _ in _BYTE_EDGES]}.map(TF.fmtBytes)));")
    res = subprocess.run([NODE, "-e", js], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "TF_CALC": str(CALC)})
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == [want for _, want in _BYTE_EDGES]


def test_the_page_prints_no_decimal_byte_units():
    """Every byte amount on the page goes through fmtBytes: no fmtSI(..., "B") is left."""
    import re
    for path in (CALC, CALC.parent / "model_page.js"):
        assert not re.search(r'fmtSI\([^)]*"B"\)', path.read_text(encoding="utf-8")), path
