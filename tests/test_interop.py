"""Ours == Hugging Face transformers, with mapped weights.

Whole models: the dense preset against ``LlamaForCausalLM``, the MoE preset without shared
experts against ``MixtralForCausalLM``, and the book's MoE preset ``tiny`` (dense first layer,
shared expert) against ``Qwen2MoeForCausalLM``. Router / MoE-block level: Mixtral and Qwen2-MoE
softmax routers (with and without renormalisation), DeepSeek-V3's sigmoid router with a
correction bias and group-limited choice. All fp32; "equal" means max abs diff <= 1e-4 for
logits, <= 1e-6 for router weights, and identical ids.
"""
import math
import sys

import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from tokenflow import KVCache, ModelConfig, TokenFlowModel, decode_step, generate, preset
from tokenflow import interop
from tokenflow.model.moe import MoE
from tokenflow.model.rope import rope_inv_freq

ATOL = 1e-4
PROMPTS = ["北京是中国的首", "东京是日本的", "Paris is the capital of", "伦敦在", "The"]


def _random_model(cfg: ModelConfig, seed: int = 0, std: float = 0.08) -> TokenFlowModel:
    """Random weights, wider than the default init so that greedy choices are clear-cut."""
    torch.manual_seed(seed)
    model = TokenFlowModel(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, std)
            else:
                p.uniform_(0.8, 1.2)                                   # RMSNorm weights
    return model


def _no_eos(hf):
    """Let HF generate run the full length, as ours does with ``eos_token_id=None``."""
    hf.generation_config.eos_token_id = None
    return hf


MODELS = {  # id -> (config, expected HF class)
    "dense": (preset("tiny-dense"), "LlamaForCausalLM"),
    "mixtral": (preset("tiny", num_shared_experts=0, first_k_dense_replace=0),
                "MixtralForCausalLM"),
    "tiny": (preset("tiny"), "Qwen2MoeForCausalLM"),
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def pair(request):
    """(ours, hf) with the same random weights."""
    cfg, cls = MODELS[request.param]
    ours = _random_model(cfg, seed=len(request.param))
    hf = _no_eos(interop.to_hf_model(ours))
    assert type(hf).__name__ == cls
    return ours, hf


# ------------------------------------------------------------------ whole model
def test_prefill_and_every_decode_step_match_hf(pair):
    ours, hf = pair
    torch.manual_seed(1)
    B, S, N = 2, 9, 16
    ids = torch.randint(3, ours.config.vocab_size, (B, S))
    cache = KVCache(ours.config, B, S + N)
    with torch.no_grad():
        full = ours(ids, kv_cache=cache)                               # prefill, all positions
        hf_full = hf(ids).logits
        diff = (full - hf_full).abs().max().item()
        assert diff <= ATOL, f"prefill logits differ by {diff}"
        steps, tok = [full[:, -1]], full[:, -1].argmax(-1)
        new = [tok]
        for _ in range(N - 1):
            logits = decode_step(ours, tok, cache)
            tok = logits.argmax(-1)
            steps.append(logits)
            new.append(tok)
        out = hf.generate(ids, max_new_tokens=N, do_sample=False, output_logits=True,
                          return_dict_in_generate=True, pad_token_id=0)
    assert len(out.logits) == N
    for t, (a, b) in enumerate(zip(steps, out.logits)):
        d = (a - b).abs().max().item()
        assert d <= ATOL, f"decode step {t}: logits differ by {d}"
    assert torch.equal(out.sequences[:, S:], torch.stack(new, dim=1))


def test_greedy_ids_equal_hf_generate_for_several_prompts(pretrained):
    """The book's trained tiny model (Qwen2-MoE layout) on real prompts, one at a time."""
    model, tok = pretrained
    hf = _no_eos(interop.to_hf_model(model))
    for text in PROMPTS:
        ids = torch.tensor([tok.encode(text)])
        ours = generate(model, ids, max_new_tokens=12, stop_at_eos=False)
        with torch.no_grad():
            theirs = hf.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=0)
        assert torch.equal(ours, theirs), text
        if text == PROMPTS[0]:
            assert tok.decode(ours[0, ids.shape[1]:ids.shape[1] + 1]) == "都"


