"""Training and checkpoint round trip: quick, on a temporary folder."""
import torch

from tokenflow import load_model, save_model
from tokenflow.train import train


def test_train_runs_and_loss_falls(tmp_path):
    _, _, short = train(steps=2, out_dir=tmp_path, progress=False)
    model, tok, longer = train(steps=30, out_dir=tmp_path, progress=False)
    assert longer["final_lm_loss"] < short["final_lm_loss"]
    assert (tmp_path / "tokenizer.json").exists()
    reloaded = load_model(tmp_path / "tiny.safetensors")
    ids = torch.tensor([tok.encode("北京是中国的首")])
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids), model(ids))


def test_save_load_roundtrip(tmp_path, make_model):
    model = make_model(scoring_func="sigmoid", n_group=2, topk_group=1)
    model.layers[1].mlp.gate.e_score_correction_bias.normal_()
    save_model(model, tmp_path / "m.safetensors")
    back = load_model(tmp_path / "m.safetensors")
    assert back.config == model.config
    ids = torch.randint(0, model.config.vocab_size, (2, 5))
    with torch.no_grad():
        torch.testing.assert_close(back(ids), model(ids))


def test_make_batches_masks_every_next_token_up_to_eos_and_no_padding():
    """Position s is a loss position when token s + 1 is real: every token of the sentence
    and its <eos>, never the <pad> after it (a hand count per row)."""
    from tokenflow import Tokenizer
    from tokenflow.train import make_batches
    tok = Tokenizer.from_file()
    lines = ["北京", "北京是中国的首都"]
    ids, mask = make_batches(tok, lines)
    lens = [len(tok.encode(line)) for line in lines]           # tokens without <eos>
    assert mask.sum(1).tolist() == lens                        # predict tokens 2.. and <eos>
    for n, k in enumerate(lens):
        assert ids[n, k].item() == tok.eos_token_id            # the last target is <eos>
        assert mask[n, :k].all() and not mask[n, k:].any()
        assert (ids[n, k + 1:] == tok.pad_token_id).all()
