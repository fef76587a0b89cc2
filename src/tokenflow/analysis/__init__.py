"""What measures or explains the model without drawing it: ``costmodel`` (one namespace for
``params``, ``memory`` (KV bytes, weights per device), ``forward`` (FLOPs and bytes of one
pass) and ``moe_comm`` (all-to-all bytes)), ``roofline`` (time for a ``Deployment``),
``attention_kinds`` (KV per token across MHA / GQA / MQA / MLA / sliding / linear attention),
``lenses`` (the simulator's serving-pipeline and model-block views), ``logit_lens`` and
``trace`` (the arrow actions of one pass, as data)."""
