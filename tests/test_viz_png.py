"""compact_png: the stored figures as palette PNGs, same size, same picture, fewer bytes."""
from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from PIL import Image  # noqa: E402

from tokenflow.viz import static  # noqa: E402
from tokenflow.viz.style import PNG_COLORS, compact_png  # noqa: E402


def _figure_png() -> bytes:
    fig, ax = plt.subplots(figsize=(4, 2.5), dpi=100)
    ax.bar(["prefill", "decode"], [3, 1], color=["#1b9e77", "#d95f02"])
    ax.plot([0, 1], [2.5, 0.5], color="#7570b3")
    ax.set_title("北京是中国的首 -> 都")
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def _pixels(png: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(png)) as im:
        return np.asarray(im.convert("RGB"), dtype=np.int16)


def test_same_size_palette_and_smaller():
    png = _figure_png()
    small = compact_png(png)
    with Image.open(io.BytesIO(png)) as a, Image.open(io.BytesIO(small)) as b:
        assert a.size == b.size
        assert b.mode == "P" and len(b.getcolors(maxcolors=PNG_COLORS + 1)) <= PNG_COLORS
    assert len(small) < len(png)


def test_the_picture_is_kept():
    png = _figure_png()
    a, b = _pixels(png), _pixels(compact_png(png))
    diff = np.abs(a - b).max(axis=-1)
    # flat fills keep their exact colour: the bar colours and white are all still there
    for colour in [(0x1b, 0x9e, 0x77), (0xd9, 0x5f, 0x02), (255, 255, 255)]:
        assert (np.abs(b - colour).max(axis=-1) == 0).any(), colour
    assert (diff <= 8).mean() > 0.99          # antialiased edges move by a few levels at most
    assert diff.mean() < 1.0


def test_deterministic():
    png = _figure_png()
    assert compact_png(png) == compact_png(png)


def test_few_colours():
    png = _figure_png()
    with Image.open(io.BytesIO(compact_png(png, colors=4))) as im:
        assert len(im.getcolors()) <= 4


@pytest.mark.parametrize("png, colors, match", [
    (b"GIF89a...", 256, "PNG"),
    ("not bytes", 256, "PNG"),
    (None, 256, "PNG"),
    (b"\x89PNG\r\n\x1a\n", 1, "colors"),
    (b"\x89PNG\r\n\x1a\n", 257, "colors"),
    (b"\x89PNG\r\n\x1a\n", True, "colors"),
])
def test_rejects_bad_input(png, colors, match):
    with pytest.raises(ValueError, match=match):
        compact_png(png, colors)


def test_explorer_figures_are_compacted():
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot([0, 1], [0, 1])
    html = static._figure_html(fig, "png")
    import base64
    import re
    data = base64.b64decode(re.search(r'base64,([^"]+)"', html).group(1))
    with Image.open(io.BytesIO(data)) as im:
        assert im.mode == "P"
        assert f'width="{im.size[0] // 2}"' in html


def test_no_dithering_noise_on_a_gradient():
    """More shades than colours (a heatmap's colour bar): without dithering every column of a
    horizontal gradient stays one colour; dithering would scatter two colours through it."""
    x = np.tile(np.linspace(0, 255, 600), (40, 1))
    rgb = np.stack([x, 255 - x, np.full_like(x, 128)], axis=-1).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    px = _pixels(compact_png(buf.getvalue(), colors=16))
    assert (px == px[:1]).all()                         # every row equals the first
    assert np.abs(px - rgb.astype(np.int16)).max() <= 24   # 600 shades in 16 colours
