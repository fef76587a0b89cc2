"""FLOPs and time for real configs: a roofline estimate from a hardware spec.

Counts (:func:`forward_flops`): a multiply-add is 2 FLOPs; every matrix multiply of the
forward pass of :mod:`tokenflow.analysis.costmodel`'s architecture: attention projections, attention
scores and weighted sum over the context, dense FFN, the ``K`` routed and the shared experts,
the router, the LM head. Norms, RoPE, softmax and activations (a few FLOPs per element) are
left out. Checked against ``torch.utils.flop_counter`` on the shared model (with
``causal=False``: the counter counts the full masked block).

Time (:func:`roofline`): one step on one device takes ``max(compute, memory, communication)``
(perfect overlap; ``serial_s`` adds them instead), each at the peak of :class:`HardwareSpec`;
compute charges the attention core at its own dtype's peak and every other matrix multiply at
the weights' (DeepSeek's service: matrix multiplications in FP8, core MLA in BF16, day-6 note
of its open-infra-index; FlashMLA's dense decoding kernel is BF16, FlashMLA README);
communication over NVLink and InfiniBand overlaps too (DeepSeek-V3 report, arXiv:2412.19437,
section 3.2.2: the IB and NVLink transfers of the all-to-all are fully overlapped), so it
takes the longer of the two. The all-to-all takes the path DeepSeek-V3 deploys for each
phase (section 3.4): decode sends every pair point to point over IB, prefill goes
IB-then-NVLink. Attention FLOPs are the causal work (the masked triangle skipped).
A bound, not a prediction: real kernels reach a fraction of peak.
"""
from __future__ import annotations

import dataclasses
import os
import time

from tokenflow.config import ModelConfig
from .costmodel import (A2A_PATHS, _check_count, _check_countable, forward_bytes,
                        moe_comm_bytes_per_token,
                        num_moe_layers)

__all__ = ["HardwareSpec", "HARDWARE", "hardware", "ridge_point", "probe_cpu", "forward_flops",
           "flops_per_token", "arithmetic_intensity", "roofline"]


@dataclasses.dataclass(frozen=True)
class HardwareSpec:
    """One device and its links. Units: FLOP/s, bytes, bytes/s (one direction, per device).

    Fields: ``name``; ``peak_flops`` (dtype -> dense FLOP/s); ``memory_bytes``;
    ``memory_bandwidth``; ``scale_up_bandwidth`` (inside a node: NVLink);
    ``scale_out_bandwidth`` (between nodes: InfiniBand / Ethernet, per device);
    ``gpus_per_node``; ``source`` (where each number comes from, and what is unverified).
    """

    name: str
    peak_flops: dict
    memory_bytes: float
    memory_bandwidth: float
    scale_up_bandwidth: float
    scale_out_bandwidth: float
    gpus_per_node: int
    source: str


_HOPPER_FLOPS = {"bf16": 989e12, "fp16": 989e12, "fp8": 1979e12, "fp32": 67e12}
_HOPPER_SRC = ("NVIDIA H100 Tensor Core GPU datasheet, SXM column: BF16/FP16 Tensor Core "
               "1,979 TFLOPS and FP8 3,958 TFLOPS are 'with sparsity', halved here to dense "
               "(989 / 1,979); FP32 (no tensor core) 67 TFLOPS. ")
HARDWARE = {
    "H100": HardwareSpec(
        "H100 SXM", _HOPPER_FLOPS, 80e9, 3.35e12, 450e9, 50e9, 8,
        _HOPPER_SRC + "HBM3 80 GB at 3.35 TB/s; NVLink 4 900 GB/s is both directions "
        "(450 GB/s each way); scale-out: DGX H100 datasheet, one ConnectX-7 400 Gb/s "
        "(50 GB/s) per GPU. Not re-read in this session: from the datasheets as remembered, "
        "cross-checked with a secondary page (glennklockwood.com/garden/processors/h100)."),
    "H200": HardwareSpec(
        "H200 SXM", _HOPPER_FLOPS, 141e9, 4.8e12, 450e9, 50e9, 8,
        _HOPPER_SRC + "(same GH100 compute per the NVIDIA H200 datasheet); HBM3e 141 GB at "
        "4.8 TB/s; NVLink 900 GB/s both directions; scale-out as H100 (400 Gb/s per GPU). "
        "From the datasheet as remembered, cross-checked with secondary pages; UNVERIFIED "
        "against the primary in this session."),
    "H800": HardwareSpec(
        "H800 SXM", _HOPPER_FLOPS, 80e9, 3.35e12, 160e9, 50e9, 8,
        "Compute and HBM as H100 SXM (export variant with reduced NVLink; UNVERIFIED "
        "against an NVIDIA datasheet in this session). Links: DeepSeek-V3 report "
        "arXiv:2412.19437 section 3.2.2, on DeepSeek's H800 cluster: 'NVLink offers a "
        "bandwidth of 160 GB/s, roughly 3.2 times that of IB (50 GB/s)' (text checked "
        "against the report's arXiv v2 HTML)."),
}
"""Hardware presets (:func:`hardware`); each ``source`` says where its numbers come from."""


