"""HF-config fallbacks: Qwen's sliding-window layers derived as
transformers derives them when ``layer_types`` is absent, and a list of EOS ids kept whole
(ModelConfig.eos_token_ids; generate stops at any)."""
import pytest
import torch

from tokenflow import ModelConfig, load_model, preset, save_model
from tokenflow.inference.generate import generate
from tokenflow.interop import to_hf_config

transformers = pytest.importorskip("transformers")

QWEN = ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe")


def _raw(mt, L, **kw):
    """A config.json as older Qwen checkpoints write it: no ``layer_types``."""
    d = dict(model_type=mt, vocab_size=64, hidden_size=32, num_hidden_layers=L,
             num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
             max_position_embeddings=256)
    if mt.endswith("moe"):
        d.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)
        if mt == "qwen2_moe":
            d.update(shared_expert_intermediate_size=16)
    d.update(kw)
    return d


def _hf_sliding(mt, raw):
    """Per layer: does HF's attention use a window (its config and modeling code)?"""
    hf = transformers.AutoConfig.for_model(mt, **{k: v for k, v in raw.items()
                                                  if k != "model_type"})
    if not hf.sliding_window:
        return [False] * hf.num_hidden_layers, None
    if mt == "qwen3_moe":                 # Qwen3MoeAttention: config.sliding_window, every layer
        return [True] * hf.num_hidden_layers, hf.sliding_window
    sliding = [t == "sliding_attention" for t in hf.layer_types]
    return sliding, hf.sliding_window if any(sliding) else None


def _ours(raw):
    c = ModelConfig.from_hf_config(raw)
    sliding = [c.layer_is_sliding(i) for i in range(c.num_hidden_layers)]
    return sliding, c.sliding_window if any(sliding) else None


@pytest.mark.parametrize("mt", QWEN)
@pytest.mark.parametrize("L", [6, 32])
@pytest.mark.parametrize("mwl", [None, 0, 1, 3, 28, 40])
@pytest.mark.parametrize("use", [True, False])
def test_qwen_windows_without_layer_types_match_transformers(mt, L, mwl, use):
    kw = dict(use_sliding_window=use, sliding_window=16)
    if mwl is not None:
        kw["max_window_layers"] = mwl
    raw = _raw(mt, L, **kw)
    assert _ours(raw) == _hf_sliding(mt, raw)


@pytest.mark.parametrize("mt", ("qwen2", "qwen3"))
def test_qwen_explicit_layer_types(mt):
    types = ["full_attention", "sliding_attention"] * 3
    raw = _raw(mt, 6, use_sliding_window=True, sliding_window=16, layer_types=types,
               max_window_layers=1)
    assert _ours(raw) == _hf_sliding(mt, raw) == ([False, True] * 3, 16)
    # a window that is not in use: HF's attention gets sliding_window=None in every layer
    off = _raw(mt, 6, use_sliding_window=False, sliding_window=16, layer_types=types)
    assert _ours(off) == _hf_sliding(mt, off) == ([False] * 6, None)


def _llama(**kw):
    d = dict(model_type="llama", vocab_size=130000, hidden_size=64, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, intermediate_size=128)
    d.update(kw)
    return d


@pytest.mark.parametrize("eos, ids", [([128001, 128009], (128001, 128009)),
                                      ([128001, 128008, 128009], (128001, 128008, 128009)),
                                      ([128009], (128009,)), (128001, (128001,)),
                                      ([], ()), (None, ())])
def test_hf_eos_list_is_kept_whole(eos, ids):
    c = ModelConfig.from_hf_config(_llama(eos_token_id=eos))
    assert c.eos_token_ids == ids
    # the transformers object (Llama 3 Instruct's list) reads the same
    hf = transformers.LlamaConfig(**{k: v for k, v in _llama(eos_token_id=eos).items()
                                     if k != "model_type"})
    assert ModelConfig.from_hf_config(hf).eos_token_ids == ids
    # and goes back to HF as HF wrote it (a list for several ids)
    back = to_hf_config(c.replace(num_experts=0, num_experts_per_tok=0, num_shared_experts=0))
    assert back.eos_token_id == (list(ids) if len(ids) > 1 else (ids[0] if ids else None))


def test_model_config_eos_forms():
    c = preset("tiny", eos_token_id=(2, 5))
    assert c.eos_token_ids == (2, 5) and c.eos_token_id == (2, 5)
    assert preset("tiny").eos_token_ids == (2,)
    assert preset("tiny", eos_token_id=None).eos_token_ids == ()
    assert preset("tiny", eos_token_id=[2, 5]) == c                       # JSON lists
    assert ModelConfig.from_dict(c.to_dict()) == c
    for bad, err in [((), ValueError), ((2, 512), ValueError), ((2, -1), ValueError),
                     (512, ValueError), ((2, True), TypeError), ((2, 2.0), TypeError),
                     ("2", TypeError)]:
        with pytest.raises(err, match="eos_token_id"):
            preset("tiny", eos_token_id=bad)


