"""The simulator's two lenses, measured on one run of the serving engine.

Chapter 7 reads the same process two ways (not to be confused with the *logit*
lens of :mod:`tokenflow.analysis.logit_lens`):

* the **pipeline lens**: request queue -> prefill -> KV cache -> decode loop -> sampling ->
  response (how a request moves through :class:`~tokenflow.serving.LLMEngine`);
* the **block lens**: input tokens -> embedding -> attention + KV -> FFN / MoE -> logits ->
  output token (how one forward pass updates the hidden state).

:func:`profile_engine_run` times both on the same engine steps with ``time.perf_counter``:
wrappers around the engine's parts (``scheduler.schedule`` / ``update``, ``runner.execute``,
the storage's ``forward``, the paged cache's ``packed_step`` / ``update``) for the pipeline, and
forward hooks on the model's modules for the blocks. Every step's pieces are disjoint
intervals inside the engine's own step time (:attr:`StepRecord.seconds
<tokenflow.serving.StepRecord>`), so they add up to at most that time; the remainder is
named (``other``): for the pipeline, the engine's own bookkeeping; for the blocks, everything
outside the six module classes (scheduler, building the step's tensors, RoPE, residual
adds, input checks: Python and scheduler overhead). Hooks and wrappers cost a few
microseconds each, which lands in ``other`` too.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

__all__ = ["PIPELINE_STAGES", "BLOCK_MODULES", "StepProfile", "LensProfile",
           "profile_engine", "profile_engine_run"]

PIPELINE_STAGES = ("request queue", "prefill", "KV cache", "decode loop", "sampling",
                   "response")
"""Stages of the pipeline lens, in the serving order. ``prefill``: compute of the steps that
carry prompt tokens (decode rows of the same step ride along in the same forward);
``decode loop``: compute of decode-only steps."""

BLOCK_MODULES = ("embedding", "attention", "FFN / MoE", "norm", "LM head", "sampling")
"""Module classes of the block lens. ``attention`` includes reading and writing the KV cache
(the cache call is made inside it); ``norm`` is every block's two RMSNorms and the final one."""

OTHER = "other"


@dataclass
class StepProfile:
    """One engine step seen through both lenses (seconds).

    Attributes:
        index: the step's index in ``engine.steps``.
        phase: ``"prefill"`` (the step computes prompt tokens) or ``"decode"``.
        seconds: the engine's own time of the step (``StepRecord.seconds``).
        num_tokens: tokens computed in the step; ``num_decode_rows``: decode rows among them.
        stages: :data:`PIPELINE_STAGES` -> seconds (disjoint).
        modules: :data:`BLOCK_MODULES` -> seconds (disjoint).
        kv_seconds: of ``modules["attention"]``, the time in the KV cache's ``update``.
    """

    index: int
    phase: str = "decode"
    seconds: float = 0.0
    num_tokens: int = 0
    num_decode_rows: int = 0
    stages: dict = field(default_factory=lambda: dict.fromkeys(PIPELINE_STAGES, 0.0))
    modules: dict = field(default_factory=lambda: dict.fromkeys(BLOCK_MODULES, 0.0))
    kv_seconds: float = 0.0


