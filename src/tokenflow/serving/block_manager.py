"""The block manager: which KV block holds which tokens. Pure bookkeeping over block ids.

The KV cache is cut into ``num_blocks`` fixed-size blocks of ``block_size`` token slots
(vLLM's PagedAttention, Kwon et al. 2023, arXiv:2309.06180, section 4.2). A request owns a
*block table*: the ids of its blocks in token order, token ``i`` sits in block
``block_table[i // block_size]`` at offset ``i % block_size``. Unused blocks wait in a free
list. Every action comes with its check, as in nano-vllm's ``BlockManager``:

* ``can_allocate`` / ``allocate``: blocks for all of a request's tokens at admission;
* ``can_append`` / ``append_slot``: one more block when the next token starts a new one;
* ``free``: give a request's blocks back (at the end, or when it is preempted).

Prefix caching (vLLM's automatic prefix caching; nano-vllm's ``compute_hash``): a *full*
block whose K/V has been computed is keyed by ``hash(key of the previous block, its token
ids)``. Chaining makes the key depend on the whole prefix, so two requests sharing a system
prompt find the same keys for its blocks. At admission the request's full blocks are looked
up in order; a hit is reused only if the stored token ids are equal (a hash collision must
not hand over someone else's K/V), and the walk stops at the first miss. Shared blocks carry
a reference count; a block goes back to the free list when it drops to 0 but keeps its key
until it is handed out again, so a later request can still hit it.

Nothing here touches tensors: the runner's storage reads the block tables.
"""
from __future__ import annotations

from collections import deque
from typing import Callable

__all__ = ["Block", "BlockManager", "chain_hash"]


def chain_hash(prev_hash: int | None, token_ids: tuple[int, ...]) -> int:
    """Key of a full block: Python's (deterministic for ints) 64-bit hash of
    ``(prev_hash, token_ids)``. Collisions are possible, so reuse compares token ids too
    (nano-vllm uses xxhash64, vLLM sha256; the chaining is the same)."""
    return hash((prev_hash, token_ids))


class Block:
    """One block: ``ref_count`` owners; ``hash`` and ``token_ids`` once it is a full,
    computed block registered in the prefix cache (else ``None`` / ``()``)."""

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.hash: int | None = None
        self.token_ids: tuple[int, ...] = ()

    def __repr__(self) -> str:
        return f"Block({self.block_id}, ref={self.ref_count}, hash={self.hash})"


