"""Stored notebook outputs do not depend on the inline backend's settings (issue R1 item 8).

A tiny notebook with one figure is executed with the default dpi and then checked by nbval in
a kernel whose config sets ``InlineBackend.rc = {'figure.dpi': 72}``: with the project's
sanitizer file it passes, without it the ``<Figure size ...>`` repr differs and it fails.
"""
import os
import subprocess
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
SANITIZE = ROOT / "tests" / "nbval_sanitize.cfg"


def _run_nbval(nb_path: Path, ipython_dir: Path, sanitize: bool) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
           "--nbval", "--nbval-current-env", str(nb_path), "--rootdir", str(nb_path.parent)]
    if sanitize:
        cmd += ["--nbval-sanitize-with", str(SANITIZE)]
    env = dict(os.environ, IPYTHONDIR=str(ipython_dir))
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=nb_path.parent,
                          timeout=300)


def test_figure_repr_is_independent_of_the_inline_dpi(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(
        "import matplotlib.pyplot as plt\nfig, ax = plt.subplots(figsize=(9.5, 3.6))\n"
        "ax.plot([1, 2, 3])\nprint('one figure')")]
    NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    stored = [o for o in nb.cells[0].outputs if o.get("output_type") == "display_data"]
    assert stored and "<Figure size 950x360 with 1 Axes>" in stored[0]["data"]["text/plain"]
    path = tmp_path / "fig.ipynb"
    nbformat.write(nb, path)
    profile = tmp_path / "ipython" / "profile_default"
    profile.mkdir(parents=True)
    (profile / "ipython_kernel_config.py").write_text(
        "c.InlineBackend.rc = {'figure.dpi': 72}\n")
    plain = _run_nbval(path, tmp_path / "ipython", sanitize=False)
    assert plain.returncode != 0 and "Figure size" in plain.stdout, plain.stdout[-2000:]
    clean = _run_nbval(path, tmp_path / "ipython", sanitize=True)
    assert clean.returncode == 0, clean.stdout[-2000:]