def hardware(name: str) -> HardwareSpec:
    """A preset from :data:`HARDWARE` (``"H100"``, ``"H200"``, ``"H800"``) or ``"cpu"``
    (:func:`probe_cpu`, measured now).

    Raises:
        ValueError: an unknown name.
    """
    if name == "cpu":
        return probe_cpu()
    if name not in HARDWARE:
        raise ValueError(f"name must be one of {sorted(HARDWARE) + ['cpu']}, got {name!r}")
    return HARDWARE[name]


def ridge_point(hw: HardwareSpec, dtype: str = "bf16") -> float:
    """The roofline's ridge point in FLOPs per byte: ``hw.peak_flops[dtype] /
    hw.memory_bandwidth``. A pass whose :func:`arithmetic_intensity` is below it is
    memory-bound on ``hw``, above it compute-bound (Williams, Waterman and Patterson 2009).

    Raises:
        ValueError: ``dtype`` not in ``hw.peak_flops``.
    """
    if dtype not in hw.peak_flops:
        raise ValueError(f"dtype must be one of {sorted(hw.peak_flops)}, got {dtype!r}")
    return hw.peak_flops[dtype] / hw.memory_bandwidth


def probe_cpu(seconds: float = 0.3) -> HardwareSpec:
    """Measure this machine now (about ``2 * seconds``): fp32 FLOP/s of a 256x256 matmul on
    the threads torch uses, and memory bandwidth of copying a 64 MiB tensor (bytes read +
    written per second). Best of the repeats. Links are 0 (one device).

    Raises:
        ValueError: if ``seconds`` is not in ``(0, 5]``.
    """
    import torch
    if not 0 < seconds <= 5:
        raise ValueError(f"seconds must be in (0, 5], got {seconds!r}")
    a = torch.randn(256, 256)
    flops = _best_rate(lambda: a @ a, 2 * 256 ** 3, seconds)
    src, dst = torch.empty(16 * 2**20), torch.empty(16 * 2**20)        # 64 MiB each, fp32
    bw = _best_rate(lambda: dst.copy_(src), 2 * src.numel() * 4, seconds)
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return HardwareSpec("this CPU (measured)", {"fp32": flops, "bf16": flops}, float(mem), bw,
                        0.0, 0.0, 1, f"measured by tokenflow.analysis.roofline.probe_cpu at "
                        f"{time.strftime('%Y-%m-%d %H:%M')} on {torch.get_num_threads()} "
                        "threads; bf16 set to the fp32 rate (no bf16 units assumed)")


def _best_rate(fn, work: float, seconds: float) -> float:
    fn()                                                        # warm-up
    best, end = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < end:
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return work / max(best, 1e-9)


def _attn_proj_flops(c: ModelConfig) -> int:
    """Projection FLOPs per token per layer: 2 per weight of the attention matrices (MLA
    in the naive form, ``kv_b_proj`` applied to each new token)."""
    H, D, nh, nkv = c.hidden_size, c.head_dim, c.num_attention_heads, c.num_key_value_heads
    if not c.is_mla:
        return 2 * (2 * H * nh * D + 2 * H * nkv * D)
    dq = c.qk_nope_head_dim + c.qk_rope_head_dim
    q = H * nh * dq if c.q_lora_rank is None else c.q_lora_rank * (H + nh * dq)
    kv = H * (c.kv_lora_rank + c.qk_rope_head_dim) \
        + c.kv_lora_rank * nh * (c.qk_nope_head_dim + c.v_head_dim)
    return 2 * (q + kv + nh * c.v_head_dim * H)


