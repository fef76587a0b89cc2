"""The book's model through tokenflow.serving and through vLLM: same requests, tokens compared.

    make vllm                                   # once: vLLM's CPU build in .venv-vllm
    .venv/bin/python scripts/vllm_peer.py       # prints the comparison
    .venv/bin/python scripts/vllm_peer.py --json src/tokenflow/data/vllm_peer.json

The second form stores what chapter 05 shows (the book's venv has no vLLM, so the chapter reads
the stored run): both engines' steps, preemptions and prefix-cache hits, and whether every token
agreed. It exits with status 1 when a token differs. Both engines run on one thread, in fp32;
vLLM without its asynchronous scheduling (as ours: each step planned once the previous step's
tokens are known). vLLM's counters still vary a little from run to run (its engine core starts
stepping while the front end is still sending requests); ours repeat exactly.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

from tokenflow import load_pretrained
from tokenflow.interop import save_hf_checkpoint
from tokenflow.interop.vllm_peer import VLLMProcess
from tokenflow.serving.peer import PEER_ENGINE_ARGS, compare_runs, peer_workload, run_ours

LOGPROB_ATOL = 1e-4
"""Largest difference allowed between the two engines' log-probabilities of a chosen token
(fp32; measured: about 1e-6)."""


def peer_run(model, tokenizer, folder: Path, num_requests: int = 48, seed: int = 0,
             threads: int = 1) -> dict:
    """Export ``model`` to ``folder``, run :func:`peer_workload` through both engines
    (:data:`PEER_ENGINE_ARGS`, ``threads`` each) and compare.

    Returns:
        ``{"settings", "workload", "ours", "vllm", "comparison", "machine"}``; ``ours`` and
        ``vllm`` hold each engine's counters and its outputs' tokens and log-probabilities.
    """
    torch.set_num_threads(threads)
    save_hf_checkpoint(model, folder, tokenizer=tokenizer)
    prompts, news = peer_workload(tokenizer, num_requests=num_requests, seed=seed)
    settings = dict(PEER_ENGINE_ARGS, max_model_len=model.config.max_position_embeddings,
                    threads=threads, async_scheduling=False)
    with VLLMProcess(folder, settings) as peer:
        theirs = peer.run(prompts, news)
        startup, version = peer.startup_s, peer.version
    ours = run_ours(model, prompts, news, **PEER_ENGINE_ARGS)
    lens = [len(p) for p in prompts]
    return {
        "settings": dict(PEER_ENGINE_ARGS, threads=threads, dtype="float32", greedy=True,
                         enable_prefix_caching=True, chunked_prefill=True, ignore_eos=True,
                         vllm_async_scheduling=False),
        "workload": {"num_requests": len(prompts), "seed": seed,
                     "prompt_tokens": [min(lens), max(lens)], "new_tokens": [min(news), max(news)],
                     "total_prompt_tokens": sum(lens), "total_new_tokens": sum(news)},
        "ours": _engine_record(ours),
        "vllm": dict(_engine_record(theirs), version=version, startup_s=round(startup, 1),
                     prefix_cache_queries=theirs["prefix_cache_queries"]),
        "comparison": dict(compare_runs(ours["outputs"], theirs["outputs"]),
                           logprob_atol=LOGPROB_ATOL),
        "machine": {"processor": platform.processor() or platform.machine(),
                    "python": platform.python_version(), "torch": torch.__version__,
                    "date": time.strftime("%Y-%m-%d")},
    }


def _engine_record(run: dict) -> dict:
    return {"num_steps": run["num_steps"], "num_preemptions": run["num_preemptions"],
            "prefix_cache_hits": run["prefix_cache_hits"],
            "token_ids": [o["token_ids"] for o in run["outputs"]],
            "logprobs": [o["logprobs"] for o in run["outputs"]]}


def agrees(result: dict) -> bool:
    """Every request's tokens identical and every log-probability within the tolerance."""
    c = result["comparison"]
    return (c["identical_requests"] == c["num_requests"]
            and c["max_logprob_diff"] is not None and c["max_logprob_diff"] <= LOGPROB_ATOL)


def summary(result: dict) -> str:
    """A few lines: requests and tokens agreeing, logprob difference, each engine's counters."""
    c, o, v = result["comparison"], result["ours"], result["vllm"]
    return "\n".join([
        f"requests identical: {c['identical_requests']}/{c['num_requests']}, tokens "
        f"{c['identical_tokens']}/{c['num_tokens']}; largest logprob difference "
        f"{c['max_logprob_diff']:.1e} (allowed {c['logprob_atol']:.0e})",
        f"{'':12}{'steps':>8}{'preemptions':>13}{'prefix-cache hits':>19}",
        f"{'tokenflow':12}{o['num_steps']:>8}{o['num_preemptions']:>13}"
        f"{o['prefix_cache_hits']:>19}",
        f"{'vLLM ' + v['version']:12}{v['num_steps']:>8}{v['num_preemptions']:>13}"
        f"{v['prefix_cache_hits']:>19}"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path, default=None, help="store the run here")
    p.add_argument("--requests", type=int, default=48)
    args = p.parse_args(argv)
    model, tok = load_pretrained()
    with tempfile.TemporaryDirectory() as d:
        result = peer_run(model, tok, Path(d) / "tiny-hf", num_requests=args.requests)
    print(summary(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    return 0 if agrees(result) else 1


if __name__ == "__main__":
    sys.exit(main())
