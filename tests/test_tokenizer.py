"""Tokenizer: text that spells a special token stays text; special tokens
only by explicit opt-in (``allowed_special``); the HF export agrees."""
import pytest

from tokenflow.tokenizer import SPECIAL_TOKENS, Tokenizer


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_file()


def _specials(tok):
    return {tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id}


TEXTS = ["a<eos>b", "<eos>", "<eos>北京", "北京<eos>", "<pad><bos><eos><unk>", "<eos><eos>",
         "x <unk> y", "<<eos>>", "<eo", "eos>", "<eos", "<EOS>", "< eos >", "北京是中国的首<pad>",
         "<bos>北京是中国的首都。<eos>\n<pad>"]


@pytest.mark.parametrize("text", TEXTS)
def test_special_spelling_is_text_and_round_trips(tok, text):
    ids = tok.encode(text)
    assert not set(ids) & _specials(tok), f"{text!r} injected a special id: {ids}"
    assert tok.decode(ids) == text
    assert "".join(tok.tokens(text)) == text


@pytest.mark.parametrize("special", SPECIAL_TOKENS)
@pytest.mark.parametrize("where", ["{}", "a{}", "{}b", "a{}b", "{0}{0}", "北京{}是"])
def test_every_special_token_at_every_place(tok, special, where):
    text = where.format(special)
    ids = tok.encode(text)
    assert not set(ids) & _specials(tok)
    assert tok.decode(ids) == text
    # the batch path encodes the same way
    batch, mask = tok.batch_encode([text])
    assert batch[0, mask[0].bool()].tolist() == ids


def test_opt_in_gives_the_special_id(tok):
    assert tok.encode("a<eos>b", allowed_special={"<eos>"}) == [
        *tok.encode("a"), tok.eos_token_id, *tok.encode("b")]
    assert tok.encode("<bos>x<eos>", allowed_special="all") == [
        tok.bos_token_id, *tok.encode("x"), tok.eos_token_id]
    every = "".join(SPECIAL_TOKENS)
    assert tok.encode(every, allowed_special="all") == [
        tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id]
    # only the named ones: <pad> stays text next to an allowed <eos>
    ids = tok.encode("<pad><eos>", allowed_special=["<eos>"])
    assert ids == [*tok.encode("<pad>"), tok.eos_token_id]
    # a partial spelling is text even when allowed
    assert tok.encode("<eo", allowed_special="all") == tok.encode("<eo")
    # decode drops the special tokens it was given
    assert tok.decode(tok.encode("a<eos>b", allowed_special="all")) == "ab"


def test_running_example_ids_unchanged(tok):
    assert tok.encode("北京是中国的首") == [513, 263, 313, 265, 268]
    assert tok.encode("北京是中国的首", allowed_special="all") == [513, 263, 313, 265, 268]


@pytest.mark.parametrize("bad, err", [("eos", TypeError), ("<eos>", TypeError),
                                      (["<foo>"], ValueError), ({"eos"}, ValueError),
                                      (5, TypeError), ([["<eos>"]], TypeError)])
def test_allowed_special_is_checked(tok, bad, err):
    with pytest.raises(err, match="allowed_special"):
        tok.encode("a<eos>b", allowed_special=bad)


def test_shipped_file_loaded_fresh_keeps_text(tmp_path, tok):
    """A tokenizer saved and loaded again (as train.py and hf_export do) keeps the rule."""
    tok.save(tmp_path / "tokenizer.json")
    back = Tokenizer.from_file(tmp_path / "tokenizer.json")
    assert back.encode("a<eos>b") == tok.encode("a<eos>b")
    assert tok.eos_token_id not in back.encode("a<eos>b")


def test_hf_export_tokenizer_keeps_special_spelling_as_text(tmp_path, tok):
    """AutoTokenizer on the exported folder gives our ids for text spelling special tokens
    (tokenizer_config.json sets split_special_tokens), and the opt-in equals HF's default."""
    transformers = pytest.importorskip("transformers")
    from tokenflow.interop.hf_export import _write_tokenizer
    _write_tokenizer(tok, tmp_path, 128)
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    for text in TEXTS:
        assert hf(text, add_special_tokens=False)["input_ids"] == tok.encode(text), text
        assert hf(text, add_special_tokens=False, split_special_tokens=False)["input_ids"] \
            == tok.encode(text, allowed_special="all"), text
        assert hf.decode(tok.encode(text)) == text


