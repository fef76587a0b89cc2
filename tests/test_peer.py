"""The peer harness on the book's side (no vLLM here): the workload, our run in vLLM's record
format, the comparison, and the stored run chapter 05 shows (peer/test_vllm.py runs vLLM)."""
import pytest
import torch

from tokenflow import generate
from tokenflow.interop.vllm_peer import VLLM_CPU_HEAD_SIZES, vllm_problem
from tokenflow.serving.peer import (PEER_ENGINE_ARGS, VLLM_COUNTERPARTS, compare_runs,
                                    load_peer_run, peer_workload, run_ours)
from tokenflow.viz import counterparts_table, peer_summary, peer_table
from tokenflow import preset

from helpers import load_script


@pytest.fixture(scope="module")
def workload(pretrained):
    return peer_workload(pretrained[1])


def test_workload_ranges_and_reproducible(workload, pretrained):
    prompts, news = workload
    assert len(prompts) == len(news) == 48
    assert all(4 <= len(p) <= 100 for p in prompts) and all(8 <= n <= 24 for n in news)
    assert min(map(len, prompts)) <= 10 and max(map(len, prompts)) >= 90
    assert peer_workload(pretrained[1]) == workload
    assert peer_workload(pretrained[1], seed=1) != workload


def test_workload_shares_full_blocks(workload):
    """Shared openings: many pairs of prompts start with the same 32 tokens (one block)."""
    prompts, _ = workload
    firsts = [tuple(p[:32]) for p in prompts if len(p) >= 32]
    shared = sum(firsts.count(f) - 1 for f in set(firsts))
    assert shared >= 10


@pytest.mark.parametrize("kw,match", [(dict(num_requests=0), "num_requests"),
                                      (dict(min_prompt=5, max_prompt=4), "min_prompt"),
                                      (dict(min_new=0), "min_new")])
def test_workload_bad_arguments(pretrained, kw, match):
    with pytest.raises(ValueError, match=match):
        peer_workload(pretrained[1], **kw)


def test_run_ours_gives_generate_tokens_and_raw_logprobs(pretrained, workload):
    """Each request's tokens equal generate's greedy continuation; each logprob equals
    log_softmax of the model's logits at that position (computed here without the engine)."""
    model, _ = pretrained
    prompts, news = workload[0][:6], workload[1][:6]
    run = run_ours(model, prompts, news, **PEER_ENGINE_ARGS)
    assert run["num_steps"] > 0 and len(run["outputs"]) == 6
    for p, n, o in zip(prompts, news, run["outputs"]):
        full = generate(model, torch.tensor([p]), n, stop_at_eos=False)[0]
        assert o["token_ids"] == full[len(p):].tolist()
        with torch.no_grad():
            lp = model(full[None, :-1])[0].log_softmax(-1)[len(p) - 1:]
        want = lp.gather(1, full[len(p):, None])[:, 0].tolist()
        assert max(abs(a - b) for a, b in zip(o["logprobs"], want)) < 1e-5
        assert o["ttft_s"] > 0 and o["tpot_s"] > 0 and o["num_cached_tokens"] >= 0
    with pytest.raises(ValueError, match="max_new_tokens"):
        run_ours(model, prompts, news[:-1], **PEER_ENGINE_ARGS)


def _rec(tokens, lps=None):
    return {"token_ids": tokens, "logprobs": lps}


def test_compare_runs_by_hand():
    a = [_rec([1, 2, 3], [-0.1, -0.2, -0.3]), _rec([4, 5], [-1.0, -2.0])]
    same = compare_runs(a, [_rec([1, 2, 3], [-0.1, -0.25, -0.3]), _rec([4, 5], [-1.0, -2.0])])
    assert same == {"num_requests": 2, "identical_requests": 2, "num_tokens": 5,
                    "identical_tokens": 5, "first_mismatch": None,
                    "max_logprob_diff": pytest.approx(0.05)}
    # second request differs at its 2nd token: 1 of its 2 agrees; the logprob after the
    # difference is not compared (it belongs to another token)
    off = compare_runs(a, [_rec([1, 2, 3], [-0.1, -0.2, -0.3]), _rec([4, 6], [-1.0, -9.0])])
    assert (off["identical_requests"], off["identical_tokens"], off["first_mismatch"]) == (1, 4, 1)
    assert off["max_logprob_diff"] == 0.0
    short = compare_runs([_rec([1, 2])], [_rec([1, 2, 3])])           # one run stopped early
    assert (short["num_tokens"], short["identical_tokens"],
            short["identical_requests"]) == (3, 2, 0)
    assert compare_runs([_rec([1])], [_rec([1])])["max_logprob_diff"] is None
    with pytest.raises(ValueError, match="1 and 2"):
        compare_runs([_rec([1])], [_rec([1]), _rec([2])])


