"""Build the fonts the book ships, as subsets of Noto Sans CJK SC (SIL Open Font License 1.1).

Two outputs, both committed, both renamed (a modified OFL font may not keep its Reserved Font
Names) and both carrying the upstream copyright and licence in their ``name`` table:

* ``src/tokenflow/data/fonts/TokenflowSans-{Regular,Bold}.ttf``: what every figure draws with
  (``tokenflow.viz.fonts`` registers them with matplotlib at import). Latin, Greek, arrows,
  maths and punctuation blocks, plus every other character the figures can show: the corpus,
  the tokenizer's vocabulary (decoded, and its byte-level alphabet), the notebooks (sources and
  stored outputs) and the package's source. TrueType outlines (converted from CFF with
  fontTools' cu2qu), so matplotlib can embed them in any backend.
* ``src/tokenflow/data/fonts/TokenflowSansFallback-{Regular,Bold}.ttf``: the few characters
  Noto Sans CJK lacks (most of Latin Extended-A, which byte-level BPE's alphabet uses, U+FFFD,
  modifier letters), taken from the DejaVu Sans that matplotlib ships (Bitstream Vera licence,
  DejaVu changes in the public domain: ``LICENSE_DEJAVU``); matplotlib falls back to it per glyph.
* ``src/tokenflow/data/fonts/TokenflowCJK-zh.woff2``: the book's web font, only the CJK glyphs
  its pages use (the zh catalogs, book pages, notebooks: the English edition's Chinese examples
  as well as the Chinese edition); ``scripts/tokenflow_i18n.py`` serves it in both editions
  (inline, so ``file://`` pages load it too), ``tokenflow.viz.notebook_css`` in JupyterLab.
* ``src/tokenflow/data/fonts/TokenflowEmoji.woff2``: the few characters beyond the Basic
  Multilingual Plane the pages show (chapter 1's emoji), a subset of Noto Color Emoji (SIL Open
  Font License 1.1, Debian's ``fonts-noto-color-emoji``), colour bitmaps (CBDT).

``tests/test_fonts.py`` fails when a character appears in the book that a font lacks; then
rerun this script. It needs the Noto Sans CJK collection (Debian's ``fonts-noto-cjk``; the
script fetches the .deb with ``apt-get download`` and unpacks it without installing anything)
and ``brotli`` for woff2 (in requirements.txt):

    .venv/bin/python scripts/build_fonts.py [--noto-dir DIR_WITH_NotoSansCJK-Regular.ttc]
"""
from __future__ import annotations

import argparse
import glob
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FONT_DIR = ROOT / "src" / "tokenflow" / "data" / "fonts"
FAMILY = "Tokenflow Sans"            # the figures' font (matplotlib)
FALLBACK_FAMILY = "Tokenflow Sans Fallback"   # glyphs Noto Sans CJK lacks, from DejaVu Sans
WEB_FAMILY = "Tokenflow CJK"         # the Chinese edition's web font
WEB_FONT = FONT_DIR / "TokenflowCJK-zh.woff2"
SC_INDEX_NAME = "Noto Sans CJK SC"   # the face taken from the .ttc collection

# Blocks kept whole in the figure font (code point ranges, inclusive).
FIGURE_RANGES = [
    (0x20, 0x7E),        # ASCII
    (0xA0, 0x17F),       # Latin-1 supplement, Latin Extended-A (byte-level BPE's alphabet)
    (0x391, 0x3C9),      # Greek
    (0x2010, 0x205E),    # general punctuation (dashes, quotes, ellipsis, prime)
    (0x2070, 0x209F),    # super- and subscripts
    (0x2190, 0x21FF),    # arrows
    (0x2200, 0x22FF),    # mathematical operators
    (0x2500, 0x257F),    # box drawing
    (0x25A0, 0x25FF),    # geometric shapes
    (0x3000, 0x303F),    # CJK symbols and punctuation
    (0xFF01, 0xFF5E),    # full-width forms
    (0xFFFD, 0xFFFD),    # replacement character (a token that is part of a UTF-8 sequence)
]
# What the web font covers (its CSS unicode-range): CJK only, Latin stays the theme's font.
WEB_RANGES = [(0x2E80, 0x9FFF), (0xF900, 0xFAFF), (0xFE30, 0xFE4F), (0xFF00, 0xFFEF)]
EMOJI_FAMILY = "Tokenflow Emoji"     # the pages' characters beyond the BMP (chapter 1's emoji)
EMOJI_FONT = FONT_DIR / "TokenflowEmoji.woff2"
EMOJI_RANGES = [(0x1F000, 0x1FAFF)]


