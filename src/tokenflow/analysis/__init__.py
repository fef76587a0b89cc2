"""What measures or explains the model without drawing it: ``costmodel`` (parameters, KV
bytes, memory), ``roofline`` (FLOPs, bytes, hardware), ``attention_kinds`` (KV per token across
MHA / GQA / MQA / MLA / sliding / linear attention), ``lenses`` (the simulator's serving-pipeline
and model-block views), ``logit_lens`` and ``trace`` (the arrow actions of one pass, as data)."""
