"""The code-size figures of ``scripts/code_metrics.py``: measured as its docstring says, and
ARCHITECTURE.md's table shows the figures of the code as it is."""
import textwrap
from pathlib import Path

from helpers import load_script

ROOT = Path(__file__).resolve().parents[1]
code_metrics = load_script("code_metrics")


def test_the_figures_of_a_small_package(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "a.py").write_text(textwrap.dedent('''\
        """Module docstring."""


        def short():
            """One line."""
            return 1


        def longer(x):
            # a comment line is not code
            y = x + 1

            return y * 2
        '''))
    body = "\n".join(f"    v{i} = {i}" for i in range(61))
    (tmp_path / "big.py").write_text(f"def big():\n{body}\n" + "\n" * 600)
    m = code_metrics.measure(tmp_path)
    assert m["functions"] == 3
    assert m["median"] == 2                       # code lines: short 1, longer 2, big 61
    assert m["over_60"] == m["over_60_span"] == 1
    assert m["model_lines"] == 13
    assert m["over_600_names"] == ["big.py"] and m["largest"][1] == "big.py"
    # docstrings: 2 lines of a.py's 8 non-blank ones, none of big.py's 62
    assert abs(m["doc_share"] - 2 / (8 + 62)) < 1e-9


def test_architecture_md_shows_the_figures_of_the_code():
    assert code_metrics.stored_table() == code_metrics.table(), (
        "ARCHITECTURE.md's code_metrics table is stale: run python scripts/code_metrics.py "
        "--write")


def test_p90_and_the_model_folder_count_exactly(tmp_path):
    """Eleven functions of 1..11 code lines: the median is 6 and p90 is the value at rank
    0.9 * (11 - 1) = 9 (0-based), 10 lines. Only files directly in ``model/`` count as the
    model; a folder below it or beside it does not."""
    funcs = "\n\n".join(f"def f{n}():\n" + "\n".join(f"    v{i} = {i}" for i in range(n))
                        for n in range(1, 12))
    (tmp_path / "lib.py").write_text(funcs + "\n")
    for folder in ("model/sub", "mymodel"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "x.py").write_text("x = 1\n")
    (tmp_path / "model" / "y.py").write_text("y = 1\nz = 2\n")
    m = code_metrics.measure(tmp_path)
    assert m["functions"] == 11 and m["median"] == 6 and m["p90"] == 10
    assert m["model_lines"] == 2
