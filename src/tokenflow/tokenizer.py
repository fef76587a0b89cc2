"""The book's BPE tokenizer, trained with Hugging Face ``tokenizers`` on the bundled corpus.

Text -> token ids is the step before the seed's first arrow. Byte-pair encoding (Sennrich et
al. 2016, arXiv:1508.07909) starts from characters and merges the most frequent adjacent
pairs. Real tokenizers first cut text into "words" (at spaces and punctuation) and merge only
inside a word. Chinese has no spaces, so our pre-tokenizer also cuts around a short list of
function characters (是 的 在 首 都 府 ...), a stand-in for word segmentation. That keeps
the seed's split 北京 / 是 / 中国 / 的 and leaves 首 and 都 as separate tokens, so the running
example's last step (首 -> 都, with 府 as runner-up) is a real choice of the model. A
production vocabulary (e.g. DeepSeek-V3's 129,280 entries) is learned from far more text.

Special tokens: ``<pad>`` (0), ``<bos>`` (1), ``<eos>`` (2), ``<unk>`` (3).
"""
from __future__ import annotations

from importlib import resources
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer as HFTokenizer, decoders, models, pre_tokenizers, trainers

__all__ = ["Tokenizer", "train_tokenizer", "FUNCTION_CHARS", "SPECIAL_TOKENS"]

SPECIAL_TOKENS = ["<pad>", "<bos>", "<eos>", "<unk>"]
FUNCTION_CHARS = "是的在首都府省会也一座大城市"
"""Characters the pre-tokenizer isolates before BPE merges (our word segmentation)."""


def _pre_tokenizer():
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(f"[{FUNCTION_CHARS}]"), behavior="isolated"),
        pre_tokenizers.Punctuation(behavior="isolated"),
        pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never"),
    ])


def train_tokenizer(lines: list[str], vocab_size: int = 512) -> "Tokenizer":
    """Train a BPE tokenizer on ``lines`` (deterministic for the same input).

    Args:
        lines: training sentences.
        vocab_size: upper bound on the vocabulary (the trainer stops earlier when no pair
            occurs twice).

    Raises:
        ValueError: if ``lines`` is empty or ``vocab_size`` is smaller than the specials.
    """
    if not lines:
        raise ValueError("lines must be a non-empty list of sentences")
    if vocab_size <= len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must be > {len(SPECIAL_TOKENS)}, got {vocab_size}")
    tok = HFTokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = _pre_tokenizer()
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="never")
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2,
                                  special_tokens=SPECIAL_TOKENS, show_progress=False)
    tok.train_from_iterator(lines, trainer=trainer)
    return Tokenizer(tok)


class Tokenizer:
    """Thin wrapper over a ``tokenizers.Tokenizer`` with the calls the book uses.

    Attributes:
        vocab_size: V (including special tokens).
        pad_token_id, bos_token_id, eos_token_id, unk_token_id: special ids.
    """

    def __init__(self, tok: HFTokenizer):
        self.tok = tok
        self.vocab_size = tok.get_vocab_size()
        self.pad_token_id, self.bos_token_id, self.eos_token_id, self.unk_token_id = (
            tok.token_to_id(t) for t in SPECIAL_TOKENS)

    @classmethod
    def from_file(cls, path: str | Path | None = None) -> "Tokenizer":
        """Load ``tokenizer.json`` (default: the one shipped in ``tokenflow/data``)."""
        if path is None:
            path = resources.files("tokenflow") / "data" / "tokenizer.json"
        return cls(HFTokenizer.from_file(str(path)))

    def save(self, path: str | Path) -> None:
        """Write ``tokenizer.json``."""
        self.tok.save(str(path))

    def encode(self, text: str) -> list[int]:
        """``text -> [S]`` token ids (no special tokens added).

        Raises:
            TypeError: if ``text`` is not a str.
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return self.tok.encode(text, add_special_tokens=False).ids

    def tokens(self, text: str) -> list[str]:
        """The token strings of ``text`` (``▁`` marks a preceding space)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return self.tok.encode(text, add_special_tokens=False).tokens

    def decode(self, ids) -> str:
        """Token ids (list or 1-D tensor) -> text; special tokens are dropped.

        Raises:
            TypeError: if ``ids`` is not a list of ints or a 1-D integer tensor.
            ValueError: if an id is outside ``[0, vocab_size)``.
        """
        if isinstance(ids, torch.Tensor):
            if ids.dim() > 1 or ids.is_floating_point():
                raise TypeError(f"ids must be a 1-D integer tensor or a list of ints, got a "
                                f"{ids.dim()}-D {ids.dtype} tensor (decode rows one at a time)")
            ids = ids.tolist()
        ids = list(ids)
        if any(isinstance(i, bool) or not isinstance(i, int) for i in ids):
            raise TypeError("ids must be a list of ints")
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"token ids must be in [0, vocab_size={self.vocab_size}), "
                             f"got {bad[0]}")
        return self.tok.decode(ids, skip_special_tokens=True)

    def id_to_token(self, i: int) -> str:
        """The string of one token id.

        Raises:
            ValueError: if ``i`` is outside ``[0, vocab_size)``.
        """
        if not 0 <= int(i) < self.vocab_size:
            raise ValueError(f"token id must be in [0, vocab_size={self.vocab_size}), got {i}")
        return self.tok.id_to_token(int(i))

    def token_to_id(self, token: str) -> int:
        """The id of a token string.

        Raises:
            KeyError: if the string is not in the vocabulary.
        """
        i = self.tok.token_to_id(token)
        if i is None:
            raise KeyError(f"{token!r} is not in the vocabulary")
        return i

    def batch_encode(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Encode several texts, left-padded to the longest.

        Returns:
            ``(input_ids [B,S] int64, attention_mask [B,S] int64)``; mask 0 marks padding.

        Raises:
            TypeError: if ``texts`` is a str or holds a non-str.
            ValueError: if ``texts`` is empty or a text encodes to no tokens.
        """
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise TypeError("texts must be a list of str (for one text, use encode or [text])")
        if not texts:
            raise ValueError("texts must be a non-empty list of str")
        seqs = [self.encode(t) for t in texts]
        if any(len(s) == 0 for s in seqs):
            raise ValueError("every text must encode to at least one token")
        S = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), S), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), S), dtype=torch.long)
        for b, s in enumerate(seqs):
            ids[b, S - len(s):] = torch.tensor(s)
            mask[b, S - len(s):] = 1
        return ids, mask

    def __repr__(self) -> str:
        return f"Tokenizer(BPE, vocab_size={self.vocab_size})"