# ------------------------------------------------------------------ lone surrogates
SURROGATE_CASES = [("ok\ud800bad", 2, "D800"), ("\udfff", 0, "DFFF"), ("北京\udc80", 2, "DC80"),
                   ("ok\ud83d\ude00", 2, "D83D")]     # a UTF-16 pair is still two surrogates


def _entry_points(tok):
    """Every call that takes text, with the name its message must give."""
    return {"encode": (tok.encode, "text"),
            "encode allowed_special": (lambda t: tok.encode(t, allowed_special="all"), "text"),
            "tokens": (tok.tokens, "text"),
            "token_to_id": (tok.token_to_id, "token"),
            "batch_encode": (lambda t: tok.batch_encode(["fine", t]), r"texts\[1\]")}


@pytest.mark.parametrize("text, pos, code", SURROGATE_CASES)
@pytest.mark.parametrize("entry", ["encode", "encode allowed_special", "tokens", "token_to_id",
                                   "batch_encode"])
def test_lone_surrogate_raises_value_error_naming_argument_and_position(tok, text, pos, code,
                                                                        entry):
    """A lone surrogate made ``tokenizers`` raise ``TypeError: TextInputSequence must be
    str`` (``token_to_id``: a ``UnicodeEncodeError``); now a ValueError that names the
    argument, the position and the code point."""
    call, name = _entry_points(tok)[entry]
    with pytest.raises(ValueError, match=f"{name} holds a lone surrogate U\\+{code} at "
                                         f"position {pos}"):
        call(text)


def test_train_tokenizer_names_the_line_with_a_surrogate():
    from tokenflow.tokenizer import train_tokenizer
    with pytest.raises(ValueError, match=r"lines\[1\] holds a lone surrogate U\+D800 at "
                                         r"position 1"):
        train_tokenizer(["ab", "c\ud800", "de"], 300)
    with pytest.raises(TypeError, match=r"lines\[0\] must be a str"):
        train_tokenizer([b"ab"], 300)
    with pytest.raises(TypeError, match="lines must be a list of str"):
        train_tokenizer("ab", 300)


@pytest.mark.parametrize("text", ["\ud7ff", "\ue000", "ok\U0001F600bad", "\uffff", "\x00",
                                  "北京\U00020000"])
def test_code_points_next_to_the_surrogates_round_trip(tok, text):
    """The neighbours of U+D800..U+DFFF, a real astral character and the edges of the BMP
    are valid Unicode: encoded and decoded back unchanged."""
    assert tok.decode(tok.encode(text)) == text
    ids, mask = tok.batch_encode([text])
    assert tok.decode(ids[0][mask[0] == 1]) == text


def test_non_str_still_type_error(tok):
    for call, name in _entry_points(tok).values():
        with pytest.raises(TypeError):
            call(b"ok")


@pytest.mark.parametrize("char, n", [("丐", 2), ("丑", 2), ("丕", 2), ("专", 2),
                                     ("龘", 3), ("键", 3), ("😀", 4)])
def test_an_unseen_character_takes_at_most_one_token_per_byte(tok, char, n):
    """None of these is in the corpus. 丐, 丑, 丕 and 专 begin with the bytes E4 B8 that 中, 东
    and 上 share, a merge the corpus taught (one token), so they take 2 tokens for 3 bytes;
    龘, 键 and the emoji have no merged part and take one token per byte."""
    from importlib import resources
    corpus = (resources.files("tokenflow") / "data" / "corpus.txt").read_text(encoding="utf-8")
    assert char not in corpus
    ids = tok.encode(char)
    assert len(ids) == n <= len(char.encode("utf-8"))
    assert tok.decode(ids) == char
    if n == 2:
        assert tok.id_to_token(ids[0]) == "<0xE4><0xB8>" and all(
            "中东上"[i].encode("utf-8")[:2] == b"\xe4\xb8" for i in range(3))
