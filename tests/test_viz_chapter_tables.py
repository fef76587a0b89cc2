"""The formatting helpers chapters 05 and 06 call instead of building rows in their cells:
serving workloads, steps, batching, packing and preemptions; the diagram's
arrow actions; the logit lens as a sentence and as tables.

Every input is small and made here (hand-built StepRecords, engines as plain namespaces, lens
tensors whose softmax is known), and every expected value is written out from the helpers'
docstrings, not read from their output.
"""
from types import SimpleNamespace

import pytest
import torch

from tokenflow.serving.engine import StepRecord
from tokenflow.viz import (
    arrow_actions_table,
    batching_table,
    batching_times_table,
    logit_lens_answers,
    logit_lens_compare,
    logit_lens_summary,
    packing_summary,
    packing_table,
    parse_mermaid,
    preemption_report,
    step_table,
    workload_summary,
)


def step(index, prefill=(), decode=(), preempted=(), tokens=0, seconds=0.0, free=0,
         positions=None):
    return StepRecord(index, list(prefill), list(decode), list(preempted), tokens, seconds, free,
                      tokens if positions is None else positions)


class Tok:
    """id -> "t<id>"; decode joins "<id>," so the tail of a prompt is easy to predict."""

    def id_to_token(self, i):
        return f"t{i}"

    def decode(self, ids):
        return "".join(f"{i}," for i in ids)


# --------------------------------------------------------------------- workload_summary
def test_workload_summary_lines():
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11]]
    params = [SimpleNamespace(max_new_tokens=n) for n in (4, 2, 9)]
    text = workload_summary(Tok(), prompts, params, [0, 2, 5], examples=(1,), tail_chars=7)
    assert text.splitlines() == [
        "request 1: 7 prompt tokens, 2 new, arrives at step 2",
        "   ...8,9,10,",                                      # the last 7 characters
        "prompt tokens 1-7 (total 11), new tokens 2-9 (total 15)",
        "arrival steps 0-5: [0, 2, 5]"]                       # all listed: no " ..."


def test_workload_summary_cuts_the_arrivals_with_dots():
    prompts = [[1]] * 4
    params = [SimpleNamespace(max_new_tokens=1)] * 4
    last = workload_summary(Tok(), prompts, params, [0, 1, 1, 3], examples=(),
                            max_arrivals=2).splitlines()[-1]
    assert last == "arrival steps 0-3: [0, 1] ..."


def test_workload_summary_rejects_bad_input():
    p = [SimpleNamespace(max_new_tokens=1)]
    with pytest.raises(ValueError, match="one length"):
        workload_summary(Tok(), [[1], [2]], p, [0, 0])
    with pytest.raises(ValueError, match="examples"):
        workload_summary(Tok(), [[1]], p, [0], examples=(3,))
    with pytest.raises(ValueError, match="tail_chars"):
        workload_summary(Tok(), [[1]], p, [0], examples=(0,), tail_chars=0)


# --------------------------------------------------------------------- step_table
def test_step_table_rows_and_html():
    t = step_table([step(3, prefill=[(0, 12), ("a<b", 4)], decode=[1, 2], tokens=18, free=7),
                    step(4, decode=[1], tokens=1, free=6)], title="two steps")
    assert t.headers == ["step", "prefill (request: tokens)", "decode rows", "tokens",
                         "free blocks"]
    text = t.to_text().splitlines()
    assert text[0] == "two steps"
    cells = [line.split() for line in text[3:]]
    assert cells[0] == ["3", "0:12,", "a<b:4", "2", "18", "7"]
    assert cells[1] == ["4", "-", "1", "1", "6"]               # no prompt chunk: "-"
    html = t._repr_html_()
    assert "0:12, a&lt;b:4" in html and "a<b" not in html
    with pytest.raises(ValueError, match="non-empty"):
        step_table([])


# --------------------------------------------------------------------- batching tables
def engine(steps, outputs):
    return SimpleNamespace(steps=steps, outputs={i: SimpleNamespace(output_token_ids=o)
                                                 for i, o in enumerate(outputs)})


def test_batching_table_counts():
    eng = engine([step(0, prefill=[(0, 5)]), step(1, decode=[0, 1]), step(2, decode=[0, 1]),
                  step(3, decode=[1])], outputs=[[7, 7], [7, 7, 7, 7]])
    timelines = [SimpleNamespace(ttft_steps=1), SimpleNamespace(ttft_steps=4),
                 SimpleNamespace(ttft_steps=None)]                # never produced a token
    t = batching_table({"mine": (eng, timelines)})
    assert t.headers == ["batching", "steps", "tokens per step", "decode rows per step",
                         "mean TTFT (steps)"]
    # 6 tokens / 4 steps; 5 decode rows / 3 decoding steps; TTFT (1 + 4) / 2
    assert [t.cell_text(0, j) for j in range(5)] == ["mine", "4", "1.50", "1.67", "2.5"]
    none = batching_table({"x": (eng, [SimpleNamespace(ttft_steps=None)])})
    assert none.cell_text(0, 4) == ""
    with pytest.raises(ValueError, match="no decode step"):
        batching_table({"y": (engine([step(0, prefill=[(0, 3)])], [[1]]), [])})
    with pytest.raises(ValueError, match="at least one"):
        batching_table({})


