"""The recap figure (issue 26 item 14): one box per stage in the book's colours, every number
given to it printed, bad input refused."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot  # noqa: E402
import pytest  # noqa: E402
from matplotlib.patches import FancyBboxPatch  # noqa: E402

from tokenflow import COLORS  # noqa: E402
from tokenflow.viz import line_figure  # noqa: E402


def test_line_figure_draws_every_stage_and_number():
    stages = [("token ids", "hidden", "5 ids", "V = 129,280"),
              ("MoE", "moe", "2 of 8", "8 of 256"), ("sampling", "token", "都", "")]
    fig = line_figure(stages, title="t")
    boxes = [p for p in fig.axes[0].patches if isinstance(p, FancyBboxPatch)]
    assert len(boxes) == 3
    want = [matplotlib.colors.to_rgba(COLORS[k], 0.9) for _, k, _, _ in stages]
    assert [tuple(round(c, 3) for c in b.get_facecolor()) for b in boxes] == \
        [tuple(round(c, 3) for c in w) for w in want]
    texts = {t.get_text() for t in fig.axes[0].texts}
    matplotlib.pyplot.close(fig)                        # leave no figure for later tests
    assert {"5 ids", "V = 129,280", "2 of 8", "8 of 256", "都", "token ids"} <= texts
    with pytest.raises(ValueError, match="kind"):
        line_figure([("x", "red", "", "")])
    with pytest.raises(ValueError, match="empty"):
        line_figure([])
