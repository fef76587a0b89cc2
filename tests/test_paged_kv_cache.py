"""The paged KV cache against the contiguous one, for GQA and MLA.

References: each sequence run alone through the contiguous :class:`KVCache` (``prefill`` +
``decode_step``), the model without any cache (recompute), a hand-computed slot of every
token (``block_table[i // block_size] * block_size + i % block_size``) and the cost
model's bytes-per-token formula. Block tables are random permutations of the pool, so a
sequence's blocks are not contiguous and not in order.
"""
import pytest
import torch

from tokenflow import KVCache, PagedKVCache, decode_step, prefill
from tokenflow.analysis import costmodel
from tokenflow.model.kv_cache import cache_entries

from helpers import random_model
from test_mla import ds_config, random_mla

BS = 4                                       # block size


@pytest.fixture(scope="module", params=["gqa", "mla"])
def model(request):
    if request.param == "mla":
        return random_mla(ds_config())
    return random_model(seed=0)


def _tables(n_seqs, blocks_each, num_blocks, seed=0):
    perm = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed)).tolist()
    return [perm[i * blocks_each:(i + 1) * blocks_each] for i in range(n_seqs)]


def _step(model, cache, tables, seqs, cached, new):
    """One ragged forward: tokens ``[cached[b], cached[b] + new[b])`` of each sequence,
    left-padded; returns the last column's logits ``[B, V]``."""
    S = max(new)
    ids = torch.tensor([[0] * (S - n) + s[c:c + n] for s, c, n in zip(seqs, cached, new)])
    cache.prepare(tables, cached, new)
    return model(ids, kv_cache=cache, logits_to_keep=1)[:, -1]


@torch.no_grad()
def test_paged_equals_contiguous_and_recompute(model):
    """Three sequences (5, 11, 8 prompt tokens): a ragged prefill in two chunks, then a step
    mixing a chunk with decode rows, then batched decode steps; every row's logits equal
    the sequence alone in a contiguous cache, and the model without a cache."""
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(1)
    lens = [5, 11, 8]
    seqs = [torch.randint(3, vocab, (n + 6,), generator=g).tolist() for n in lens]
    tables = _tables(3, 5, 16)
    paged = PagedKVCache(model.config, 16, BS)
    plan = [([0, 0, 0], [3, 6, 8]), ([3, 6, 8], [2, 5, 1])]          # prefill in chunks
    plan += [([5, 11, 9], [1, 3, 1])]                                # a chunk among decodes
    plan += [([5 + i, 13 + i, 9 + i], [1, 1, 1]) for i in range(1, 4)]
    got = [_step(model, paged, tables, seqs, cached, new) for cached, new in plan]
    for b, s in enumerate(seqs):
        ref = KVCache(model.config, 1, 32)
        want = [prefill(model, torch.tensor([s[:lens[b]]]), ref)[0]]
        ends = [c[b] + n[b] for c, n in plan]
        for t in range(lens[b], ends[-1]):
            want.append(decode_step(model, torch.tensor([s[t]]), ref)[0])
        for step, end in enumerate(ends[1:], 1):                     # skip the middle chunk
            torch.testing.assert_close(got[step][b], want[end - lens[b]], atol=1e-5, rtol=0)
            uncached = model(torch.tensor([s[:end]]))[0, -1]
            torch.testing.assert_close(got[step][b], uncached, atol=1e-5, rtol=0)