def forward_flops(config: ModelConfig, batch: int, seq_len: int, past_len: int = 0,
                  logits: str = "all", causal: bool = True) -> dict:
    """FLOPs of one forward pass over ``[batch, seq_len]`` new tokens after ``past_len``
    cached ones, by part: ``attention_proj``, ``attention_scores`` (``q.k`` and weights @ V:
    ``2 * nh * L * (d_qk + d_v)`` per query; MLA counts the form that runs, absorbed for a
    decode step, ``d_qk = r + dr, d_v = r``, naive otherwise; ``L`` the keys the query is
    computed against), ``dense_ffn``, ``routed_experts`` (``K`` per token),
    ``shared_experts``, ``router``, ``lm_head`` (``logits="all"`` positions or only the
    ``"last"``), and ``total``.

    ``causal=True`` (default): query ``i`` of the block meets the ``past_len + i + 1`` keys
    it may see, capped at ``sliding_window`` on sliding layers: the work of a causal kernel
    that skips the masked triangle (FlashAttention, Dao et al. 2022; FlashMLA's prefill), about
    half the block's scores for a long prompt. ``causal=False``: every query against all
    ``past_len + seq_len`` keys, what a dense masked kernel computes and what
    ``torch.utils.flop_counter`` reports for ``scaled_dot_product_attention`` or a masked
    matmul (it counts the shapes, not the mask). A decode step (``seq_len == 1``) is the same
    either way.

    Raises:
        ValueError: counts out of range, ``logits`` not ``"all"``/``"last"``, a config with
            ``unsupported_fields``.
        TypeError: ``causal`` not a bool.
    """
    c = config
    _check_countable(c)
    _check_count("batch", batch, 1)
    _check_count("seq_len", seq_len, 1)
    _check_count("past_len", past_len, 0)
    if logits not in ("all", "last"):
        raise ValueError(f"logits must be 'all' or 'last', got {logits!r}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {causal!r}")
    T, H = batch * seq_len, c.hidden_size
    d_qk, d_v = _attention_widths(c, seq_len)
    out = dict.fromkeys(("attention_proj", "attention_scores", "dense_ffn", "routed_experts",
                         "shared_experts", "router", "lm_head"), 0)
    for i in range(c.num_hidden_layers):
        W = c.sliding_window if c.layer_is_sliding(i) else None
        keys = _keys_met(past_len, seq_len, W) if causal else \
            seq_len * (past_len + seq_len if W is None else min(past_len + seq_len, W))
        out["attention_proj"] += T * _attn_proj_flops(c)
        out["attention_scores"] += batch * keys * 2 * c.num_attention_heads * (d_qk + d_v)
        if not c.layer_is_moe(i):
            out["dense_ffn"] += T * 2 * _ffn_matmul_params(c, c.intermediate_size)
            continue
        out["routed_experts"] += T * c.num_experts_per_tok * 2 * _ffn_matmul_params(
            c, c.moe_intermediate_size)
        out["shared_experts"] += T * 2 * _ffn_matmul_params(
            c, c.num_shared_experts * c.moe_intermediate_size)
        out["router"] += T * 2 * c.num_experts * H
    out["lm_head"] = 2 * H * c.vocab_size * (T if logits == "all" else batch)
    out["total"] = sum(out.values())
    return out


def _keys_met(past_len: int, seq_len: int, window: int | None) -> int:
    """(query, key) pairs a causal kernel computes for ``seq_len`` queries after ``past_len``
    cached keys: ``sum over i of min(past_len + i + 1, window)`` (no cap when ``window`` is
    ``None``), in closed form."""
    lo, hi = past_len + 1, past_len + seq_len                 # keys of the first / last query
    if window is None or hi <= window:
        return (lo + hi) * seq_len // 2
    if lo >= window:
        return window * seq_len
    under = window - lo                                       # queries below the cap
    return (lo + window - 1) * under // 2 + window * (seq_len - under)