def test_save_load_keeps_several_eos(tmp_path):
    from helpers import random_model
    m = random_model(0, eos_token_id=(2, 7))
    save_model(m, tmp_path / "m.safetensors")
    assert load_model(tmp_path / "m.safetensors").config.eos_token_ids == (2, 7)


@pytest.fixture(scope="module")
def free_run():
    """A random model's greedy continuation of 2 prompts with no EOS stop."""
    from helpers import wide_random_model
    m = wide_random_model(4)
    ids = torch.tensor([[5, 9, 11, 4], [8, 3, 3, 20]])
    out = generate(m, ids, 8, stop_at_eos=False)[:, 4:]
    return m, ids, out


def _with_eos(model, eos):
    from tokenflow import TokenFlowModel
    m = TokenFlowModel(model.config.replace(eos_token_id=eos)).eval()
    m.load_state_dict(model.state_dict())
    return m


def test_generate_stops_at_any_config_eos(free_run):
    model, ids, out = free_run
    a, b = out[0].tolist(), out[1].tolist()
    # row 0 hits e0 at step 1, row 1 hits e1 at a later step sb; neither id comes earlier
    sa, e0 = 1, a[1]
    sb = next(i for i in range(2, 8) if b[i] not in a[:2] and b[i] not in b[:i])
    e1 = b[sb]
    assert e0 != a[0] and e0 not in b[:sb + 1], (a, b)
    m = _with_eos(model, (e1, e0))    # the row that finishes first stops at the 2nd id
    got = generate(m, ids, 8)
    assert got.shape[1] == 4 + sb + 1                  # stops once every row has hit one
    rows = got[:, 4:].tolist()
    assert rows[0][:sa + 1] == a[:sa + 1] and set(rows[0][sa:]) == {e0}   # repeats its own
    assert rows[1] == b[:sb + 1]
    # the same through the argument, as a list
    assert torch.equal(generate(model, ids, 8, eos_token_id=[e1, e0]), got)
    # no EOS in the config: the full length
    assert generate(_with_eos(model, None), ids, 8).shape[1] == 12


@pytest.mark.parametrize("bad, err", [([2, 10**6], ValueError),
                                      ([2, True], TypeError), ((2.0,), TypeError)])
def test_generate_checks_every_eos(free_run, bad, err):
    model, ids, _ = free_run
    with pytest.raises(err, match="eos_token_id"):
        generate(model, ids, 2, eos_token_id=bad)


# ------------------------------------------------------------------ every family's defaults
HF_CONFIG_CLASSES = {"llama": "LlamaConfig", "mistral": "MistralConfig",
                     "qwen2": "Qwen2Config", "qwen3": "Qwen3Config",
                     "mixtral": "MixtralConfig", "qwen2_moe": "Qwen2MoeConfig",
                     "qwen3_moe": "Qwen3MoeConfig", "deepseek_v2": "DeepseekV2Config",
                     "deepseek_v3": "DeepseekV3Config", "gpt_oss": "GptOssConfig",
                     "gpt2": "GPT2Config"}

# Settings on which HF derives other fields from the ones given (or reads a default it
# ignores otherwise): the omitted fields must follow.
DEFAULT_VARIANTS = [(mt, {}) for mt in HF_CONFIG_CLASSES] + [
    ("llama", dict(num_attention_heads=8, hidden_size=1024)),       # kv heads, head_dim
    ("deepseek_v2", dict(num_attention_heads=16)),
    ("qwen3", dict(hidden_size=1024, num_attention_heads=16,        # head_dim stays 128
                   num_key_value_heads=8)),
    ("qwen2", dict(num_attention_heads=64)),                        # kv heads stay 32
    ("qwen2", dict(use_sliding_window=True, num_hidden_layers=30)),
    ("qwen3", dict(use_sliding_window=True, num_hidden_layers=30)),
    ("qwen2_moe", dict(use_sliding_window=True)),
    ("qwen3_moe", dict(use_sliding_window=True)),
    ("gpt_oss", dict(num_hidden_layers=5)),                         # alternating windows
    ("mistral", dict(num_hidden_layers=4)),
    ("gpt2", dict(n_embd=256, n_head=4)),                           # n_inner = 4 * n_embd
    ("deepseek_v3", dict(num_hidden_layers=4)),
]


def _from_hf(d):
    return ModelConfig.from_hf_config(d)


def _v2_fix(mt, d):
    """DeepseekV2Config's num_experts_per_tok defaults to None (its router cannot run):
    that raises; then both sides get the same value."""
    if mt == "deepseek_v2" and d.get("num_experts_per_tok") is None:
        with pytest.raises(ValueError, match="num_experts_per_tok"):
            _from_hf(d)
        return dict(d, num_experts_per_tok=6)
    return d


@pytest.mark.parametrize("mt, given", DEFAULT_VARIANTS,
                         ids=[f"{mt}-{'-'.join(g) or 'defaults'}" for mt, g in DEFAULT_VARIANTS])
