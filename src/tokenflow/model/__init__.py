"""What a token passes through: the model itself.

``norm``, ``rope``   RMSNorm; rotary position embedding (default / linear / llama3 / yarn)
``attention``    grouped-query attention reading and writing the KV cache
``mla``          multi-head latent attention (DeepSeek-V2/V3): latent cache, absorbed decode
``ffn``, ``moe``     dense SwiGLU FFN; router (top-k), routed + shared experts, dispatch / combine
``fused``        packed q/k/v and gate/up weights
``kv_cache``     the one cache interface (CacheStep / CacheStorage) and contiguous storage
``transformer``  embedding -> decoder blocks -> final norm -> LM head (:class:`TokenFlowModel`)

Only the forward path: what the chapters open up (the trace, attention step by step, the reference
MoE loop, load statistics, the logit lens) is :mod:`tokenflow.explain`, which imports this package.
The :class:`~tokenflow.config.ModelConfig` it is built from lives in :mod:`tokenflow.config`.
This layer imports nothing else from tokenflow but :mod:`tokenflow.config` and
:mod:`tokenflow.validate` (checked by ``tests/test_layering.py``).
"""