def _attention_widths(c: ModelConfig, seq_len: int) -> tuple[int, int]:
    """(key width, value width) of the attention core as it runs. GQA / MHA: ``head_dim``
    both. MLA: the naive form ``(dn + dr, dv)`` for a prefill or chunk, the absorbed form
    ``(r + dr, r)`` for a decode step (``seq_len == 1``), as :class:`tokenflow.mla.MLAttention`
    and DeepSeek's FlashMLA run it (MQA mode: one 576-wide key and 512-wide value shared by
    all heads, for DeepSeek-V3's ``r = 512, dr = 64``). The absorbed form's two small
    matmuls per token (``W_UK`` into the query, ``W_UV`` on the output) cost what the naive
    form's ``kv_b_proj`` of the new token costs, so the projections need no switch."""
    if not c.is_mla:
        return c.head_dim, c.head_dim
    if seq_len == 1:
        return c.kv_lora_rank + c.qk_rope_head_dim, c.kv_lora_rank
    return c.qk_nope_head_dim + c.qk_rope_head_dim, c.v_head_dim


def _ffn_matmul_params(c: ModelConfig, I: int) -> int:
    return (3 if c.gated_mlp else 2) * c.hidden_size * I


def flops_per_token(config: ModelConfig, context_len: int, phase: str = "decode") -> float:
    """FLOPs per token: ``"decode"``, one new token reading ``context_len - 1`` cached ones
    (LM head once); ``"prefill"``, a ``context_len`` prompt, total / ``context_len`` (LM head
    on the last position only, as a server computes it).

    Raises:
        ValueError: ``phase`` not ``"decode"``/``"prefill"``, ``context_len < 1``.
    """
    per_seq = 1 if phase == "decode" else context_len
    return _sequence_flops(config, context_len, phase)["total"] / per_seq


def _sequence_flops(config: ModelConfig, context_len: int, phase: str) -> dict:
    """:func:`forward_flops` of one sequence's step: a decode step after ``context_len - 1``
    cached tokens, or a ``context_len`` prefill with the LM head on its last position."""
    _check_count("context_len", context_len, 1)
    if phase == "decode":
        return forward_flops(config, 1, 1, context_len - 1)
    if phase == "prefill":
        return forward_flops(config, 1, context_len, 0, "last")
    raise ValueError(f"phase must be 'decode' or 'prefill', got {phase!r}")


def arithmetic_intensity(config: ModelConfig, new_tokens: int, cached_tokens: int = 0,
                         batch_size: int = 1, bytes_per_element: float = 2,
                         causal: bool = True) -> float:
    """FLOPs per byte of one forward pass on one device: ``batch_size`` sequences each feeding
    ``new_tokens`` tokens after ``cached_tokens`` cached ones (prefill: ``new_tokens = S,
    cached_tokens = 0``; a decode step: ``new_tokens = 1``). Numerator
    :func:`forward_flops` ``(config, batch_size, new_tokens, cached_tokens, causal=causal)
    ["total"]`` (LM head at every new position; causal attention work unless
    ``causal=False``); denominator
    :func:`~tokenflow.analysis.costmodel.forward_bytes` (weights read once, KV read and written, at
    ``bytes_per_element``). Compare with :func:`ridge_point`.

    Raises:
        ValueError: the errors of the two functions (counts out of range,
            ``bytes_per_element <= 0``).
    """
    flops = forward_flops(config, batch_size, new_tokens, cached_tokens,
                          causal=causal)["total"]
    return flops / forward_bytes(config, new_tokens, cached_tokens, batch_size,
                                 bytes_per_element)


