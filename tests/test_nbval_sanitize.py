"""Stored notebook outputs do not depend on the inline backend's settings.

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


def _run_nbval(nb_path: Path, ipython_dir: Path, sanitize: bool,
               extra_env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
           "--nbval", "--nbval-current-env", str(nb_path), "--rootdir", str(nb_path.parent)]
    if sanitize:
        cmd += ["--nbval-sanitize-with", str(SANITIZE)]
    env = dict(os.environ, IPYTHONDIR=str(ipython_dir), **(extra_env or {}))
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


def test_inline_svg_markup_is_not_compared_but_text_is(tmp_path):
    """An inline-SVG figure (precomputed_explorer kind="svg")
    whose geometry changes (here its width, as a different font or FreeType would change it)
    passes with the sanitizer and fails without; a changed printed line still fails with it."""
    src = ("import os\nimport matplotlib\nmatplotlib.use('agg')\nimport matplotlib.pyplot as plt\n"
           "from tokenflow.viz import precomputed_explorer\n"
           "def fig(k):\n"
           "    f, ax = plt.subplots(figsize=(float(os.environ.get('TF_TEST_W', '3')), 2))\n"
           "    ax.set_title(f'北京 {k}')\n    return f\n"
           "print(os.environ.get('TF_TEST_TEXT', 'equal within 1e-06: True'))\n"
           "precomputed_explorer(fig, {'k': [1, 2]}, kind='svg')")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src)]
    NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    html = [o for o in nb.cells[0].outputs if o.get("output_type") == "execute_result"]
    assert html and "<svg" in html[0]["data"]["text/html"]
    path = tmp_path / "svg.ipynb"
    nbformat.write(nb, path)
    ipython = tmp_path / "ipython"
    wider = {"TF_TEST_W": "3.5"}
    plain = _run_nbval(path, ipython, sanitize=False, extra_env=wider)
    assert plain.returncode != 0, plain.stdout[-2000:]
    clean = _run_nbval(path, ipython, sanitize=True, extra_env=wider)
    assert clean.returncode == 0, clean.stdout[-2000:]
    text = _run_nbval(path, ipython, sanitize=True, extra_env={"TF_TEST_TEXT": "equal: False"})
    assert text.returncode != 0 and "equal: False" in text.stdout, text.stdout[-2000:]
