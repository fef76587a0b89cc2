"""The packed serving step (issue F13): a step's chunks laid end to end, no padded position.

* :meth:`PagedKVCache.packed_step` on a hand-worked batch: positions, slot mapping,
  ``cu_seqlens`` and the gathered context, value by value.
* ``model.forward_packed`` on a mixed batch (decode rows of different context lengths, a
  chunk continuing a prompt, a fresh prompt) equals each sequence run alone through the
  ordinary ``model(ids [1, S], kv_cache=KVCache)``, for GQA and MLA.
* The engine's output equals :func:`tokenflow.generate` per request (greedy and seeded
  sampling) on a workload that forces chunked prefill, preemption and prefix-cache hits,
  for GQA and MLA, and every step's forward computes exactly its scheduled tokens (counted
  by hooks on the embedding and the LM head, independently of the runner's own count).
"""
import pytest
import torch

from tokenflow import KVCache, PagedKVCache, generate
from tokenflow.serving import LLMEngine, SamplingParams

from helpers import random_model, wide_random_model

BLOCK = 4
MLA = dict(num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=32, qk_rope_head_dim=8,
           qk_nope_head_dim=16, v_head_dim=16, head_dim=8, scoring_func="sigmoid",
           norm_topk_prob=True, routed_scaling_factor=2.5, n_group=4, topk_group=2)
"""benchmarks/_common.py's ``tiny-mla``: the tiny preset with DeepSeek-V3's attention."""


def _wide_mla(seed=0):
    """A random tiny-mla model with wide weights (clear greedy choices)."""
    return wide_random_model(seed=seed, **MLA)


@pytest.fixture(scope="module", params=["gqa", "mla"])
def model(request):
    return wide_random_model(seed=0) if request.param == "gqa" else _wide_mla(seed=0)