def roofline(config: ModelConfig, hw: HardwareSpec, phase: str, batch: int, context_len: int,
             tp_size: int = 1, ep_size: int = 1, dtype: str = "bf16",
             bytes_per_param: float = 2, kv_bytes_per_element: float = 2,
             max_nodes_per_token: int | None = None,
             dispatch_bytes_per_element: float | None = None,
             combine_bytes_per_element: float = 2,
             attention_dtype: str | None = None, a2a_path: str | None = None) -> dict:
    """Roofline time of one step on one device, and its tokens/s.

    ``batch`` sequences run on this device's tensor-parallel group (each of the
    ``ep_size / tp_size`` groups of the expert-parallel group runs its own). ``"decode"``:
    each sequence adds one token after ``context_len - 1``; ``"prefill"``: each processes a
    ``context_len`` prompt.

    * compute: the step's :func:`forward_flops` (``batch`` times one sequence's, over
      ``tp_size``) at the peak of the dtype each part runs in: the attention core
      (``attention_scores``: ``q.k`` and weights @ V over the context) at
      ``peak_flops[attention_dtype]``, everything else (projections, FFN and experts, router,
      LM head) at ``peak_flops[dtype]``; ``attention_dtype=None`` charges all at ``dtype``.
      DeepSeek's V3/R1 service runs "matrix multiplications [...] in FP8" and "core MLA
      computations [...] in BF16" (DeepSeek-V3/R1 Inference System Overview, open-infra-index,
      day 6, 2025), and FlashMLA's dense MLA decoding kernel takes a BF16 KV cache (FlashMLA
      README, support matrix), so its roofline is ``dtype="fp8", attention_dtype="bf16"``.
    * memory: :func:`~tokenflow.analysis.costmodel.forward_bytes` of the step on this device (its
      share of the weights, only the experts the step's tokens touch, the embedding rows
      looked up; the KV cache of the batch: decode reads ``context_len - 1`` slots per
      sequence and writes one, prefill writes ``context_len``), over ``memory_bandwidth``.
      Weights at ``bytes_per_param``, cache at ``kv_bytes_per_element``.
    * communication: EP dispatch + combine (:func:`~tokenflow.analysis.costmodel.
      moe_comm_bytes_per_token` with ``hw.gpus_per_node`` and ``max_nodes_per_token``) per
      token and MoE layer over the scale-out and scale-up links along ``a2a_path``
      (``None``: as DeepSeek-V3 deploys it, V3 report sections 3.4.1-3.4.2, ``"direct"``
      point-to-point over InfiniBand for decode, ``"hierarchical"`` InfiniBand-then-NVLink
      for prefill), dispatch at
      ``dispatch_bytes_per_element`` (``None``: ``bytes_per_param``) and combine at
      ``combine_bytes_per_element`` (default 2: DeepSeek's day-6 note dispatches in FP8 and
      combines in BF16); TP: two ring all-reduces of ``[T, H]`` per layer (``2 (tp-1)/tp``
      of the bytes each, at ``bytes_per_param``) over scale-up. The two links run at the
      same time (V3 report section 3.2.2): ``comm_s = max(up / scale_up_bandwidth,
      out / scale_out_bandwidth)``.

    Returns:
        dict: ``flops``, ``attention_flops`` (the part charged at ``attention_dtype``),
        ``memory_bytes``, ``scale_up_bytes``, ``scale_out_bytes``, ``compute_s``,
        ``memory_s``, ``comm_s`` (the longer link), ``scale_up_s``,
        ``scale_out_s``, ``step_s`` (max of compute, memory, comm),
        ``serial_s`` (their sum), ``bound`` (which one is the max), ``tokens_per_s`` (new
        tokens per second on this device).

    Raises:
        ValueError: a bad ``phase``, ``dtype`` or ``attention_dtype`` not in
            ``hw.peak_flops``, bad sizes.
    """
    c = config
    if dtype not in hw.peak_flops:
        raise ValueError(f"dtype must be one of {sorted(hw.peak_flops)}, got {dtype!r}")
    attention_dtype = dtype if attention_dtype is None else attention_dtype
    if attention_dtype not in hw.peak_flops:
        raise ValueError(f"attention_dtype must be one of {sorted(hw.peak_flops)} or None, "
                         f"got {attention_dtype!r}")
    _check_count("batch", batch, 1)
    if a2a_path not in (None, *A2A_PATHS):
        raise ValueError(f"a2a_path must be None or one of {A2A_PATHS}, got {a2a_path!r}")
    per_seq = 1 if phase == "decode" else context_len
    T = batch * per_seq                                         # new tokens on this device
    f = _sequence_flops(c, context_len, phase)
    flops = batch * f["total"] / tp_size
    attn = batch * f["attention_scores"] / tp_size
    mem = forward_bytes(c, per_seq, context_len - per_seq, batch, bytes_per_param,
                        kv_bytes_per_element=kv_bytes_per_element, tp_size=tp_size,
                        ep_size=ep_size)
    bd = bytes_per_param if dispatch_bytes_per_element is None else dispatch_bytes_per_element
    path = a2a_path or ("direct" if phase == "decode" else "hierarchical")
    up, out = _comm_bytes(c, hw, T, tp_size, ep_size, bytes_per_param, bd,
                          combine_bytes_per_element, max_nodes_per_token, path)
    links = {"scale_up_s": _seconds(up, hw.scale_up_bandwidth),
             "scale_out_s": _seconds(out, hw.scale_out_bandwidth)}
    compute = (flops - attn) / hw.peak_flops[dtype] + attn / hw.peak_flops[attention_dtype]
    times = {"compute_s": compute, "memory_s": mem / hw.memory_bandwidth,
             "comm_s": max(links.values())}
    step = max(times.values())
    return dict(flops=flops, attention_flops=attn, memory_bytes=mem, scale_up_bytes=up,
                scale_out_bytes=out,
                **times, **links, step_s=step, serial_s=sum(times.values()),
                bound=max(times, key=times.get)[:-2], tokens_per_s=T / step)


