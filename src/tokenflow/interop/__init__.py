"""The book's model outside the book: Hugging Face configs and models both ways, HF checkpoint
folders, and the package's own safetensors checkpoints.

``hf_architectures``  which HF class matches a config; :func:`to_hf_config` /
                :func:`from_hf_config`
``hf_models``   state dicts, whole models and MoE blocks mapped to and from transformers
                (Llama, Mixtral, Qwen2-MoE, DeepSeek-V3)
``hf_export``   :func:`save_hf_checkpoint`: a folder ``AutoModelForCausalLM`` loads
``checkpoint``  :func:`load_pretrained` / :func:`load_model` / :func:`save_model` (safetensors)

Parsing an HF ``config.json`` into a :class:`~tokenflow.config.ModelConfig` lives with the
config itself (``tokenflow.config.hf_config``), since ``ModelConfig.from_hf_config`` is part of
the config's public API and neither the config nor the model imports anything from here.
"""
from .checkpoint import DEFAULT_WEIGHTS, load_model, load_pretrained, save_model
from .hf_export import save_hf_checkpoint
from .hf_architectures import HF_CLASSES, from_hf_config, hf_architecture, to_hf_config
from .hf_models import (from_hf_model, hf_position_ids, moe_from_hf, moe_to_hf,
                        state_dict_from_hf, state_dict_to_hf, to_hf_model)

__all__ = ["DEFAULT_WEIGHTS", "load_model", "load_pretrained", "save_model", "save_hf_checkpoint",
           "HF_CLASSES", "from_hf_config", "from_hf_model", "hf_architecture", "hf_position_ids",
           "moe_from_hf", "moe_to_hf", "state_dict_from_hf", "state_dict_to_hf", "to_hf_config",
           "to_hf_model"]