def test_left_padded_batch_matches_hf_and_unpadded_rows(pretrained):
    """RoPE positions count from each row's first real token. RoPE is relative, so a constant
    shift of a row's positions would not change its logits: the positions themselves are
    compared too (ours, from the model's rotary module, vs HF generate's ``position_ids``,
    which are ``cumsum(attention_mask) - 1``), at every forward of the generation."""
    model, tok = pretrained
    hf = _no_eos(interop.to_hf_model(model))
    ids, mask = tok.batch_encode(PROMPTS)
    assert (mask == 0).any()
    real = mask.bool()
    pos = interop.hf_position_ids(mask)
    with torch.no_grad():
        ours = model(ids, attention_mask=mask)
        theirs = hf(ids, attention_mask=mask, position_ids=pos).logits
        d = (ours - theirs)[real].abs().max().item()
        assert d <= ATOL, f"left-padded logits differ by {d} at real positions"
        for b, text in enumerate(PROMPTS):                             # == each row alone
            alone = model(torch.tensor([tok.encode(text)]))[0]
            d = (ours[b][real[b]] - alone).abs().max().item()
            assert d <= ATOL, f"row {b}: padded vs alone differ by {d}"

    seen = {"ours": [], "hf": []}
    h1 = model.rotary.register_forward_hook(
        lambda m, args, out: seen["ours"].append(args[0].clone()))
    h2 = hf.model.rotary_emb.register_forward_hook(
        lambda m, args, kwargs, out: seen["hf"].append(
            kwargs.get("position_ids", args[-1]).clone()),
        with_kwargs=True)
    try:
        a = generate(model, ids, max_new_tokens=10, attention_mask=mask, stop_at_eos=False)
        with torch.no_grad():
            b = hf.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False,
                            pad_token_id=0)
    finally:
        h1.remove(), h2.remove()
    assert torch.equal(a, b)
    assert len(seen["ours"]) == len(seen["hf"]) == 10
    for step, (p, q) in enumerate(zip(seen["ours"], seen["hf"])):
        if step == 0:
            assert torch.equal(p[real], q[real]) and torch.equal(p, pos)
        else:
            assert torch.equal(p, q), f"decode step {step}: positions {p} vs HF {q}"
    assert seen["ours"][-1][:, 0].tolist() == (mask.sum(1) + 8).tolist()


def test_hf_to_ours_round_trip(pair):
    ours, hf = pair
    back = interop.from_hf_model(hf)
    for (k, v), (k2, v2) in zip(ours.state_dict().items(), back.state_dict().items()):
        assert k == k2 and torch.equal(v, v2), k
    cfg = interop.from_hf_config(interop.to_hf_config(ours.config))
    c = ours.config
    keep = ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "num_experts", "max_position_embeddings",
            "rope_theta", "rms_norm_eps", "tie_word_embeddings", "pad_token_id",
            "bos_token_id", "eos_token_id"]
    if c.is_moe:
        keep += ["moe_intermediate_size", "num_experts_per_tok", "num_shared_experts",
                 "first_k_dense_replace", "norm_topk_prob", "scoring_func"]
    if c.first_k_dense_replace or not c.is_moe:
        keep.append("intermediate_size")
    assert {k: getattr(cfg, k) for k in keep} == {k: getattr(c, k) for k in keep}


def test_tied_embeddings_map():
    ours = _random_model(preset("tiny-dense", tie_word_embeddings=True))
    hf = interop.to_hf_model(ours)
    ids = torch.randint(3, 512, (1, 6))
    with torch.no_grad():
        assert (ours(ids) - hf(ids).logits).abs().max() <= ATOL


# ------------------------------------------------------------------ routers and MoE blocks
def _moe_cfg(**kw) -> ModelConfig:
    base = dict(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                num_key_value_heads=2, moe_intermediate_size=16, num_experts=8,
                num_experts_per_tok=2, num_shared_experts=1)
    base.update(kw)
    return ModelConfig(**base)


def _sorted_route(indices, weights):
    """Order each token's K choices by expert id (HF's DeepSeek router uses sorted=False)."""
    idx, order = indices.sort(dim=-1)
    return idx, weights.gather(1, order)


