"""Expert parallelism over real processes: torch.distributed (gloo, loopback) with
W = 1, 2, 4 ranks gives the single-process MoE output, and the bytes each rank sends match the
all-to-all formula. Each run forks its ranks from a forkserver (one thread each), with a 60 s
timeout; the whole file takes a few seconds."""
import os

import pytest
import torch

from tokenflow.analysis.costmodel import moe_a2a_bytes
from tokenflow.parallel.expert_parallel import (
    EPResult,
    demo_moe,
    expert_owner,
    run_expert_parallel,
    simulate_routing,
    traffic_matrix,
)
from tokenflow.model.moe import moe_inputs

ATOL, RTOL = 1e-5, 1e-4          # float32, same weights; only the matmul batch sizes differ


def check_bytes(res: EPResult, H: int, K: int, b: int = 4) -> None:
    """Per-rank bytes == formula, and what rank i sends rank j is what j receives from i."""
    W = len(res.ranks)
    traffic = res.traffic                                             # [W, W]
    for s in res.ranks:
        r = s.rank
        assert s.tokens == res.splits[r] and sum(s.sent_rows) == s.tokens * K
        assert s.local_rows == traffic[r, r]
        assert s.recv_rows == traffic[:, r].tolist()
        assert s.dispatch_bytes_sent == s.dispatch_bytes_formula == moe_a2a_bytes(
            s.tokens, K, H, b, local_pairs=s.local_rows)
        assert s.combine_bytes_sent == s.combine_bytes_formula == (
            (sum(s.recv_rows) - s.local_rows) * H * b)
        assert s.count_bytes_sent == (W - 1) * (len(s.local_experts)) * 8
    total_dispatch = sum(s.dispatch_bytes_sent for s in res.ranks)
    assert total_dispatch == sum(s.combine_bytes_sent for s in res.ranks)
    assert total_dispatch == (int(traffic.sum()) - int(traffic.trace())) * H * b


def test_pretrained_layer_world_size_2_equals_single_process(pretrained):
    model, tok = pretrained
    text = "北京是中国的首都。巴黎是法国的首都。"
    ids = torch.tensor([tok.encode(text)])
    x, single = moe_inputs(model, ids, 1)                             # [1, S, H] x2
    moe = model.layers[1].mlp
    res = run_expert_parallel(moe, x, 2, timeout_s=60)
    torch.testing.assert_close(res.output, single[0], atol=ATOL, rtol=RTOL)
    check_bytes(res, moe.gate.weight.shape[1], moe.gate.top_k)
    assert [s.local_experts for s in res.ranks] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert res.backend == "gloo"


@pytest.mark.parametrize("scoring,E,K,splits", [
    ("softmax", 8, 2, None),
    ("sigmoid", 8, 3, [5, 0, 7, 3]),            # DeepSeek routing; one rank has no tokens
    ("softmax", 16, 4, [1, 2, 3, 4]),
])
def test_world_size_4_equals_single_process(scoring, E, K, splits):
    moe = demo_moe("random", num_experts=E, top_k=K, scoring_func=scoring, seed=E + K)
    T = 15 if splits is not None and sum(splits) == 15 else (10 if splits else 24)
    x = torch.randn(T, 64, generator=torch.Generator().manual_seed(K))
    with torch.no_grad():
        single = moe(x[None])[0]
    res = run_expert_parallel(moe, x, 4, splits=splits, timeout_s=60)
    torch.testing.assert_close(res.output, single, atol=ATOL, rtol=RTOL)
    check_bytes(res, 64, K)
    # the traffic the ranks reported is the one the router implies
    token_rank = torch.repeat_interleave(torch.arange(4), torch.tensor(res.splits))
    idx, _, _ = moe.gate(x)
    assert torch.equal(res.traffic, traffic_matrix(idx, token_rank, E, 4))


def test_world_size_1_sends_nothing():
    moe = demo_moe("random")
    x = torch.randn(9, 64)
    with torch.no_grad():
        single = moe(x[None])[0]
    res = run_expert_parallel(moe, x, 1, timeout_s=60)
    torch.testing.assert_close(res.output, single, atol=ATOL, rtol=RTOL)
    s = res.ranks[0]
    assert s.local_rows == 9 * 2 and s.dispatch_bytes_sent == s.combine_bytes_sent == 0


