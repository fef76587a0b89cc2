"""Explorers and the paging figures show what they claim: each control of a chapter's
explorer changes the output in view; a block table is the block manager's state; the KV slot
counts of a run match a count by hand; the chunked-prefill sentence follows the numbers."""
import re
from types import SimpleNamespace

import pytest

pytest.importorskip("matplotlib")
import matplotlib  # noqa: E402

matplotlib.use("Agg")

from tokenflow.serving import (BlockManager, LLMEngine, SamplingParams,  # noqa: E402
                               request_timeline, run_with_arrivals)
from tokenflow.viz import (block_table_figure, block_table_rows, block_table_sentence,  # noqa: E402
                           chunked_prefill_sentence, kv_slot_sentence,
                           explore, kv_slot_table, kv_slot_usage, moe_routing_static,
                           serving_counts, serving_static, trace_shapes_static)
from conftest import random_model  # noqa: E402


def _png_payload(fragment: str) -> str:
    m = re.search(r'src="data:image/png;base64,([^"]+)"', fragment)
    return m.group(1) if m else fragment


def _each_control_changes_the_output(ex, view=lambda f: f):
    """Move each control through its values with the others at their default: every value
    gives a different output (``view`` picks what is in view)."""
    names = list(ex.controls)
    for k, name in enumerate(names):
        seen = set()
        for i in range(len(ex.controls[name])):
            idx = list(ex.default.values())
            idx[k] = i
            seen.add(view(ex.fragments["-".join(map(str, idx))]))
        assert len(seen) == len(ex.controls[name]), name


def test_trace_shapes_explorer_shows_what_E_changes_in_its_caption():
    cfg = random_model().config
    ex = trace_shapes_static(cfg, batch=(1, 2), seq_len=(3, 5), experts=(2, 4, 8),
                             default={"B": 2, "S": 5, "E": 4})
    # the caption (above the table, in view at any width) moves with every control
    _each_control_changes_the_output(ex, lambda f: re.search(r"<caption>(.*?)</caption>", f,
                                                             re.S).group(1))
    cap = re.search(r"<caption>(.*?)</caption>", ex.fragments["1-1-2"], re.S).group(1)
    k = cfg.num_experts_per_tok
    assert "[10, 8]" in cap and f"{10 * k / 8:g} (token, expert) pairs" in cap


def test_moe_routing_explorer_reaches_deepseek_v3_top_k():
    ex = moe_routing_static(num_experts=(8, 64), top_k=(6, 8), world_size=(8,),
                            batch_size=1, seq_len=8)
    assert 8 in ex.controls["top-k K"]
    _each_control_changes_the_output(ex, _png_payload)


def test_serving_explorer_shows_block_size_waste_and_moves_with_each_control():
    model = random_model()
    ids = list(range(4, 400))
    c16 = serving_counts(model, ids, 4, 16, 9, 2, 16, length_step=3)
    c4 = serving_counts(model, ids, 4, 16, 9, 2, 4, length_step=3)
    # prompts 16, 13, 10, 7 + 9 new = 25, 22, 19, 16 tokens; by hand:
    assert c16["tokens"] == [25, 22, 19, 16]
    assert c16["slots"] == [32, 32, 32, 16] and c16["unused_slots"] == 7 + 10 + 13 + 0
    assert c4["slots"] == [28, 24, 20, 16] and c4["unused_slots"] == 3 + 2 + 1 + 0
    assert c16["steps"] == c4["steps"]
    ex = serving_static(model, ids, controls={"requests": [2, 4], "seats": [1, 2],
                                              "block": [4, 16]},
                        default={"requests": 4, "seats": 2, "block": 16})
    assert all("<img" in f for f in ex.fragments.values())       # a figure, not a table
    _each_control_changes_the_output(ex, _png_payload)


