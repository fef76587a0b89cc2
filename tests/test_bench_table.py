"""book/benchmarks.md's speed table is generated from benchmarks/latest.json (issue 26 item 18):
the committed page must equal what scripts/bench_table.py renders, and a changed JSON changes
the page."""
import copy
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("bench_table", ROOT / "scripts" / "bench_table.py")
bench_table = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_table)


def test_page_table_is_the_json():
    data = json.loads(bench_table.JSON.read_text(encoding="utf-8"))
    page = bench_table.PAGE.read_text(encoding="utf-8")
    assert bench_table.render(page, data) == page
    assert bench_table.main(["--check"]) == 0


def test_a_changed_json_changes_the_table_only():
    data = json.loads(bench_table.JSON.read_text(encoding="utf-8"))
    page = bench_table.PAGE.read_text(encoding="utf-8")
    other = copy.deepcopy(data)
    other["rows"][0]["ratio"] = 9.876
    new = bench_table.render(page, other)
    assert "9.88x" in new and new != page
    outside = page.split(bench_table.BEGIN)[0], page.split(bench_table.END)[1]
    assert new.startswith(outside[0]) and new.endswith(outside[1])
    other["rows"][2]["repeats"] = 5                     # tiny, prefill 128
    assert "tiny 7 (prefill 128: 5); tiny-dense" in bench_table.render(page, other)
    with pytest.raises(ValueError, match="markers|no"):
        bench_table.render("no table here", data)
    other["rows"][0]["preset"] = "mystery"
    with pytest.raises(ValueError, match="HF_CLASS"):
        bench_table.table(other)
