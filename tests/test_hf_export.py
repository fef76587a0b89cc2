"""The exported Hugging Face folder loads with transformers offline: logits equal
ours within 1e-4, greedy continuations agree, and AutoTokenizer gives our ids."""
import json

import pytest
import torch
import transformers

from tokenflow import Tokenizer, TokenFlowModel, generate, preset
from tokenflow.interop import save_hf_checkpoint

from helpers import random_model

ATOL = 1e-4
TEXTS = ["北京是中国的首", "东京是日本的首都。", "Paris is the capital of France.",
         "伦敦 London 2024!", "The"]


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer.from_file()


FAMILIES = {   # fixture param -> (preset, overrides, the HF class the export names)
    "tiny": ("tiny", {}, "Qwen2MoeForCausalLM"),
    "tiny-dense": ("tiny-dense", {}, "LlamaForCausalLM"),
    "mixtral": ("tiny", dict(num_shared_experts=0, first_k_dense_replace=0),
                "MixtralForCausalLM"),
    "deepseek_v3": ("tiny", dict(kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=32,
                                 v_head_dim=32, head_dim=64, scoring_func="sigmoid", n_group=2,
                                 topk_group=1, routed_scaling_factor=2.5),
                    "DeepseekV3ForCausalLM"),
}


def _model(name, tokenizer, seed=0):
    """Random model of a family (:data:`FAMILIES`) whose vocabulary fits the shipped
    tokenizer."""
    base, overrides, _ = FAMILIES[name]
    m = TokenFlowModel(preset(base, vocab_size=tokenizer.vocab_size, **overrides))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.08, generator=g)
    return m


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def exported(request, tokenizer, tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.setenv("TRANSFORMERS_OFFLINE", "1")
    ours = _model(request.param, tokenizer).eval()
    ours.config = ours.config.replace(name=request.param)
    folder = save_hf_checkpoint(ours, tmp_path_factory.mktemp(request.param), tokenizer)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(folder)
    yield ours, hf, hf_tok, folder
    mp.undo()


def test_folder_contents(exported):
    ours, hf, _, folder = exported
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json"} <= names
    cfg = json.loads((folder / "config.json").read_text())
    expected = FAMILIES[ours.config.name][2]
    assert cfg["architectures"] == [expected]
    assert type(hf).__name__ == expected


def test_experts_stored_as_published_checkpoints_store_them(exported):
    """One tensor per expert, under the names vLLM's loaders read (Mixtral's
    block_sparse_moe.experts.{j}.w1/w2/w3; experts.{j}.*_proj for Qwen2-MoE and DeepSeek-V3),
    each equal to our expert's matrix; no fused [E, ...] expert tensor."""
    from safetensors.torch import load_file
    ours, _, _, folder = exported
    sd = load_file(folder / "model.safetensors")
    assert not [k for k in sd if k.endswith(("experts.gate_up_proj", "experts.down_proj"))]
    c = ours.config
    for i in range(c.num_hidden_layers):
        if not c.layer_is_moe(i):
            continue
        mlp = ours.layers[i].mlp
        for j in range(c.num_experts):
            e = mlp.experts[j]
            if ours.config.name == "mixtral":
                pre = f"model.layers.{i}.block_sparse_moe.experts.{j}."
                names = {"w1": e.gate_proj, "w3": e.up_proj, "w2": e.down_proj}
            else:
                pre = f"model.layers.{i}.mlp.experts.{j}."
                names = {"gate_proj": e.gate_proj, "up_proj": e.up_proj,
                         "down_proj": e.down_proj}
            for n, lin in names.items():
                assert torch.equal(sd[pre + n + ".weight"], lin.weight), pre + n
        gate = ("block_sparse_moe" if ours.config.name == "mixtral" else "mlp") + ".gate.weight"
        assert torch.equal(sd[f"model.layers.{i}.{gate}"], mlp.gate.weight)


def test_logits_equal_ours(exported, tokenizer):
    ours, hf, _, _ = exported
    for text in TEXTS:
        ids = torch.tensor([tokenizer.encode(text)])
        with torch.no_grad():
            diff = (ours(ids) - hf(ids).logits).abs().max().item()
        assert diff <= ATOL, text


def test_greedy_continuation_equal(exported, tokenizer):
    ours, hf, _, _ = exported
    ids = torch.tensor([tokenizer.encode(TEXTS[0])])
    mine = generate(ours, ids, 8, stop_at_eos=False)
    theirs = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8,
                         min_new_tokens=8, do_sample=False)
    assert mine.tolist() == theirs.tolist()


