"""The model page (tokenflow.viz.model_page) in headless Chromium, opened from ``file://`` with
every network request blocked, in both editions (the document's ``lang``): pick models, paste
configs (valid, with a field the cost model cannot express, broken), move the controls; every
displayed number must be the Python value as the page prints it; no console error; the page
fits 1280 and 390 px. The built book's chapter 7 is checked by tests/test_browser.py."""
from __future__ import annotations

import json

import pytest

from tokenflow.analysis.costmodel import reference_config
from tokenflow.model.config import ModelConfig
from tokenflow.viz.model_page import fmt_bytes, fmt_si, fmt_time, model_page, page_numbers

UNITS = {"kv_bytes_per_token": "B", "weights_tp": "B", "weights_ep": "B",
         "weights_replicated": "B", "weights": "B", "kv_cache": "B", "memory_used": "B",
         "memory_budget": "B", "params_total": "", "params_active": "",
         "prefill_tokens_per_s": "tok/s", "decode_tokens_per_s": "tok/s"}


@pytest.fixture(scope="module", params=["en", "zh-CN"])
def page(browser, tmp_path_factory, request):
    path = tmp_path_factory.mktemp("mp") / "model_page.html"
    path.write_text(f'<!doctype html><html lang="{request.param}"><head><meta charset="utf-8">'
                    '<meta name="viewport" content="width=device-width"></head><body>'
                    f'{model_page()._repr_html_()}</body></html>', encoding="utf-8")
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = ctx.new_page()
    log = {"errors": [], "blocked": []}
    pg.on("console", lambda m: m.type == "error" and log["errors"].append(m.text))
    pg.on("pageerror", lambda e: log["errors"].append(str(e)))
    pg.on("request", lambda r: not r.url.startswith(("file:", "data:")) and
          log["blocked"].append(r.url))
    pg.goto(path.as_uri())
    yield pg, log, request.param
    ctx.close()


def shown(pg) -> dict:
    return pg.evaluate("""() => Object.fromEntries([...document.querySelectorAll(
        '.tf-model-page [data-k]')].map(e => [e.dataset.k, e.textContent]))""")


def expect(config, hw, precision, batch, context, tp, ep) -> dict:
    """What the page must print, from the Python definitions."""
    r = page_numbers(config, hw, precision, batch, context, tp, ep)
    out = {k: fmt_bytes(r[k]) if u == "B" else fmt_si(r[k], u) for k, u in UNITS.items()}
    for ph in ("prefill", "decode"):
        for k in ("compute_s", "memory_s", "scale_up_s", "scale_out_s", "step_s"):
            out[f"{ph}_{k}"] = fmt_time(r[f"{ph}_{k}"])
    out["max_batch"] = f"{r['max_batch']:,}"
    out["ridge"] = fmt_si(r["ridge"], "")
    for ph in ("prefill", "decode"):
        out[f"{ph}_intensity"] = fmt_si(r[f"{ph}_intensity"], "")
    out["vocab_logits"] = f"{config.vocab_size:,}"
    return out, r


def set_controls(pg, **values):
    for k, v in values.items():
        loc = pg.locator(f'.tf-model-page [data-ctl="{k}"]')
        if k in ("batch", "context"):
            loc.fill(str(v))
        else:
            loc.select_option(str(v))


def check(pg, config, hw, precision, batch, context, tp, ep):
    want, r = expect(config, hw, precision, batch, context, tp, ep)
    got = shown(pg)
    wrong = {k: (got.get(k), v) for k, v in want.items() if got.get(k) != v}
    assert not wrong, f"shown vs Python: {wrong}"
    return r


def test_models_and_controls_show_the_python_values(page):
    pg, log, lang = page
    ds = reference_config("DeepSeek-V3")
    check(pg, ds, "H800", "fp8", 64, 4096, 1, 32)            # the first setting
    for model, hw, prec, b, ctx, tp, ep in [
            ("DeepSeek-V3", "H200", "fp8", 88, 4989, 1, 128),
            ("DeepSeek-V3", "H800", "bf16", 8, 32768, 8, 256),
            ("Mixtral-8x7B", "H100", "bf16", 16, 8192, 2, 8),
            ("Llama-3-8B", "H100", "bf16", 1, 1, 1, 1),
            ("gpt-oss-120b", "H200", "fp8", 32, 131072, 4, 16),
            ("GPT-3-175B", "H100", "bf16", 4, 2048, 8, 1)]:
        set_controls(pg, model=model, hardware=hw, precision=prec, batch=b, context=ctx,
                     tp=tp, ep=ep)
        check(pg, reference_config(model), hw, prec, b, ctx, tp, ep)
    assert not log["errors"] and not log["blocked"], log


