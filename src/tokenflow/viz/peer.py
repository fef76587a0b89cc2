"""Chapter 05: our engine next to vLLM's on the same requests (from the stored peer run)."""
from __future__ import annotations

from ..serving.peer import VLLM_COUNTERPARTS
from .fmt import Table
from .lang import language, tr

_IMPORTED = set(globals())          # the names above are imported, not defined here


def peer_table(run: dict) -> Table:
    """Both engines on the stored run (:func:`tokenflow.serving.peer.load_peer_run`): tokens
    agreeing, the largest log-probability difference and each engine's counters."""
    c, o, v, w = run["comparison"], run["ours"], run["vllm"], run["workload"]
    same = (f"{c['identical_tokens']:,} of {c['num_tokens']:,} "
            f"({c['identical_requests']} of {c['num_requests']} requests)")
    rows = [["requests / new tokens", f"{w['num_requests']} / {w['total_new_tokens']:,}",
             "the same"],
            ["tokens identical to ours", "", same],
            ["largest logprob difference", "",
             f"{c['max_logprob_diff']:.0e} (allowed {c['logprob_atol']:.0e})"],
            ["engine steps", o["num_steps"], v["num_steps"]],
            ["preemptions", o["num_preemptions"], v["num_preemptions"]],
            ["prompt tokens from the prefix cache", o["prefix_cache_hits"],
             v["prefix_cache_hits"]]]
    return Table(rows, ["", "tokenflow.serving", f"vLLM {v['version']} (CPU)"], align="<>>")


def peer_summary(run: dict) -> str:
    """One paragraph comparing the two engines' counters, worded from the numbers (each
    clause through :func:`~tokenflow.viz.lang.tr`, so it reads in the set language)."""
    c, o, v = run["comparison"], run["ours"], run["vllm"]
    verdict = (tr("Both engines gave the same tokens on every request.")
               if c["identical_requests"] == c["num_requests"] else
               tr(f"Both engines differed on {c['num_requests'] - c['identical_requests']} "
                  "requests."))

    def cmp(what: str, a: int, b: int) -> str:
        if a == b:
            return tr(f"the same {what} ({a})")
        return tr(f"{'more' if b > a else 'fewer'} {what} in vLLM ({b} against our {a})")
    parts = [cmp("steps", o["num_steps"], v["num_steps"]),
             cmp("preemptions", o["num_preemptions"], v["num_preemptions"]),
             cmp("prompt tokens served from the prefix cache", o["prefix_cache_hits"],
                 v["prefix_cache_hits"])]
    same = (o["num_steps"], o["num_preemptions"], o["prefix_cache_hits"]) == (
        v["num_steps"], v["num_preemptions"], v["prefix_cache_hits"])
    head = "The schedules are the same" if same else "The schedules are close but not equal"
    gap = "" if language() == "zh" else " "
    return verdict + gap + tr(f"{head}: {parts[0]}, {parts[1]} and {parts[2]}.")


def counterparts_table() -> Table:
    """Each piece of :mod:`tokenflow.serving` and its counterpart in vLLM's v1 engine."""
    return Table([list(r) for r in VLLM_COUNTERPARTS],
                 ["tokenflow/serving/", "what it does", "vLLM v1", "file to open next"])


# what this module defines (every public name after the imports)
__all__ = [n for n in globals() if not n.startswith("_") and n not in _IMPORTED]
