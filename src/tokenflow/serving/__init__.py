"""A small serving engine in the spirit of vLLM / nano-vllm, written for reading.

request.py (what a request asks and gets) -> block_manager.py (which KV block holds which
tokens) -> scheduler.py (who computes what this step) -> runner.py (model calls) ->
sampler.py (each request's next token, logprobs, errors) -> engine.py (the loop and its
metrics). See ARCHITECTURE.md, section 3.
"""
from .request import Request, RequestOutput, RequestStatus, SamplingParams
from .block_manager import Block, BlockManager, chain_hash
from .scheduler import ScheduledChunk, Scheduler, StepPlan
from .sampler import SampledToken, sample_requests, sample_token
from .runner import ContiguousRunner, ModelRunner, PaddedRunner, PagedRunner
from .runner import ContiguousKVStorage, PagedKVStorage, PaddedKVStorage  # noqa: F401 (old names)
from .engine import LLMEngine, StepRecord
from .workload import (DECODE, PREFILL, WAIT, RequestTimeline, corpus_lines, corpus_next_chars,
                       mixed_workload, request_timeline, run_with_arrivals)

__all__ = ["Request", "RequestOutput", "RequestStatus", "SamplingParams", "Block",
           "BlockManager", "chain_hash", "ScheduledChunk", "Scheduler", "StepPlan",
           "SampledToken", "sample_token", "sample_requests",
           "ContiguousRunner", "PagedRunner", "PaddedRunner", "ModelRunner",
           "LLMEngine", "StepRecord",
           "WAIT", "PREFILL", "DECODE", "RequestTimeline", "request_timeline",
           "run_with_arrivals", "corpus_lines", "mixed_workload", "corpus_next_chars"]
