"""Nothing stored in a notebook may depend on the host that ran it.

* Every notebook cell whose output nbval compares (no ``nbval-ignore-output`` tag) prints an
  agreement between two computations as a claim with its tolerance
  (``tokenflow.viz.agree``: "equal within 1e-6: True"), never the digits of a difference: a
  cell that measures ``.abs().max()`` of a difference and stores a number in scientific
  notation fails here, naming the notebook, the cell and the line. (The digits change with the
  CPU's instruction set, the BLAS and the thread count: chapter 03 stored 3.0e-07 where an AVX2
  machine prints 1.8e-07 and ``ATEN_CPU_CAPABILITY=default`` 2.4e-07.)
* nbval itself runs every notebook's kernel with ``ATEN_CPU_CAPABILITY=default`` and one
  thread (tests/conftest.py ``NBVAL_KERNEL_ENV``), so on the machine that wrote the outputs too a
  host-dependent output fails; checked here that the kernels really get that environment.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
# a number as Python's e-format writes it (two-digit exponent): 1.8e-07, 0e+00, 4.2e-09; not a
# tolerance as written in a claim (1e-5, or agree's 1e-6)
SCI = re.compile(r"(?<![\w.])\d(?:\.\d+)?e[-+]\d\d\b")
DIFFERENCE = re.compile(r"abs\(\)\s*\.max\(\)|\.max\(\)\s*\.abs\(\)")


def _compared_text(cell) -> str:
    """The text nbval compares for a code cell (streams and text/plain)."""
    parts = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            parts.append("".join(out.get("text", "")))
        for key in ("text/plain",):
            if key in out.get("data", {}):
                parts.append("".join(out["data"][key]))
    return "\n".join(parts)


def noise_cells(path: Path) -> list[str]:
    """``"<notebook> cell <i>: <stored line>"`` for each compared code cell of ``path`` that
    computes the largest absolute difference of two results and stores a number in scientific
    notation (the kind of output that differs from CPU to CPU)."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    found = []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        if "nbval-ignore-output" in cell.get("metadata", {}).get("tags", []):
            continue
        source = "".join(cell["source"])
        if "NBVAL_IGNORE_OUTPUT" in source or not DIFFERENCE.search(source):
            continue
        for line in _compared_text(cell).splitlines():
            if SCI.search(line):
                found.append(f"{path.name} cell {i}: {line.strip()}")
    return found


def test_the_noise_detector_flags_a_printed_difference(tmp_path):
    cell = {"cell_type": "code", "metadata": {}, "source": [
        "d = (a - b).abs().max()\n", "print(f'largest difference: {d:.1e}')"],
        "outputs": [{"output_type": "stream", "name": "stdout",
                     "text": ["largest difference: 1.8e-07\n"]}]}
    claim = dict(cell, source=["print(agree(a, b, 1e-6))"],
                 outputs=[{"output_type": "stream", "name": "stdout",
                           "text": ["equal within 1e-6: True\n"]}])
    ignored = dict(cell, metadata={"tags": ["nbval-ignore-output"]})
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps({"cells": [cell, claim, ignored]}), encoding="utf-8")
    assert noise_cells(path) == ["nb.ipynb cell 0: largest difference: 1.8e-07"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_no_stored_output_prints_rounding_noise(path):
    found = noise_cells(path)
    assert not found, ("stored outputs that print a difference's digits (they change with the "
                       "CPU; print tokenflow.viz.agree(a, b, tol) instead, or tag the cell "
                       "nbval-ignore-output):\n  " + "\n  ".join(found))


def test_nbval_kernels_run_with_a_perturbed_cpu_environment():
    """The conftest hook is installed and passes NBVAL_KERNEL_ENV to each kernel nbval starts."""
    import nbval.kernel as nbval_kernel
    from helpers import NBVAL_KERNEL_ENV      # the hook's own setting
    start = nbval_kernel.start_new_kernel
    assert getattr(start, "tokenflow_perturbed", False), "nbval's kernels are not perturbed"
    assert NBVAL_KERNEL_ENV["ATEN_CPU_CAPABILITY"] == "default"
    km, kc = start(startup_timeout=60, kernel_name=nbval_kernel.CURRENT_ENV_KERNEL_NAME)
    try:
        msg_id = kc.execute("import os; print(os.environ.get('ATEN_CPU_CAPABILITY'), "
                            "os.environ.get('OMP_NUM_THREADS'))")
        text = ""
        while True:
            msg = kc.get_iopub_msg(timeout=30)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream":
                text += msg["content"]["text"]
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
        assert text.split() == ["default", "1"], text
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_without_chromium_the_browser_tests_say_how_to_get_one(tmp_path):
    """No Chromium anywhere: the browser fixture errors with one message naming the three ways
    (PATH, apt-get as root, Playwright's own build), not with a bare AssertionError."""
    import os
    import subprocess
    import sys
    (tmp_path / "test_needs_browser.py").write_text("def test_b(browser):\n    pass\n")
    env = dict(os.environ, TOKENFLOW_CHROMIUM=str(tmp_path / "no-such-chromium"),
               PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "-p", "no:xdist", "-p", "conftest", str(tmp_path / "test_needs_browser.py"),
                        "--rootdir", str(tmp_path)], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=180)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out[-2000:]
    for way in ("chromium` on PATH", "apt-get install chromium", "playwright install chromium"):
        assert way in out, out[-2000:]
    assert "AssertionError" not in out, out[-2000:]