class BlockManager:
    """Block pool, free list, reference counts and prefix-cache keys.

    Args:
        num_blocks: blocks in the pool (int >= 1).
        block_size: token slots per block (int >= 1).
        enable_prefix_caching: look up and register full blocks by their chained hash.
        hash_fn: ``(prev_hash, token_ids) -> int``; default :func:`chain_hash` (tests pass
            a colliding one).

    Attributes:
        blocks: all :class:`Block` objects, index = block id.
        free_block_ids: deque of free ids; handed out from the left, returned to the right.
        hash_to_block_id: prefix-cache index.
        num_queried_blocks, num_hit_blocks: prefix-cache statistics (full blocks looked up
            at a request's first admission / found): reuse across requests.
        num_preempted_queried_blocks, num_preempted_hit_blocks: the same at the
            re-admissions of preempted requests, counted apart (a recompute finds the
            request's own freed blocks; vLLM's ``preempted_queries`` / ``preempted_hits``,
            left out of its hit rate, vLLM PR 25787).

    Raises:
        ValueError: ``num_blocks`` or ``block_size`` not an int >= 1.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 hash_fn: Callable[[int | None, tuple], int] = chain_hash):
        for name, v in (("num_blocks", num_blocks), ("block_size", block_size)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.hash_fn = hash_fn
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_block_ids: deque[int] = deque(range(num_blocks))
        self.hash_to_block_id: dict[int, int] = {}
        self.num_queried_blocks = 0
        self.num_hit_blocks = 0
        self.num_preempted_queried_blocks = 0
        self.num_preempted_hit_blocks = 0

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    # ------------------------------------------------------------------ prefix cache
    def _block_tokens(self, req, i: int) -> tuple[int, ...]:
        bs = self.block_size
        return tuple(req.token_ids[i * bs:(i + 1) * bs])

    def _cached_prefix(self, req) -> list[int]:
        """Ids of the cached blocks that start ``req``'s tokens. Only blocks inside the
        first ``num_tokens - 1`` tokens count, so at least one token is left to compute
        (its logits give the next token), as vLLM does."""
        if not self.enable_prefix_caching:
            return []
        hits, h = [], None
        for i in range((req.num_tokens - 1) // self.block_size):
            tokens = self._block_tokens(req, i)
            h = self.hash_fn(h, tokens)
            block_id = self.hash_to_block_id.get(h)
            if block_id is None or self.blocks[block_id].token_ids != tokens:
                break                                  # miss (or a collision): stop here
            hits.append(block_id)
        return hits

    def cache_full_blocks(self, req) -> None:
        """Register ``req``'s full blocks whose K/V is computed (``num_computed_tokens``)
        in the prefix cache. Called after each step; blocks already keyed are skipped."""
        if not self.enable_prefix_caching:
            return
        prev = None
        for i in range(req.num_computed_tokens // self.block_size):
            block = self.blocks[req.block_table[i]]
            if block.hash is None:
                block.token_ids = self._block_tokens(req, i)
                block.hash = self.hash_fn(prev, block.token_ids)
                self.hash_to_block_id[block.hash] = block.block_id
            prev = block.hash

    # ------------------------------------------------------------------ allocate / free
    def _take_free_block(self) -> int:
        """Pop a free block and forget its old prefix-cache key (it gets new contents)."""
        block = self.blocks[self.free_block_ids.popleft()]
        if block.hash is not None and self.hash_to_block_id.get(block.hash) == block.block_id:
            del self.hash_to_block_id[block.hash]
        block.hash, block.token_ids, block.ref_count = None, (), 1
        return block.block_id

    def can_allocate(self, req) -> bool:
        """Whether the free list can cover all of ``req``'s tokens now (cache hits on
        blocks other requests hold cost no free block)."""
        shared = sum(1 for b in self._cached_prefix(req) if self.blocks[b].ref_count > 0)
        return self.num_free_blocks >= req.num_blocks(self.block_size) - shared

    def allocate(self, req) -> int:
        """Give ``req`` (with an empty block table) blocks for all its tokens: first the
        cached prefix (ref counts + 1), then fresh blocks. At the first admission
        (``req.num_preemptions == 0``) the hits count in :attr:`num_hit_blocks` and set
        ``req.num_cached_tokens``; at a re-admission after a preemption they count in
        :attr:`num_preempted_hit_blocks` and leave ``req.num_cached_tokens`` alone.

        Returns:
            the number of tokens the cached prefix covers (their K/V is computed).

        Raises:
            ValueError: ``req`` already has blocks, or :meth:`can_allocate` is False.
        """
        if req.block_table:
            raise ValueError(f"request {req.request_id!r} already has blocks")
        if not self.can_allocate(req):
            raise ValueError(f"not enough free blocks for request {req.request_id!r}")
        hits = self._cached_prefix(req)
        queried = (req.num_tokens - 1) // self.block_size
        if req.num_preemptions:
            self.num_preempted_queried_blocks += queried
            self.num_preempted_hit_blocks += len(hits)
        else:
            self.num_queried_blocks += queried
            self.num_hit_blocks += len(hits)
            req.num_cached_tokens = len(hits) * self.block_size
        for block_id in hits:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                self.free_block_ids.remove(block_id)   # revive a freed but still keyed block
            block.ref_count += 1
        fresh = [self._take_free_block()
                 for _ in range(req.num_blocks(self.block_size) - len(hits))]
        req.block_table = hits + fresh
        return len(hits) * self.block_size

    def can_append(self, req) -> bool:
        """Whether the blocks for ``req``'s tokens (its next token included) can be had."""
        return self.num_free_blocks >= req.num_blocks(self.block_size) - len(req.block_table)

    def append_slot(self, req) -> None:
        """Add the block(s) ``req`` needs for all its tokens (0 or 1 per decode step).

        Raises:
            ValueError: if :meth:`can_append` is False.
        """
        if not self.can_append(req):
            raise ValueError(f"no free block for request {req.request_id!r}")
        while len(req.block_table) < req.num_blocks(self.block_size):
            req.block_table.append(self._take_free_block())

    def free(self, req) -> None:
        """Drop ``req``'s hold on its blocks; blocks nobody holds return to the free list
        (last block first, so the shareable first blocks are reused last)."""
        for block_id in reversed(req.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_block_ids.append(block_id)
        req.block_table = []
