#!/usr/bin/env bash
# The path without make (README "Without make"), run as a reader on macOS or Windows would, in a
# throwaway virtual environment: python -m venv, pip install -r requirements.txt, then a few
# checks that the chapters' code works (the model, a figure in the bundled font, a notebook
# executed headless). Takes torch from the default index, as those readers do (on Linux that is
# the CUDA build, several GB: pass TORCH_INDEX=https://download.pytorch.org/whl/cpu there, or
# reuse pip's cache).
#
#   bash scripts/setup_without_make.sh [PYTHON]      # default: python3; venv in a temp folder
#   KEEP=1 bash scripts/setup_without_make.sh        # keep the venv (its path is printed)
set -euo pipefail
PY=${1:-python3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=$(mktemp -d "${TMPDIR:-/tmp}/tokenflow-nomake.XXXXXX")
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$DIR"' EXIT
start=$(date +%s)

"$PY" -m venv "$DIR/venv"
VPY="$DIR/venv/bin/python"
[ -x "$VPY" ] || VPY="$DIR/venv/Scripts/python.exe"          # Windows (Git Bash)
"$VPY" -m pip install --upgrade pip
if [ -n "${TORCH_INDEX:-}" ]; then
    "$VPY" -m pip install --no-deps --index-url "$TORCH_INDEX" "$(grep -E '^torch==' "$ROOT/requirements.txt")"
fi
(cd "$ROOT" && "$VPY" -m pip install -r requirements.txt)
echo "installed in $(( $(date +%s) - start )) s"

cd "$ROOT"
"$VPY" - <<'EOF'
import matplotlib
matplotlib.use("Agg")
import torch
from tokenflow import generate, load_pretrained
from tokenflow.viz import hidden_state_heatmap, setup_notebook
from tokenflow.viz.fonts import FONT_DIR
setup_notebook()
model, tok = load_pretrained()
ids = torch.tensor([tok.encode("北京是中国的首")])
text = tok.decode(generate(model, ids, max_new_tokens=1)[0])
assert text == "北京是中国的首都", text
fig = hidden_state_heatmap(model.embed_tokens(ids)[0].detach(), [tok.decode([i]) for i in ids[0].tolist()])
from matplotlib import font_manager
used = font_manager.findfont(font_manager.FontProperties())
assert str(FONT_DIR) in used, used
print("model, greedy token and a figure in the bundled font: ok")
EOF
"$DIR/venv/bin/jupyter" nbconvert --to notebook --execute --ExecutePreprocessor.timeout=120 notebooks/00_token_flow.ipynb \
    --output "$DIR/00_token_flow.ipynb" >/dev/null
echo "notebooks/00_token_flow.ipynb executed headless: ok"
echo "without make: all checks passed in $(( $(date +%s) - start )) s (venv: $DIR/venv)"