def _block(cfg: ModelConfig, arch: str, bias: torch.Tensor | None = None, seed: int = 0):
    """Our MoE with wide random weights and the HF block with the same weights."""
    torch.manual_seed(seed)
    moe = MoE(cfg).eval()
    with torch.no_grad():
        for p in moe.parameters():
            p.normal_(0.0, 0.3)
        if bias is not None:
            moe.gate.e_score_correction_bias.copy_(bias)
    hf_cfg = interop.to_hf_config(cfg, arch)
    mod = {"mixtral": "mixtral.modeling_mixtral.MixtralSparseMoeBlock",
           "qwen2_moe": "qwen2_moe.modeling_qwen2_moe.Qwen2MoeSparseMoeBlock",
           "deepseek_v3": "deepseek_v3.modeling_deepseek_v3.DeepseekV3MoE"}[arch]
    module, cls = mod.rsplit(".", 1)
    import importlib
    block_cls = getattr(importlib.import_module(f"transformers.models.{module}"), cls)
    hf_cfg._experts_implementation = "eager"
    hf = block_cls(hf_cfg).eval()
    interop.moe_to_hf(moe, hf)
    return moe, hf


ROUTERS = {
    "mixtral-softmax-renorm": (dict(num_shared_experts=0), "mixtral", None),
    "qwen-softmax-renorm": (dict(norm_topk_prob=True), "qwen2_moe", None),
    "qwen-softmax-no-renorm": (dict(norm_topk_prob=False, num_experts_per_tok=3),
                               "qwen2_moe", None),
    # DeepSeek-V3: sigmoid, selection-only bias, 4 groups keep 2, scaled by 2.5.
    "deepseek-groups-bias": (dict(scoring_func="sigmoid", n_group=4, topk_group=2,
                                  routed_scaling_factor=2.5, num_shared_experts=2),
                             "deepseek_v3", torch.linspace(0.0, 0.4, 8)),
    "deepseek-no-renorm": (dict(scoring_func="sigmoid", n_group=2, topk_group=1,
                                norm_topk_prob=False, num_experts_per_tok=3),
                           "deepseek_v3", torch.tensor([.3, 0, .1, .2, 0, .05, .3, .1])),
    # A negative bias can make a kept expert's biased score < 0. transformers 5.x fills the
    # dropped groups with -inf, as we do (older releases filled 0.0, which could then pick a
    # dropped expert); the positive-bias cases above are safe under both conventions.
    "deepseek-negative-bias": (dict(scoring_func="sigmoid", n_group=4, topk_group=2),
                               "deepseek_v3", torch.full((8,), -0.9)),
}


@pytest.mark.parametrize("name", sorted(ROUTERS))
def test_router_and_moe_block_match_hf(name):
    kw, arch, bias = ROUTERS[name]
    cfg = _moe_cfg(**kw)
    moe, hf = _block(cfg, arch, bias)
    torch.manual_seed(3)
    x = torch.randn(2, 40, cfg.hidden_size)
    with torch.no_grad():
        idx, w, logits = moe.gate(x.reshape(-1, cfg.hidden_size))
        hf_logits, hf_w, hf_idx = hf.gate(x.reshape(-1, cfg.hidden_size))
        a, b = _sorted_route(idx, w), _sorted_route(hf_idx, hf_w)
        assert torch.equal(a[0], b[0]), f"{name}: chosen experts differ"
        assert (a[1] - b[1]).abs().max() <= 1e-6, f"{name}: router weights differ"
        assert (logits - hf_logits).abs().max() <= 1e-5
        if cfg.norm_topk_prob:
            torch.testing.assert_close(w.sum(-1), torch.full((80,), cfg.routed_scaling_factor))
        out, hf_out = moe(x), hf(x)
    d = (out - hf_out).abs().max().item()
    assert d <= ATOL, f"{name}: MoE block outputs differ by {d}"
    assert out.abs().max() > 0.1                                        # not trivially zero


