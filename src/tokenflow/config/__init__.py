"""The model's configuration: what a model is, before any tensor exists.

``model_config``  :class:`ModelConfig` (Hugging Face field names), one ``validate()`` for every
                  field, and the presets (:func:`preset`)
``hf_config``     :func:`parse_hf_config`: an HF ``config.json`` into ModelConfig fields
``choices``       the values each choice field may take

Imports nothing from tokenflow but :mod:`tokenflow.validate`; :mod:`tokenflow.model` builds on
it (``tests/test_layering.py``). The old paths ``tokenflow.model.config`` and
``tokenflow.config.hf_config`` name these same modules.
"""
from .choices import HIDDEN_ACTS, ROPE_TYPES, SCORING_FUNCS, TOPK_METHODS
from .hf_config import FAMILIES, parse_hf_config
from .model_config import PRESETS, ModelConfig, preset

__all__ = ["ModelConfig", "PRESETS", "preset", "parse_hf_config", "FAMILIES", "HIDDEN_ACTS",
           "ROPE_TYPES", "SCORING_FUNCS", "TOPK_METHODS"]


OLD_PATHS = {"tokenflow.model.config": "tokenflow.config.model_config",
             "tokenflow.model.hf_config": "tokenflow.config.hf_config"}
"""Where these modules lived before; each old name is the same module object."""


def _keep_old_paths() -> None:
    """Make each old module path of :data:`OLD_PATHS` import the module it names now (called
    by the package root once :mod:`tokenflow.model` is imported; the model never imports
    this back)."""
    import importlib
    import sys
    for old, new in OLD_PATHS.items():
        parent, _, name = old.rpartition(".")
        module = importlib.import_module(new)
        sys.modules[old] = module
        setattr(sys.modules[parent], name, module)
