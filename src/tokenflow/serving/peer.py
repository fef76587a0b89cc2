"""One workload for two engines: ours and vLLM's, on the same checkpoint, compared.

:func:`peer_workload` builds the requests, :func:`run_ours` runs them through
:class:`~.engine.LLMEngine` and returns the same plain record as
:func:`tokenflow.interop.vllm_peer.generate_greedy`, and :func:`compare_runs` says whether the two
gave the same tokens and how far apart their log-probabilities are. ``scripts/vllm_peer.py``
runs both and stores the result the book shows (``tokenflow/data/vllm_peer.json``).
"""
from __future__ import annotations

import time

from .engine import LLMEngine
from .request import SamplingParams
from .workload import corpus_lines

__all__ = ["PEER_ENGINE_ARGS", "VLLM_COUNTERPARTS", "PEER_RUN", "peer_workload", "run_ours",
           "compare_runs", "load_peer_run"]

PEER_ENGINE_ARGS = dict(block_size=32, num_blocks=24, max_num_seqs=16,
                        max_num_batched_tokens=256)
"""The settings both engines share: 32-token blocks, a pool of 24 blocks (768 token slots:
tight enough that the longest requests are preempted at times), up to 16 sequences and 256
tokens per step (prompts longer than what is left of the budget are prefilled in chunks)."""


VLLM_COUNTERPARTS = (
    ("request.py: Request, SamplingParams", "what a request asks for and holds",
     "Request; SamplingParams", "vllm/v1/request.py, vllm/sampling_params.py"),
    ("block_manager.py: BlockManager, chain_hash",
     "block pool, free list, reference counts, prefix-cache keys",
     "BlockPool, FreeKVCacheBlockQueue, hash_block_tokens; KVCacheManager",
     "vllm/v1/core/block_pool.py, kv_cache_utils.py, kv_cache_manager.py"),
    ("scheduler.py: Scheduler.schedule",
     "token budget, chunked prefill, preempting the newest request",
     "Scheduler.schedule", "vllm/v1/core/sched/scheduler.py"),
    ("runner.py, paged_kv_cache.py: the packed step",
     "one flattened batch per step, block tables, K/V slot writes",
     "GPUModelRunner._prepare_inputs (query_start_loc, slot_mapping), BlockTable; the CPU "
     "attention backend", "vllm/v1/worker/gpu_model_runner.py (cpu_model_runner.py extends "
     "it), block_table.py, vllm/v1/attention/backends/cpu_attn.py"),
    ("sampler.py: sample_requests", "greedy, temperature, top-k / top-p, raw logprobs",
     "Sampler", "vllm/v1/sample/sampler.py"),
    ("engine.py: LLMEngine.step", "schedule -> run -> update, metrics",
     "EngineCore.step (in a process of its own); LLMEngine and LLM, the front end",
     "vllm/v1/engine/core.py, llm_engine.py, vllm/entrypoints/llm.py"),
)
"""``(our file: names, what it does, vLLM v1's counterpart, vLLM's files)`` per piece of
:mod:`tokenflow.serving`, for a reader who opens vLLM next (vLLM 0.32; the files are
checked to exist by ``peer/test_vllm.py``)."""

PEER_RUN = "vllm_peer.json"
"""The stored peer run in ``tokenflow/data`` (``scripts/vllm_peer.py --json``)."""


def load_peer_run(path=None) -> dict:
    """The stored run of :func:`peer_workload` through both engines (``scripts/vllm_peer.py
    --json src/tokenflow/data/vllm_peer.json`` writes it; the book's venv has no vLLM).

    Raises:
        FileNotFoundError: no such file.
    """
    import json
    from importlib import resources
    if path is None:
        path = resources.files("tokenflow") / "data" / PEER_RUN
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def peer_workload(tokenizer, num_requests: int = 48, seed: int = 0, min_prompt: int = 4,
                  max_prompt: int = 100, min_new: int = 8,
                  max_new: int = 24) -> tuple[list[list[int]], list[int]]:
    """Requests with shared prefixes, as chat traffic has: prompt ``i`` starts, two times in
    three, with one of four fixed openings (6-10 corpus lines, about 40-70 tokens:
    one or two full 32-token blocks to share), goes on with random corpus
    lines and is cut to a length drawn from ``[min_prompt, max_prompt]`` tokens; it asks for
    a number of new tokens drawn from ``[min_new, max_new]``. Reproducible from ``seed``.

    Returns:
        ``(prompts, max_new_tokens)``: token-id lists and ints.

    Raises:
        ValueError: ``num_requests < 1`` or a range with ``lo < 1`` or ``lo > hi``.
    """
    import torch
    if isinstance(num_requests, bool) or not isinstance(num_requests, int) or num_requests < 1:
        raise ValueError(f"num_requests must be an int >= 1, got {num_requests!r}")
    for name, lo, hi in (("min_prompt/max_prompt", min_prompt, max_prompt),
                         ("min_new/max_new", min_new, max_new)):
        if not (isinstance(lo, int) and isinstance(hi, int) and 1 <= lo <= hi):
            raise ValueError(f"{name} must be ints with 1 <= lo <= hi, got {lo!r}, {hi!r}")
    g = torch.Generator().manual_seed(seed)
    rand = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=g))  # noqa: E731
    lines = corpus_lines()
    line = lambda: lines[rand(0, len(lines) - 1)]                        # noqa: E731
    openings = [" ".join(line() for _ in range(rand(6, 10))) for _ in range(4)]
    prompts, news = [], []
    for _ in range(num_requests):
        length = rand(min_prompt, max_prompt)
        text = openings[rand(0, 3)] if rand(0, 2) else line()
        ids = tokenizer.encode(text)
        while len(ids) < length:
            text += " " + line()
            ids = tokenizer.encode(text)
        prompts.append(ids[:length])
        news.append(rand(min_new, max_new))
    return prompts, news


