"""The forward path (ARCHITECTURE.md, section 1): norm, rope, attention, mla, ffn, moe, fused,
linear, kv_cache, transformer. What the chapters open up is :mod:`tokenflow.explain`; this
package imports only :mod:`tokenflow.config` and :mod:`tokenflow.validate`.
"""