@torch.no_grad()
def test_update_writes_each_token_to_its_slot(model):
    """Entries land at ``block_table[i // bs]``, offset ``i % bs``, of every pool (hand
    computed), and ``update`` / ``read`` return each row's tokens right-aligned."""
    cfg = model.config
    cache = PagedKVCache(cfg, 12, BS)
    tables = _tables(2, 3, 12, seed=3)
    cache.prepare(tables, [0, 0], [7, 10])
    step = cache.begin_step(None, 2, 10)
    new = [torch.randn(2, heads, 10, dim) for _, heads, dim in cache_entries(cfg)]
    out = cache.update(1, step, *new)
    for pool, x, o in zip(cache.layers[1], new, out):
        assert o.shape == (2, x.shape[1], 10, x.shape[3])
        for b, n in enumerate((7, 10)):
            for i in range(n):
                entry = x[b, :, 10 - n + i]                            # left-padded input
                blk, off = tables[b][i // BS], i % BS
                assert torch.equal(pool[blk, :, off], entry)
                assert torch.equal(o[b, :, 10 - n + i], entry)
    for r, o in zip(cache.read(1, 10), out):
        assert torch.equal(r, o)
    assert cache.num_real.tolist() == [7, 10] and cache.length == 10


@torch.no_grad()
def test_shared_prefix_blocks_are_read_not_recomputed(model):
    """Sequence B starts with A's first 2 blocks: B's table holds A's block ids, B's step
    starts after them (num_computed 8), and its logits equal B computed alone."""
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(2)
    prefix = torch.randint(3, vocab, (8,), generator=g).tolist()
    a = prefix + torch.randint(3, vocab, (3,), generator=g).tolist()
    b = prefix + torch.randint(3, vocab, (5,), generator=g).tolist()
    cache = PagedKVCache(model.config, 10, BS)
    ta = [7, 2, 5]
    tb = ta[:2] + [0, 9]                                              # shares 7 and 2
    _step(model, cache, [ta], [a], [0], [11])
    shared = [p[[7, 2]].clone() for p in cache.layers[0]]
    got = _step(model, cache, [tb], [b], [8], [5])[0]
    torch.testing.assert_close(got, model(torch.tensor([b]))[0, -1], atol=1e-5, rtol=0)
    assert all(torch.equal(p[[7, 2]], s) for p, s in zip(cache.layers[0], shared))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bytes_per_token_equal_the_formula(model, dtype):
    cfg = model.config
    cache = PagedKVCache(cfg, 6, BS, dtype=dtype)
    itemsize = torch.tensor([], dtype=dtype).element_size()
    assert cache.bytes_per_token() == costmodel.kv_cache_bytes_per_token(cfg, itemsize)
    assert cache.nbytes() == cache.bytes_per_token() * 6 * BS
    assert cache.bytes_per_token() == KVCache(cfg, 1, 8, dtype=dtype).bytes_per_token()
    name, heads, dim = cache_entries(cfg)[0]
    assert cache.layers[0][0].shape == (6, heads, BS, dim)
    assert name in repr(cache)


def test_bad_use_raises(model):
    cfg = model.config
    cache = PagedKVCache(cfg, 4, BS)
    ids = torch.tensor([[5, 6, 7]])
    with pytest.raises(ValueError, match="prepare"):
        model(ids, kv_cache=cache)
    with pytest.raises(ValueError, match="block_tables\\[0\\]"):
        cache.prepare([[0]], [2], [3])                                # 5 tokens need 2 blocks
    with pytest.raises(ValueError, match="num_blocks=4"):
        cache.prepare([[0, 4]], [2], [3])
    with pytest.raises(ValueError, match="num_new"):
        cache.prepare([[0, 1]], [2], [0])
    with pytest.raises(ValueError, match="same length"):
        cache.prepare([[0, 1]], [2, 3], [1])
    cache.prepare([[0, 1]], [0], [3])
    with pytest.raises(ValueError, match=r"\[1, 3\]"):
        model(torch.tensor([[5, 6]]), kv_cache=cache)                 # S differs
    with pytest.raises(ValueError, match="read"):
        PagedKVCache(cfg, 4, BS).read(0, 1)
    for name, kw in (("num_blocks", dict(num_blocks=0)), ("block_size", dict(block_size=2.0))):
        with pytest.raises(ValueError, match=name):
            PagedKVCache(cfg, **{"num_blocks": 4, "block_size": 4, **kw})


def test_left_padding_is_not_new():
    """Row 1 (2 new tokens) is left-padded by 4 columns to row 0's 6, row 2 (a decode row
    after 3 cached tokens) by 5: only real new tokens are ``is_new``, and ``slot_mapping``
    lists each of their slots once (hand computed: row 0 blocks 0-1, row 1 block 2, row 2
    block 3, token 3)."""
    cache = PagedKVCache(random_model(seed=0).config, 8, BS)
    cache.prepare([[0, 1], [2], [3]], [0, 0, 3], [6, 2, 1])
    step = cache.begin_step(None, 3, 6)
    assert step.is_new.tolist() == [[True] * 6, [False] * 4 + [True] * 2,
                                    [False] * 5 + [True]]
    assert step.slot_mapping.tolist() == [0, 1, 2, 3, 4, 5, 8, 9, 15]


@pytest.mark.parametrize("cached,new,length", [([8, 0], [1, 3], 6), ([0, 0], [4, 2], 0),
                                               ([5, 2], [1, 1], 5)])
def test_prepare_length_is_the_longest_row_before_its_new_tokens(cached, new, length):
    """``length`` is the padded layout's cached width: the longest row (cached + new) minus
    the widest new part, so rows with few cached tokens do not widen it."""
    cache = PagedKVCache(random_model().config, 8, 4)
    cache.prepare([[0, 1, 2], [3, 4]], cached, new)
    assert cache.length == length
