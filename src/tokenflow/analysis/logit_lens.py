"""The logit lens lives in :mod:`tokenflow.explain.logit_lens`; these names stay importable
from here."""
from tokenflow.explain.logit_lens import answer_depth, logit_lens, token_rank

__all__ = ["logit_lens", "token_rank", "answer_depth"]
