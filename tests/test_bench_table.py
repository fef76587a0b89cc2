"""book/benchmarks.md's speed table is generated from benchmarks/latest.json (issue 26 item 18):
the committed page must equal what scripts/bench_table.py renders, and a changed JSON changes
the page."""
import copy
import json
from pathlib import Path

import pytest

from helpers import load_script

ROOT = Path(__file__).resolve().parent.parent
bench_table = load_script("bench_table")


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


def _serving(data):
    """``data`` with a small ``serving`` entry (the layout ``bench_serving.py --json``
    writes): one paired measure met, one missed, one not paired."""
    out = copy.deepcopy(data)
    out["serving"] = dict(
        machine="CPU X, 2 cores", date="2026-12-01", started="14:00 UTC", threads=1, pairs=5,
        quick=False, load_before=2.04, load_after=3.96,
        rows=[dict(what="packed vs padded engine (mixed)", value=1.2, text="1.20x",
                   target=">= 1.5x", met=False, ratios=[1.1, 1.2, 1.3], ratio_min=1.1,
                   ratio_max=1.3, steps=187, decode_only_steps=171),
              dict(what="ours vs transformers generate_batch (long)", value=2.5, text="2.50x",
                   target=">= 1.5x", met=True, ratios=[2.4, 2.5], ratio_min=2.4,
                   ratio_max=2.5),
              dict(what="positions computed / real tokens (mixed)", value=1.0,
                   text="1.00 (padded 3.49)", target="1.00", met=True)])
    return out


def test_serving_table_and_notes_come_from_the_json():
    data = _serving(json.loads(bench_table.JSON.read_text(encoding="utf-8")))
    t = bench_table.serving_table(data).splitlines()
    assert t[0] == "| measure (1 thread) | this run | pairs (min-max) | target | met |"
    assert t[2] == "| packed vs padded engine (mixed) | 1.20x | 1.10-1.30 | >= 1.5x | no |"
    assert (
        t[4] == "| positions computed / real tokens (mixed) | 1.00 (padded 3.49) |  | 1.00 | yes |"
    )
    notes = bench_table.serving_notes(data)
    assert notes.startswith("2 of 3 targets met in this run; missed: packed vs padded "
                            "engine (mixed) 1.20x (target >= 1.5x).")
    assert "187 engine steps, 171 of them decode-only" in notes
    assert "load average 2.0 at the start and 4.0 at the end; 5 alternating pairs" in notes
    data["serving"]["rows"][0]["met"] = True                 # now every target is met
    assert bench_table.serving_notes(data).startswith("3 of 3 targets met in this run; "
                                                      "missed: none.")


def test_a_changed_serving_run_changes_its_block_only():
    data = json.loads(bench_table.JSON.read_text(encoding="utf-8"))
    page = bench_table.PAGE.read_text(encoding="utf-8")
    new = bench_table.render(page, _serving(data))
    assert "| packed vs padded engine (mixed) | 1.20x | 1.10-1.30 |" in new and new != page
    outside = (page.split(bench_table.SERVING_BEGIN)[0],
               page.split(bench_table.SERVING_END)[1])
    assert new.startswith(outside[0]) and new.endswith(outside[1])
    no_block = page.replace(bench_table.SERVING_END, "")
    with pytest.raises(ValueError, match="serving-table"):
        bench_table.render(no_block, data)


def _vllm(data):
    """``data`` with a small ``vllm`` entry (the layout ``bench_vllm.py --json`` writes)."""
    out = copy.deepcopy(data)
    run = dict(threads=1, vllm_startup_s=41.2, identical=True, ratio=1.62, ratio_min=1.5,
               ratio_max=1.71, ratios=[1.5, 1.62, 1.71], target=1.5, met=True,
               ours_tok_s=2345.6, ours_ttft_s=0.0512, ours_tpot_s=0.00421, ours_cpu_s=0.93,
               vllm_tok_s=1447.9, vllm_ttft_s=0.1004, vllm_tpot_s=0.0061, vllm_cpu_s=2.5)
    two = dict(run, threads=2, ratio=0.8, ratio_min=0.7, ratio_max=0.9, met=False,
               target=1.0, identical=False, vllm_startup_s=38.0)
    out.setdefault("vllm", {})["tiny"] = dict(
        model="tiny", machine="CPU X, 2 cores", date="2026-12-01", started="22:00 UTC",
        pairs=3, load_before=1.46, load_after=2.51, requests=48, new_tokens=790,
        runs=[run, two])
    return out