def _in(ranges, ch: str) -> bool:
    return any(a <= ord(ch) <= b for a, b in ranges)


def _text_of(paths) -> str:
    return "".join(Path(p).read_text(encoding="utf-8") for p in paths)


def figure_characters(root: Path = ROOT) -> set[str]:
    """Every character a figure of the book can draw, beyond :data:`FIGURE_RANGES`: the
    corpus, the tokenizer's decoded vocabulary and byte-level alphabet, the notebooks (sources
    and stored outputs) and the package's Python source, except ``check.py`` (the laptop
    preflight, whose Chinese messages go to a terminal, never into a figure). Control
    characters are dropped."""
    src = root / "src" / "tokenflow"
    text = _text_of([src / "data" / "corpus.txt"])
    text += _text_of(sorted(glob.glob(str(root / "notebooks" / "*.ipynb"))))
    text += _text_of(sorted(glob.glob(str(root / "notebooks" / "zh" / "*.ipynb"))))
    text += _text_of(sorted(p for p in glob.glob(str(src / "**" / "*.py"), recursive=True)
                            if Path(p) != src / "check.py"))
    text += _text_of([src / "data" / "outputs_zh.json"])   # tokenflow.viz.lang's Chinese
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(src / "data" / "tokenizer.json"))
    text += "".join(tok.decode([i]) for i in range(tok.get_vocab_size()))
    text += "".join(tok.get_vocab())
    # printable characters of the Basic Multilingual Plane (an emoji in a chapter's example text
    # is printed, never drawn: a figure shows its byte-level pieces, U+FFFD)
    return {c for c in set(text) if c.isprintable() and ord(c) <= 0xFFFF}


def _theme_messages() -> str:
    """The Chinese interface strings of Sphinx and the themes (search page, light / dark mode,
    navigation, admonition titles): their zh_CN catalogs and Sphinx's zh_CN search script."""
    import importlib.util
    from babel.messages.mofile import read_mo
    text = []
    for package in ("sphinx", "sphinx_book_theme", "pydata_sphinx_theme"):
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.origin:
            continue
        base = Path(spec.origin).parent
        for path in sorted(base.rglob("*")):
            if "zh" not in path.parts and not any(p.startswith("zh_") for p in path.parts):
                continue
            if path.suffix in (".po", ".js"):
                text.append(path.read_text(encoding="utf-8"))
            elif path.suffix == ".mo" and not path.with_suffix(".po").exists():
                with path.open("rb") as f:
                    text.extend(str(m.string) for m in read_mo(f) if m.string)
    return "".join(text)


def web_characters(root: Path = ROOT) -> set[str]:
    """The CJK characters (:data:`WEB_RANGES`) the Chinese edition's pages can show: its
    catalogs, the book's pages, the notebooks (whose code and outputs are not translated), the
    model page's Chinese text (``tokenflow/data/model_page.js``, stored in the notebook as
    ``\\u`` escapes), the figure scroll hint of ``scripts/book_html.py`` and the Chinese
    interface strings of Sphinx and the themes."""
    paths = sorted(glob.glob(str(root / "locale" / "zh_CN" / "**" / "*.po"), recursive=True))
    paths += sorted(glob.glob(str(root / "book" / "*.md")))
    paths += sorted(glob.glob(str(root / "notebooks" / "*.ipynb")))
    paths += sorted(glob.glob(str(root / "notebooks" / "zh" / "*.ipynb")))
    paths += [root / "_config.yml", root / "_toc.yml", root / "scripts" / "tokenflow_i18n.py"]
    paths += [root / "scripts" / "book_html.py"]                      # the figure scroll hint
    paths += [root / "src" / "tokenflow" / "data" / "model_page.js"]   # its zh text, escaped
    text = _text_of(p for p in paths if Path(p).exists()) + _theme_messages()
    text += "".join(figure_characters(root))
    return {c for c in set(text) if _in(WEB_RANGES, c)}