def test_stored_peer_run_reproduces_with_todays_engine(pretrained, workload):
    """The stored run (chapter 05) agreed on every token; our engine still gives its tokens,
    so vLLM's stored tokens are still ours."""
    run = load_peer_run()
    c = run["comparison"]
    assert c["identical_requests"] == c["num_requests"] == 48
    assert c["max_logprob_diff"] <= c["logprob_atol"] <= 1e-4
    assert run["vllm"]["token_ids"] == run["ours"]["token_ids"]
    assert run["settings"]["block_size"] == PEER_ENGINE_ARGS["block_size"]
    assert run["workload"]["total_new_tokens"] == sum(workload[1])
    now = run_ours(pretrained[0], *workload, **PEER_ENGINE_ARGS)
    assert [o["token_ids"] for o in now["outputs"]] == run["ours"]["token_ids"]
    assert (now["num_steps"], now["num_preemptions"], now["prefix_cache_hits"]) == (
        run["ours"]["num_steps"], run["ours"]["num_preemptions"],
        run["ours"]["prefix_cache_hits"])


def _fake(ours=(91, 6, 416), vllm=(90, 8, 480), identical=48):
    keys = ("num_steps", "num_preemptions", "prefix_cache_hits")
    return {"comparison": {"num_requests": 48, "identical_requests": identical,
                           "num_tokens": 790, "identical_tokens": 790, "max_logprob_diff": 4e-6,
                           "logprob_atol": 1e-4},
            "ours": dict(zip(keys, ours)), "vllm": dict(zip(keys, vllm), version="0.32.0"),
            "workload": {"num_requests": 48, "total_new_tokens": 790}}


def test_peer_summary_follows_the_numbers():
    s = peer_summary(_fake())
    assert "same tokens on every request" in s and "close but not equal" in s
    assert "fewer steps in vLLM (90 against our 91)" in s
    assert "more preemptions in vLLM (8 against our 6)" in s
    assert "more prompt tokens served from the prefix cache in vLLM (480 against our 416)" in s
    s = peer_summary(_fake(vllm=(91, 6, 416), identical=47))
    assert "differed on 1 requests" in s and "The schedules are the same" in s
    assert "the same steps (91)" in s
    text = peer_table(_fake()).to_text()
    assert "790 of 790 (48 of 48 requests)" in text and "4e-06 (allowed 1e-04)" in text


def test_counterparts_name_vllm_files():
    t = counterparts_table()
    assert len(t.rows) == len(VLLM_COUNTERPARTS) == 6
    assert all("vllm/" in r[3] for r in VLLM_COUNTERPARTS)


@pytest.mark.parametrize("D", [8, 16, 24, 32, 40, 48, 64, 128, 1024])
def test_vllm_problem_names_unsupported_head_dims(D):
    cfg = preset("tiny-dense", head_dim=D, hidden_size=4 * D)
    msg = vllm_problem(cfg)
    if D in VLLM_CPU_HEAD_SIZES:
        assert msg is None
    else:
        assert f"head_dim {D} " in msg and "32, 64, 80" in msg


def test_vllm_problem_accepts_the_shipped_shape_and_the_mla_latent(pretrained):
    assert vllm_problem(pretrained[0].config) is None
    mla = preset("tiny", kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=32,
                 v_head_dim=32, head_dim=64)
    assert vllm_problem(mla) is None
    assert "256 + 64 = 320" in vllm_problem(mla.replace(kv_lora_rank=256))


