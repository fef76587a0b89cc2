"""The book's byte-level BPE tokenizer, trained with Hugging Face ``tokenizers`` on the corpus.

Text -> token ids is the step before the seed's first arrow. Like the tokenizers of GPT-2,
Llama 3, Qwen and DeepSeek, ours is **byte-level**: text is first turned into its UTF-8 bytes,
and the 256 possible byte values are the first entries of the vocabulary. Byte-pair encoding
(Sennrich et al. 2016, arXiv:1508.07909; byte-level variant: Radford et al. 2019, GPT-2)
then merges the most frequent adjacent pairs into longer tokens. So every string can be
encoded and decoded back exactly: a character the corpus never showed (an emoji, a newline,
a rare Chinese character) is spelled with its bytes, at most one token per byte. Fewer when
the corpus taught a merge of part of a character: many Chinese characters share a first
byte pair (中, 东 and 上 begin E4 B8, token 266), so the unseen 专 (E4 B8 93) takes 2 tokens,
while 键 (E9 94 AE), whose bytes no merge covers, takes 3.

Real tokenizers first cut text into "words" (at spaces and punctuation) and merge only inside
a word. Chinese has no spaces, so our pre-tokenizer also cuts around a short list of function
characters (是 的 在 首 都 府 ...), a stand-in for word segmentation. That keeps the seed's split
北京 / 是 / 中国 / 的 and leaves 首 and 都 as separate tokens, so the running example's last step
(首 -> 都, with 府 as runner-up) is a real choice of the model. A production vocabulary (e.g.
DeepSeek-V3's 129,280 entries) is learned from far more text.

Token strings: inside the vocabulary a byte-level token is stored with each byte mapped to a
printable character (GPT-2's ``bytes_to_unicode`` table, e.g. 北 = bytes E5 8C 97 is stored as
``åĮĹ``). The book shows tokens as the text they stand for instead: :meth:`Tokenizer.id_to_token`
and :meth:`Tokenizer.tokens` return the decoded text, or ``<0xE5>``-style byte names (as
the byte-fallback tokens of Llama 1 and 2's SentencePiece vocabulary are named; Llama 3's
byte-level BPE has no such tokens) when a token holds only part of a character.

Special tokens: ``<pad>`` (0), ``<bos>`` (1), ``<eos>`` (2), ``<unk>`` (3, kept for
compatibility; a byte-level tokenizer never needs it). Text is always just text: ``encode``
spells a string such as ``"<eos>"`` as its characters, so user text can never inject a
control token and every valid Unicode string round-trips through ``decode`` (a str holding a
lone surrogate, U+D800 to U+DFFF, e.g. from ``bytes.decode(errors="surrogateescape")``, is
not valid Unicode and has no UTF-8 bytes: every entry point that takes text refuses it with
a ``ValueError`` naming the argument and the position). A special token comes only
from its id (``tok.eos_token_id``) or an explicit opt-in, ``encode(text,
allowed_special=...)``, as tiktoken's ``allowed_special`` and transformers'
``split_special_tokens`` do.
"""
from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from typing import Iterable

import torch
from tokenizers import Regex, Tokenizer as HFTokenizer, decoders, models, pre_tokenizers, trainers

__all__ = ["Tokenizer", "train_tokenizer", "bytes_to_unicode", "FUNCTION_CHARS",
           "SPECIAL_TOKENS"]

SPECIAL_TOKENS = ["<pad>", "<bos>", "<eos>", "<unk>"]
FUNCTION_CHARS = "是的在首都府省会也一座大城市"
"""Characters the pre-tokenizer isolates before BPE merges (our word segmentation)."""


_SURROGATE = re.compile("[\ud800-\udfff]")