def emoji_characters(root: Path = ROOT) -> set[str]:
    """The emoji (:data:`EMOJI_RANGES`) the pages can show: the same sources as
    :func:`web_characters`."""
    paths = sorted(glob.glob(str(root / "locale" / "zh_CN" / "**" / "*.po"), recursive=True))
    paths += sorted(glob.glob(str(root / "book" / "*.md")))
    paths += sorted(glob.glob(str(root / "notebooks" / "*.ipynb")))
    return {c for c in set(_text_of(paths)) if _in(EMOJI_RANGES, c)}


def _noto_dir(given: str | None) -> Path:
    if given:
        return Path(given)
    tmp = Path(tempfile.mkdtemp(prefix="noto-cjk-"))
    subprocess.run(["apt-get", "download", "fonts-noto-cjk", "fonts-noto-color-emoji"],
                   cwd=tmp, check=True)
    for deb in tmp.glob("fonts-noto-*.deb"):
        subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp / "x")], check=True)
    return tmp / "x" / "usr" / "share" / "fonts" / "opentype" / "noto"


def _emoji_file(noto_dir: Path) -> Path:
    """NotoColorEmoji.ttf next to the CJK collection or where Debian's package puts it."""
    for path in (noto_dir / "NotoColorEmoji.ttf",
                 noto_dir.parents[1] / "truetype" / "noto" / "NotoColorEmoji.ttf"):
        if path.is_file():
            return path
    raise FileNotFoundError(f"no NotoColorEmoji.ttf near {noto_dir} (fonts-noto-color-emoji)")


def _sc_face(ttc: Path):
    from fontTools.ttLib import TTCollection
    for font in TTCollection(str(ttc)).fonts:
        if font["name"].getDebugName(4) in (SC_INDEX_NAME, f"{SC_INDEX_NAME} Bold"):
            return font
    raise ValueError(f"{ttc} has no {SC_INDEX_NAME!r} face")


def _subset(font, chars: set[str]):
    from fontTools import subset
    opts = subset.Options()
    opts.layout_features = ["kern", "liga", "vert", "ccmp", "locl"]
    opts.name_IDs = ["*"]
    opts.notdef_outline = True
    opts.hinting = False
    opts.desubroutinize = True
    sub = subset.Subsetter(opts)
    sub.populate(unicodes=sorted(ord(c) for c in chars))
    sub.subset(font)
    font.recalcTimestamp = False      # keep the upstream dates: the same input, the same bytes
    return font


def _rename(font, family: str, style: str, source: str = SC_INDEX_NAME) -> None:
    """New family name (OFL: no Reserved Font Name in a modified version); copyright (0),
    licence (13, 14) and a description of the derivation stay/are added."""
    name = font["name"]
    upstream = name.getDebugName(5) or ""
    full = f"{family} {style}" if style != "Regular" else family
    ps = f"{family.replace(' ', '')}-{style}"
    for nid in (1, 2, 3, 4, 6, 16, 17, 21, 22):
        name.removeNames(nameID=nid)
    for nid, value in {1: family, 2: style, 3: f"{ps};tokenflow subset", 4: full, 6: ps,
                       10: f"Subset of {source} ({upstream}) for the tokenflow book, "
                           "made by scripts/build_fonts.py"}.items():
        name.setName(value, nid, 3, 1, 0x409)
        name.setName(value, nid, 1, 0, 0)
    if "CFF " in font:
        cff = font["CFF "].cff
        cff.fontNames = [ps]
        top = cff.topDictIndex[0]
        top.FullName, top.FamilyName = full, family


def _cff_to_glyf(font) -> None:
    """Replace CFF outlines by TrueType quadratic ones (fontTools' otf2ttf recipe)."""
    from fontTools.pens.cu2quPen import Cu2QuPen
    from fontTools.pens.ttGlyphPen import TTGlyphPen
    from fontTools.ttLib import newTable
    order = font.getGlyphOrder()
    gs = font.getGlyphSet()
    glyf = newTable("glyf")
    glyf.glyphOrder = order
    glyf.glyphs = {}
    for g in order:
        pen = TTGlyphPen(gs)
        gs[g].draw(Cu2QuPen(pen, max_err=1.0, reverse_direction=True))
        glyf.glyphs[g] = pen.glyph()
    del font["CFF "]
    if "VORG" in font:
        del font["VORG"]
    font["glyf"] = glyf
    font["loca"] = newTable("loca")
    font["maxp"].tableVersion = 0x00010000
    for attr in ("maxZones", "maxTwilightPoints", "maxStorage", "maxFunctionDefs",
                 "maxInstructionDefs", "maxStackElements", "maxSizeOfInstructions",
                 "maxComponentElements"):
        setattr(font["maxp"], attr, 0)
    font["maxp"].maxZones = 1
    font["head"].glyphDataFormat = 0
    post = font["post"]
    post.formatType, post.extraNames, post.mapping = 2.0, [], {}
    post.glyphOrder = order
    font.sfntVersion = "\x00\x01\x00\x00"
    font.recalcBBoxes = True