def test_groups_change_the_choice():
    """The group-limited case really restricts the choice (the test above can fail)."""
    cfg = _moe_cfg(scoring_func="sigmoid", n_group=4, topk_group=1, num_experts_per_tok=2)
    moe, _ = _block(cfg, "deepseek_v3", torch.zeros(8))
    x = torch.randn(64, cfg.hidden_size)
    with torch.no_grad():
        idx, _, _ = moe.gate(x)
        plain = (x @ moe.gate.weight.t()).sigmoid().topk(2, dim=-1).indices
    assert (idx // 2 == idx[:, :1] // 2).all()                          # one group per token
    assert not torch.equal(idx.sort(-1).values, plain.sort(-1).values)


def test_moe_from_hf_round_trip():
    cfg = _moe_cfg(norm_topk_prob=False)
    moe, hf = _block(cfg, "qwen2_moe")
    back = MoE(cfg).eval()
    interop.moe_from_hf(hf, back)
    for (k, v), (k2, v2) in zip(moe.state_dict().items(), back.state_dict().items()):
        assert k == k2 and torch.equal(v, v2), k
    with torch.no_grad():
        hf.shared_expert_gate.weight.fill_(0.1)
    with pytest.raises(ValueError, match="shared_expert_gate"):
        interop.moe_from_hf(hf, back)


# ------------------------------------------------------------------ configs and errors
def test_architecture_choice_and_errors():
    assert interop.hf_architecture(preset("tiny-dense")) == "llama"
    assert interop.hf_architecture(preset("small-moe")) == "mixtral"
    assert interop.hf_architecture(preset("tiny")) == "qwen2_moe"
    with pytest.raises(ValueError, match="DeepseekV3MoE"):
        interop.hf_architecture(preset("tiny", scoring_func="sigmoid"))
    with pytest.raises(ValueError, match="no dense first layers"):
        interop.hf_architecture(preset("tiny", num_shared_experts=0))
    with pytest.raises(ValueError, match="renormalises"):
        interop.hf_architecture(preset("tiny", num_shared_experts=0, first_k_dense_replace=0,
                                       norm_topk_prob=False))
    with pytest.raises(ValueError, match="shared experts"):
        interop.to_hf_config(preset("tiny"), "mixtral")
    with pytest.raises(ValueError, match="architecture must be one of"):
        interop.to_hf_config(preset("tiny"), "gpt2")
    with pytest.raises(ValueError, match="dense"):
        interop.to_hf_config(preset("tiny-dense"), "mixtral")
    with pytest.raises(ValueError, match="deepseek_v3: DeepSeek-V3 routes with sigmoid"):
        interop.state_dict_to_hf(TokenFlowModel(preset("tiny")), architecture="deepseek_v3")
    with pytest.raises(ValueError, match="needs MLA attention"):
        interop.state_dict_to_hf(TokenFlowModel(preset("tiny", scoring_func="sigmoid")),
                                 architecture="deepseek_v3")
    moe = MoE(_moe_cfg(scoring_func="sigmoid"))
    hf_cfg = interop.to_hf_config(_moe_cfg(num_shared_experts=0), "mixtral")
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
    with pytest.raises(ValueError, match="sigmoid"):
        interop.moe_to_hf(moe, MixtralSparseMoeBlock(hf_cfg))
    with pytest.raises(ValueError, match="MixtralSparseMoeBlock"):
        interop.moe_to_hf(moe, torch.nn.Linear(2, 2))


def test_from_hf_config_reads_rope_parameters_and_rejects_others():
    hf = interop.to_hf_config(preset("tiny-dense", rope_theta=5e5))
    assert hf.rope_parameters["rope_theta"] == 5e5
    assert interop.from_hf_config(hf).rope_theta == 5e5
    d = hf.to_dict()
    d["rope_parameters"] = {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 4.0}
    with pytest.raises(ValueError, match="rope_type 'dynamic'"):
        interop.from_hf_config(d)
    q = interop.to_hf_config(preset("tiny")).to_dict()
    q["shared_expert_intermediate_size"] = 100
    with pytest.raises(ValueError, match="multiple"):
        interop.from_hf_config(q)
    q = interop.to_hf_config(preset("tiny")).to_dict()
    q["mlp_only_layers"] = [1]
    with pytest.raises(ValueError, match="first k layers dense"):
        interop.from_hf_config(q)


def test_from_hf_model_rejects_biases():
    cfg = preset("tiny-dense")
    hf_cfg = interop.to_hf_config(cfg)
    hf_cfg.attention_bias = True
    hf = transformers.LlamaForCausalLM(hf_cfg)
    with torch.no_grad():
        hf.model.layers[0].self_attn.q_proj.bias.fill_(0.5)
    with pytest.raises(ValueError, match="bias"):
        interop.from_hf_model(hf)


def test_package_imports_without_transformers(monkeypatch):
    """transformers is a test dependency: no tokenflow module imports it at module level
    (checked on the source), and interop imports and answers with it blocked."""
    import ast
    import importlib
    from pathlib import Path

    import tokenflow
    for path in Path(tokenflow.__file__).parent.glob("*.py"):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.split(".")[0] == "transformers" for n in names), path.name
    monkeypatch.setitem(sys.modules, "transformers", None)
    monkeypatch.delitem(sys.modules, "tokenflow.interop")
    fresh = importlib.import_module("tokenflow.interop")
    assert fresh.hf_architecture(preset("tiny")) == "qwen2_moe"
    sd = fresh.state_dict_to_hf(TokenFlowModel(preset("tiny")))        # pure tensor work
    assert sd["model.layers.1.mlp.experts.gate_up_proj"].shape == (8, 256, 128)
    with pytest.raises(ImportError):
        fresh.to_hf_config(preset("tiny"))