def test_batching_times_table_units():
    t = batching_times_table({
        "fast": {"throughput_tok_s": 1234.6, "mean_ttft_s": 0.01234, "mean_e2e_s": 0.25},
        "none": {"throughput_tok_s": 7.0, "mean_ttft_s": None, "mean_e2e_s": None}})
    assert t.headers == ["batching", "tokens/s", "mean TTFT ms", "mean end-to-end ms"]
    assert [t.cell_text(0, j) for j in range(4)] == ["fast", "1,235", "12.3", "250.0"]
    assert [t.cell_text(1, j) for j in range(4)] == ["none", "7", "", ""]
    with pytest.raises(ValueError, match="mean_e2e_s"):
        batching_times_table({"a": {"throughput_tok_s": 1.0, "mean_ttft_s": 1.0}})


# --------------------------------------------------------------------- packing
def packing_runs():
    """Two workloads: "w" with a prompt-chunk step and a decode-only step, "v" with one
    step of each; padded runs compute more positions than the tokens they schedule, and v's
    padded run counts another number of scheduled tokens (12) than its packed run (11)."""
    return {
        ("w", "padded"): engine([step(0, prefill=[(0, 4)], decode=[1], tokens=5, seconds=0.3,
                                      positions=12),
                                 step(1, decode=[0, 1], tokens=2, seconds=0.1)], []),
        ("w", "paged"): engine([step(0, prefill=[(0, 4)], decode=[1], tokens=5, seconds=0.1),
                                step(1, decode=[0, 1], tokens=2, seconds=0.1)], []),
        ("v", "padded"): engine([step(0, prefill=[(0, 10)], tokens=10, seconds=0.5,
                                      positions=30),
                                 step(1, decode=[0], tokens=2, seconds=0.05, positions=1)], []),
        ("v", "paged"): engine([step(0, prefill=[(0, 10)], tokens=10, seconds=0.2),
                                step(1, decode=[0], tokens=1, seconds=0.05)], [])}


def test_packing_table_rows():
    t = packing_table(packing_runs())
    assert t.headers == ["workload", "layout", "tokens", "positions", "per token", "ms",
                         "ms: chunk steps", "ms: decode-only"]
    text = [[t.cell_text(i, j) for j in range(8)] for i in range(4)]
    assert text == [["w", "padded", "7", "14", "2.00", "400", "300", "100"],
                    ["w", "packed", "7", "7", "1.00", "200", "100", "100"],
                    ["v", "padded", "11", "31", "2.82", "550", "500", "50"],   # packed run's 11
                    ["v", "packed", "11", "11", "1.00", "250", "200", "50"]]
    assert t.align == ["<", "<", ">", ">", ">", ">", ">", ">"]


def test_packing_summary_text():
    text = packing_summary(packing_runs(), labels={"w": "the small one"})
    # padded positions per token of the padded run itself: 14 / 7 and 31 / 12
    assert text == ("Padding computed 2.0x the scheduled tokens on the small one and 2.6x on "
                    "v; packing computes 1.00x. Time, padded / packed: 2.00x on the small one, "
                    "2.20x on v. Steps that carry a prompt chunk alone: 3.00x and 2.50x.")


def test_packing_rejects_a_missing_layout():
    runs = packing_runs()
    del runs["v", "paged"]
    with pytest.raises(ValueError, match="missing"):
        packing_table(runs)
    runs = packing_runs()
    runs["w", "contiguous"] = runs["w", "paged"]
    with pytest.raises(ValueError, match="nothing else"):
        packing_summary(runs)


# --------------------------------------------------------------------- preemption_report
def test_preemption_report_lines():
    steps = [step(0, prefill=[(0, 5), (1, 3), (2, 2)]),
             step(1, decode=[0, 1, 2], preempted=[1]),
             step(2, decode=[0], preempted=[0, 2]),
             step(3, prefill=[(1, 6)]),
             step(4, decode=[0])]                      # back as a decode row: 1 token
    prompts = [[9] * 5, [9] * 3, [9] * 2]
    assert preemption_report(steps, prompts).splitlines() == [
        "step 1: request 1 preempted (its blocks freed)",
        "step 3: admitted again, 6 tokens recomputed (prompt 3 + the tokens it had generated)",
        "step 2: request 0 preempted (its blocks freed)",
        "step 4: admitted again, 1 tokens recomputed (prompt 5 + the tokens it had generated)",
        "step 2: request 2 preempted (its blocks freed)",
        "no later step admitted it again"]
    assert preemption_report(steps[:1], prompts) == "no request was preempted"
    with pytest.raises(ValueError, match="does not index"):
        preemption_report(steps, prompts[:1])