def _rename_fallback(font, style: str) -> None:
    """DejaVu subset: new names (the Bitstream Vera licence forbids "Bitstream" and "Vera" in a
    modified font's names), its copyright and licence kept."""
    name = font["name"]
    ps = f"{FALLBACK_FAMILY.replace(' ', '')}-{style}"
    full = f"{FALLBACK_FAMILY} {style}" if style != "Regular" else FALLBACK_FAMILY
    for nid in (1, 2, 3, 4, 6, 16, 17, 21, 22):
        name.removeNames(nameID=nid)
    for nid, value in {1: FALLBACK_FAMILY, 2: style, 3: f"{ps};tokenflow subset", 4: full,
                       6: ps, 10: "Subset of DejaVu Sans (as shipped with matplotlib) for the "
                                  "tokenflow book, made by scripts/build_fonts.py"}.items():
        name.setName(value, nid, 3, 1, 0x409)
        name.setName(value, nid, 1, 0, 0)


def build(noto_dir: Path, out_dir: Path = FONT_DIR) -> list[Path]:
    """Write the figure fonts (Regular, Bold), their DejaVu fallback and the web font into
    ``out_dir``."""
    import shutil

    import matplotlib
    from fontTools.ttLib import TTFont
    out_dir.mkdir(parents=True, exist_ok=True)
    figure = figure_characters() | {chr(c) for a, b in FIGURE_RANGES for c in range(a, b + 1)}
    dejavu = Path(matplotlib.get_data_path(), "fonts", "ttf")
    written = []
    for style in ("Regular", "Bold"):
        font = _subset(_sc_face(noto_dir / f"NotoSansCJK-{style}.ttc"), figure)
        covered = set(font.getBestCmap())
        _rename(font, FAMILY, style)
        _cff_to_glyf(font)
        path = out_dir / f"TokenflowSans-{style}.ttf"
        font.save(str(path))
        written.append(path)
        rest = {c for c in figure if ord(c) not in covered}
        src = dejavu / ("DejaVuSans.ttf" if style == "Regular" else "DejaVuSans-Bold.ttf")
        fallback = TTFont(str(src))
        rest = {c for c in rest if ord(c) in fallback.getBestCmap()}
        fallback = _subset(fallback, rest | {" "})
        _rename_fallback(fallback, style)
        path = out_dir / f"TokenflowSansFallback-{style}.ttf"
        fallback.save(str(path))
        written.append(path)
    shutil.copyfile(dejavu / "LICENSE_DEJAVU", out_dir / "LICENSE_DEJAVU")
    web = _subset(_sc_face(noto_dir / "NotoSansCJK-Regular.ttc"), web_characters())
    _rename(web, WEB_FAMILY, "Regular")
    web.flavor = "woff2"
    web.save(str(WEB_FONT if out_dir == FONT_DIR else out_dir / WEB_FONT.name))
    written.append(out_dir / WEB_FONT.name)
    emoji = _subset(TTFont(str(_emoji_file(noto_dir))), emoji_characters())
    _rename(emoji, EMOJI_FAMILY, "Regular", source="Noto Color Emoji")
    emoji.flavor = "woff2"
    emoji.save(str(EMOJI_FONT if out_dir == FONT_DIR else out_dir / EMOJI_FONT.name))
    written.append(out_dir / EMOJI_FONT.name)
    for p in written:
        print(f"{p.relative_to(ROOT) if p.is_relative_to(ROOT) else p}: {p.stat().st_size:,} bytes")
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--noto-dir", help="folder with NotoSansCJK-{Regular,Bold}.ttc "
                        "(default: apt-get download fonts-noto-cjk into a temporary folder)")
    args = parser.parse_args(argv)
    build(_noto_dir(args.noto_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
