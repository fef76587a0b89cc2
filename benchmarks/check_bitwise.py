"""Speed changes must not change numbers: compare this checkout's outputs with a git revision's.

    .venv/bin/python benchmarks/check_bitwise.py c1d3f1b      # revision before the speed work

Extracts ``src/tokenflow`` of the revision (``git archive``) into a temporary folder, runs the
same script under both packages in fresh processes (``torch.set_num_threads(2)``) and
compares every output tensor with ``torch.equal``: logits of the trained tiny model (full
forward, prefill + 8 decode steps, left-padded batch), greedy ids of ``generate`` (with and
without padding), full-forward logits / greedy ids of random ``small-moe`` and
``tiny-dense`` models, and of random ``tiny`` MoE models with softmax and with grouped sigmoid
routing at batch 1, 2 and 8 (each MoE execution path), and of a random multi-head latent
attention model (``tiny`` with DeepSeek-V3's attention and routing, as the benchmark's
``tiny-mla``) at batch 1 and 8: forward, prefill + 8 decode steps, greedy ids. Prints one line
per output and exits 1 if any differs.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = r'''
import inspect, json, sys, torch
if sys.argv[1] != "-":
    sys.path.insert(0, sys.argv[1])
import tokenflow
from tokenflow import (KVCache, TokenFlowModel, decode_step, generate, load_pretrained, prefill,
                       preset)
torch.set_num_threads(2)
# newer generate() stops at EOS by default; compare full-length runs on both sides
NO_EOS = {"stop_at_eos": False} if "stop_at_eos" in inspect.signature(generate).parameters else {}
model, tok = load_pretrained()
res = {}
with torch.inference_mode():
    for text in ["北京是中国的首", "东京是日本的", "Paris is the capital of", "伦敦在"]:
        ids = torch.tensor([tok.encode(text)])
        res[text + " forward"] = model(ids)
        cache = KVCache(model.config, 1, 40)
        steps = [prefill(model, ids, cache)]
        for _ in range(8):
            steps.append(decode_step(model, steps[-1].argmax(-1), cache))
        res[text + " prefill+decode"] = torch.stack(steps)
        res[text + " generate"] = generate(model, ids, 12, **NO_EOS)
    ids, mask = tok.batch_encode(["北京是中国的首", "东京", "Paris is"])
    res["left-padded forward"] = model(ids, attention_mask=mask)
    res["left-padded generate"] = generate(model, ids, 10, attention_mask=mask, **NO_EOS)
    for name in ["small-moe", "tiny-dense"]:
        torch.manual_seed(1)
        m = TokenFlowModel(preset(name, max_position_embeddings=256)).eval()
        ids = torch.randint(3, 512, (2, 100))
        res[name + " forward"] = m(ids)
        res[name + " generate"] = generate(m, ids[:, :10], 20, **NO_EOS)
    # the MoE paths at batch 1, 2 and 8, softmax and DeepSeek-style sigmoid routing
    for label, kw in [("tiny softmax", {}),
                      ("tiny sigmoid+groups", dict(scoring_func="sigmoid", n_group=2,
                                                   topk_group=1, routed_scaling_factor=2.5))]:
        torch.manual_seed(2)
        m = TokenFlowModel(preset("tiny", max_position_embeddings=256, **kw)).eval()
        for p in m.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.08)
        for B in (1, 2, 8):
            ids = torch.randint(3, 512, (B, 12))
            res[f"{label} b{B} generate"] = generate(m, ids, 24, **NO_EOS)
            res[f"{label} b{B} forward"] = m(ids)
    # multi-head latent attention (DeepSeek-V3 in miniature: q-LoRA, sigmoid routing with
    # groups, a shared expert); skipped for revisions from before MLA existed
    base, overrides = json.loads(sys.argv[3])           # _common.EXTRA["tiny-mla"]
    try:
        cfg = preset(base, max_position_embeddings=256, **overrides)
    except (TypeError, ValueError):
        cfg = None
    if cfg is not None:
        torch.manual_seed(3)
        m = TokenFlowModel(cfg).eval()
        for p in m.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.08)
        for B in (1, 8):
            ids = torch.randint(3, 512, (B, 12))
            res[f"tiny-mla b{B} forward"] = m(ids)
            cache = KVCache(cfg, B, 40)
            steps = [prefill(m, ids, cache)]
            for _ in range(8):
                steps.append(decode_step(m, steps[-1].argmax(-1), cache))
            res[f"tiny-mla b{B} prefill+decode"] = torch.stack(steps)
            res[f"tiny-mla b{B} generate"] = generate(m, ids, 24, **NO_EOS)
torch.save(res, sys.argv[2])
'''


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    rev = sys.argv[1]
    import torch
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from _common import EXTRA
    mla = json.dumps(EXTRA["tiny-mla"])                     # the benchmark's MLA config
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "src/tokenflow"],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive, check=True)
        probe = tmp / "probe.py"
        probe.write_text(PROBE, encoding="utf-8")
        out = {}
        for label, path in (("old", str(tmp / "src")), ("new", "-")):
            dest = tmp / f"{label}.pt"
            subprocess.run([sys.executable, str(probe), path, str(dest), mla], check=True)
            out[label] = torch.load(dest)
    bad = 0
    for key, old in out["old"].items():
        new = out["new"][key]
        same = torch.equal(old, new)
        bad += not same
        if old.shape != new.shape:       # e.g. a revision from before the tokenizer change
            print(f"DIFFERENT  shape {list(old.shape)} -> {list(new.shape)}  {key}")
            continue
        diff = (old.float() - new.float()).abs().max().item()
        print(f"{'identical' if same else 'DIFFERENT':9s}  max|diff| {diff:.3g}  {key}")
    print(f"{len(out['old']) - bad}/{len(out['old'])} outputs bit-identical to {rev}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