def _ids(n, seed):
    return torch.randint(4, 512, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


# ------------------------------------------------------------------- the step's tensors
def test_packed_step_by_hand():
    """Two decode rows (5 and 2 tokens cached), then a chunk of 3 after 4 cached tokens, in
    blocks of 4. Each sequence gathers whole blocks; the decode rows as many as the longest
    (2 blocks: windows 8 wide, real tokens at the left)."""
    cfg = random_model().config
    cache = PagedKVCache(cfg, 12, BLOCK)
    step = cache.packed_step([[7, 2], [5], [9, 3]], [5, 2, 4], [1, 1, 3])
    assert step.positions.tolist() == [[5, 2, 4, 5, 6]]
    assert step.num_tokens == 5 and step.num_decode == 2 and step.decode_len == 8
    assert step.cu_seqlens_q.tolist() == [0, 1, 2, 5]
    assert step.cu_seqlens_k.tolist() == [0, 8, 16, 24] and step.seqlens_k == [6, 3, 7]
    # token i of a sequence lives in slot table[i // 4] * 4 + i % 4
    assert step.slot_mapping.tolist() == [2 * 4 + 1, 5 * 4 + 2, 3 * 4 + 0, 3 * 4 + 1, 3 * 4 + 2]
    assert step.context_blocks == [[7, 2], [5, 0], [9, 3]]   # [5] padded with block 0
    heads = cfg.num_key_value_heads                          # 2: rows block * 2 + head
    read, write = step.rows[heads]
    assert read.tolist() == [14, 4, 15, 5, 10, 0, 11, 1, 18, 6, 19, 7]
    # the writes head-major: rows block * 8 + head * 4 + offset of the five slots
    assert write.tolist() == [17, 42, 24, 25, 26, 21, 46, 28, 29, 30]
    dec = step.masks[0]                                 # [2, 1, 1, 8]
    assert dec.shape == (2, 1, 1, 8)
    assert dec[0, 0, 0].tolist() == [True] * 6 + [False] * 2
    assert dec[1, 0, 0].tolist() == [True] * 3 + [False] * 5
    causal = step.masks[1][0, 0]                        # [3, 7]: new tokens 4, 5, 6
    assert causal.tolist() == [[j <= i for j in range(7)] for i in (4, 5, 6)]


def test_packed_update_writes_and_gathers_each_sequence_as_one_block():
    """``update`` of the hand-worked step writes the new entries at their slots and returns
    each sequence's whole blocks as one ``[heads, blocks * 4, dim]`` block, one after the
    other (the decode windows side by side: ``[2, heads, 8, dim]``), read back from the
    pool; attention's views of them hold each sequence's tokens 0 .. L_i - 1."""
    cfg = random_model().config
    cache = PagedKVCache(cfg, 12, BLOCK)
    g = torch.Generator().manual_seed(0)
    for pool in cache.layers[1]:
        pool.copy_(torch.randn(pool.shape, generator=g))
    step = cache.packed_step([[7, 2], [5], [9, 3]], [5, 2, 4], [1, 1, 3])
    new = [torch.randn(1, heads, 5, dim, generator=g) for _, heads, dim in cache.entries]
    out = cache.update(1, step, *new)
    seen = []
    step.attend_each(lambda *a: seen.append(a) or a[0], tuple(x for x in new), out)
    cu_k = step.cu_k
    for j, (pool, x, e) in enumerate(zip(cache.layers[1], new, out)):
        _, heads, _, dim = pool.shape
        by_slot = pool.transpose(1, 2).reshape(-1, heads, dim)      # [slots, heads, dim]
        assert torch.equal(by_slot[step.slot_mapping], x[0].transpose(0, 1))
        assert e.shape == (heads * cu_k[-1], dim)
        for i, blocks in enumerate(step.context_blocks):
            slots = [b * BLOCK + o for b in blocks for o in range(BLOCK)]
            want = by_slot[slots].transpose(0, 1)                    # [heads, blocks * 4, dim]
            assert torch.equal(e[heads * cu_k[i]:heads * cu_k[i + 1]].view(heads, -1, dim),
                               want)
        # what attention reads: the decode windows [2, heads, 8, dim], the chunk [1, heads, 7, dim]
        dec, chunk = seen[0][len(new) + j], seen[1][len(new) + j]
        assert dec.shape == (2, heads, 8, dim) and chunk.shape == (1, heads, 7, dim)
        assert torch.equal(dec[0, :, :6], by_slot[[28, 29, 30, 31, 8, 9]].transpose(0, 1))
        assert torch.equal(dec[1, :, :3], by_slot[[20, 21, 22]].transpose(0, 1))
        assert torch.equal(chunk[0], by_slot[[36, 37, 38, 39, 12, 13, 14]].transpose(0, 1))


def test_packed_step_rejects_a_short_block_table():
    cache = PagedKVCache(random_model().config, 4, BLOCK)
    with pytest.raises(ValueError, match="block_tables"):
        cache.packed_step([[0]], [3], [2])


def test_forward_packed_checks_its_inputs():
    model = random_model()
    cache = PagedKVCache(model.config, 40, BLOCK)
    step = cache.packed_step([[0, 1]], [0], [5])
    keep = torch.tensor([4])
    with pytest.raises(ValueError, match="T=5"):
        model.forward_packed(torch.tensor([5, 6, 7]), step, cache, keep)
    with pytest.raises(ValueError, match="vocab_size"):
        model.forward_packed(torch.tensor([5, 6, 7, 8, 9999]), step, cache, keep)
    with pytest.raises(TypeError, match="integer"):
        model.forward_packed(torch.ones(5), step, cache, keep)
    with pytest.raises(TypeError, match="PackedCacheStep"):
        model.forward_packed(torch.tensor([5, 6, 7, 8, 9]), None, cache, keep)
    far = cache.packed_step([list(range(40))], [model.config.max_position_embeddings - 1], [2])
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model.forward_packed(torch.tensor([5, 6]), far, cache, torch.tensor([1]))


def _alone(model, prompt, chunks):
    """Logits of the last token of each of ``chunks`` (lengths summing to the prompt)
    with the ordinary API: one sequence, a contiguous cache, one call per chunk."""
    cache = KVCache(model.config, 1, len(prompt))
    out, start = [], 0
    for n in chunks:
        ids = torch.tensor([prompt[start:start + n]])
        out.append(model(ids, kv_cache=cache)[0, -1])
        start += n
    return out


@torch.inference_mode()
def test_forward_packed_equals_each_sequence_alone(model):
    """Step 1 packs three fresh prompts (9, 14, 5 tokens; the second only in part); step 2
    packs two decode rows at contexts 10 and 6 with the rest of the second prompt (4 tokens
    after 10 cached). Every sampled logit equals that sequence run alone."""
    cache = PagedKVCache(model.config, 16, BLOCK)
    prompts = [_ids(10, 1), _ids(14, 2), _ids(6, 3)]
    tables = [[3, 0, 8], [1, 9, 4, 12], [6, 2]]
    step = cache.packed_step(tables, [0, 0, 0], [9, 10, 5])
    ids = torch.tensor(prompts[0][:9] + prompts[1][:10] + prompts[2][:5])
    first = model.forward_packed(ids, step, cache, torch.tensor([8, 18, 23]))   # [3, V]
    step = cache.packed_step([tables[0], tables[2], tables[1]], [9, 5, 10], [1, 1, 4])
    ids = torch.tensor([prompts[0][9], prompts[2][5]] + prompts[1][10:])
    second = model.forward_packed(ids, step, cache, torch.tensor([0, 1, 5]))   # [3, V]
    want = [_alone(model, prompts[0], [9, 1]), _alone(model, prompts[1], [10, 4]),
            _alone(model, prompts[2], [5, 1])]
    got = [(first[0], second[0]), (first[1], second[2]), (first[2], second[1])]
    for (g1, g2), (w1, w2) in zip(got, want):
        assert torch.allclose(g1, w1, atol=1e-5) and torch.allclose(g2, w2, atol=1e-5)


@torch.inference_mode()
def test_decode_rows_that_fill_their_blocks_read_without_a_mask(model):
    """Decode rows whose contexts fill their whole blocks (8 and 8 tokens in blocks of 4)
    read unmasked windows (``sdpa_hint == "none"``); one token shorter (8 and 7), the
    window is masked. Either way each row's logits equal that sequence run alone."""
    prompts = [_ids(8, 11), _ids(8, 12)]
    for lengths, hint in (((8, 8), "none"), ((8, 7), None)):
        cache = PagedKVCache(model.config, 8, BLOCK)
        tables = [[5, 1], [2, 6]]
        step = cache.packed_step(tables, [0, 0], [lengths[0] - 1, lengths[1] - 1])
        ids = torch.tensor(prompts[0][:lengths[0] - 1] + prompts[1][:lengths[1] - 1])
        model.forward_packed(ids, step, cache, torch.tensor([0]))
        step = cache.packed_step(tables, [lengths[0] - 1, lengths[1] - 1], [1, 1])
        assert getattr(step.masks[0], "sdpa_hint", None) == hint and step.decode_len == 8
        ids = torch.tensor([prompts[0][lengths[0] - 1], prompts[1][lengths[1] - 1]])
        got = model.forward_packed(ids, step, cache, torch.tensor([0, 1]))     # [2, V]
        for g, prompt, L in zip(got, prompts, lengths):
            want = _alone(model, prompt[:L], [L - 1, 1])[1]
            assert torch.allclose(g, want, atol=1e-5)


# ------------------------------------------------------------------- the engine
def _reference(model, prompt, sp):
    out = generate(model, torch.tensor([prompt]), sp.max_new_tokens, sp.temperature, sp.top_k,
                   sp.top_p, sp.min_p, generator=torch.Generator().manual_seed(sp.seed),
                   stop_at_eos=False)
    return out[0, len(prompt):].tolist()


def _workload():
    """8 requests, half greedy, half seeded sampling; 5 share a 12-token system prompt."""
    system = _ids(12, 100)
    prompts = [system + _ids(3, 1), _ids(30, 3), system + _ids(9, 2), _ids(41, 4),
               system + _ids(5, 5), _ids(7, 7), system + _ids(2, 6), system + _ids(14, 8)]
    SP = SamplingParams
    params = [SP(12, seed=0), SP(20, 0.8, top_k=50, top_p=0.9, seed=1), SP(9, seed=2),
              SP(16, 1.0, min_p=0.05, seed=3), SP(6, seed=4), SP(20, 0.7, seed=5),
              SP(10, seed=6), SP(8, 1.0, seed=7)]
    for p in params:
        p.ignore_eos = True
    return prompts, params


class _Counter:
    """Counts the positions the model's embedding and LM head see, per engine step."""

    def __init__(self, model):
        self.embedded, self.projected = [], []
        self.hooks = [model.embed_tokens.register_forward_hook(
                          lambda m, a, out: self.embedded.append(a[0].numel())),
                      model.lm_head.register_forward_hook(
                          lambda m, a, out: self.projected.append(out.shape[:-1].numel()))]

    def remove(self):
        for h in self.hooks:
            h.remove()


@pytest.fixture(scope="module")
def served(model):
    """(engine, prompts, params, outputs, embedded positions per step, LM-head rows per
    step) of the workload on a pool too small for it and a budget of 16 tokens."""
    prompts, params = _workload()
    engine = LLMEngine(model, num_blocks=22, block_size=BLOCK, max_num_seqs=4,
                       max_num_batched_tokens=16)
    counter = _Counter(model)
    embedded, projected = [], []
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
    try:
        while engine.has_unfinished():
            before = (len(counter.embedded), len(counter.projected))
            engine.step()
            embedded.append(sum(counter.embedded[before[0]:]))
            projected.append(sum(counter.projected[before[1]:]))
    finally:
        counter.remove()
    return engine, prompts, params, [engine.outputs[i] for i in ids], embedded, projected


def test_engine_equals_generate_per_request(served, model):
    _, prompts, params, outs, _, _ = served
    for i, (prompt, sp, out) in enumerate(zip(prompts, params, outs)):
        assert out.output_token_ids == _reference(model, prompt, sp), f"request {i}"


def test_workload_forces_chunks_preemption_and_prefix_hits(served):
    engine, prompts, _, outs, _, _ = served
    chunks = [(rid, n) for s in engine.steps for rid, n in s.prefill]
    assert any(n < len(prompts[rid]) for rid, n in chunks)                  # chunked
    assert engine.metrics()["num_preemptions"] >= 1
    assert any(o.num_cached_tokens >= 12 for o in outs)                     # prefix hits
    assert any(len(s.decode) >= 2 and s.prefill for s in engine.steps)      # mixed steps


def test_every_step_computes_exactly_its_scheduled_tokens(served):
    """No padded position: the embedding sees exactly the step's scheduled tokens, the
    step record says so too, and the LM head runs once per sampled token."""
    engine, _, _, outs, embedded, projected = served
    scheduled = [s.num_tokens for s in engine.steps]
    assert embedded == scheduled
    assert [s.num_positions for s in engine.steps] == scheduled
    assert sum(projected) == sum(len(o.output_token_ids) for o in outs)     # one per token
    assert all(len(s.decode) <= p <= len(s.prefill) + len(s.decode)
               for p, s in zip(projected, engine.steps))


def test_per_chunk_forwards_give_the_same_tokens(model):
    """``batch_decode=False`` (one packed forward per chunk, nothing shared between
    sequences) gives the tokens of the packed step."""
    prompts, params = _workload()
    outs = {}
    for packed in (True, False):
        engine = LLMEngine(model, num_blocks=22, block_size=BLOCK, max_num_seqs=4,
                           max_num_batched_tokens=16, batch_decode=packed)
        outs[packed] = [o.output_token_ids for o in engine.run(prompts[:5], params[:5],
                                                               use_tqdm=False)]
    assert outs[True] == outs[False]


def test_padded_storage_gives_the_same_tokens_and_counts_its_padding(model):
    """The step before packing (``kv_storage="padded"``, kept for comparison): same tokens,
    and it reports the ``B * S_max`` positions it computes."""
    prompts, params = _workload()
    runs = {}
    for storage in ("paged", "padded"):
        engine = LLMEngine(model, num_blocks=22, block_size=BLOCK, max_num_seqs=4,
                           max_num_batched_tokens=16, kv_storage=storage)
        outs = engine.run(prompts[:5], params[:5], use_tqdm=False)
        runs[storage] = ([o.output_token_ids for o in outs], engine.steps)
    assert runs["paged"][0] == runs["padded"][0]
    padded = [(len(s.prefill) + len(s.decode)) * max([n for _, n in s.prefill] + [1])
              for s in runs["padded"][1]]
    assert [s.num_positions for s in runs["padded"][1]] == padded
    assert sum(padded) > sum(s.num_tokens for s in runs["padded"][1])


def test_a_mixed_step_puts_its_decode_rows_first_in_one_group():
    """In a step with two decoding requests and a new prompt, the packed forward sees the two
    decode rows first (``num_decode`` 2: one batched attention call for them), then the
    prompt chunk."""
    model = random_model()
    seen = []
    real = model.forward_packed

    def spy(ids, step, *a, **kw):
        seen.append((step.num_decode, step.num_tokens))
        return real(ids, step, *a, **kw)

    model.forward_packed = spy
    eng = LLMEngine(model, num_blocks=16, block_size=4)
    for p in ([5, 6, 7], [8, 9, 10, 11]):
        eng.add_request(p, SamplingParams(4, ignore_eos=True))
    eng.step()                                        # both prompts
    eng.add_request([12, 13, 14, 15, 16], SamplingParams(2, ignore_eos=True))
    eng.step()                                        # two decodes + the new prompt
    assert seen[0][0] == 0
    assert seen[1] == (2, 2 + 5)
