"""Time for real configs: a roofline estimate from a hardware spec and a deployment.

FLOPs and bytes of one pass: :mod:`tokenflow.analysis.forward` (:func:`forward_flops`,
:func:`arithmetic_intensity` and :func:`flops_per_token` are re-exported here).

Time (:func:`roofline`): the deployment (:class:`Deployment`: hardware, dtypes, parallel sizes,
all-to-all path) is one frozen value, checked once; one step on one device takes ``max(compute,
memory, communication)`` (perfect overlap; ``serial_s`` adds them instead), each at the peak of
:class:`HardwareSpec`; compute charges the attention core at its own dtype's peak and every
other matrix multiply at the weights' (DeepSeek's service: matrix multiplications in FP8, core
MLA in BF16, day-6 note of its open-infra-index; FlashMLA's dense decoding kernel is BF16,
FlashMLA README); communication over NVLink and InfiniBand overlaps too (DeepSeek-V3 report,
arXiv:2412.19437, section 3.2.2: the IB and NVLink transfers of the all-to-all are fully
overlapped), so it takes the longer of the two. The all-to-all takes the path DeepSeek-V3
deploys for each phase (section 3.4): decode sends every pair point to point over IB, prefill
goes IB-then-NVLink. Attention FLOPs are the causal work (the masked triangle skipped). A
bound, not a prediction: real kernels reach a fraction of peak.
"""
from __future__ import annotations

import dataclasses
import os
import time

from tokenflow import validate
from tokenflow.config import ModelConfig

from .forward import _sequence_flops, arithmetic_intensity, flops_per_token, forward_bytes
from .forward import forward_flops  # noqa: F401  (re-exported)
from .moe_comm import A2A_PATHS, moe_comm_bytes_per_token, num_moe_layers
from .params import _check_count

__all__ = ["HardwareSpec", "HARDWARE", "hardware", "ridge_point", "probe_cpu", "forward_flops",
           "flops_per_token", "arithmetic_intensity", "Deployment", "roofline"]


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
        "(50 GB/s) per GPU. The figures as NVIDIA's datasheets state them, taken here from a "
        "secondary summary (glennklockwood.com/garden/processors/h100), not re-checked "
        "against the datasheet PDFs."),
    "H200": HardwareSpec(
        "H200 SXM", _HOPPER_FLOPS, 141e9, 4.8e12, 450e9, 50e9, 8,
        _HOPPER_SRC + "(same GH100 compute per the NVIDIA H200 datasheet); HBM3e 141 GB at "
        "4.8 TB/s; NVLink 900 GB/s both directions; scale-out as H100 (400 Gb/s per GPU). "
        "Taken from secondary pages that quote the datasheet; not checked against the "
        "datasheet itself."),
    "H800": HardwareSpec(
        "H800 SXM", _HOPPER_FLOPS, 80e9, 3.35e12, 160e9, 50e9, 8,
        "Compute and HBM assumed equal to the H100 SXM's (the H800 is its export variant "
        "with reduced NVLink; this book cites no NVIDIA datasheet for the H800). Links: "
        "DeepSeek-V3 report "
        "arXiv:2412.19437 section 3.2.2, on DeepSeek's H800 cluster: 'NVLink offers a "
        "bandwidth of 160 GB/s, roughly 3.2 times that of IB (50 GB/s)' (quoted from the "
        "report's arXiv v2)."),
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