def test_argument_errors():
    moe = demo_moe("random")
    x = torch.randn(4, 64)
    with pytest.raises(ValueError, match="world_size"):
        run_expert_parallel(moe, x, 3)
    with pytest.raises(ValueError, match="world_size"):
        run_expert_parallel(moe, x, 0)
    with pytest.raises(ValueError, match="splits"):
        run_expert_parallel(moe, x, 2, splits=[1, 2])
    with pytest.raises(ValueError, match="x must"):
        run_expert_parallel(moe, torch.randn(4, 5), 2)
    with pytest.raises(ValueError, match="backend"):
        run_expert_parallel(moe, x, 2, backend="mpi")
    with pytest.raises(ValueError, match="world_size"):
        expert_owner(8, 3)
    with pytest.raises(ValueError, match="source"):
        demo_moe("hub")


def test_expert_owner_and_traffic_matrix():
    assert expert_owner(8, 4).tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    idx = torch.tensor([[0, 7], [2, 3], [6, 1]])                      # T=3, K=2, E=8
    m = traffic_matrix(idx, torch.tensor([0, 1, 1]), 8, 2)
    assert m.tolist() == [[1, 1], [3, 1]]                             # rows: from, cols: to


def test_simulate_routing():
    r = simulate_routing(num_experts=8, top_k=2, batch_size=2, seq_len=16, world_size=4,
                         hidden_size=7168, bytes_per_element=2)
    assert r["tokens"] == 32 and sum(r["counts"]) == 64
    assert r["local_pairs"] + r["remote_pairs"] == 64
    assert r["dispatch_bytes"] == r["remote_pairs"] * 7168 * 2
    assert r["uniform_bytes"] == 64 * 7168 * 2 * 0.75
    assert simulate_routing(world_size=1)["dispatch_bytes"] == 0
    with pytest.raises(ValueError, match="top_k"):
        simulate_routing(num_experts=4, top_k=6)
    with pytest.raises(ValueError, match="world_size"):
        simulate_routing(num_experts=8, world_size=3)


def test_timeout_kills_the_workers_and_raises(monkeypatch):
    """Spawned interpreters need far longer than 0.05 s just to import torch: the run times out,
    and afterwards none of its ranks is alive and its temporary folder is gone."""
    import tempfile

    import psutil
    folders = []
    mkdtemp = tempfile.mkdtemp
    monkeypatch.setattr(tempfile, "mkdtemp", lambda **kw: folders.append(mkdtemp(**kw))
                        or folders[-1])
    before = {c.pid for c in psutil.Process().children()}
    moe = demo_moe("random")
    with pytest.raises(TimeoutError, match="timeout_s"):
        run_expert_parallel(moe, torch.randn(4, 64), 2, timeout_s=0.05, start_method="spawn")
    assert len(folders) == 1 and not os.path.exists(folders[0])
    left = [c.cmdline() for c in psutil.Process().children() if c.pid not in before
            and c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    # multiprocessing's resource tracker stays for the life of this process, by design
    left = [cmd for cmd in left if "multiprocessing.resource_tracker" not in " ".join(cmd)]
    assert not left, f"ranks still running: {left}"


def test_spawn_start_method_works():
    """The plain ``spawn`` path (a fresh interpreter per rank; what platforms without forkserver
    use). One rank only, to keep the test quick: the all-to-all code is the same as above."""
    moe = demo_moe("random", scoring_func="sigmoid")
    x = torch.randn(6, 64, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        single = moe(x[None])[0]
    res = run_expert_parallel(moe, x, 1, start_method="spawn", timeout_s=60)
    torch.testing.assert_close(res.output, single, atol=ATOL, rtol=RTOL)
    check_bytes(res, 64, 2)
    with pytest.raises(ValueError, match="start_method"):
        run_expert_parallel(moe, x, 1, start_method="fork")


def test_module_entry_point_runs_without_warnings():
    """``python -m tokenflow.parallel.expert_parallel`` prints its report and no runpy warning
    (the forkserver must not preload the module that is itself ``__main__``)."""
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-W", "default", "-m", "tokenflow.parallel.expert_parallel",
                        "--nproc", "2", "--tokens", "16"],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    # a claim with its tolerance, not digits: the sum order differs per rank (5.96e-08 on AVX2)
    assert "EP vs single process: allclose(atol=1e-05): True" in r.stdout, r.stdout[-2000:]
    assert "Warning" not in r.stderr, r.stderr[-2000:]