# ------------------------------------------------------------------ RoPE settings (R1 item 3)
ROPE_KINDS = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 4.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
             "beta_fast": 32, "beta_slow": 1},
}


@pytest.mark.parametrize("kind", sorted(ROPE_KINDS))
def test_rope_kinds_equal_hf(kind):
    """Each RoPE kind, as HF's config spells it, parses back to ours, gives HF's cos/sin
    tables, and a whole Llama model with it equals LlamaForCausalLM."""
    cfg = preset("tiny-dense", rope_theta=5e5, rope_scaling=ROPE_KINDS[kind])
    ours = _random_model(cfg)
    hf = interop.to_hf_model(ours)
    assert hf.config.rope_parameters["rope_type"] == kind
    back = ModelConfig.from_hf_config(hf.config)
    assert (back.rope_theta, back.rope_scaling) == (cfg.rope_theta, cfg.rope_scaling)
    pos = torch.arange(cfg.max_position_embeddings)[None]
    x = torch.zeros(1, 1, dtype=torch.float32)
    hf_cos, hf_sin = hf.model.rotary_emb(x, pos)                        # [1, P, D]
    cos, sin = ours.rotary(pos)                                         # [1, 1, P, D]
    torch.testing.assert_close(cos[:, 0], hf_cos, atol=1e-6, rtol=0)
    torch.testing.assert_close(sin[:, 0], hf_sin, atol=1e-6, rtol=0)
    ids = torch.randint(3, 512, (2, 40))
    with torch.no_grad():
        assert (ours(ids) - hf(ids).logits).abs().max() <= ATOL
    if kind != "default":                                               # the scaling matters
        plain = TokenFlowModel(cfg.replace(rope_scaling=None))
        assert not torch.allclose(plain.rotary.cos, ours.rotary.cos, atol=1e-3)


