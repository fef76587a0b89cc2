"""tokenflow: follow one token through a real (tiny) LLM at inference time.

Public API (stable names the chapters and tests use)::

    ModelConfig, preset, load_pretrained, TokenFlowModel, KVCache, PagedKVCache, Trace,
    prefill, decode_step, generate, filter_logits, sample, Tokenizer
"""

def _torch_problem():
    """None when torch imports and looks like torch; else the exception (a missing or broken
    install), so that ``python -m tokenflow.check`` can still run and say what to fix."""
    try:
        import torch
        torch.float32, torch.Tensor, torch.nn.Module        # an empty or shadowing module fails
    except Exception as exc:                                 # noqa: BLE001 (reported below)
        return exc
    return None


_TORCH_PROBLEM = _torch_problem()

if _TORCH_PROBLEM is None:
    from .config import ModelConfig, PRESETS, preset
    from .model.kv_cache import KVCache
    from .serving.paged_kv_cache import PagedKVCache
    from .explain.trace import Trace, TraceEvent, COLORS
    from .model.transformer import TokenFlowModel
    from .inference.sampling import filter_logits, sample
    from .inference.generate import prefill, decode_step, generate
    from .tokenizer import Tokenizer
    from .interop.checkpoint import load_pretrained, load_model, save_model
    from . import explain
    explain.keep_old_paths()        # e.g. tokenflow.model.moe.load_stats, where chapters look
    from .config import _keep_old_paths
    _keep_old_paths()               # tokenflow.model.config, tokenflow.model.hf_config
else:
    def __getattr__(name):
        """Every public name needs torch: say so, naming the cause and the fix."""
        raise ImportError(
            f"tokenflow.{name} needs a working torch, and importing torch failed "
            f"({type(_TORCH_PROBLEM).__name__}: {_TORCH_PROBLEM}). Install the requirements "
            f"(pip install -r requirements.txt) and run python -m tokenflow.check"
        ) from _TORCH_PROBLEM

__all__ = ["ModelConfig", "PRESETS", "preset", "KVCache", "PagedKVCache", "Trace", "TraceEvent",
           "COLORS", "TokenFlowModel", "filter_logits", "sample", "prefill", "decode_step",
           "generate", "Tokenizer", "load_pretrained", "load_model", "save_model"]
__version__ = "0.1.0"