def test_run_ours_times_are_the_request_outputs(pretrained, workload, monkeypatch):
    """TTFT and TPOT of our record are RequestOutput's own (one definition): fixed stamps in,
    TTFT = first - arrival, TPOT = (last - first) / (n - 1) out."""
    from tokenflow.serving import RequestOutput
    fixed = [RequestOutput(0, [1, 2], [5, 6, 7, 8, 9], "length", arrival_time=0.0,
                           first_token_time=1.0, finish_time=9.0, last_token_time=5.0,
                           logprobs=[{t: -0.5} for t in (5, 6, 7, 8, 9)])]
    monkeypatch.setattr("tokenflow.serving.peer.LLMEngine.run",
                        lambda self, prompts, params, use_tqdm=True: fixed)
    rec = run_ours(pretrained[0], [[1, 2]], [5], **PEER_ENGINE_ARGS)["outputs"][0]
    assert rec["ttft_s"] == 1.0 and rec["tpot_s"] == 1.0 and rec["logprobs"] == [-0.5] * 5


def test_vllm_record_of_a_request_output():
    """vLLM's RequestOutput as our record: TTFT from queueing to the first token, TPOT from
    the first to the last token over n - 1, the chosen tokens' logprobs."""
    from types import SimpleNamespace as NS
    from tokenflow.interop.vllm_peer import _output
    lp = [{t: NS(logprob=-0.1 * t), 99: NS(logprob=-9.0)} for t in (1, 2, 3, 4, 5)]
    o = NS(outputs=[NS(token_ids=[1, 2, 3, 4, 5], logprobs=lp)], num_cached_tokens=32,
           metrics=NS(queued_ts=0.5, first_token_ts=1.0, last_token_ts=5.0))
    rec = _output(o)
    assert rec["token_ids"] == [1, 2, 3, 4, 5] and rec["num_cached_tokens"] == 32
    assert rec["ttft_s"] == 0.5 and rec["tpot_s"] == 1.0
    assert rec["logprobs"] == pytest.approx([-0.1, -0.2, -0.3, -0.4, -0.5])
    one = NS(outputs=[NS(token_ids=[7], logprobs=None)], num_cached_tokens=None,
             metrics=NS(queued_ts=0.0, first_token_ts=2.0, last_token_ts=2.0))
    assert _output(one) == {"token_ids": [7], "logprobs": None, "num_cached_tokens": 0,
                            "ttft_s": 2.0, "tpot_s": None}


def test_make_llm_gives_vllm_our_settings(monkeypatch):
    """make_llm hands vLLM one block more than ours (vLLM keeps block 0 as its null block),
    chunked prefill, stats on, and binds its threads to the first cores."""
    import sys
    import types
    from tokenflow.interop.vllm_peer import make_llm
    got = {}
    fake = types.ModuleType("vllm")
    fake.LLM = lambda **kw: got.update(kw) or "llm"
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    assert make_llm("/m", block_size=32, num_blocks=24, max_num_seqs=16,
                    max_num_batched_tokens=256, max_model_len=128, threads=2,
                    async_scheduling=False) == "llm"
    assert got["num_gpu_blocks_override"] == 25 and got["block_size"] == 32
    assert got["enable_chunked_prefill"] and not got["disable_log_stats"]
    assert got["async_scheduling"] is False and got["dtype"] == "float32"
    import os
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    got.clear()
    make_llm("/m", block_size=16, num_blocks=8, max_num_seqs=1, max_num_batched_tokens=16,
             max_model_len=64)
    assert "async_scheduling" not in got and got["num_gpu_blocks_override"] == 9
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "0"


def test_vllm_problem_mla_depends_on_the_latent_only():
    """vLLM's CPU MLA kernel takes the 576-wide latent whatever the RoPE part's width; the GQA
    head sizes do not apply to MLA."""
    mla = preset("tiny", kv_lora_rank=560, qk_rope_head_dim=16, qk_nope_head_dim=32,
                 v_head_dim=32, head_dim=16)
    assert vllm_problem(mla) is None