def _comm_bytes(c: ModelConfig, hw: HardwareSpec, T: int, tp: int, ep: int, b: float,
                bd: float, bc: float, max_nodes, path: str) -> tuple[float, float]:
    """(scale-up, scale-out) bytes one device sends in a step of ``T`` tokens."""
    up = 2 * c.num_hidden_layers * 2 * (tp - 1) / tp * T * c.hidden_size * b
    out = 0.0
    if c.num_experts and ep > 1:
        m = moe_comm_bytes_per_token(c, ep, bd, bc, gpus_per_node=hw.gpus_per_node,
                                     max_nodes_per_token=max_nodes, path=path)
        up += m["scale_up"] * T * num_moe_layers(c)
        out = m["scale_out"] * T * num_moe_layers(c)
    return up, out


def _seconds(nbytes: float, bandwidth: float) -> float:
    if nbytes == 0:
        return 0.0
    if bandwidth <= 0:
        raise ValueError("the step needs a link this hardware spec does not have "
                         "(bandwidth 0): use tp_size = ep_size = 1")
    return nbytes / bandwidth


# ---- a published deployment to hold the roofline against (chapter 07)
__all__ += ["DEEPSEEK_V3_SERVICE", "implied_nodes"]

DEEPSEEK_V3_SERVICE = dict(
    prefill_tok_s_per_node=73.7e3, decode_tok_s_per_node=14.8e3, gpus_per_node=8,
    input_tokens=608e9, cache_hit_tokens=342e9, cache_hit_rate=0.563, output_tokens=168e9,
    seconds=24 * 3600, average_nodes=226.75, peak_nodes=278,
    output_tok_s_per_request=(20, 22), kv_len_per_output_token=4_989,
    source="DeepSeek, 'DeepSeek-V3/R1 Inference System Overview', open-infra-index, day 6 of "
           "Open Source Week (2025): 24 hours of the online service (Feb 27-28, 2025). Per "
           "H800 node ~73.7k input tokens/s in prefill (including on-disk cache hits) or "
           "~14.8k output tokens/s in decode; 608B input tokens of which 342B (56.3%) hit the "
           "on-disk KV cache; 168B output tokens; 'The average output speed was 20-22 tokens "
           "per second' (no latency target is given); average "
           "KV length per output token 4,989; peak 278 nodes, average 226.75 nodes.")
"""The figures DeepSeek published for its V3/R1 service (``source`` says where from)."""


def implied_nodes(service: dict = DEEPSEEK_V3_SERVICE) -> dict:
    """Nodes the published totals imply, as a check that the per-node rates are per node and
    per phase: ``input_tokens / (prefill_tok_s_per_node * seconds)`` prefill nodes plus
    ``output_tokens / (decode_tok_s_per_node * seconds)`` decode nodes, against the reported
    average occupancy (DeepSeek-V3: 95.5 + 131.4 = 226.9 against 226.75).

    Returns:
        ``{"prefill", "decode", "total", "reported"}`` (nodes, floats).

    Raises:
        ValueError: a rate or duration <= 0, or a missing key.
    """
    need = ("input_tokens", "output_tokens", "prefill_tok_s_per_node",
            "decode_tok_s_per_node", "seconds", "average_nodes")
    missing = [k for k in need if k not in service]
    if missing:
        raise ValueError(f"service is missing {missing}")
    for k in need[2:5]:
        if service[k] <= 0:
            raise ValueError(f"service[{k!r}] must be > 0, got {service[k]!r}")
    pre = service["input_tokens"] / (service["prefill_tok_s_per_node"] * service["seconds"])
    dec = service["output_tokens"] / (service["decode_tok_s_per_node"] * service["seconds"])
    return {"prefill": pre, "decode": dec, "total": pre + dec,
            "reported": service["average_nodes"]}
