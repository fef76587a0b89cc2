"""Train the book's tiny model on the bundled corpus, reproducibly, and save it.

Run ``python -m tokenflow.train`` (under a minute on one CPU core). It

1. trains the byte-level BPE tokenizer on ``data/corpus.txt`` and writes ``data/tokenizer.json``;
2. trains the ``tiny`` preset (next-token cross-entropy on each sentence + ``<eos>``, plus a
   small Switch load-balancing loss for the MoE routers, both over real tokens only: the
   right padding counts in neither) with AdamW, seeded;
3. checks that greedy decoding continues 北京是中国的首 with 都, and writes
   ``data/tiny.safetensors``.

Same seed and same thread count give the same weights on the same machine; the command line
uses one thread and seed 0 (the shipped weights).
"""
from __future__ import annotations

import argparse
import time
from importlib import resources
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from .interop.checkpoint import DEFAULT_WEIGHTS, save_model
from .config import preset
from .model.transformer import TokenFlowModel
from .tokenizer import Tokenizer, train_tokenizer

__all__ = ["train", "make_batches", "main"]

PROMPT = "北京是中国的首"


def _data_dir() -> Path:
    return Path(str(resources.files("tokenflow") / "data"))


def make_batches(tok: Tokenizer, lines: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Encode each sentence + ``<eos>``, right-pad with ``<pad>``.

    Returns:
        ``(ids [N, L], loss_mask [N, L])``; ``loss_mask[n, s]`` is 1 where position ``s``
        has a real next token to predict.
    """
    seqs = [tok.encode(line) + [tok.eos_token_id] for line in lines]
    L = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), L), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), L), dtype=torch.long)
    for n, s in enumerate(seqs):
        ids[n, :len(s)] = torch.tensor(s)
        mask[n, :len(s) - 1] = 1
    return ids, mask


def train(steps: int = 400, batch_size: int = 64, lr: float = 3e-3, seed: int = 0,
          aux_loss_coef: float = 0.01, out_dir: Path | None = None,
          progress: bool = True) -> tuple[TokenFlowModel, Tokenizer, dict]:
    """Train tokenizer and model; write ``tokenizer.json`` and the weights to ``out_dir``.

    Returns:
        ``(model, tokenizer, info)``, ``info`` with the final loss and seconds taken.

    Raises:
        ValueError: if ``steps`` or ``batch_size`` < 1.
    """
    if steps < 1 or batch_size < 1:
        raise ValueError(f"steps and batch_size must be >= 1, got {steps}, {batch_size}")
    out_dir = Path(out_dir) if out_dir is not None else _data_dir()
    t0 = time.perf_counter()
    torch.manual_seed(seed)
    lines = [s for s in (_data_dir() / "corpus.txt").read_text(encoding="utf-8").splitlines()
             if s.strip()]
    tok = train_tokenizer(lines)
    tok.save(out_dir / "tokenizer.json")
    config = preset("tiny", vocab_size=tok.vocab_size, pad_token_id=tok.pad_token_id,
                    bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    model = TokenFlowModel(config)
    ids, loss_mask = make_batches(tok, lines)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps,
                                                pct_start=0.1)
    gen = torch.Generator().manual_seed(seed)
    model.train()
    bar = tqdm(range(steps), desc="training tiny model", disable=not progress)
    for _ in bar:
        rows = torch.randint(0, ids.shape[0], (batch_size,), generator=gen)
        x, m = ids[rows], loss_mask[rows]
        real = x != tok.pad_token_id             # [b, L] the router statistics skip padding
        logits = model(x, token_mask=real)                              # [b, L, V]
        lm = F.cross_entropy(logits[:, :-1].reshape(-1, config.vocab_size),
                             x[:, 1:].reshape(-1), reduction="none")
        lm = (lm * m[:, :-1].reshape(-1)).sum() / m.sum()
        aux = sum(layer.mlp.aux_loss for layer in model.layers if layer.is_moe)
        loss = lm + aux_loss_coef * aux
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        bar.set_postfix(loss=f"{lm.item():.3f}")
    model.eval()
    info = {"final_lm_loss": round(lm.item(), 4), "seconds": round(time.perf_counter() - t0, 1),
            "steps": steps, "seed": seed}
    save_model(model, out_dir / DEFAULT_WEIGHTS, metadata=info)
    return model, tok, info


def main(argv: list[str] | None = None) -> None:
    """Command-line entry: ``python -m tokenflow.train [--steps N] [--seed S]``."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", type=Path, default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    model, tok, info = train(steps=args.steps, seed=args.seed, out_dir=args.out_dir)
    ids = torch.tensor([tok.encode(PROMPT)])
    with torch.no_grad():
        probs = model(ids)[0, -1].softmax(-1)
    top = probs.topk(5)
    ranked = ", ".join(f"{tok.id_to_token(int(i))} {float(p):.3f}"
                       for p, i in zip(top.values, top.indices))
    print(f"{info}\n{PROMPT} -> top-5: {ranked}")
    if tok.id_to_token(int(top.indices[0])) != "都":
        raise SystemExit("training did not teach 北京是中国的首 -> 都; weights written anyway")


if __name__ == "__main__":
    main()