# --------------------------------------------------------------------- arrow_actions_table
DIAGRAM = """flowchart TD
  a["box A<br/>second line"]
  b["box B"]
  c["box C"]
  a -->|"go"| b
  b -->|"back"| a
  b -->|"on"| c
  c -->|"twice"| a
  a -->|"twice"| c
  linkStyle 0 stroke:#3B7DD8,stroke-width:2px
  linkStyle 1 stroke:#123456
"""


def test_arrow_actions_table_names_boxes_and_colours():
    d = parse_mermaid(DIAGRAM)
    t = arrow_actions_table(d, ["on", "go", "back"])
    assert t.headers == ["arrow action", "from", "to", "colour"]
    assert t.rows == [["on", "box B", "box C", ""],             # no linkStyle
                      ["go", "box A", "box B", "blue"],          # the book's blue, any case
                      ["back", "box B", "box A", "#123456"]]     # another colour, as written
    with pytest.raises(ValueError, match="exactly one arrow, found 2"):
        arrow_actions_table(d, ["twice"])
    with pytest.raises(ValueError, match="found 0"):
        arrow_actions_table(d, ["fly"])


# --------------------------------------------------------------------- logit lens helpers
def lens_from_probs(probs):
    """``[L+1, 1, S, V]`` logits whose softmax over V is ``probs`` exactly (log-probs)."""
    return torch.tensor(probs, dtype=torch.float32).log()[:, None]


# depth x position x vocab; at position 1 token 2 leads from depth 1 on
PROBS = [[[0.7, 0.1, 0.1, 0.1], [0.1, 0.2, 0.3, 0.4]],
         [[0.7, 0.1, 0.1, 0.1], [0.1, 0.1, 0.7, 0.1]],
         [[0.1, 0.6, 0.2, 0.1], [0.05, 0.05, 0.8, 0.1]]]


def test_logit_lens_summary_sentence():
    lens = lens_from_probs(PROBS)
    assert logit_lens_summary(lens, Tok(), 2) == (
        "t2 is the top token from depth 1 (after block 0) on, at every deeper layer too; its "
        "probability goes 0.3000 -> 0.7000 -> 0.8000. The largest step is block 0 "
        "(0.3000 -> 0.7000).")
    assert logit_lens_summary(lens, Tok(), 3).startswith(
        "t3 is not the top token at the last depth; its probability goes 0.4000 -> 0.1000")
    # position 0: token 1 leads only at the last depth, its largest step is block 1
    assert logit_lens_summary(lens, Tok(), 1, position=0) == (
        "t1 is the top token from depth 2 (after block 1) on, at every deeper layer too; its "
        "probability goes 0.1000 -> 0.1000 -> 0.6000. The largest step is block 1 "
        "(0.1000 -> 0.6000).")
    with pytest.raises(ValueError, match="token_id"):
        logit_lens_summary(lens, Tok(), 4)
    with pytest.raises(ValueError, match="position"):
        logit_lens_summary(lens, Tok(), 1, position=2)


def test_logit_lens_compare_table():
    lens = lens_from_probs(PROBS)
    other_probs = [PROBS[0], PROBS[1], [[0.1, 0.6, 0.2, 0.1], [0.0005, 0.0995, 0.8, 0.1]]]
    other = lens_from_probs(other_probs)
    t = logit_lens_compare(lens, other, Tok(), 0, names=("A<1>", "B"))
    assert t.headers == ["depth", "reads", "identical readings", "p(t0) A<1>", "p(t0) B"]
    assert t.title == "A<1> vs B, last position"
    text = [[t.cell_text(i, j) for j in range(5)] for i in range(3)]
    assert text == [["0", "embedding", "True", "0.1000", "0.1000"],
                    ["1", "after block 0", "True", "0.1000", "0.1000"],
                    ["2", "after block 1", "False", "0.0500", "0.0005"]]  # 4 decimals down to 1e-4
    assert "A&lt;1&gt; vs B" in t._repr_html_()
    assert logit_lens_compare(lens, other, Tok(), 0, ("A", "B"), position=0).title == \
        "A vs B, position 0"
    with pytest.raises(ValueError, match="same L\\+1 and V"):
        logit_lens_compare(lens, lens[:2], Tok(), 0, ("A", "B"))
    with pytest.raises(ValueError, match="names"):
        logit_lens_compare(lens, other, Tok(), 0, ("A",))


def test_logit_lens_answers_table():
    lens = lens_from_probs(PROBS)
    t = logit_lens_answers(lens, Tok(), ["x", "y"])
    assert t.headers == ["position", "token", "final top", "top from depth"]
    # position 0: final top t1, first at depth 2; position 1: t2 from depth 1
    assert t.rows == [[0, "x", "t1", 2], [1, "y", "t2", 1]]
    with pytest.raises(ValueError, match="2 entries"):
        logit_lens_answers(lens, Tok(), ["x"])
