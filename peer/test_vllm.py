"""vLLM's CPU build as a peer: the exported checkpoints give our tokens (`make vllm-test`).

Runs from the book's venv; vLLM runs in processes of its own venv (.venv-vllm, `make vllm`,
found by tokenflow.interop.vllm_peer.vllm_python). Where vLLM cannot run, every test fails
with the reason: nothing is skipped.
"""
from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tokenflow import TokenFlowModel, generate, load_pretrained, preset
from tokenflow.interop import save_hf_checkpoint
from tokenflow.interop.vllm_peer import (VLLM_CPU_HEAD_SIZES, VLLM_CPU_MLA_HEAD_SIZE,
                                         VLLMProcess, complete_via_server, start_vllm_server,
                                         stop_vllm_server, vllm_python)
from tokenflow.serving.peer import PEER_ENGINE_ARGS, load_peer_run

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from vllm_peer import LOGPROB_ATOL, agrees, peer_run, summary  # noqa: E402


@pytest.fixture(scope="session")
def shipped():
    return load_pretrained()


@pytest.fixture(scope="session")
def peer(shipped, tmp_path_factory):
    """The 48-request workload through both engines (one vLLM start)."""
    model, tok = shipped
    return peer_run(model, tok, tmp_path_factory.mktemp("tiny-hf"))