def test_vllm_counters_read_vllms_metric_names():
    """_counters sums vLLM's own Prometheus metrics by their names (vLLM 0.32)."""
    from types import SimpleNamespace as NS
    from tokenflow.interop.vllm_peer import _counters
    metrics = [NS(name="vllm:iteration_tokens_total", count=7, value=None),
               NS(name="vllm:num_preemptions", value=3.0),
               NS(name="vllm:prefix_cache_queries", value=100.0),
               NS(name="vllm:prefix_cache_hits", value=64.0),
               NS(name="vllm:num_requests_running", value=5.0)]
    got = _counters(NS(get_metrics=lambda: metrics))
    assert got == {"num_steps": 7, "num_preemptions": 3, "prefix_cache_queries": 100,
                   "prefix_cache_hit_tokens": 64}


def test_vllm_process_sends_each_batch_as_one_json_line():
    """VLLMProcess.run writes the batch (prompts, max_new_tokens, logprobs) as one JSON line
    and reads one record back; a closed pipe raises RuntimeError."""
    import io
    import json
    from types import SimpleNamespace as NS
    from tokenflow.interop.vllm_peer import VLLMProcess
    p = object.__new__(VLLMProcess)
    sent = io.StringIO()
    p.proc = NS(stdin=sent, stdout=io.StringIO('{"outputs": [], "num_steps": 2}\n'))
    p.log = None
    assert p.run([[1, 2]], [3], logprobs=False) == {"outputs": [], "num_steps": 2}
    assert json.loads(sent.getvalue()) == {"prompts": [[1, 2]], "max_new_tokens": [3],
                                           "logprobs": False}
    p.proc = NS(stdin=io.StringIO(), stdout=io.StringIO(""))
    from pathlib import Path
    p.log = Path("/nonexistent/vllm.log")
    with pytest.raises(RuntimeError, match="died"):
        p.run([[1]], [1])


def test_workload_accepts_a_one_value_range(pretrained):
    prompts, news = peer_workload(pretrained[1], num_requests=5, min_new=8, max_new=8,
                                  min_prompt=10, max_prompt=10)
    assert news == [8] * 5 and [len(p) for p in prompts] == [10] * 5


def test_run_ours_passes_prefix_caching_through(pretrained, workload):
    model = pretrained[0]
    prompts, news = workload[0][:16], [2] * 16
    on = run_ours(model, prompts, news, **PEER_ENGINE_ARGS)
    off = run_ours(model, prompts, news, **PEER_ENGINE_ARGS, enable_prefix_caching=False)
    assert on["prefix_cache_hits"] > 0 and off["prefix_cache_hits"] == 0
    assert [o["token_ids"] for o in on["outputs"]] == [o["token_ids"] for o in off["outputs"]]


def test_compare_runs_names_the_first_mismatch():
    a = [_rec([1]), _rec([2]), _rec([3]), _rec([4])]
    b = [_rec([1]), _rec([9]), _rec([9]), _rec([4])]
    c = compare_runs(a, b)
    assert c["first_mismatch"] == 1 and c["identical_requests"] == 2


def test_peer_table_columns_are_ours_then_vllm():
    rows = {r[0]: r[1:] for r in peer_table(_fake(ours=(91, 1, 416), vllm=(90, 9, 480))).rows}
    assert rows["engine steps"] == [91, 90] and rows["preemptions"] == [1, 9]
    assert rows["prompt tokens from the prefix cache"] == [416, 480]


def _script():
    return load_script("vllm_peer", "vllm_peer_script")


def test_script_agrees_needs_every_token_and_the_logprobs():
    s = _script()
    run = _fake()
    assert s.agrees(run)
    run["comparison"]["max_logprob_diff"] = None                 # no logprobs: no claim
    assert not s.agrees(run)
    run["comparison"]["max_logprob_diff"] = 2 * s.LOGPROB_ATOL
    assert not s.agrees(run)
    run = _fake(identical=47)
    assert not s.agrees(run)


def test_script_summary_columns():
    s = _script()
    run = _fake(ours=(91, 2, 64), vllm=(90, 9, 480))
    run["comparison"]["identical_tokens"] = 790
    lines = s.summary(run).splitlines()
    assert lines[0].startswith("requests identical: 48/48, tokens 790/790")
    assert lines[2].split() == ["tokenflow", "91", "2", "64"]
    assert lines[3].split() == ["vLLM", "0.32.0", "90", "9", "480"]
