"""tokenflow: follow one token through a real (tiny) LLM at inference time.

Public API (stable names the chapters and tests use)::

    ModelConfig, preset, load_pretrained, TokenFlowModel, KVCache, PagedKVCache, Trace,
    prefill, decode_step, generate, filter_logits, sample, Tokenizer
"""
from .model.config import ModelConfig, PRESETS, preset
from .model.kv_cache import KVCache
from .serving.paged_kv_cache import PagedKVCache
from .analysis.trace import Trace, TraceEvent, COLORS
from .model.transformer import TokenFlowModel
from .inference.sampling import filter_logits, sample
from .inference.generate import prefill, decode_step, generate
from .tokenizer import Tokenizer
from .interop.checkpoint import load_pretrained, load_model, save_model

__all__ = ["ModelConfig", "PRESETS", "preset", "KVCache", "PagedKVCache", "Trace", "TraceEvent",
           "COLORS", "TokenFlowModel", "filter_logits", "sample", "prefill", "decode_step", "generate",
           "Tokenizer", "load_pretrained", "load_model", "save_model"]
__version__ = "0.1.0"
