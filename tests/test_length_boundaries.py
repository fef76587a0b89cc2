"""Position and length boundaries at every entry point that checks a length: a sequence that
exactly fills ``max_position_embeddings`` (or a cache, a block table, the block pool) runs,
one token more is refused, naming the limit. The packed serving forward, the model's own
forward with and without a cache, ``KVCache``, ``prefill``, ``decode_step``, ``generate``,
the engine's ``add_request`` / ``run`` (rejection) and the paged cache's block tables."""
import pytest
import torch

from tokenflow import KVCache, PagedKVCache, decode_step, generate, prefill
from tokenflow.serving import LLMEngine, SamplingParams

from helpers import wide_random_model

P = 32              # max_position_embeddings of the models here
BS = 4


@pytest.fixture(scope="module", params=["gqa", "mla"])
def model(request):
    mla = dict(num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=32, qk_rope_head_dim=8,
               qk_nope_head_dim=16, v_head_dim=16, head_dim=8)
    return wide_random_model(seed=0, max_position_embeddings=P,
                             **(mla if request.param == "mla" else {}))


def _ids(n, seed=0):
    return torch.randint(4, 512, (n,), generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------ the packed forward
def _packed(model, cached, new, pool=P // BS + 4):
    """One packed step for sequences with ``cached`` tokens already stored and ``new``
    tokens now (block tables long enough), and the model's logits for it."""
    cache = PagedKVCache(model.config, pool * len(cached), BS)
    tables, start = [], 0
    for c, n in zip(cached, new):
        k = -(-(c + n) // BS)
        tables.append(list(range(start, start + k)))
        start += k
    step = cache.packed_step(tables, cached, new)
    ids = _ids(sum(new))
    last = torch.tensor(new).cumsum(0) - 1
    return model.forward_packed(ids, step, cache, last), cache


@pytest.mark.parametrize("cached, new", [([0], [P]), ([P - 1], [1]), ([P - 4], [4]),
                                         ([0, P - 1, 3], [P, 1, 2])])
def test_packed_forward_runs_a_sequence_that_exactly_fills_the_positions(model, cached, new):
    with torch.no_grad():
        logits, _ = _packed(model, cached, new)
    assert logits.shape == (len(new), model.config.vocab_size)
    assert torch.isfinite(logits).all()


def test_packed_prompt_of_max_positions_equals_the_plain_forward(model):
    ids = _ids(P)
    cache = PagedKVCache(model.config, P // BS, BS)
    step = cache.packed_step([list(range(P // BS))], [0], [P])
    with torch.no_grad():
        packed = model.forward_packed(ids, step, cache, torch.tensor([P - 1]))
        plain = model(ids[None])[0, -1]
    assert (packed[0] - plain).abs().max() < 1e-4


@pytest.mark.parametrize("cached, new", [([0], [P + 1]), ([P], [1]), ([P - 1], [2]),
                                         ([0, P - 1], [3, 2])])
def test_packed_forward_refuses_one_position_more(model, cached, new):
    with pytest.raises(ValueError, match=f"position {P} >= max_position_embeddings={P}"):
        _packed(model, cached, new)


# ------------------------------------------------------------------ the model's forward
def test_forward_without_cache_at_and_over_the_limit(model):
    with torch.no_grad():
        assert model(_ids(P)[None]).shape == (1, P, model.config.vocab_size)
        with pytest.raises(ValueError, match=f"sequence length {P + 1} .* exceeds "
                                             f"max_position_embeddings={P}"):
            model(_ids(P + 1)[None])


def test_cache_filled_to_max_positions_then_one_more(model):
    cache = KVCache(model.config, 1)
    assert cache.max_len == P
    with torch.no_grad():
        model(_ids(P - 1)[None], kv_cache=cache)
        model(_ids(1)[None], kv_cache=cache)                   # the last position
        assert cache.length == P
        with pytest.raises(ValueError, match="max_position_embeddings"):
            model(_ids(1)[None], kv_cache=cache)
    assert cache.length == P


@pytest.mark.parametrize("max_len", [1, P])
def test_kv_cache_capacity_range_ends(model, max_len):
    assert KVCache(model.config, 1, max_len).max_len == max_len
    for bad in (0, P + 1):
        with pytest.raises(ValueError, match=f"max_len must be in \\[1, "
                                             f"max_position_embeddings={P}\\]"):
            KVCache(model.config, 1, bad)


def test_a_cache_shorter_than_the_limit_fills_exactly(model):
    cache = KVCache(model.config, 1, 8)
    with torch.no_grad():
        prefill(model, _ids(7)[None], cache)
        decode_step(model, torch.tensor([5]), cache)           # slot 8 of 8
        with pytest.raises(ValueError, match="max_len=8"):
            decode_step(model, torch.tensor([5]), cache)


@pytest.mark.parametrize("S", [2, P])
def test_prefill_fills_a_cache_exactly_and_refuses_one_token_more(model, S):
    cache = KVCache(model.config, 1, S)
    with torch.no_grad():
        assert prefill(model, _ids(S)[None], cache).shape == (1, model.config.vocab_size)
        assert cache.length == S
        with pytest.raises(ValueError, match=f"max_len={S - 1}"):
            prefill(model, _ids(S)[None], KVCache(model.config, 1, S - 1))
    with pytest.raises(TypeError, match="kv_cache"):
        prefill(model, _ids(S)[None], None)


# ------------------------------------------------------------------ generate
@pytest.mark.parametrize("S, new", [(P - 3, 3), (1, P - 1), (P, 0)])
def test_generate_may_fill_the_positions_exactly(model, S, new):
    out = generate(model, _ids(S)[None], new, stop_at_eos=False)
    assert out.shape == (1, P)


@pytest.mark.parametrize("S, new", [(P - 3, 4), (1, P), (P, 1), (P + 1, 0)])
def test_generate_refuses_one_token_over(model, S, new):
    """Refused by generate's own check, before a cache is built (a prompt alone over the
    limit: by the model's input check)."""
    want = (f"prompt length {S} \\+ max_new_tokens {new} exceeds" if S <= P else
            f"sequence length {S}") + f".*max_position_embeddings={P}"
    with pytest.raises(ValueError, match=want):
        generate(model, _ids(S)[None], new, stop_at_eos=False)


# ------------------------------------------------------------------ the engine
def test_engine_runs_a_request_that_fills_the_positions_and_rejects_one_more(model):
    """``add_request``: prompt + max_new_tokens == P runs to ``length``; P + 1 is rejected
    naming the limit (the pool holds both, so the position limit is what refuses)."""
    engine = LLMEngine(model, num_blocks=P // BS + 1, block_size=BS, max_num_batched_tokens=64)
    prompt = _ids(P - 4).tolist()
    ok = engine.add_request(prompt, SamplingParams(4, ignore_eos=True))
    over = engine.add_request(prompt, SamplingParams(5, ignore_eos=True))
    long = engine.add_request(_ids(P).tolist(), SamplingParams(1))
    while engine.has_unfinished():
        engine.step()
    o = engine.outputs
    assert o[ok].finish_reason == "length" and len(o[ok].output_token_ids) == 4
    ref = generate(model, torch.tensor([prompt]), 4, stop_at_eos=False)[0, len(prompt):]
    assert o[ok].output_token_ids == ref.tolist()
    for rid, total in ((over, P + 1), (long, P + 1)):
        assert o[rid].finish_reason == "rejected"
        assert f"= {total} exceeds max_position_embeddings={P}" in o[rid].reason


@pytest.mark.parametrize("storage", ["paged", "contiguous", "padded"])
def test_engine_fills_the_positions_with_every_storage(model, storage):
    engine = LLMEngine(model, num_blocks=P // BS, block_size=BS, max_num_batched_tokens=8,
                       kv_storage=storage)
    prompt = _ids(P - 6, 1).tolist()
    out = engine.run([prompt], SamplingParams(6, ignore_eos=True), use_tqdm=False)[0]
    ref = generate(model, torch.tensor([prompt]), 6, stop_at_eos=False)[0, len(prompt):]
    assert out.finish_reason == "length" and out.output_token_ids == ref.tolist()


def test_engine_pool_boundary(model):
    """P // BS blocks hold exactly P tokens: prompt + new = P runs; a pool one block
    smaller rejects the same request naming num_blocks."""
    prompt = _ids(P - 2, 2).tolist()
    small = LLMEngine(model, num_blocks=P // BS - 1, block_size=BS)
    out = small.run([prompt], SamplingParams(2, ignore_eos=True), use_tqdm=False)[0]
    assert out.finish_reason == "rejected" and f"num_blocks={P // BS - 1}" in out.reason
    exact = LLMEngine(model, num_blocks=P // BS, block_size=BS)
    assert exact.run([prompt], SamplingParams(2, ignore_eos=True),
                     use_tqdm=False)[0].finish_reason == "length"


# ------------------------------------------------------------------ the paged cache
@pytest.mark.parametrize("cached, new, blocks", [(0, 4, 1), (0, 5, 2), (3, 1, 1), (4, 1, 2),
                                                 (7, 1, 2), (8, 8, 4)])
def test_block_table_must_cover_exactly_the_tokens(model, cached, new, blocks):
    """ceil((cached + new) / block_size) blocks are enough; one fewer is refused."""
    cache = PagedKVCache(model.config, 8, BS)
    cache.packed_step([list(range(blocks))], [cached], [new])
    cache.prepare([list(range(blocks))], [cached], [new])
    with pytest.raises(ValueError, match=f"block_tables\\[0\\] must hold {blocks} block ids"):
        cache.packed_step([list(range(blocks - 1))], [cached], [new])


def test_block_ids_and_counts_at_their_ends(model):
    cache = PagedKVCache(model.config, 8, BS)
    cache.packed_step([[7]], [0], [1])                            # the last block id
    with pytest.raises(ValueError, match="num_blocks=8"):
        cache.packed_step([[8]], [0], [1])
    with pytest.raises(ValueError, match="num_new >= 1"):
        cache.packed_step([[0]], [0], [0])
    with pytest.raises(ValueError, match="num_computed must be >= 0"):
        cache.packed_step([[0]], [-1], [1])
    cache.packed_step([[0]], [0], [1])                            # num_computed 0 is fine