def test_explore_live_has_the_same_controls_and_default():
    w = explore(lambda a, b: f"{a}{b}", {"a": [1, 2, 3], "b": ["x", "y"]}, live=True,
                default={"a": 2})
    assert [list(c.options) for c in w.children[:2]] == [[1, 2, 3], ["x", "y"]]
    assert w.children[0].value == 2 and w.children[1].value == "x"
    with pytest.raises(ValueError, match="default"):
        explore(lambda a: a, {"a": [1]}, live=True, default={"a": 5})


def _req(rid, n, blocks):
    return SimpleNamespace(request_id=rid, num_tokens=n, block_table=list(blocks))


def test_block_table_rows_are_the_block_managers_state():
    model = random_model()
    shared = list(range(4, 4 + 8))                   # two full blocks of 4
    eng = LLMEngine(model, num_blocks=16, block_size=4)
    eng.add_request(shared + [20, 21], SamplingParams(4, ignore_eos=True))
    eng.step()
    eng.add_request(shared + [30], SamplingParams(4, ignore_eos=True))
    eng.step()
    running = list(eng.scheduler.running)
    rows = block_table_rows(eng.block_manager, running)
    for r in running:
        mine = [x for x in rows if x["request_id"] == r.request_id]
        assert [x["physical"] for x in mine] == r.block_table
        assert sum(x["tokens"] for x in mine) == r.num_tokens
    # the two prefix blocks: the same physical ids in both tables, held twice
    t0, t1 = (r.block_table for r in running)
    assert t0[:2] == t1[:2] and t0[2] != t1[2]
    assert all(x["shared"] == (x["logical"] < 2) for x in rows)
    assert all(x["ref_count"] == eng.block_manager.blocks[x["physical"]].ref_count for x in rows)
    block_table_figure(eng.block_manager, running)
    # 2 requests, 3 logical blocks each, 4 physical: blocks t0[:2] shared twice
    assert block_table_sentence(eng.block_manager, running) == (
        f"2 requests hold 4 physical blocks for 6 logical ones; blocks {sorted(t0[:2])} are "
        "shared, reference count 2.")
    # a third request shares only the first prefix block: counts 3 and 2, in block order
    eng.add_request(shared[:4] + [40, 41, 42, 43, 44], SamplingParams(4, ignore_eos=True))
    eng.step()
    running = list(eng.scheduler.running)
    first, second = running[0].block_table[:2]
    assert block_table_sentence(eng.block_manager, running).endswith(
        f"blocks {sorted([first, second])} are shared, reference counts "
        + ("3 and 2." if first < second else "2 and 3."))
    bm = BlockManager(4, 4)
    with pytest.raises(ValueError, match="holds no blocks"):
        block_table_rows(bm, [_req("a", 3, [])])
    with pytest.raises(ValueError, match="at least one"):
        block_table_rows(bm, [])


def test_kv_slot_usage_counts_by_hand():
    """One seat, blocks of 4: request 0 (5 prompt + 3 new) runs steps 0-2, request 1 (7 + 3)
    steps 3-5, counted after each step. After step 0 request 0 holds 5 K/V in 2 blocks (its 6
    tokens: 8 slots), after step 1 6 K/V (a decode writes the token it feeds; its slot is
    allocated when it is scheduled); step 2 gives its last token and frees it. Request 1: 7 K/V
    in 2 blocks, then 8 in 2, then done."""
    model = random_model()
    eng = LLMEngine(model, num_blocks=8, block_size=4, max_num_seqs=1,
                    enable_prefix_caching=False)
    prompts = [list(range(4, 9)), list(range(10, 17))]
    outs, arr = run_with_arrivals(eng, prompts, SamplingParams(3, ignore_eos=True), [0, 0])
    u = kv_slot_usage(eng.steps, request_timeline(eng, arr, outs), 8, 4, reserve_len=32)
    assert u["used"] == [5, 6, 0, 7, 8, 0]
    assert u["paged"] == [8, 8, 0, 8, 8, 0]
    assert u["contiguous"] == [32, 32, 0, 32, 32, 0]
    assert u["used_total"] == 26 and u["contiguous_total"] == 128 and u["paged_total"] == 32
    t = kv_slot_table(u)
    assert t.rows[0][2] == 128 and t.rows[0][4] == 102 and t.rows[1][4] == 6
    # 128 / 26 = 4.9x (20% used); 32 / 26 = 1.23x (81% used); busiest 32 of a 32-slot pool
    assert kv_slot_sentence(u) == (
        "Over the run a contiguous reservation of 32 slots per request would hold 4.9x the "
        "slot-steps the K/V fills (20% used); the paged blocks hold 1.23x (81% used). At the "
        "busiest step the reservation needs 32 slots, the pool has 32.")
    with pytest.raises(ValueError, match="reserve_len"):
        kv_slot_usage(eng.steps, [], 8, 4, 0)