@dataclass
class LensProfile:
    """:func:`profile_engine_run`'s result: a :class:`StepProfile` per step, plus the run's
    ``outputs`` and ``arrivals`` (as :func:`~tokenflow.serving.run_with_arrivals` returns)."""

    steps: list
    outputs: list = field(default_factory=list)
    arrivals: dict = field(default_factory=dict)

    def _select(self, phase):
        if phase not in (None, "prefill", "decode"):
            raise ValueError(f"phase must be None, 'prefill' or 'decode', got {phase!r}")
        return [s for s in self.steps if phase is None or s.phase == phase]

    def total_s(self, phase: str | None = None) -> float:
        """Sum of the engine's step times (all steps, or one ``phase``); for all steps this
        is ``engine.metrics()["elapsed_s"]``."""
        return sum(s.seconds for s in self._select(phase))

    def _sum(self, attr: str, keys, phase) -> dict:
        steps = self._select(phase)
        out = {k: sum(getattr(s, attr)[k] for s in steps) for k in keys}
        out[OTHER] = sum(s.seconds for s in steps) - sum(out.values())
        return out

    def pipeline(self, phase: str | None = None) -> dict:
        """Seconds per :data:`PIPELINE_STAGES` entry and ``"other"`` (the rest of the step
        time); the values add up to :meth:`total_s`."""
        return self._sum("stages", PIPELINE_STAGES, phase)

    def blocks(self, phase: str | None = None) -> dict:
        """Seconds per :data:`BLOCK_MODULES` entry and ``"other"`` (Python and scheduler
        overhead); the values add up to :meth:`total_s`."""
        return self._sum("modules", BLOCK_MODULES, phase)

    def kv_seconds(self, phase: str | None = None) -> float:
        """Seconds in the KV cache's ``update`` (part of the ``attention`` module time)."""
        return sum(s.kv_seconds for s in self._select(phase))

    def cross_tab(self, phase: str | None = None) -> dict:
        """The block lens inside the pipeline lens: seconds of each module class spent in
        each pipeline stage, ``{stage: {module: seconds}}`` over :data:`PIPELINE_STAGES` and
        ``"other"`` (rows) and :data:`BLOCK_MODULES` and ``"other"`` (columns).

        The modules of a step's forward pass sit in its ``prefill`` or ``decode loop`` stage,
        except the attention's KV-cache ``update`` (:attr:`StepProfile.kv_seconds`), which
        the pipeline lens calls ``KV cache``; ``sampling`` is the same time in both lenses.
        Each row's ``other`` is the stage time no module claims (RoPE, residual adds, the
        cache's set-up; for ``request queue`` and ``response`` all of it). Rows add up to
        :meth:`pipeline`, columns to :meth:`blocks`.

        Raises:
            ValueError: ``phase`` not ``None``, ``"prefill"`` or ``"decode"``.
        """
        cols = BLOCK_MODULES + (OTHER,)
        out = {st: dict.fromkeys(cols, 0.0) for st in PIPELINE_STAGES + (OTHER,)}
        for s in self._select(phase):
            fwd = out["prefill" if s.phase == "prefill" else "decode loop"]
            for k in BLOCK_MODULES:
                (out["sampling"] if k == "sampling" else fwd)[k] += s.modules[k]
            fwd["attention"] -= s.kv_seconds
            out["KV cache"]["attention"] += s.kv_seconds
        for st, seconds in self.pipeline(phase).items():
            out[st][OTHER] = seconds - sum(out[st][k] for k in BLOCK_MODULES)
        return out

    def num_tokens(self, phase: str | None = None) -> int:
        """Tokens computed (prompt tokens and decode rows) in the selected steps."""
        return sum(s.num_tokens for s in self._select(phase))


def _module_roles(model) -> list[tuple[torch.nn.Module, str]]:
    """(module, block-lens class) for the modules hooked: the top-level ones of each role
    only (a norm inside MLA stays inside ``attention``)."""
    roles = [(model.embed_tokens, "embedding"), (model.norm, "norm"), (model.lm_head, "LM head")]
    for layer in model.layers:
        roles += [(layer.input_layernorm, "norm"), (layer.post_attention_layernorm, "norm"),
                  (layer.self_attn, "attention"), (layer.mlp, "FFN / MoE")]
    return roles


