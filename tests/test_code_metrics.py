"""The code-size figures of ``scripts/code_metrics.py``: measured as its docstring says, and
ARCHITECTURE.md's table shows the figures of the code as it is."""
import importlib.util
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("code_metrics", ROOT / "scripts" / "code_metrics.py")
code_metrics = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(code_metrics)


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