def test_kv_slot_usage_adds_up_a_prompt_prefilled_in_chunks():
    """A budget of 4 tokens a step splits a 7-token prompt: 4 K/V after step 0, 7 after
    step 1 (the last chunk gives the first token), then the one decode gives the last token
    and frees the request."""
    eng = LLMEngine(random_model(), num_blocks=8, block_size=4, max_num_seqs=1,
                    max_num_batched_tokens=4, enable_prefix_caching=False)
    outs, arr = run_with_arrivals(eng, [list(range(10, 17))], SamplingParams(2, ignore_eos=True),
                                  [0])
    assert [len(s.prefill) for s in eng.steps] == [1, 1, 0]
    u = kv_slot_usage(eng.steps, request_timeline(eng, arr, outs), 8, 4, reserve_len=16)
    assert u["used"] == [4, 7, 0]
    assert all(p >= n for p, n in zip(u["paged"], u["used"]))


def _eng(ttft_s, step_s):
    steps = [SimpleNamespace(seconds=s, decode=[0]) for s in step_s]
    return SimpleNamespace(outputs={4: SimpleNamespace(ttft=ttft_s)}, steps=steps)


def test_chunked_prefill_sentence_follows_the_numbers():
    runs = {2048: _eng(0.0648, [0.084, 0.002]), 256: _eng(0.0693, [0.028]),
            64: _eng(0.0600, [0.009])}
    s = chunked_prefill_sentence(runs, 4, 2048)
    assert "budget 256 it came 4.5 ms later (69.3 ms)" in s
    assert "budget 64 it came 4.8 ms sooner (60.0 ms)" in s
    assert "longest decode step took 84 ms" in s
    # a slower step that only prefills is no decode step
    runs[2048].steps.append(SimpleNamespace(seconds=0.5, decode=[]))
    assert "longest decode step took 84 ms" in chunked_prefill_sentence(runs, 4, 2048)
    with pytest.raises(ValueError, match="baseline"):
        chunked_prefill_sentence(runs, 4, 1)


def test_kv_scale_explorer_counts_llama_by_hand_and_moves_with_each_control():
    from tokenflow.analysis.costmodel import reference_config
    from tokenflow.viz import kv_cache_scale_static, kv_cache_scale_table
    llama = reference_config("Llama-3-8B")
    t = kv_cache_scale_table(llama, 8192, 32, 8)
    # 32 layers x 2 (K, V) x 8 heads x 128 x 2 B = 128 KiB per token
    assert t.rows[1][1] == pytest.approx(32 * 8192 * 128 / 2**20)
    assert t.rows[2][1] == pytest.approx(t.rows[0][1] + t.rows[1][1])
    with pytest.raises(ValueError, match="num_key_value_heads"):
        kv_cache_scale_table(llama, 8192, 1, 3)
    ex = kv_cache_scale_static(llama, context=(1024, 8192), batch=(1, 32), kv_heads=(1, 8, 32),
                               default={"S": 8192, "B": 32, "kv_heads": 8})
    _each_control_changes_the_output(ex)