class _Recorder:
    """Installs the wrappers and hooks on one engine and collects :class:`StepProfile`."""

    def __init__(self, engine):
        self.engine, self.steps, self.current = engine, [], None
        dev = next(engine.model.parameters()).device
        self.sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
        self._undo, self._open = [], {}

    def now(self) -> float:
        self.sync()
        return time.perf_counter()

    def _patch(self, obj, name: str, make):
        had_own = name in vars(obj)                  # an instance attribute, not a method
        orig = getattr(obj, name)
        setattr(obj, name, make(orig))
        self._undo.append(lambda: setattr(obj, name, orig) if had_own else delattr(obj, name))

    def _timed(self, obj, name: str, on_done):
        """Replace ``obj.name`` with a wrapper calling ``on_done(start, end, result)``."""
        def make(orig):
            def wrapper(*args, **kwargs):
                t0 = self.now()
                result = orig(*args, **kwargs)
                on_done(t0, self.now(), result)
                return result
            return wrapper
        self._patch(obj, name, make)

    def install(self) -> None:
        e, storage = self.engine, self.engine.runner.strategy
        self._timed(e.scheduler, "schedule", self._on_schedule)
        self._timed(e.scheduler, "update", lambda a, b, r: self._add_stage("response", b - a))
        self._timed(e, "_finish", lambda a, b, r: self._add_stage("response", b - a))
        self._timed(e.runner, "free", lambda a, b, r: self._add_stage("KV cache", b - a))
        self._timed(e.runner, "execute", self._on_execute)
        self._timed(storage, "forward", self._on_forward)
        self._timed(storage.cache, "packed_step", self._on_kv)
        self._timed(storage.cache, "update", self._on_kv_update)
        for module, role in _module_roles(e.model):
            self._undo.append(module.register_forward_pre_hook(self._pre).remove)
            self._undo.append(module.register_forward_hook(self._post(role)).remove)

    def uninstall(self) -> None:
        for undo in reversed(self._undo):
            undo()
        self._undo = []

    # ---- callbacks
    def _on_schedule(self, t0, t1, plan):
        s = StepProfile(len(self.steps))
        s.phase = "prefill" if any(not c.is_decode for c in plan.chunks) else "decode"
        s.num_tokens = plan.num_tokens
        s.num_decode_rows = sum(c.is_decode for c in plan.chunks)
        self.steps.append(s)
        self.current, self._fwd, self._kv = s, (t1, t1), 0.0
        s.stages["request queue"] += t1 - t0

    def _add_stage(self, name, dt):
        if self.current is not None:
            self.current.stages[name] += dt

    def _on_forward(self, t0, t1, result):
        self._fwd = (t0, t1)

    def _on_kv(self, t0, t1, result):
        self._kv += t1 - t0

    def _on_kv_update(self, t0, t1, result):
        self._kv += t1 - t0
        self.current.kv_seconds += t1 - t0

    def _on_execute(self, t0, t1, result):
        s, (f0, f1) = self.current, self._fwd
        # storage allocate/free, packed_step, writes
        s.stages["KV cache"] += (f0 - t0) + self._kv
        s.stages["prefill" if s.phase == "prefill" else "decode loop"] += (f1 - f0) - self._kv
        s.stages["sampling"] += t1 - f1
        s.modules["sampling"] += t1 - f1

    def _pre(self, module, args):
        self._open[id(module)] = self.now()

    def _post(self, role):
        def hook(module, args, output):
            t0 = self._open.pop(id(module))
            if self.current is not None:
                self.current.modules[role] += self.now() - t0
        return hook


@contextmanager
def profile_engine(engine):
    """Time every step ``engine`` runs inside the ``with`` block through both lenses.

    Yields a list that fills with one :class:`StepProfile` per step; when the block ends the
    wrappers and hooks are removed and each profile gets the engine's step time.

    Raises:
        ValueError: an engine that is not fresh (it has run steps) or whose KV storage is not
            the paged one (``kv_storage="paged"``, the default).
    """
    if engine.steps:
        raise ValueError("engine must be fresh (no steps run) so steps and profiles match")
    if not hasattr(engine.runner.strategy, "cache"):
        raise ValueError("engine must use kv_storage='paged' (the default)")
    rec = _Recorder(engine)
    rec.install()
    try:
        yield rec.steps
    finally:
        rec.uninstall()
    for s in rec.steps:
        s.seconds = engine.steps[s.index].seconds


def profile_engine_run(engine, prompts: list, params, arrival_steps: list[int]) -> LensProfile:
    """Serve ``prompts`` with :func:`~tokenflow.serving.run_with_arrivals` on a fresh
    paged ``engine`` and time each step through both lenses (see the module docstring).

    Args:
        engine: a fresh :class:`~tokenflow.serving.LLMEngine` (``kv_storage="paged"``).
        prompts, params, arrival_steps: as :func:`~tokenflow.serving.run_with_arrivals`.

    Returns:
        :class:`LensProfile`: per step, seconds per pipeline stage and per module class,
        with ``pipeline()`` / ``blocks()`` totals whose values (``"other"`` included) add
        up to the engine's measured time.

    Raises:
        ValueError: as :func:`profile_engine` and :func:`~tokenflow.serving.run_with_arrivals`.
    """
    from tokenflow.serving import run_with_arrivals
    with profile_engine(engine) as steps:
        outputs, arrivals = run_with_arrivals(engine, prompts, params, arrival_steps)
    return LensProfile(steps, outputs, arrivals)