@dataclasses.dataclass(frozen=True)
class Deployment:
    """How a model is served, the knobs of :func:`roofline` in one value, checked once here.

    Fields:
        hw: the device and its links (:class:`HardwareSpec`, e.g. ``hardware("H800")``).
        tp_size, ep_size: tensor- and expert-parallel group sizes (ints >= 1).
        dtype: the dtype the matrix multiplications run in, a key of ``hw.peak_flops``.
        attention_dtype: the attention core's dtype (``None``: ``dtype``). DeepSeek's V3/R1
            service runs "matrix multiplications [...] in FP8" and "core MLA computations
            [...] in BF16" (DeepSeek-V3/R1 Inference System Overview, open-infra-index, day 6,
            2025), and FlashMLA's dense decoding kernel takes a BF16 KV cache (FlashMLA README,
            support matrix), so its deployment is ``dtype="fp8", attention_dtype="bf16"``.
        bytes_per_param: bytes per weight; kv_bytes_per_element: bytes per cache element.
        dispatch_bytes_per_element (``None``: ``bytes_per_param``),
            combine_bytes_per_element: element sizes of the MoE all-to-all's two directions
            (DeepSeek's day-6 note: dispatch FP8, combine BF16).
        max_nodes_per_token: node-limited routing (``None``: the config's own group limit).
        a2a_path: ``"direct"`` or ``"hierarchical"`` (:data:`~tokenflow.analysis.moe_comm.
            A2A_PATHS`); ``None``: as DeepSeek-V3 deploys it, direct for decode and
            hierarchical for prefill (V3 report, arXiv:2412.19437, sections 3.4.1-3.4.2).

    What depends on the model (a ``tp_size`` that splits the heads, an ``ep_size`` that
    splits the experts) is checked by :func:`roofline` against the config.

    Raises:
        ArgTypeError: ``hw`` not a :class:`HardwareSpec`, a size or element size of the wrong
            type.
        ValueError: a size < 1, an element size <= 0, a dtype not in ``hw.peak_flops``, an
            unknown ``a2a_path``.
    """

    hw: HardwareSpec
    tp_size: int = 1
    ep_size: int = 1
    dtype: str = "bf16"
    attention_dtype: str | None = None
    bytes_per_param: float = 2
    kv_bytes_per_element: float = 2
    dispatch_bytes_per_element: float | None = None
    combine_bytes_per_element: float = 2
    max_nodes_per_token: int | None = None
    a2a_path: str | None = None

    def __post_init__(self):
        if not isinstance(self.hw, HardwareSpec):
            raise validate.ArgTypeError(f"hw must be a HardwareSpec (e.g. hardware('H800')), "
                                        f"got {type(self.hw).__name__} {self.hw!r}")
        validate.integer("tp_size", self.tp_size, 1)
        validate.integer("ep_size", self.ep_size, 1)
        validate.integer("max_nodes_per_token", self.max_nodes_per_token, 1, none=True)
        validate.choice("dtype", self.dtype, self.hw.peak_flops)
        if self.attention_dtype is not None:
            validate.choice("attention_dtype", self.attention_dtype, self.hw.peak_flops)
        for name in ("bytes_per_param", "kv_bytes_per_element", "combine_bytes_per_element"):
            validate.number(name, getattr(self, name), 0, lo_open=True)
        validate.number("dispatch_bytes_per_element", self.dispatch_bytes_per_element, 0,
                        lo_open=True, none=True)
        if self.a2a_path is not None:
            validate.choice("a2a_path", self.a2a_path, A2A_PATHS)

    def a2a_path_for(self, phase: str) -> str:
        """The all-to-all path of a ``phase``: ``a2a_path``, or direct for decode and
        hierarchical for prefill."""
        return self.a2a_path or ("direct" if phase == "decode" else "hierarchical")