def test_decode_binding_resource_is_named(page):
    pg, log, lang = page
    set_controls(pg, model="DeepSeek-V3", hardware="H800", precision="fp8", batch=88,
                 context=4989, tp=1, ep=128)
    r = check(pg, reference_config("DeepSeek-V3"), "H800", "fp8", 88, 4989, 1, 128)
    names = {"en": {"memory": "memory", "compute": "compute", "scale_out": "InfiniBand",
                    "scale_up": "NVLink"},
             "zh-CN": {"memory": "显存", "compute": "计算", "scale_out": "InfiniBand",
                       "scale_up": "NVLink"}}[lang]
    assert shown(pg)["decode_binding"] == names[r["decode_binding"]]


def test_a_pasted_config_is_read_or_refused_with_the_field_named(page):
    pg, log, lang = page
    hf = {"model_type": "qwen3_moe", "vocab_size": 151936, "hidden_size": 4096,
          "num_hidden_layers": 94, "num_attention_heads": 64, "num_key_value_heads": 4,
          "head_dim": 128, "intermediate_size": 12288, "moe_intermediate_size": 1536,
          "num_experts": 128, "num_experts_per_tok": 8, "max_position_embeddings": 40960}
    paste = pg.locator('.tf-model-page [data-ctl="paste"]')
    read = pg.locator('.tf-model-page [data-ctl="read"]')
    set_controls(pg, model="DeepSeek-V3", hardware="H200", precision="bf16", batch=16,
                 context=8192, tp=4, ep=16)
    paste.fill(json.dumps(hf))
    read.click()
    check(pg, ModelConfig.from_hf_config(hf), "H200", "bf16", 16, 8192, 4, 16)
    assert "8" in shown(pg)["experts_per_token"] and "128" in shown(pg)["experts_per_token"]
    msg = pg.locator(".tf-model-page .tf-mp-msg")
    # a field the cost model cannot express: listed by name, no counts
    paste.fill(json.dumps({**hf, "my_router_temperature": 0.7}))
    read.click()
    assert "my_router_temperature" in msg.inner_text()
    assert "params_total" not in shown(pg) and "vocab_logits" in shown(pg)
    # broken JSON, and a config without a field the shape needs
    paste.fill('{"model_type": "llama", "hidden_size": 4096,')
    read.click()
    assert "JSON" in msg.inner_text() and not shown(pg)
    paste.fill(json.dumps({"hidden_size": 64, "num_attention_heads": 4, "vocab_size": 10}))
    read.click()
    assert "num_hidden_layers" in msg.inner_text()
    # an EP that does not split the experts: the message names the argument, the shapes stay
    paste.fill(json.dumps(hf))
    read.click()
    set_controls(pg, tp=16, ep=16)
    check(pg, ModelConfig.from_hf_config(hf), "H200", "bf16", 16, 8192, 16, 16)
    set_controls(pg, model="Mixtral-8x7B")
    assert "ep_size" in msg.inner_text() and "vocab_logits" in shown(pg)
    set_controls(pg, ep=8, batch=0)
    assert "batch" in msg.inner_text()
    assert not log["errors"] and not log["blocked"], log


@pytest.mark.parametrize("width", [1280, 390])
def test_the_page_fits(page, width):
    pg, log, lang = page
    set_controls(pg, model="DeepSeek-V3", hardware="H800", precision="fp8", batch=64,
                 context=4096, tp=1, ep=32)
    pg.set_viewport_size({"width": width, "height": 900})
    over = pg.evaluate("() => document.documentElement.scrollWidth - window.innerWidth")
    assert over <= 0, f"{width} px: the page scrolls sideways by {over} px"
    pg.set_viewport_size({"width": 1280, "height": 900})


def test_the_chinese_page_writes_no_english_sentence(page):
    """In the Chinese edition every shown text of the page (its lenses, the formula column,
    the formulas and the hardware source line) is Chinese: no run of English prose words
    (tests/test_zh_output_words.py's rule), on every hardware preset."""
    from tokenflow.analysis.roofline import HARDWARE
    from test_zh_output_words import english_runs
    pg, log, lang = page
    if lang != "zh-CN":
        pytest.skip("the English page is English")
    left = []
    for hw in HARDWARE:
        set_controls(pg, model="DeepSeek-V3", hardware=hw, precision="fp8", batch=64,
                     context=4096, tp=1, ep=32)
        left += [(hw, r) for r in english_runs(pg.locator(".tf-model-page").inner_text())]
    assert not left, left
    assert not log["errors"], log
