"""The serving engine: engine output == ``generate`` per request, block
bookkeeping, scheduling decisions, rejections and settings errors.

The reference for every request is :func:`tokenflow.inference.generate` run on that request alone
(batch 1, whole prompt in one prefill, no preemption), with a fresh ``torch.Generator``
seeded like the request. The workload forces chunked prefill (prompts longer than the token
budget), preemption (a pool smaller than the requests' needs) and prefix-cache hits (a
shared system prompt), for both storages (paged: one packed forward per step, or one per
chunk, and shared prefix blocks; contiguous: a cache and a forward per request).
"""
import pytest
import torch

from tokenflow import generate
from tokenflow.serving import (BlockManager, LLMEngine, Request, SamplingParams, Scheduler)


BLOCK = 4


def _ids(n, seed):
    return torch.randint(4, 512, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _reference(model, prompt, sp):
    """``generate`` on this request alone."""
    out = generate(model, torch.tensor([prompt]), sp.max_new_tokens, sp.temperature, sp.top_k,
                   sp.top_p, sp.min_p, generator=torch.Generator().manual_seed(sp.seed),
                   eos_token_id=sp.eos_token_id, stop_at_eos=not sp.ignore_eos)
    return out[0, len(prompt):].tolist()


def _workload(model):
    """(prompts, params): 7 good requests sharing a 12-token system prompt in part."""
    system = _ids(12, 100)
    prompts = [system + _ids(3, 1), system + _ids(9, 2), _ids(30, 3), _ids(40, 4),
               system + _ids(5, 5), system + _ids(2, 6), _ids(7, 7)]
    SP = SamplingParams
    params = [SP(12, seed=0), SP(20, 0.8, top_k=50, top_p=0.9, seed=1), SP(9, seed=2),
              SP(16, 1.0, min_p=0.05, seed=3), SP(6, seed=4),
              SP(20, 0.7, seed=5, ignore_eos=True), SP(10, seed=6)]
    # the last one stops at an end-of-sequence id: the first of its greedy tokens (taken from
    # generate) from the third on that did not occur before
    ref = _reference(model, prompts[6], params[6])
    params[6].eos_token_id = next(t for i, t in enumerate(ref) if i >= 2 and t not in ref[:i])
    return prompts, params


BAD = [(_ids(90, 9), SamplingParams(10), "num_blocks"),
       (_ids(100, 9), SamplingParams(40), "max_position_embeddings")]
"""Well-formed requests this engine can never run: rejected alone (bad arguments raise
instead, see tests/test_serving_robust.py)."""


@pytest.fixture(scope="module", params=["paged-batched", "paged-per-request",
                                        "contiguous-per-request"])
def run(request, model):
    """(engine, prompts, params, outputs of the good requests, outputs of the bad ones)."""
    prompts, params = _workload(model)
    storage, mode = request.param.split("-", 1)
    engine = LLMEngine(model, num_blocks=20, block_size=BLOCK, max_num_seqs=3,
                       max_num_batched_tokens=16, batch_decode=mode == "batched",
                       kv_storage=storage)
    all_prompts = prompts[:3] + [b[0] for b in BAD] + prompts[3:]
    all_params = params[:3] + [b[1] for b in BAD] + params[3:]
    outs = engine.run(all_prompts, all_params, use_tqdm=False)
    bad = outs[3:3 + len(BAD)]
    return engine, prompts, params, outs[:3] + outs[3 + len(BAD):], bad


def test_engine_equals_generate_per_request(run, model):
    engine, prompts, params, outs, _ = run
    for i, (prompt, sp, out) in enumerate(zip(prompts, params, outs)):
        assert out.output_token_ids == _reference(model, prompt, sp), f"request {i}"
    assert outs[6].finish_reason == "eos" and 3 <= len(outs[6].output_token_ids) < 10
    assert outs[6].output_token_ids[-1] == params[6].eos_token_id
    assert outs[5].finish_reason == "length" and len(outs[5].output_token_ids) == 20


def test_workload_forces_chunks_preemption_and_prefix_hits(run):
    engine, prompts, params, outs, _ = run
    prompt_len = {o.request_id: len(o.prompt_token_ids) for o in outs}
    chunks = [(rid, n) for s in engine.steps for rid, n in s.prefill]
    assert any(n < prompt_len[rid] for rid, n in chunks if rid in prompt_len)    # chunked
    assert all(s.num_tokens <= 16 for s in engine.steps)                         # the budget
    assert engine.metrics()["num_preemptions"] >= 1
    assert sum(o.num_preemptions for o in outs) >= 1
    # a request that was never preempted found the shared system prompt's 3 full blocks
    assert any(o.num_cached_tokens >= 12 and o.num_preemptions == 0 for o in outs[4:6])


def test_all_blocks_back_in_free_list(run):
    engine = run[0]
    bm = engine.block_manager
    assert sorted(bm.free_block_ids) == list(range(bm.num_blocks))
    assert all(b.ref_count == 0 for b in bm.blocks)
    assert len(engine.runner.strategy) == 0
    assert not engine.has_unfinished()


def test_paged_storage_shares_prefix_hits_instead_of_recomputing(run):
    engine = run[0]
    recomputed = engine.metrics()["num_recomputed_tokens"]
    if engine.runner.strategy.__class__.__name__ == "PagedRunner":
        assert recomputed == 0
    else:
        assert recomputed >= 12                         # the contiguous one recomputes them


def test_bad_requests_rejected_alone(run):
    engine, _, _, outs, bad = run
    for (_, _, word), out in zip(BAD, bad):
        assert out.finish_reason == "rejected" and out.output_token_ids == []
        assert word in out.reason
    assert all(o.finish_reason in ("eos", "length") for o in outs)


def test_metrics_are_consistent(run):
    engine, _, _, outs, _ = run
    m = engine.metrics()
    assert m["num_rejected"] == len(BAD)
    assert m["num_generated_tokens"] == sum(len(o.output_token_ids) for o in outs)
    for o in outs:
        assert 0 < o.ttft <= o.e2e_latency
        if len(o.output_token_ids) > 1:
            assert o.tpot > 0
    # every generated token is sampled after a chunk that ends at the request's last token
    assert m["num_computed_tokens"] >= sum(len(o.prompt_token_ids) for o in outs)


@pytest.mark.parametrize("name, value", [("num_blocks", 0), ("block_size", 0),
                                         ("max_num_seqs", 0), ("max_num_batched_tokens", -1),
                                         ("block_size", 2.5), ("enable_prefix_caching", "yes"),
                                         ("batch_decode", 1), ("kv_storage", "flat")])
def test_bad_engine_settings_name_the_setting(model, name, value):
    with pytest.raises(ValueError, match=name):
        LLMEngine(model, **{name: value})


def test_duplicate_request_id_raises(model):
    engine = LLMEngine(model, num_blocks=8, block_size=4)
    engine.add_request([5, 6, 7], request_id="a")
    with pytest.raises(ValueError, match="request_id"):
        engine.add_request([5, 6], request_id="a")


def test_unseeded_requests_get_different_generators(model):
    engine = LLMEngine(model, num_blocks=16, block_size=4)
    sp = SamplingParams(8, temperature=1.0)
    a, b = engine.run([[5, 6, 7], [5, 6, 7]], sp, use_tqdm=False)
    assert a.output_token_ids != b.output_token_ids


# ------------------------------------------------------------------- cache variants
def _recompute_greedy(model, prompt, n):
    """Greedy tokens without any cache: the whole sequence through the model every step."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    return ids[len(prompt):]


def _serve_late_arrivals(engine, prompts, sp):
    """Add ``prompts[0]``, step once, add the rest, step to the end. Returns the outputs and,
    per step, the block tables of the requests running after it."""
    ids = [engine.add_request(prompts[0], sp)]
    engine.step()
    ids += [engine.add_request(p, sp) for p in prompts[1:]]
    tables = []
    while engine.has_unfinished():
        engine.step()
        tables.append({r.request_id: list(r.block_table) for r in engine.scheduler.running})
    return [engine.outputs[i] for i in ids], tables


@pytest.mark.parametrize("storage, prefix", [("contiguous", True), ("paged", True),
                                             ("paged", False)])
def test_greedy_tokens_identical_across_cache_variants(model, storage, prefix):
    """Contiguous, paged (with and without shared prefix blocks) and recompute (no cache)
    give the same greedy tokens. Requests 1-2 arrive while request 0, which shares their
    12-token prefix, still runs: with the paged storage their block tables hold request 0's
    first 3 physical blocks, and nothing is recomputed."""
    system = _ids(12, 200)
    prompts = [system + _ids(n, 210 + n) for n in (3, 6, 2)] + [_ids(9, 220)]
    sp = SamplingParams(8, ignore_eos=True)
    engine = LLMEngine(model, num_blocks=24, block_size=BLOCK, max_num_seqs=4,
                       max_num_batched_tokens=64, enable_prefix_caching=prefix,
                       kv_storage=storage)
    outs, tables = _serve_late_arrivals(engine, prompts, sp)
    assert [o.output_token_ids for o in outs] == [_recompute_greedy(model, p, 8) for p in prompts]
    shared = [o.num_cached_tokens for o in outs[1:3]]
    assert shared == ([12, 12] if prefix else [0, 0])
    first = tables[0]
    if prefix:
        assert first[0][:3] == first[1][:3] == first[2][:3]     # same physical blocks
    else:
        assert not set(first[0]) & set(first[1])
    recomputed = engine.metrics()["num_recomputed_tokens"]
    assert recomputed == (24 if storage == "contiguous" else 0)
    assert sorted(engine.block_manager.free_block_ids) == list(range(24))


# ------------------------------------------------------------------- block manager
def _req(rid, tokens, n_new=4):
    return Request(rid, tokens, SamplingParams(n_new))


def _computed(bm, req):
    """Pretend the runner computed all of ``req``'s tokens."""
    req.num_computed_tokens = req.num_tokens
    bm.cache_full_blocks(req)


def test_block_manager_shares_prefix_with_ref_counts():
    bm = BlockManager(10, BLOCK)
    a = _req("a", list(range(10, 20)))                  # 10 tokens: 2 full blocks + 2
    bm.allocate(a)
    assert len(a.block_table) == 3 and bm.num_free_blocks == 7
    _computed(bm, a)
    b = _req("b", list(range(10, 18)) + [99, 98, 97])    # same first 8 tokens
    assert bm.can_allocate(b)
    bm.allocate(b)
    assert b.block_table[:2] == a.block_table[:2] and b.num_cached_tokens == 8
    assert [bm.blocks[i].ref_count for i in a.block_table] == [2, 2, 1]
    assert bm.num_free_blocks == 6                      # only b's third block was new
    bm.free(a)
    assert [bm.blocks[i].ref_count for i in b.block_table] == [1, 1, 1]
    assert bm.num_free_blocks == 7
    bm.free(b)
    assert sorted(bm.free_block_ids) == list(range(10))


def test_prefix_hash_is_chained():
    """Block 2 of ``c`` equals block 2 of ``a`` but follows a different block 1: no hit. Once
    ``c`` is computed too, its block 2 must not take over ``a``'s key: ``d`` = ``a``'s prompt
    + more gets ``a``'s two blocks (a key without the previous block's key would hand out
    ``c``'s block 2, whose K/V differ)."""
    bm = BlockManager(10, BLOCK)
    a = _req("a", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    bm.allocate(a)
    _computed(bm, a)
    c = _req("c", [0, 2, 3, 4, 5, 6, 7, 8, 9])
    bm.allocate(c)
    assert c.num_cached_tokens == 0 and not set(c.block_table) & set(a.block_table)
    _computed(bm, c)
    d = _req("d", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    bm.allocate(d)
    assert d.num_cached_tokens == 8
    assert d.block_table[:2] == a.block_table[:2]


def test_hash_collision_is_guarded_by_token_comparison():
    bm = BlockManager(10, BLOCK, hash_fn=lambda prev, tokens: 42)   # every block collides
    a = _req("a", [1, 2, 3, 4, 5])
    bm.allocate(a)
    _computed(bm, a)
    b = _req("b", [9, 9, 9, 9, 5])
    bm.allocate(b)
    assert b.num_cached_tokens == 0 and b.block_table[0] != a.block_table[0]


def test_full_prompt_hit_leaves_one_token_to_compute():
    bm = BlockManager(10, BLOCK)
    a = _req("a", list(range(20, 28)))                  # exactly 2 blocks
    bm.allocate(a)
    _computed(bm, a)
    b = _req("b", list(range(20, 28)))
    bm.allocate(b)
    assert b.num_cached_tokens == 4                     # not 8: the last token is recomputed


def test_freed_block_keeps_its_key_until_reused():
    bm = BlockManager(3, BLOCK)
    a = _req("a", list(range(30, 35)))                  # 2 blocks, first one full
    bm.allocate(a)
    _computed(bm, a)
    bm.free(a)
    b = _req("b", list(range(30, 36)))
    bm.allocate(b)                                      # revived from the free list
    assert b.num_cached_tokens == 4 and bm.blocks[b.block_table[0]].ref_count == 1
    bm.free(b)
    c = _req("c", list(range(60, 72)))                  # takes all 3 blocks: keys dropped
    bm.allocate(c)
    bm.free(c)
    d = _req("d", list(range(30, 36)))
    bm.allocate(d)
    assert d.num_cached_tokens == 0


def test_append_slot_needs_a_free_block():
    bm = BlockManager(2, BLOCK)
    a = _req("a", [1, 2, 3, 4])
    bm.allocate(a)
    b = _req("b", [5, 6, 7])
    bm.allocate(b)
    assert bm.can_append(a)                             # 4 tokens fit its block
    a.output_token_ids.append(8)                        # token 5 starts block 2
    assert not bm.can_append(a)
    with pytest.raises(ValueError, match="no free block"):
        bm.append_slot(a)
    bm.free(b)
    bm.append_slot(a)
    assert len(a.block_table) == 2
    with pytest.raises(ValueError, match="not enough free blocks"):
        bm.allocate(_req("c", [1]))


def test_block_manager_settings():
    with pytest.raises(ValueError, match="num_blocks"):
        BlockManager(0, 4)
    with pytest.raises(ValueError, match="block_size"):
        BlockManager(4, 0)


# ------------------------------------------------------------------- scheduler
def _drive(sched, token=7, max_steps=500, before_step=None):
    """Run the scheduler with a fake runner that samples ``token`` every time;
    ``before_step(i)`` runs before step ``i`` (e.g. to add a late request)."""
    plans = []
    while sched.has_unfinished() and len(plans) < max_steps:
        if before_step:
            before_step(len(plans))
        plan = sched.schedule()
        plans.append([(c.request.request_id, c.start, c.num_tokens) for c in plan.chunks] +
                     [("preempted", r.request_id) for r in plan.preempted])
        sched.update(plan, {c.request.request_id: token for c in plan.chunks if c.samples})
    return plans


def _sreq(rid, n_prompt, n_new, eos=2):
    r = Request(rid, list(range(10, 10 + n_prompt)), SamplingParams(n_new, eos_token_id=eos))
    return r


def test_scheduler_chunks_a_long_prompt():
    sched = Scheduler(BlockManager(10, BLOCK), max_num_seqs=4, max_num_batched_tokens=4)
    r = _sreq("r", 10, 3)
    sched.add(r)
    plans = _drive(sched)
    assert plans == [[("r", 0, 4)], [("r", 4, 4)], [("r", 8, 2)], [("r", 10, 1)],
                     [("r", 11, 1)]]
    assert r.output_token_ids == [7, 7, 7] and r.finish_reason == "length"


def test_scheduler_respects_max_num_seqs_and_budget():
    sched = Scheduler(BlockManager(20, BLOCK), max_num_seqs=2, max_num_batched_tokens=6)
    for i in range(3):
        sched.add(_sreq(i, 3, 4))
    plans = _drive(sched)
    assert plans[0] == [(0, 0, 3), (1, 0, 3)]           # request 2 waits for a seat
    assert all(len({c[0] for c in p}) <= 2 for p in plans)
    assert all(sum(c[2] for c in p if c[0] != "preempted") <= 6 for p in plans)
    assert (2, 0, 3) in plans[4]                        # admitted when 0 and 1 finished


def test_scheduler_preempts_the_newest_and_recomputes_it():
    """4 blocks of 4 for two requests of 4 + 8 tokens (3 blocks each). At step 5 "old"
    needs its third block; the pool is empty, so the newest ("new", 5 tokens generated)
    loses its blocks. "old" finishes; "new" comes back with its prompt block from the prefix
    cache and recomputes the other 5 tokens (4..8) in one chunk, then decodes on."""
    bm = BlockManager(4, BLOCK)
    sched = Scheduler(bm, max_num_seqs=2, max_num_batched_tokens=16)
    old, new = _sreq("old", 4, 8), _sreq("new", 4, 8)
    sched.add(old)
    sched.add(new)
    plans = _drive(sched)
    both = [[("old", i, n), ("new", i, n)] for i, n in ((0, 4), (4, 1), (5, 1), (6, 1), (7, 1))]
    assert plans == both + [[("old", 8, 1), ("preempted", "new")], [("old", 9, 1)],
                            [("old", 10, 1)], [("new", 4, 5)], [("new", 9, 1)],
                            [("new", 10, 1)]]
    assert new.num_preemptions == 1 and old.num_preemptions == 0
    assert old.output_token_ids == [7] * 8 and new.output_token_ids == [7] * 8
    assert sorted(bm.free_block_ids) == list(range(4))


def test_preempted_request_has_nothing_computed_while_it_waits():
    """Between its preemption and its readmission a request holds no blocks and no
    computed tokens (``num_computed_tokens`` is 0 after a preemption)."""
    bm = BlockManager(4, BLOCK)
    sched = Scheduler(bm, max_num_seqs=2, max_num_batched_tokens=16)
    old, new = _sreq("old", 4, 8), _sreq("new", 4, 8)
    sched.add(old)
    sched.add(new)
    seen = []
    _drive(sched, before_step=lambda i: seen.append(
        (new.status.value, new.num_computed_tokens, len(new.block_table))))
    assert seen[6:8] == [("waiting", 0, 0)] * 2 and seen[5] == ("running", 8, 2)


def test_scheduler_finishes_on_eos():
    sched = Scheduler(BlockManager(8, BLOCK), max_num_seqs=2, max_num_batched_tokens=8)
    r = _sreq("r", 3, 10, eos=7)
    sched.add(r)
    _drive(sched, token=7)
    assert r.output_token_ids == [7] and r.finish_reason == "eos"


def test_scheduler_settings():
    with pytest.raises(ValueError, match="max_num_seqs"):
        Scheduler(BlockManager(4, 4), max_num_seqs=0, max_num_batched_tokens=4)
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        Scheduler(BlockManager(4, 4), max_num_seqs=1, max_num_batched_tokens=True)


# ------------------------------------------------------------------- runner storage
def test_contiguous_storage_matches_own_caches(model):
    """Decode rows of several requests in one step give the logits of each request decoded
    alone; a request freed and allocated again starts from an empty cache."""
    from tokenflow import KVCache, decode_step, prefill
    from tokenflow.serving import ContiguousRunner, ScheduledChunk
    store = ContiguousRunner(model)
    reqs = [_req(i, _ids(n, 20 + i), 8) for i, n in enumerate((5, 11, 8))]
    refs = []
    for r in reqs:
        store.allocate(r.request_id, 24)
        store.forward([ScheduledChunk(r, 0, r.num_tokens)])
        refs.append(KVCache(model.config, 1, 24))
        prefill(model, torch.tensor([r.token_ids]), refs[-1])
    for step in range(3):
        for r in reqs:
            r.output_token_ids.append(40 + step)
        got = store.forward([ScheduledChunk(r, r.num_tokens - 1, 1) for r in reqs])
        for r, ref in zip(reqs, refs):
            want = decode_step(model, torch.tensor([r.token_ids[-1]]), ref)[0]
            assert torch.allclose(got[r.request_id], want, atol=1e-5)
    assert [store.num_computed(r.request_id) for r in reqs] == [r.num_tokens for r in reqs]
    store.free(1)
    store.allocate(1, 24)
    assert store.num_computed(1) == 0 and store.num_computed(0) == reqs[0].num_tokens
    got = store.forward([ScheduledChunk(reqs[1], 0, reqs[1].num_tokens)])
    fresh = KVCache(model.config, 1, 24)
    want = prefill(model, torch.tensor([reqs[1].token_ids]), fresh)[0]
    assert torch.allclose(got[1], want, atol=1e-5)


# ---- found by planting bugs (review of F5): neighbours the suite missed
def test_last_budget_token_admits_a_one_token_chunk():
    """Budget 4: a's 3-token prompt leaves 1 token, which starts b's prefill (chunked
    prefill fills the budget, as vLLM's scheduler does)."""
    sched = Scheduler(BlockManager(20, BLOCK), max_num_seqs=4, max_num_batched_tokens=4)
    sched.add(_sreq("a", 3, 2))
    sched.add(_sreq("b", 5, 2))
    plans = _drive(sched)
    assert plans[0] == [("a", 0, 3), ("b", 0, 1)]


def test_static_batching_waits_for_the_running_batch_even_with_free_seats():
    """a (3 + 4 tokens) runs alone; b arrives after step 0 with a free seat. Static batching
    admits b only once a is done: a decodes at steps 1-3 (tokens 3, 4, 5), b starts at step 4."""
    sched = Scheduler(BlockManager(20, BLOCK), max_num_seqs=4, max_num_batched_tokens=16,
                      static_batching=True)
    sched.add(_sreq("a", 3, 4))
    plans = _drive(sched, before_step=lambda i: i == 1 and sched.add(_sreq("b", 3, 1)))
    assert plans == [[("a", 0, 3)], [("a", 3, 1)], [("a", 4, 1)], [("a", 5, 1)], [("b", 0, 3)]]


# ------------------------------------------------------------------- mutation-test additions
def test_partly_computed_block_is_keyed_only_once_full():
    """After a 6-token prefill block 1 holds 2 computed tokens: it must not be keyed yet.
    Once decode fills it, it is keyed with its 4 tokens, so a follow-up turn hits it too."""
    bm = BlockManager(8, BLOCK)
    a = _req("a", list(range(40, 46)))                  # 6 tokens: 1 full block + 2
    bm.allocate(a)
    _computed(bm, a)
    assert bm.blocks[a.block_table[1]].hash is None
    a.output_token_ids += [50, 51]                       # now 8 tokens, 2 full blocks
    bm.append_slot(a)
    _computed(bm, a)
    b = _req("b", a.token_ids + [52])
    bm.allocate(b)
    assert b.num_cached_tokens == 8 and b.block_table[:2] == a.block_table


def test_reused_block_loses_its_old_key():
    """a = X + T is freed; b = Y + T takes a's T block again (new K/V, other prefix). Then
    c = X + T + z must hit X only: a's old key for T must not lead to b's block."""
    bm = BlockManager(3, BLOCK)
    X, Y, T = [1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]
    a = _req("a", X + T)
    bm.allocate(a)
    _computed(bm, a)
    bm.free(a)                                          # free list [2, t, x]
    b = _req("b", Y + T)
    bm.allocate(b)                                      # takes 2 and a's T block
    assert a.block_table == [] and bm.num_free_blocks == 1
    _computed(bm, b)
    bm.free(b)
    c = _req("c", X + T + [13])
    bm.allocate(c)
    assert c.num_cached_tokens == 4


def test_preempted_request_goes_back_before_later_arrivals():
    """As the preemption test above, with a third request waiting for a seat: "new",
    preempted, goes to the front of ``waiting`` and is admitted again before "late"."""
    bm = BlockManager(4, BLOCK)
    sched = Scheduler(bm, max_num_seqs=2, max_num_batched_tokens=16)
    old, new, late = _sreq("old", 4, 8), _sreq("new", 4, 8), _sreq("late", 4, 2)
    for r in (old, new, late):
        sched.add(r)
    plans = _drive(sched)
    assert plans[5:9] == [[("old", 8, 1), ("preempted", "new")], [("old", 9, 1)],
                          [("old", 10, 1)], [("new", 4, 5), ("late", 0, 4)]]
    assert [r.finish_reason for r in (old, new, late)] == ["length"] * 3


# ------------------------------------------------------------------- plants 3: the survivors
def test_prefix_walk_stops_at_the_first_miss():
    """With a key that ignores the previous block (position-blind), ``b``'s block 2 equals
    ``a``'s block 2 in key and tokens, but ``b``'s block 1 missed: the walk must stop
    there, or ``b`` would read ``a``'s K/V for its tokens 0-3 (computed after other
    tokens). A prompt equal to ``a``'s on both blocks still gets both."""
    bm = BlockManager(10, BLOCK, hash_fn=lambda prev, tokens: hash(tokens))
    a = _req("a", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    bm.allocate(a)
    _computed(bm, a)
    b = _req("b", [0, 0, 0, 0, 5, 6, 7, 8, 9])
    assert bm._cached_prefix(b) == []
    bm.allocate(b)
    assert b.num_cached_tokens == 0 and not set(b.block_table) & set(a.block_table)
    c = _req("c", [1, 2, 3, 4, 5, 6, 7, 8, 10])
    bm.allocate(c)
    assert c.num_cached_tokens == 8 and c.block_table[:2] == a.block_table[:2]


def test_can_allocate_counts_held_prefix_hits_as_shared():
    """``a`` holds 3 of the 4 blocks, 2 of them full and keyed. ``b`` shares those 2 and
    needs 3 blocks: 2 shared + 1 fresh fits the 1 free block. ``c`` (no hit) does not."""
    bm = BlockManager(4, BLOCK)
    a = _req("a", list(range(9)))
    bm.allocate(a)
    _computed(bm, a)
    assert bm.num_free_blocks == 1
    assert not bm.can_allocate(_req("c", list(range(20, 29))))
    b = _req("b", list(range(8)) + [20])
    assert bm.can_allocate(b)
    bm.allocate(b)
    assert b.block_table[:2] == a.block_table[:2] and bm.num_free_blocks == 0


def test_corpus_next_chars_finds_what_the_corpus_says_next():
    """Every corpus line cut before its last character is continued by that character; a text
    the corpus never starts gives nothing; only a str is accepted."""
    from tokenflow.serving import corpus_lines, corpus_next_chars
    for line in corpus_lines():
        assert line[-1] in corpus_next_chars("context. " + line[:-1]), line
    assert corpus_next_chars("福州是福建的省") == {"会"}          # corpus: 福州是福建的省会。
    assert corpus_next_chars("qqqq") == set()
    with pytest.raises(TypeError, match="text"):
        corpus_next_chars(3)