def test_vllm_head_sizes_are_the_ones_the_export_checks():
    code = ("import json; from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend as A;"
            "from vllm.v1.attention.backends.mla.cpu_mla import CPUMLABackend as M;"
            "print(json.dumps([A.get_supported_head_sizes(), M.get_supported_head_sizes()]))")
    r = subprocess.run([str(vllm_python()), "-c", code], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    gqa, mla = json.loads(r.stdout.strip().splitlines()[-1])
    assert tuple(gqa) == VLLM_CPU_HEAD_SIZES and mla == [VLLM_CPU_MLA_HEAD_SIZE]


def test_shipped_model_same_tokens_on_every_request(peer):
    c = peer["comparison"]
    print(summary(peer))
    assert c["num_requests"] >= 48
    assert c["identical_requests"] == c["num_requests"], (c, summary(peer))
    assert c["identical_tokens"] == c["num_tokens"] == peer["workload"]["total_new_tokens"]
    assert c["max_logprob_diff"] is not None and c["max_logprob_diff"] <= LOGPROB_ATOL
    assert agrees(peer)


def test_schedules_close_to_ours_and_ours_repeats_the_stored_run(peer):
    """Ours repeats the stored run (chapter 05) exactly. vLLM's counters vary a little run to
    run (its engine core starts stepping while requests still arrive): its step count stays
    within 10% of ours, and the tight pool preempts in both."""
    stored = load_peer_run()
    keys = ("num_steps", "num_preemptions", "prefix_cache_hits")
    assert {k: peer["ours"][k] for k in keys} == {k: stored["ours"][k] for k in keys}
    assert abs(peer["vllm"]["num_steps"] - peer["ours"]["num_steps"]) <= 0.1 * peer["ours"][
        "num_steps"]
    assert peer["ours"]["num_preemptions"] > 0 and peer["vllm"]["num_preemptions"] > 0
    assert peer["vllm"]["token_ids"] == stored["vllm"]["token_ids"]


def test_workload_exercises_prefix_caching_and_chunking(peer):
    """Shared openings give prefix-cache hits in both engines; prompts span 4..100 tokens, so
    some are chunked under the 256-token budget when the batch is full."""
    w = peer["workload"]
    assert w["prompt_tokens"][0] <= 10 and w["prompt_tokens"][1] >= 90
    assert 8 <= w["new_tokens"][0] and w["new_tokens"][1] <= 24
    assert peer["ours"]["prefix_cache_hits"] > 0 and peer["vllm"]["prefix_cache_hits"] > 0
    assert peer["ours"]["num_steps"] > 0 and peer["vllm"]["num_steps"] > 0


def _wide(model: TokenFlowModel, seed: int) -> TokenFlowModel:
    """Matrices drawn with std 0.08 (clear greedy choices, no near-ties)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.08)
    return model.eval()


FAMILIES = {
    "llama": dict(name="tiny-dense"),
    "mixtral": dict(name="tiny", num_shared_experts=0, first_k_dense_replace=0),
    "qwen2_moe": dict(name="tiny"),
    "deepseek_v3": dict(name="tiny", kv_lora_rank=512, qk_rope_head_dim=64,
                        qk_nope_head_dim=32, v_head_dim=32, head_dim=64,
                        scoring_func="sigmoid", n_group=2, topk_group=1,
                        routed_scaling_factor=2.5, norm_topk_prob=True),
}


@pytest.mark.parametrize("arch", sorted(FAMILIES))
def test_each_exported_family_gives_our_greedy_tokens(arch, shipped, tmp_path):
    """A random model of each family the export writes: vLLM's greedy tokens equal
    tokenflow's ``generate`` on 8 prompts (fp32; DeepSeek-V3 on vLLM's CPU MLA backend, which
    loads and runs the export but disagrees: see the xfail)."""
    tok = shipped[1]
    kw = dict(FAMILIES[arch])
    torch.manual_seed(0)
    model = _wide(TokenFlowModel(preset(kw.pop("name"), vocab_size=tok.vocab_size, **kw)), 0)
    folder = save_hf_checkpoint(model, tmp_path / arch, tokenizer=tok)
    assert json.loads((folder / "config.json").read_text())["model_type"] == arch
    prompts = [tok.encode(t) for t in ("北京是中国的首", "东京是日本的首都。", "Paris is",
                                       "伦敦 London 2024!", "The capital of", "首", "中国",
                                       "Berlin ist die Hauptstadt")]
    news = [8] * len(prompts)
    ours = [generate(model, torch.tensor([p]), n, stop_at_eos=False)[0, len(p):].tolist()
            for p, n in zip(prompts, news)]
    settings = dict(PEER_ENGINE_ARGS, max_model_len=model.config.max_position_embeddings,
                    threads=1, enforce_eager=True,
                    attention_backend="CPU_MLA" if arch == "deepseek_v3" else None)
    with VLLMProcess(folder, settings) as peer:
        theirs = [o["token_ids"] for o in peer.run(prompts, news, logprobs=False)["outputs"]]
    assert [len(t) for t in theirs] == news                 # it loads and runs the export
    if arch == "deepseek_v3" and theirs != ours:
        pytest.xfail("vLLM 0.32's CPU MLA backend (cpu_mla.py, a reference implementation) "
                     "gives other tokens than ours from the first or second token on; "
                     "transformers' DeepseekV3ForCausalLM agrees with ours on every token "
                     "(tests/test_hf_export.py)")
    assert theirs == ours


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_openai_server_one_request(shipped, tmp_path):
    """`python -m vllm.entrypoints.openai.api_server` on 127.0.0.1: one /v1/completions
    request with token ids gives our greedy tokens; the server ends by its PID."""
    model, tok = shipped
    folder = save_hf_checkpoint(model, tmp_path / "tiny-hf", tokenizer=tok)
    port = _free_port()
    prompt = tok.encode("北京是中国的首")
    ours = generate(model, torch.tensor([prompt]), 6, stop_at_eos=False)[0, len(prompt):]
    proc = start_vllm_server(folder, port)
    try:
        got = complete_via_server(port, str(folder), prompt, 6)
    finally:
        code = stop_vllm_server(proc)
    assert got["token_ids"] == ours.tolist()
    assert got["text"].startswith("都")
    assert proc.poll() is not None, code
    with socket.socket() as s:                    # nothing listens on the port any more
        assert s.connect_ex(("127.0.0.1", port)) != 0


def test_missing_vllm_environment_says_what_to_do(monkeypatch, tmp_path):
    monkeypatch.setenv("TOKENFLOW_VLLM_PYTHON", str(tmp_path / "none" / "python"))
    with pytest.raises(RuntimeError, match="make vllm"):
        vllm_python()


def _counterpart_files() -> list[str]:
    """Every file VLLM_COUNTERPARTS names, as paths from the directory above ``vllm/`` (a
    bare name is in the directory of the path before it)."""
    import re
    from tokenflow.serving.peer import VLLM_COUNTERPARTS
    files = []
    for *_, where in VLLM_COUNTERPARTS:
        folder = ""
        for name in re.findall(r"[\w/]+\.py", where):
            if "/" in name:
                folder = name.rsplit("/", 1)[0]
                files.append(name)
            else:
                files.append(f"{folder}/{name}")
    return files


def test_the_counterpart_files_exist_in_vllm():
    """Chapter 05's map from tokenflow.serving to vLLM names files a reader can open."""
    files = _counterpart_files()
    assert len(files) >= 12 and "vllm/v1/core/kv_cache_manager.py" in files
    code = "import os, vllm; print(os.path.dirname(os.path.dirname(vllm.__file__)))"
    r = subprocess.run([str(vllm_python()), "-c", code], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    root = Path(r.stdout.strip().splitlines()[-1])
    assert [f for f in files if not (root / f).is_file()] == []