def _check_text(text, name: str) -> str:
    """``text`` if it is a str of valid Unicode (UTF-8 can encode it).

    Raises:
        TypeError: not a str (the message names ``name``).
        ValueError: it holds a lone surrogate (U+D800 to U+DFFF); the message names ``name``,
            the position and the code point.
    """
    if not isinstance(text, str):
        raise TypeError(f"{name} must be a str, got {type(text).__name__}")
    bad = _SURROGATE.search(text)
    if bad is not None:
        raise ValueError(f"{name} holds a lone surrogate U+{ord(bad.group()):04X} at position "
                         f"{bad.start()}: not valid Unicode, UTF-8 cannot encode it (decode "
                         f"bytes with errors='replace' instead of 'surrogateescape')")
    return text


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's table from the 256 byte values to printable characters (``{byte: char}``).

    Bytes that are printable Latin-1 characters map to themselves; the others (control
    characters, space, ...) map to characters from U+0100 upwards, so that every token of a
    byte-level vocabulary is a visible string. Same table as ``tokenizers``'
    ``pre_tokenizers.ByteLevel`` (tested), from openai/gpt-2 ``encoder.py``.
    """
    keep = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1))
            + list(range(ord("\xae"), ord("\xff") + 1)))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


_BYTE_TO_CHAR = bytes_to_unicode()
_CHAR_TO_BYTE = {c: b for b, c in _BYTE_TO_CHAR.items()}


def _pre_tokenizer():
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(f"[{FUNCTION_CHARS}]"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])


def train_tokenizer(lines: list[str], vocab_size: int = 1024) -> "Tokenizer":
    """Train a byte-level BPE tokenizer on ``lines`` (deterministic for the same input).

    The vocabulary starts with the 4 special tokens and all 256 byte values, then adds one
    merged token per BPE merge.

    Args:
        lines: training sentences.
        vocab_size: upper bound on the vocabulary (the trainer stops earlier when no pair
            occurs twice); at least ``4 + 256``.

    Raises:
        TypeError: ``lines`` is a str or holds a non-str (naming ``lines[i]``).
        ValueError: if ``lines`` is empty, a line holds a lone surrogate (naming ``lines[i]``
            and the position), or ``vocab_size`` is smaller than specials + bytes.
    """
    if isinstance(lines, str):
        raise TypeError("lines must be a list of str, got a str")
    if not lines:
        raise ValueError("lines must be a non-empty list of sentences")
    for i, line in enumerate(lines):
        _check_text(line, f"lines[{i}]")
    smallest = len(SPECIAL_TOKENS) + 256
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < smallest:
        raise ValueError(f"vocab_size must be an int >= {smallest} (specials + 256 bytes), "
                         f"got {vocab_size!r}")
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = _pre_tokenizer()
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2,
                                  special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(lines, trainer=trainer)
    return Tokenizer(tok)


class Tokenizer:
    """Thin wrapper over a ``tokenizers.Tokenizer`` with the calls the book uses.

    It sets the wrapped tokenizer's ``encode_special_tokens = True`` (text spelling a special
    token stays text; see :meth:`encode`), also for direct ``self.tok.encode`` calls.

    Attributes:
        vocab_size: V (including special tokens).
        pad_token_id, bos_token_id, eos_token_id, unk_token_id: special ids.
    """

    def __init__(self, tok: HFTokenizer):
        self.tok = tok
        # the added (special) tokens are never matched in text: "<eos>" is 5 characters
        # (tokenizers' encode_special_tokens, what transformers' split_special_tokens sets)
        tok.encode_special_tokens = True
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

    def encode(self, text: str, allowed_special: str | Iterable[str] = ()) -> list[int]:
        """``text -> [S]`` token ids (no special tokens added).

        Text that spells a special token (``"<eos>"``, ``"<pad>"``, ...) is encoded as its
        characters, like any other text, so ``decode(encode(text)) == text`` for every str
        of valid Unicode.

        Args:
            text: the text.
            allowed_special: special tokens (from :data:`SPECIAL_TOKENS`) that, where their
                exact spelling occurs in ``text``, become that special token's id; ``"all"``
                for all of them. Default none (tiktoken's ``allowed_special``; transformers'
                ``split_special_tokens=False`` is ``"all"``).

        Raises:
            TypeError: if ``text`` is not a str, or ``allowed_special`` is neither ``"all"``
                nor a collection of str.
            ValueError: if ``text`` holds a lone surrogate (the message gives its position),
                or ``allowed_special`` names a string that is not a special token.
        """
        _check_text(text, "text")
        allowed = self._allowed_special(allowed_special)
        if not allowed:
            return self.tok.encode(text, add_special_tokens=False).ids
        ids: list[int] = []
        pattern = "|".join(re.escape(t) for t in sorted(allowed, key=len, reverse=True))
        for piece in re.split(f"({pattern})", text):  # odd pieces: the special tokens
            if piece in allowed:
                ids.append(self.tok.token_to_id(piece))
            elif piece:
                ids.extend(self.tok.encode(piece, add_special_tokens=False).ids)
        return ids

    @staticmethod
    def _allowed_special(allowed_special) -> set[str]:
        if isinstance(allowed_special, str):
            if allowed_special != "all":
                raise TypeError(f"allowed_special must be 'all' or a collection of special "
                                f"tokens such as {{'<eos>'}}, got the str {allowed_special!r}")
            return set(SPECIAL_TOKENS)
        try:
            allowed = set(allowed_special)
        except TypeError:
            raise TypeError(f"allowed_special must be 'all' or a collection of str, got "
                            f"{type(allowed_special).__name__}") from None
        bad = sorted(repr(t) for t in allowed if t not in SPECIAL_TOKENS)
        if bad:
            raise ValueError(f"allowed_special must name special tokens {SPECIAL_TOKENS}, "
                             f"got {', '.join(bad)}")
        return allowed

    def tokens(self, text: str) -> list[str]:
        """The text of each token of ``text`` (see :meth:`id_to_token`).

        Raises:
            TypeError: if ``text`` is not a str. ValueError: if it holds a lone surrogate.
        """
        return [self.id_to_token(i) for i in self.encode(text)]

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

    def _check_id(self, i) -> int:
        if isinstance(i, torch.Tensor) and i.numel() == 1 and not i.is_floating_point():
            i = int(i)
        if isinstance(i, bool) or not isinstance(i, int):
            raise TypeError(f"token id must be an int, got {type(i).__name__}")
        if not 0 <= i < self.vocab_size:
            raise ValueError(f"token id must be in [0, vocab_size={self.vocab_size}), got {i}")
        return i

    def token_bytes(self, i: int) -> bytes:
        """The UTF-8 bytes token ``i`` stands for (special tokens: their name's bytes).

        Raises:
            TypeError: if ``i`` is not an int. ValueError: if outside ``[0, vocab_size)``.
        """
        raw = self.tok.id_to_token(self._check_id(i))
        if raw in SPECIAL_TOKENS:
            return raw.encode("utf-8")
        return bytes(_CHAR_TO_BYTE[c] for c in raw)

    def id_to_token(self, i: int) -> str:
        """The text of one token: its bytes decoded as UTF-8, a special token's name
        (``<eos>``), or, when the token holds only part of a character (a byte-level
        fallback for a character the vocabulary has no token for), its bytes written as
        ``<0xE5><0x8C>``. The raw vocabulary string is ``self.tok.id_to_token(i)``.

        Raises:
            TypeError: if ``i`` is not an int. ValueError: if outside ``[0, vocab_size)``.
        """
        raw = self.tok.id_to_token(self._check_id(i))
        if raw in SPECIAL_TOKENS:
            return raw
        data = bytes(_CHAR_TO_BYTE[c] for c in raw)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return "".join(f"<0x{b:02X}>" for b in data)

    def token_to_id(self, token: str) -> int:
        """The id of a token given as its text (the inverse of :meth:`id_to_token`).

        Raises:
            TypeError: if ``token`` is not a str.
            ValueError: if it holds a lone surrogate.
            KeyError: if no single token has that text.
        """
        _check_text(token, "token")
        if token in SPECIAL_TOKENS:
            return self.tok.token_to_id(token)
        hexes = re.fullmatch(r"(?:<0x[0-9A-F]{2}>)+", token)
        data = (bytes(int(h, 16) for h in re.findall(r"<0x([0-9A-F]{2})>", token)) if hexes
                else token.encode("utf-8"))
        i = self.tok.token_to_id("".join(_BYTE_TO_CHAR[b] for b in data)) if data else None
        if i is None:
            raise KeyError(f"{token!r} is not a single token of the vocabulary")
        return i

    def batch_encode(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Encode several texts, left-padded to the longest.

        Returns:
            ``(input_ids [B,S] int64, attention_mask [B,S] int64)``; mask 0 marks padding.

        Raises:
            TypeError: if ``texts`` is a str or holds a non-str.
            ValueError: if ``texts`` is empty, a text holds a lone surrogate (naming
                ``texts[i]`` and the position) or a text encodes to no tokens.
        """
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise TypeError("texts must be a list of str (for one text, use encode or [text])")
        if not texts:
            raise ValueError("texts must be a non-empty list of str")
        for i, t in enumerate(texts):
            _check_text(t, f"texts[{i}]")
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
        return f"Tokenizer(byte-level BPE, vocab_size={self.vocab_size})"
