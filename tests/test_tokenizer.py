"""Tokenizer (issue R2 item 7): text that spells a special token stays text; special tokens
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