def test_rope_theta_and_type_in_both_spellings():
    base = interop.to_hf_config(preset("tiny-dense")).to_dict()
    for k in ("rope_parameters", "rope_scaling", "rope_theta"):
        base.pop(k, None)
    new = dict(base, rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
    old = dict(base, rope_theta=500000.0)
    assert ModelConfig.from_hf_config(new).rope_theta == 500000.0
    assert ModelConfig.from_hf_config(old) == ModelConfig.from_hf_config(new)
    assert ModelConfig.from_hf_config(base).rope_theta == 10000.0
    yarn = {"factor": 4.0, "original_max_position_embeddings": 32, "beta_fast": 32,
            "beta_slow": 1}
    new = dict(base, rope_parameters={"rope_type": "yarn", "rope_theta": 5e4, **yarn})
    old = dict(base, rope_theta=5e4, rope_scaling={"type": "yarn", **yarn})
    a, b = ModelConfig.from_hf_config(new), ModelConfig.from_hf_config(old)
    assert a == b and a.rope_theta == 5e4 and a.rope_scaling == {"rope_type": "yarn", **yarn}
    for bad in ({"rope_type": "dynamic", "factor": 2.0}, {"type": "longrope"},
                {"rope_type": "su"}):
        with pytest.raises(ValueError, match="rope_type"):
            ModelConfig.from_hf_config(dict(base, rope_scaling=bad))
    with pytest.raises(ValueError, match="rope_scaling\\['factor'\\]"):
        preset("tiny-dense", rope_scaling={"rope_type": "linear"})
    with pytest.raises(ValueError, match="rope_scaling\\['factor'\\]"):
        preset("tiny-dense", rope_scaling={"rope_type": "linear", "factor": 0.5})


def test_one_hf_config_parser():
    """interop's parser is ModelConfig's: the two cannot disagree."""
    assert interop.from_hf_config == ModelConfig.from_hf_config
    for cfg in (preset("tiny"), preset("small-moe"), preset("tiny-dense", rope_theta=5e5)):
        hf = interop.to_hf_config(cfg)
        assert interop.from_hf_config(hf) == ModelConfig.from_hf_config(hf.to_dict())


# ------------------------------------------------------------------ a missing LM head (R1 item 7)
def test_untied_state_dict_without_lm_head_raises():
    cfg = preset("tiny-dense")
    sd = interop.state_dict_to_hf(TokenFlowModel(cfg))
    del sd["lm_head.weight"]
    with pytest.raises(ValueError, match="lm_head.weight"):
        interop.state_dict_from_hf(sd, cfg)
    # transformers agrees that the weight is missing
    hf = transformers.LlamaForCausalLM(interop.to_hf_config(cfg))
    missing, _ = hf.load_state_dict(sd, strict=False)
    assert missing == ["lm_head.weight"]
    tied = cfg.replace(tie_word_embeddings=True)
    out = interop.state_dict_from_hf(sd, tied)                          # tied: fine
    assert out["lm_head.weight"] is out["embed_tokens.weight"]


# ---- found by planting bugs (R1 review): each test names a neighbour the suite missed
@pytest.mark.parametrize("lo,hi", [(1.0, 4.0), (2.0, 8.0)])
def test_llama3_inv_freq_with_a_medium_band_equals_hf(lo, hi):
    """The shared tiny-dense llama3 case has no frequency in the smoothed band (wavelengths
    between old/hi and old/lo); this config has several, so the ramp is compared with HF."""
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": lo,
               "high_freq_factor": hi, "original_max_position_embeddings": 128}
    cfg = preset("tiny-dense", hidden_size=128, num_attention_heads=2, num_key_value_heads=1,
                 rope_theta=5e5, max_position_embeddings=512, rope_scaling=scaling)
    d = cfg.head_dim
    wavelen = [2 * math.pi * cfg.rope_theta ** (2 * i / d) for i in range(d // 2)]
    medium = [w for w in wavelen if 128 / hi < w < 128 / lo]
    assert len(medium) >= 2 and any(w > 128 / lo for w in wavelen)      # all 3 regimes present
    hf_inv, _ = ROPE_INIT_FUNCTIONS["llama3"](interop.to_hf_config(cfg), "cpu")
    ours, attn = rope_inv_freq(cfg)
    torch.testing.assert_close(ours, hf_inv.float(), atol=0, rtol=1e-6)
    assert attn == 1.0


def test_from_hf_config_reads_non_default_fields():
    base = interop.to_hf_config(preset("tiny-dense")).to_dict()
    cfg = ModelConfig.from_hf_config(dict(base, rms_norm_eps=1e-5, max_position_embeddings=96,
                                          tie_word_embeddings=True))
    assert (cfg.rms_norm_eps, cfg.max_position_embeddings, cfg.tie_word_embeddings) == \
        (1e-5, 96, True)


# ------------------------------------------------------------------ hidden_act
ACTS = ["silu", "gelu", "gelu_new", "gelu_pytorch_tanh", "relu"]


def _wide(hf, seed=0, std=0.2):
    """Wider random weights than HF's init, so the activations differ clearly."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in hf.parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * std)
    return hf.eval()


def _tiny_hf(cls_name, seed=0, **kw):
    base = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                pad_token_id=0)
    cfg = getattr(transformers, cls_name.replace("ForCausalLM", "Config"))(**(base | kw))
    torch.manual_seed(seed)
    return _wide(getattr(transformers, cls_name)(cfg), seed)


@pytest.mark.parametrize("act", ACTS)
def test_llama_hidden_act_converts_and_matches_hf(act):
    """A Llama with ``hidden_act=act`` converts to ours running that activation (it used
    to run SiLU whatever the config said) and back; the logits equal HF's both ways, with
    and without gradients (the packed and unpacked FFN paths)."""
    hf = _tiny_hf("LlamaForCausalLM", hidden_act=act)
    ours = interop.from_hf_model(hf)
    assert ours.config.hidden_act == act
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf(ids).logits
        assert (ours(ids) - want).abs().max() <= ATOL
        if act != "silu":                    # the test can tell the activations apart
            silu = interop.from_hf_model(_tiny_hf("LlamaForCausalLM", hidden_act="silu"))
            assert (silu(ids) - want).abs().max() > 100 * ATOL
    assert (ours(ids) - want).abs().max() <= ATOL                         # gradients on
    assert interop.to_hf_config(ours.config).hidden_act == act
    back = interop.to_hf_model(ours)
    assert back.config.hidden_act == act
    with torch.no_grad():
        assert (back(ids).logits - want).abs().max() <= ATOL


@pytest.mark.parametrize("act", ["gelu", "relu"])
def test_moe_experts_run_hidden_act(act):
    """The experts' three paths (grouped for a prompt, one token for a batch-1 decode, the
    per-expert loop with gradients) and the shared expert use the config's activation:
    Mixtral and Qwen2-MoE with it equal HF."""
    for cls_name, kw in (("MixtralForCausalLM", dict(num_local_experts=4)),
                         ("Qwen2MoeForCausalLM", dict(num_experts=4, moe_intermediate_size=16,
                                                      shared_expert_intermediate_size=16,
                                                      qkv_bias=False))):
        hf = _tiny_hf(cls_name, hidden_act=act, num_experts_per_tok=2, **kw)
        if cls_name.startswith("Qwen2"):
            with torch.no_grad():
                for layer in hf.model.layers:      # our shared expert has no gate: sigmoid(0)
                    layer.mlp.shared_expert_gate.weight.zero_()
        ours = interop.from_hf_model(hf)
        ids = torch.randint(0, 64, (1, 10), generator=torch.Generator().manual_seed(2))
        with torch.no_grad():
            assert (ours(ids) - hf(ids).logits).abs().max() <= ATOL, cls_name
            one = ids[:, :1]
            assert (ours(one) - hf(one).logits).abs().max() <= ATOL, cls_name
        assert (ours(ids) - hf(ids).logits).abs().max() <= ATOL, cls_name


def test_unsupported_hidden_act_is_refused_naming_the_field():
    hf_cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48,
                                      num_hidden_layers=1, num_attention_heads=4,
                                      hidden_act="tanh")
    with pytest.raises(ValueError, match="hidden_act 'tanh'"):
        interop.from_hf_config(hf_cfg)
    with pytest.raises(ValueError, match="hidden_act"):
        interop.from_hf_model(transformers.LlamaForCausalLM(hf_cfg))
    assert "hidden_act" in interop.from_hf_config(hf_cfg, allow_unsupported=True
                                                  ).unsupported_fields
    with pytest.raises(ValueError, match="hidden_act"):
        ModelConfig(hidden_act="swiglu")
    with pytest.raises(TypeError, match="hidden_act"):
        ModelConfig(hidden_act=None)
    from tokenflow.model.ffn import FFN
    with pytest.raises(ValueError, match="hidden_act"):
        FFN(8, 16, hidden_act="quick_gelu")


def test_gpt2_activation_function_is_read():
    assert interop.from_hf_config(transformers.GPT2Config()).hidden_act == "gelu_new"
    assert interop.from_hf_config(transformers.GPT2Config(activation_function="relu")
                                  ).hidden_act == "relu"
    with pytest.raises(ValueError, match="activation_function 'quick_gelu'"):
        interop.from_hf_config(transformers.GPT2Config(activation_function="quick_gelu"))


# ------------------------------------------------------------------ topk_method
def _v2_config(method, **kw):
    base = dict(vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                n_routed_experts=16, num_experts_per_tok=3, n_group=4, topk_group=2,
                topk_method=method, n_shared_experts=1, kv_lora_rank=16, q_lora_rank=None,
                qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
                routed_scaling_factor=1.5, first_k_dense_replace=1)
    return transformers.DeepseekV2Config(**(base | kw))


def _hf_and_our_router(hf_cfg, router_cls):
    from tokenflow.model.moe import Router
    torch.manual_seed(4)
    hf = router_cls(hf_cfg)
    with torch.no_grad():
        hf.weight.normal_(0.0, 0.5)
    ours = Router(interop.from_hf_config(hf_cfg))
    with torch.no_grad():
        ours.weight.copy_(hf.weight)
    return hf, ours


@pytest.mark.parametrize("method", ["greedy", "group_limited_greedy"])
def test_deepseek_v2_router_matches_hf_for_each_topk_method(method):
    """DeepSeek-V2's ``DeepseekV2TopkRouter`` on the same weights: same experts, same
    weights. ``group_limited_greedy`` ranks the 4 groups by their best score (our router
    used the sum of the top 2, V3's rule), ``greedy`` ignores the groups."""
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter
    hf, ours = _hf_and_our_router(_v2_config(method), DeepseekV2TopkRouter)
    assert ours.topk_method == method
    x = torch.randn(200, 32, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        idx, w, _ = ours(x)
        _, hf_w, hf_idx = hf(x)
    a, b = _sorted_route(idx, w), _sorted_route(hf_idx, hf_w)
    assert torch.equal(a[0], b[0])
    assert (a[1] - b[1]).abs().max() <= 1e-6
    others = {m: route_with(ours, x, m) for m in ("greedy", "group_limited_greedy", "noaux_tc")}
    for m, other in others.items():                  # the methods choose differently here
        if m != method:
            assert not torch.equal(other.sort(-1).values, idx.sort(-1).values), m


def route_with(router, x, method):
    from tokenflow.model.moe import route
    return route(x, router.weight, router.top_k, scoring_func=router.scoring_func,
                 norm_topk_prob=router.norm_topk_prob, n_group=router.n_group,
                 topk_group=router.topk_group, topk_method=method)[0]


def test_deepseek_v3_router_is_noaux_tc_and_other_methods_are_refused():
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter
    v3 = transformers.DeepseekV3Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
        n_routed_experts=16, num_experts_per_tok=3, n_group=4, topk_group=2, kv_lora_rank=16,
        q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
        first_k_dense_replace=1)
    hf, ours = _hf_and_our_router(v3, DeepseekV3TopkRouter)
    assert ours.topk_method == "noaux_tc"
    x = torch.randn(200, 32, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        a, b = _sorted_route(*ours(x)[:2]), _sorted_route(hf(x)[2], hf(x)[1])
    assert torch.equal(a[0], b[0]) and (a[1] - b[1]).abs().max() <= 1e-6
    d = v3.to_dict() | {"topk_method": "group_limited_greedy"}
    with pytest.raises(ValueError, match="topk_method 'group_limited_greedy'"):
        interop.from_hf_config(d)
    with pytest.raises(ValueError, match="topk_method 'noaux_tc'"):
        interop.from_hf_config(_v2_config("noaux_tc"))
    mla = interop.from_hf_config(v3).replace(topk_method="group_limited_greedy")
    with pytest.raises(ValueError, match="topk_method"):
        interop.to_hf_config(mla, "deepseek_v3")
    with pytest.raises(ValueError, match="topk_method"):
        ModelConfig(topk_method="top2")


def test_deepseek_v3_group_rules_at_their_edges():
    """DeepseekV3TopkRouter scores a group by its top-2 experts: one expert per group is
    refused, two are enough; with two or more groups only 'noaux_tc' ranks them like HF."""
    from tokenflow.interop.hf_architectures import moe_block_problem
    cfg = lambda **kw: _moe_cfg(scoring_func="sigmoid", **kw)  # noqa: E731
    assert "at least 2 experts per group" in moe_block_problem(
        cfg(n_group=8, topk_group=2), "deepseek_v3")
    assert moe_block_problem(cfg(n_group=4, topk_group=2), "deepseek_v3") is None
    assert "noaux_tc" in moe_block_problem(
        cfg(n_group=2, topk_group=1, topk_method="group_limited_greedy"), "deepseek_v3")
    assert moe_block_problem(cfg(n_group=1, topk_group=1, topk_method="greedy"),
                             "deepseek_v3") is None