def test_tokenizer_same_ids(exported, tokenizer):
    _, _, hf_tok, _ = exported
    for text in TEXTS:
        assert hf_tok(text, add_special_tokens=False)["input_ids"] == tokenizer.encode(text)
        ids = tokenizer.encode(text)
        assert hf_tok.decode(ids, skip_special_tokens=True) == tokenizer.decode(ids)
    assert (hf_tok.eos_token_id, hf_tok.bos_token_id, hf_tok.pad_token_id) == (
        tokenizer.eos_token_id, tokenizer.bos_token_id, tokenizer.pad_token_id)


def test_special_ids_must_match(tokenizer, tmp_path):
    m = random_model(0, vocab_size=tokenizer.vocab_size, eos_token_id=5)
    with pytest.raises(ValueError, match="eos_token_id"):
        save_hf_checkpoint(m, tmp_path, tokenizer)
    small = random_model(0, vocab_size=64)
    with pytest.raises(ValueError, match="vocab_size"):
        save_hf_checkpoint(small, tmp_path, tokenizer)


def test_shipped_model_exports(pretrained, tmp_path):
    """The book's model: the HF copy predicts what ours predicts after 北京是中国的首
    (whichever token that is for the current weights)."""
    model, tok = pretrained
    folder = save_hf_checkpoint(model, tmp_path, tok)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = torch.tensor([tok.encode(TEXTS[0])])
    with torch.no_grad():
        mine, theirs = model(ids)[0, -1], hf(ids).logits[0, -1]
    assert (mine - theirs).abs().max().item() <= ATOL
    assert int(mine.argmax()) == int(theirs.argmax())


@pytest.mark.parametrize("head_dim,ok", [(16, False), (24, False), (32, True), (48, False),
                                         (64, True), (80, True), (128, True)])
def test_export_refuses_head_sizes_vllm_cpu_cannot_run(tokenizer, tmp_path, head_dim, ok):
    """vLLM 0.32's CPU attention runs head sizes 32, 64, 80, ... 256, 512 only (cpu_attn.py):
    the export names the field and the sizes, and check_vllm=False writes it anyway."""
    cfg = dict(vocab_size=tokenizer.vocab_size, num_attention_heads=2, num_key_value_heads=1,
               hidden_size=2 * head_dim, head_dim=head_dim)
    m = TokenFlowModel(preset("tiny-dense", **cfg)).eval()
    if ok:
        assert (save_hf_checkpoint(m, tmp_path, tokenizer) / "config.json").exists()
        return
    with pytest.raises(ValueError, match=rf"head_dim {head_dim} .*32, 64, 80.*check_vllm=False"):
        save_hf_checkpoint(m, tmp_path, tokenizer)
    assert not (tmp_path / "config.json").exists()          # refused before writing anything
    folder = save_hf_checkpoint(m, tmp_path, tokenizer, check_vllm=False)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = torch.tensor([tokenizer.encode(TEXTS[0])])
    with torch.no_grad():
        assert (m(ids) - hf(ids).logits).abs().max().item() <= ATOL


def test_export_refuses_an_mla_latent_vllm_cpu_cannot_run(tokenizer, tmp_path):
    mla = dict(vocab_size=tokenizer.vocab_size, kv_lora_rank=16, qk_rope_head_dim=8,
               qk_nope_head_dim=8, v_head_dim=8, head_dim=8)
    with pytest.raises(ValueError, match=r"kv_lora_rank \+ qk_rope_head_dim = 16 \+ 8 = 24"):
        save_hf_checkpoint(TokenFlowModel(preset("tiny-dense", **mla)), tmp_path, tokenizer)
    with pytest.raises(TypeError, match="check_vllm"):
        save_hf_checkpoint(TokenFlowModel(preset("tiny-dense")), tmp_path, tokenizer,
                           check_vllm="no")


def test_qwen2_moe_export_writes_zero_qkv_biases(exported):
    """vLLM's Qwen2MoeAttention always has q/k/v biases and leaves missing ones uninitialised:
    the folder holds them, zero, with qkv_bias true; the other families' exports have none."""
    from safetensors.torch import load_file
    ours, _, _, folder = exported
    cfg = json.loads((folder / "config.json").read_text())
    sd = load_file(folder / "model.safetensors")
    biases = {k: v for k, v in sd.items() if k.endswith("_proj.bias")}
    if ours.config.name != "tiny":
        assert not biases and not cfg.get("attention_bias") and not cfg.get("qkv_bias")
        return
    assert cfg["qkv_bias"] is True
    c = ours.config
    kv = c.num_key_value_heads * c.head_dim
    rows = {"q_proj": c.num_attention_heads * c.head_dim, "k_proj": kv, "v_proj": kv}
    assert sorted(biases) == sorted(f"model.layers.{i}.self_attn.{n}.bias"
                                    for i in range(c.num_hidden_layers) for n in rows)
    for k, v in biases.items():
        assert v.shape == (rows[k.split(".")[-2]],) and v.dtype == torch.float32
        assert v.abs().max().item() == 0.0