def roofline(config: ModelConfig, deployment: Deployment, *, phase: str, batch: int,
             context_len: int) -> dict:
    """Roofline time of one step on one device of ``deployment``, and its tokens/s.

    ``batch`` sequences run on this device's tensor-parallel group (each of the
    ``ep_size / tp_size`` groups of the expert-parallel group runs its own). ``"decode"``:
    each sequence adds one token after ``context_len - 1``; ``"prefill"``: each processes a
    ``context_len`` prompt.

    * compute: the step's :func:`forward_flops` (``batch`` times one sequence's, over
      ``tp_size``) at the peak of the dtype each part runs in: the attention core
      (``attention_scores``: ``q.k`` and weights @ V over the context) at
      ``peak_flops[attention_dtype]``, everything else (projections, FFN and experts, router,
      LM head) at ``peak_flops[dtype]``.
    * memory: :func:`~tokenflow.analysis.forward.forward_bytes` of the step on this device
      (its share of the weights, only the experts the step's tokens touch, the embedding rows
      looked up; the KV cache of the batch: decode reads ``context_len - 1`` slots per
      sequence and writes one, prefill writes ``context_len``), over ``memory_bandwidth``.
      Weights at ``bytes_per_param``, cache at ``kv_bytes_per_element``.
    * communication: EP dispatch + combine (:func:`~tokenflow.analysis.moe_comm.
      moe_comm_bytes_per_token` with ``hw.gpus_per_node`` and ``max_nodes_per_token``) per
      token and MoE layer over the scale-out and scale-up links along
      :meth:`Deployment.a2a_path_for` the phase; TP: two ring all-reduces of ``[T, H]`` per
      layer (``2 (tp-1)/tp`` of the bytes each, at ``bytes_per_param``) over scale-up. The
      two links run at the same time (V3 report section 3.2.2): ``comm_s = max(up /
      scale_up_bandwidth, out / scale_out_bandwidth)``.

    Returns:
        dict: ``flops``, ``attention_flops`` (the part charged at ``attention_dtype``),
        ``memory_bytes``, ``scale_up_bytes``, ``scale_out_bytes``, ``compute_s``,
        ``memory_s``, ``comm_s`` (the longer link), ``scale_up_s``,
        ``scale_out_s``, ``step_s`` (max of compute, memory, comm),
        ``serial_s`` (their sum), ``bound`` (which one is the max), ``tokens_per_s`` (new
        tokens per second on this device).

    Raises:
        ArgTypeError: ``deployment`` not a :class:`Deployment`.
        ValueError: a bad ``phase``, bad sizes, a ``tp_size`` / ``ep_size`` that does not
            split the config's heads / experts.
    """
    if not isinstance(deployment, Deployment):
        raise validate.ArgTypeError(
            f"deployment must be a Deployment (e.g. Deployment(hardware('H800'), tp_size=1)), "
            f"got {type(deployment).__name__}")
    c, d, hw = config, deployment, deployment.hw
    _check_count("batch", batch, 1)
    tp = d.tp_size
    per_seq = 1 if phase == "decode" else context_len
    T = batch * per_seq                                         # new tokens on this device
    f = _sequence_flops(c, context_len, phase)
    flops = batch * f["total"] / tp
    attn = batch * f["attention_scores"] / tp
    mem = forward_bytes(c, batch=batch, new_tokens=per_seq, cached_tokens=context_len - per_seq,
                        bytes_per_element=d.bytes_per_param,
                        kv_bytes_per_element=d.kv_bytes_per_element, tp_size=tp,
                        ep_size=d.ep_size)
    up, out = _comm_bytes(c, d, T, d.a2a_path_for(phase))
    links = {"scale_up_s": _seconds(up, hw.scale_up_bandwidth),
             "scale_out_s": _seconds(out, hw.scale_out_bandwidth)}
    compute = (flops - attn) / hw.peak_flops[d.dtype] \
        + attn / hw.peak_flops[d.attention_dtype or d.dtype]
    times = {"compute_s": compute, "memory_s": mem / hw.memory_bandwidth,
             "comm_s": max(links.values())}
    step = max(times.values())
    return dict(flops=flops, attention_flops=attn, memory_bytes=mem, scale_up_bytes=up,
                scale_out_bytes=out,
                **times, **links, step_s=step, serial_s=sum(times.values()),
                bound=max(times, key=times.get)[:-2], tokens_per_s=T / step)


def _comm_bytes(c: ModelConfig, d: Deployment, T: int, path: str) -> tuple[float, float]:
    """(scale-up, scale-out) bytes one device of ``d`` sends in a step of ``T`` tokens."""
    tp, ep, b = d.tp_size, d.ep_size, d.bytes_per_param
    up = 2 * c.num_hidden_layers * 2 * (tp - 1) / tp * T * c.hidden_size * b
    out = 0.0
    if c.num_experts and ep > 1:
        bd = b if d.dispatch_bytes_per_element is None else d.dispatch_bytes_per_element
        m = moe_comm_bytes_per_token(c, ep, dispatch_bytes_per_element=bd,
                                     combine_bytes_per_element=d.combine_bytes_per_element,
                                     gpus_per_node=d.hw.gpus_per_node,
                                     max_nodes_per_token=d.max_nodes_per_token, path=path)
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