def test_vllm_table_comes_from_the_json():
    data = _vllm(json.loads(bench_table.JSON.read_text(encoding="utf-8")))
    text = bench_table.vllm_table(data)
    lines = text.splitlines()
    assert lines[2] == ("| 1 | 2,346 | 1,448 | 1.62x (1.50-1.71) | >= 1.5x | yes | 51 / 100 "
                        "| 4.2 / 6.1 | 0.93 / 2.50 |")
    assert lines[3].startswith("| 2 | 2,346 | 1,448 | 0.80x (0.70-0.90) | >= 1.0x | no |")
    assert "48 requests, 790 new tokens per run; tokens identical to vLLM's in every run: no." \
        in text                                      # one thread count disagreed
    assert "41 s (1 thread), 38 s (2 threads)" in text
    assert "load average 1.5 at the start and 2.5 at the end; 3 alternating pairs" in text
    page = bench_table.PAGE.read_text(encoding="utf-8")
    new = bench_table.render(page, data)
    outside = page.split(bench_table.VLLM_BEGIN)[0], page.split(bench_table.VLLM_END)[1]
    assert "| 1 | 2,346 | 1,448 |" in new and new.startswith(outside[0]) \
        and new.endswith(outside[1])
    with pytest.raises(ValueError, match="vllm-table"):
        bench_table.render(page.replace(bench_table.VLLM_END, ""), data)


def test_ops_table_comes_from_the_json():
    """Each cell is the JSON's milliseconds and their multiple of the class's floor; a class
    without a floor (host code) shows milliseconds only."""
    step = lambda ms, wall: dict(step=0, num_tokens=256, num_seqs=6, wall_ms=wall,  # noqa: E731
                                 ms={"linear (GEMM)": ms, "sampling": 0.5},
                                 floor_ms={"linear (GEMM)": ms / 4})
    model = {"prefill": step(400.0, 500.0), "decode": step(30.0, 40.0)}
    data = {"ops": {"date": "2026-12-02", "torch": "2.x", "load_before": 1.0,
                    "load_after": 2.0, "peak": {"1": {"gflops": 120.0, "gbs": 9.5}},
                    "models": {"tiny": {"1": model}, "dense-92m": {"1": model}}}}
    lines = bench_table.ops_table(data).splitlines()
    assert lines[2] == ("| linear (GEMM) | 400.0 (4.0x) | 30.0 (4.0x) | 400.0 (4.0x) "
                        "| 30.0 (4.0x) |")
    assert lines[3] == "| sampling | 0.5 | 0.5 | 0.5 | 0.5 |"
    assert lines[4] == "| whole step | 500.0 | 40.0 | 500.0 | 40.0 |"
    assert "120 GFLOP/s" in lines[-1] and "9.5 GB/s" in lines[-1] and "(1 thread)" in lines[-1]
    data["ops"]["peak"]["2"] = {"gflops": 230.0, "gbs": 14.0}
    for m in ("tiny", "dense-92m"):
        data["ops"]["models"][m]["2"] = model
    two = bench_table.ops_table(data, threads="2").splitlines()[-1]
    assert "230 GFLOP/s" in two and "14.0 GB/s" in two and "(2 threads)" in two


def test_ops_summary_names_the_gemm_share_and_the_next_classes():
    """The sentence under the op table quotes the JSON: GEMM milliseconds of each step over the
    step's wall time with the multiple of their floor, then the decode step's two largest other
    classes, largest first, a floor multiple only where the class has a floor."""
    def step(gemm, wall, other):
        ms = {"linear (GEMM)": gemm, **other}
        return dict(step=0, num_tokens=256, num_seqs=6, wall_ms=wall, ms=ms,
                    floor_ms={"linear (GEMM)": gemm / 2, "RoPE": 1.0})
    model = {"prefill": step(300.0, 400.0, {"RoPE": 3.0, "sampling": 1.0}),
             "decode": step(50.0, 80.0, {"RoPE": 4.0, "sampling": 9.0, "Python": 2.0})}
    data = {"ops": {"models": {"dense-92m": {"1": model}}}}
    s = bench_table.ops_summary(data)
    assert "300 of the prefill step's 400 ms (2.0x their floor)" in s
    assert "50 of the decode step's 80 ms (2.0x their floor)" in s
    assert s.endswith("are sampling at 9.0 ms and RoPE at 4.0 ms (4.0x its floor).")
    assert "Python" not in s