def run_ours(model, prompts: list[list[int]], max_new_tokens: list[int], *,
             block_size: int, num_blocks: int, max_num_seqs: int,
             max_num_batched_tokens: int, enable_prefix_caching: bool = True,
             logprobs: bool = True) -> dict:
    """Greedy generation of ``prompts`` with :class:`~.engine.LLMEngine` (paged storage),
    EOS ignored, in the record format of :func:`tokenflow.interop.vllm_peer.generate_greedy`.

    Returns:
        ``{"wall_s", "outputs": [{"token_ids", "logprobs", "num_cached_tokens", "ttft_s",
        "tpot_s"}], "num_steps", "num_preemptions", "prefix_cache_hits"}``; TTFT and TPOT
        are :class:`~.request.RequestOutput`'s (arrival to first token; first to last token,
        per token after the first).

    Raises:
        ValueError: ``len(max_new_tokens) != len(prompts)``, or as :class:`~.engine.LLMEngine`.
    """
    if len(max_new_tokens) != len(prompts):
        raise ValueError(f"max_new_tokens needs one int per prompt ({len(prompts)}), "
                         f"got {len(max_new_tokens)}")
    engine = LLMEngine(model, num_blocks=num_blocks, block_size=block_size,
                       max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                       enable_prefix_caching=enable_prefix_caching)
    params = [SamplingParams(max_new_tokens=n, ignore_eos=True, logprobs=0 if logprobs else None)
              for n in max_new_tokens]
    t = time.perf_counter()
    outs = engine.run(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - t
    records = []
    for o in outs:
        lps = None if o.logprobs is None else [float(d[t]) for d, t in
                                               zip(o.logprobs, o.output_token_ids)]
        records.append({"token_ids": list(o.output_token_ids), "logprobs": lps,
                        "num_cached_tokens": o.num_cached_tokens, "ttft_s": o.ttft,
                        "tpot_s": o.tpot})
    m = engine.metrics()
    return {"wall_s": wall, "outputs": records, "num_steps": m["num_steps"],
            "num_preemptions": m["num_preemptions"],
            "prefix_cache_hits": sum(r["num_cached_tokens"] for r in records)}


def compare_runs(ours: list[dict], theirs: list[dict]) -> dict:
    """Request by request: are the generated tokens identical, and how far apart are the
    chosen tokens' log-probabilities where both reported them?

    Args:
        ours, theirs: the ``"outputs"`` lists of :func:`run_ours` / ``generate_greedy``, in request
            order.

    Returns:
        ``{"num_requests", "identical_requests", "num_tokens", "identical_tokens",
        "first_mismatch" (request index or None), "max_logprob_diff" (over tokens up to each
        request's first difference; None without logprobs)}``.

    Raises:
        ValueError: the two lists differ in length.
    """
    if len(ours) != len(theirs):
        raise ValueError(f"the runs hold {len(ours)} and {len(theirs)} requests")
    same_req = same_tok = total = 0
    first, diff = None, None
    for i, (a, b) in enumerate(zip(ours, theirs)):
        ta, tb = a["token_ids"], b["token_ids"]
        total += max(len(ta), len(tb))
        agree = 0
        while agree < min(len(ta), len(tb)) and ta[agree] == tb[agree]:
            agree += 1
        same_tok += agree
        if ta == tb:
            same_req += 1
        elif first is None:
            first = i
        if a.get("logprobs") is not None and b.get("logprobs") is not None:
            d = [abs(x - y) for x, y in zip(a["logprobs"][:agree], b["logprobs"][:agree])]
            diff = max([diff or 0.0] + d)
    return {"num_requests": len(ours), "identical_requests": same_req, "num_tokens": total,
            "identical_tokens": same_tok, "first_mismatch": first, "max_logprob_diff": diff}