def test_omitted_fields_take_the_defaults_of_the_hf_config_class(mt, given):
    """A config.json with only ``model_type`` (and ``given``) reads as the same
    ModelConfig as the full dict of ``transformers``' own config class built with no other
    argument: every default of every family (``rope_theta``, ``rms_norm_eps``,
    ``tie_word_embeddings``, ``norm_topk_prob``, ``routed_scaling_factor``, group routing,
    dense first layers, biases, windows, MTP layers, shapes, special tokens)."""
    full = getattr(transformers, HF_CONFIG_CLASSES[mt])(**given).to_dict()
    full = _v2_fix(mt, full)
    sparse = _v2_fix(mt, {"model_type": mt, **given})
    assert _from_hf(sparse) == _from_hf(full)


@pytest.mark.parametrize("mt", sorted(HF_CONFIG_CLASSES))
def test_each_field_left_out_alone_takes_its_hf_default(mt):
    """The full default dict with one field removed at a time reads the same."""
    full = _v2_fix(mt, getattr(transformers, HF_CONFIG_CLASSES[mt])().to_dict())
    want = _from_hf(full)
    for key in sorted(full):
        if key != "model_type":
            less = _v2_fix(mt, {k: v for k, v in full.items() if k != key})
            assert _from_hf(less) == want, key


@pytest.mark.parametrize("mt, field, hf_value", [
    ("deepseek_v3", "norm_topk_prob", True), ("deepseek_v3", "routed_scaling_factor", 2.5),
    ("deepseek_v3", "n_group", 8), ("deepseek_v3", "topk_group", 4),
    ("deepseek_v3", "first_k_dense_replace", 3), ("deepseek_v3", "num_nextn_predict_layers", 1),
    ("deepseek_v3", "scoring_func", "sigmoid"), ("deepseek_v2", "topk_method", "greedy"),
    ("deepseek_v2", "scoring_func", "softmax"), ("mixtral", "rope_theta", 1e6),
    ("mixtral", "rms_norm_eps", 1e-5), ("gpt_oss", "rope_theta", 150000.0),
    ("gpt_oss", "attention_bias", True), ("gpt2", "tie_word_embeddings", True),
    ("gpt2", "hidden_act", "gelu_new"), ("qwen2_moe", "num_experts_per_tok", 4),
    ("qwen3_moe", "num_experts", 128), ("qwen3", "head_dim", 128),
    ("mistral", "sliding_window", 4096), ("llama", "max_position_embeddings", 2048)])
def test_named_defaults_by_hand(mt, field, hf_value):
    """A few of those defaults spelled out (read off ``transformers``' configuration files),
    so a failure above names its field: HF's full default dict without that field."""
    full = getattr(transformers, HF_CONFIG_CLASSES[mt])().to_dict()
    hf_names = {"rope_theta": "rope_parameters", "num_experts": "num_local_experts",
                "hidden_act": "activation_function"}
    less = {k: v for k, v in full.items() if k != hf_names.get(field, field)}
    assert getattr(_from_hf(_v2_fix(mt, less)), field) == hf_value


def test_an_explicit_null_is_not_replaced_by_the_default():
    """Mistral v0.2 writes ``"sliding_window": null`` for "no window": HF keeps None."""
    assert transformers.MistralConfig(sliding_window=None).sliding_window is None
    full = transformers.MistralConfig().to_dict()
    assert _from_hf(dict(full, sliding_window=None)).sliding_window is None
    assert _from_hf({k: v for k, v in full.items() if k != "sliding_window"}
                    ).sliding_window == 4096


@pytest.mark.parametrize("kind, extra", [
    ("yarn", {}), ("llama3", dict(low_freq_factor=1.0, high_freq_factor=4.0)), ("linear", {})])
def test_rope_scaling_without_its_original_length_takes_the_hf_default(kind, extra):
    """A llama3 or yarn ``rope_parameters`` without ``original_max_position_embeddings``
    gets ``max_position_embeddings``, as ``transformers``' rope standardisation fills it; a
    linear scaling gets none."""
    rope = {"rope_type": kind, "factor": 4.0, "rope_theta": 10000.0, **extra}
    hf = transformers.LlamaConfig(max_position_embeddings=8192, rope_parameters=dict(rope))
    ours = ModelConfig.from_hf_config(_llama(max_position_embeddings=8192,
                                             rope_parameters=dict(rope)))
    want = hf.rope_parameters.get("original_max_position_embeddings")
    assert (want == 8192) == (kind != "linear")
    assert ours.rope_scaling.get("original_max_position_embeddings") == want


def test_qwen2_moe_without_qkv_bias_has_q_k_v_biases_as_transformers_does():
    """Qwen1.5-MoE's config.json has no ``qkv_bias``; transformers' Qwen2MoeConfig defaults it
    to True, and so does the parser: biases on q, k, v, none on o."""
    from tokenflow.config.hf_config import parse_hf_config
    raw = _raw("qwen2_moe", 2)
    assert "qkv_bias" not in raw
    assert transformers.AutoConfig.for_model("qwen2_moe").qkv_bias is True
    kw = parse_hf_config(raw)
    assert kw["attention_bias"] is True and kw["attention_out_bias"] is False
    assert parse_hf_config({**raw, "qkv_bias": False})["attention_bias"] is False
