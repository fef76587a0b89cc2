"""Formatting helpers, in one place: display width of Chinese text, padding, byte sizes,
wrapped sentences, tables that render as HTML in the book and as aligned text in a terminal, and
agreement claims (:func:`agree`: "equal within 1e-6: True" instead of last-bit digits).

Nothing here imports torch or matplotlib, so any module may use it. The old names stay
importable: ``tokenflow.viz.fmt.pad`` / ``display_width``, ``tokenflow.viz.fmt.format_bytes``,
``tokenflow.viz.say``.
"""
from __future__ import annotations

import html
import numbers
import re
import unicodedata

from .lang import tr

_IMPORTED = set(globals())          # the names above are imported, not defined here


def display_width(text: str) -> int:
    """Columns ``text`` takes in a monospace terminal: East Asian wide and full-width
    characters (北, 京, ...) take 2, others 1 (Unicode UAX #11 ``east_asian_width``)."""
    return sum(2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1 for ch in str(text))


def pad(text, width: int, align: str = "<") -> str:
    """Pad ``text`` to ``width`` display columns (see :func:`display_width`), so tables with
    Chinese tokens line up. ``align``: ``"<"`` left, ``">"`` right.

    Raises:
        ValueError: if ``align`` is not ``"<"`` or ``">"``.
    """
    if align not in ("<", ">"):
        raise ValueError(f"align must be '<' or '>', got {align!r}")
    text = str(text)
    fill = " " * max(0, width - display_width(text))
    return text + fill if align == "<" else fill + text


_NO_BREAK_BEFORE = set("，。、；：！？）」』】》〉”’…,.;:!?)%")
_NO_BREAK_AFTER = set("（「『【《〈“‘(")


def _pieces(text: str) -> list[tuple[str, bool]]:
    """``text`` cut where a line may break: at spaces (``True``: a space goes before the
    piece) and next to a wide character, as Chinese text breaks between characters, except
    before closing and after opening punctuation (``False``: glued on without a space)."""
    out = []
    for word in text.split():
        start = 0
        for i in range(1, len(word)):
            a, b = word[i - 1], word[i]
            if ((display_width(a) == 2 or display_width(b) == 2) and b not in _NO_BREAK_BEFORE
                    and a not in _NO_BREAK_AFTER):
                out.append((word[start:i], start == 0))
                start = i
        out.append((word[start:], start == 0))
    return out


def fold(text, width: int = 90, indent: str = "") -> list[str]:
    """``text`` in lines of at most ``width`` display columns (:func:`display_width`); lines
    after the first start with ``indent``. A str breaks at its spaces and between Chinese
    characters (not before ``，`` or ``。``); a list of strings breaks only between its
    entries, joined by one space. A piece wider than a line is cut.

    Raises:
        ValueError: if ``width`` leaves fewer than 10 columns after ``indent``.
    """
    if width - display_width(indent) < 10:
        raise ValueError(f"width must leave >= 10 columns after the indent, got width={width}, "
                         f"indent of {display_width(indent)}")
    pieces = _pieces(text) if isinstance(text, str) else [(str(w), True) for w in text]
    lines, line = [], ""
    for piece, spaced in pieces:
        candidate = line + (" " if spaced and line.strip() else "") + piece
        if not line:
            candidate = (indent if lines else "") + piece
        if display_width(candidate) <= width:
            line = candidate
            continue
        if line.strip():
            lines.append(line)
        head = indent if lines else ""
        for ch in piece:                   # a piece wider than a line, cut into lines
            if display_width(head + ch) > width:
                lines.append(head)
                head = indent
            head += ch
        line = head
    if line.strip() or not lines:
        lines.append(line)
    return lines


def format_bytes(n: float) -> str:
    """``n`` bytes in binary units with 2 decimals, e.g. ``131072 -> "128.00 KiB"``.

    Raises:
        ValueError: if ``n`` is negative or not a number.
    """
    if isinstance(n, bool) or not isinstance(n, (int, float)) or n < 0:
        raise ValueError(f"n must be a number of bytes >= 0, got {n!r}")
    units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]
    x, i = float(n), 0
    while x >= 1024 and i < len(units) - 1:
        x, i = x / 1024, i + 1
    return f"{int(n)} B" if i == 0 else f"{x:.2f} {units[i]}"


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and ``noun`` in agreement: ``counted(1, "KV head") -> "1 KV head"``,
    ``counted(8, "KV head") -> "8 KV heads"``; ``plural`` replaces the default ``noun + "s"``.

    Raises:
        ValueError: if ``n`` is not an integer >= 0.
    """
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
        raise ValueError(f"n must be an integer >= 0, got {n!r}")
    return f"{n:,} {noun if n == 1 else (plural or noun + 's')}"


def say(text: str, width: int = 88) -> None:
    """Print ``text`` wrapped to ``width`` columns, continuation lines indented under the
    first word (so "1. ..." items stay readable on a book page, ~90 columns, without
    side-scrolling). Columns are counted as a terminal shows them (:func:`display_width`: a
    Chinese character takes two); Chinese text breaks between characters (:func:`fold`).

    Raises:
        ValueError: if ``width < 20``.
    """
    if width < 20:
        raise ValueError(f"width must be >= 20, got {width}")
    text = tr(text)
    m = re.match(r"(\d+\.|-)\s", text)
    print("\n".join(fold(text, width, " " * (len(m.group(0)) if m else 0))))


# --------------------------------------------------------------------- Table
def _is_number(x) -> bool:
    return isinstance(x, numbers.Number) and not isinstance(x, bool)


def _per_column(value, n: int, name: str) -> list:
    """``value`` for each of ``n`` columns: one value for all (``None``, an int, or a
    one-character string), or a sequence (or string) of ``n`` entries."""
    if value is None or isinstance(value, int) or isinstance(value, str) and len(value) == 1:
        return [value] * n
    if not isinstance(value, (str, list, tuple)):
        raise TypeError(f"{name} must be one value or a list with one per column, got {value!r}")
    value = list(value)
    if len(value) != n:
        raise ValueError(f"{name} must have one entry per column ({n}), got {len(value)}")
    return value


class Table:
    """A table that a notebook cell shows by ending with it: an HTML ``<table>`` in the book
    and JupyterLab (numbers right-aligned), aligned monospace text in ``print`` / ``repr``
    (Chinese text counted as two columns, see :func:`display_width`).

    Args:
        rows: a sequence of rows, each a sequence of cells (str, int, float, bool, None or
            anything with ``str``); ``len(headers)`` cells per row.
        headers: the column names.
        title: an optional caption (the first line of the text form).
        align: ``"<"`` (left) or ``">"`` (right) per column, as a string such as ``"<>>"`` or a
            list; ``None`` right-aligns columns whose cells are all numbers (or empty).
        digits: decimals for float cells, one int for all columns or one per column
            (``None`` entries: 2). Ints print with thousands separators (``12,288``).
        keys: how many leading columns name a row (default 1); a text form too wide for the
            page repeats them in each part (:meth:`to_text`).

    Raises:
        ValueError: if a row's length differs from ``headers``, ``align`` / ``digits``
            have the wrong length or values, or ``keys`` is not in 1..len(headers).
        TypeError: if ``digits`` is not an int (or a sequence of ints / None).
    """

    def __init__(self, rows, headers, *, title: str | None = None, align=None, digits=None,
                 keys: int = 1):
        self.headers = [tr(str(h)) for h in headers]
        n = len(self.headers)
        if n == 0:
            raise ValueError("headers must name at least one column")
        self.rows = [list(r) for r in rows]
        for i, r in enumerate(self.rows):
            if len(r) != n:
                raise ValueError(f"rows[{i}] has {len(r)} cells, headers has {n}")
        self.title = tr(title)
        self.digits = [2 if d is None else d for d in _per_column(digits, n, "digits")]
        for d in self.digits:
            if isinstance(d, bool) or not isinstance(d, int) or not 0 <= d <= 12:
                raise TypeError(f"digits must be ints in 0..12 (or None), got {digits!r}")
        if align is None:
            align = [">" if self.rows and all(_is_number(r[j]) or r[j] is None for r in self.rows)
                     else "<" for j in range(n)]
        self.align = _per_column(align, n, "align")
        if any(a not in ("<", ">") for a in self.align):
            raise ValueError(f"align entries must be '<' or '>', got {align!r}")
        if isinstance(keys, bool) or not isinstance(keys, int) or not 1 <= keys <= n:
            raise ValueError(f"keys must be an int in 1..{n} (columns that name a row), "
                             f"got {keys!r}")
        self.keys = keys

    def cell_text(self, i: int, j: int) -> str:
        """Row ``i``, column ``j`` as shown: floats rounded to the column's digits (``-0.00``
        shown as ``0.00``), ints with thousands separators, ``None`` empty."""
        x = self.rows[i][j]
        if x is None:
            return ""
        if isinstance(x, bool) or not _is_number(x):
            return tr(str(x))
        if isinstance(x, numbers.Integral):
            return f"{int(x):,}"
        d = self.digits[j]
        return f"{round(float(x), d) + 0.0:,.{d}f}"

    def _cells(self) -> list[list[str]]:
        return [[self.cell_text(i, j) for j in range(len(self.headers))]
                for i in range(len(self.rows))]

    def to_text(self, max_width: int = 90) -> str:
        """Aligned text within ``max_width`` display columns: the title (wrapped), a header, a
        dashed rule, one line per row. Columns are separated by two spaces, or one when that
        keeps the table within ``max_width``. A wider table is folded into parts of whole
        columns, one after another, each repeating the ``keys`` columns that name a row.
        Where one column is too wide even for that, each row is written as a record:
        ``header: cell`` per line, wrapped, empty cells left out.

        Raises:
            ValueError: if ``max_width < 30``.
        """
        if max_width < 30:
            raise ValueError(f"max_width must be >= 30, got {max_width}")
        body = self._cells()
        widths = [max(display_width(c) for c in col) for col in zip(self.headers, *body)]
        title = ([ln for t in self.title.split("\n") for ln in fold(t, max_width)]
                 if self.title else [])
        if sum(widths) + len(widths) - 1 <= max_width:
            return "\n".join(title + self._text_part(range(len(widths)), body, widths,
                                                      max_width))
        keys = self.keys
        parts, part = [], []
        for j in range(keys, len(widths)):
            used = sum(widths[k] + 2 for k in [*range(keys), *part, j]) - 2
            if part and used > max_width:
                parts.append(part)
                part = []
            part.append(j)
        parts.append(part)
        fits = all(sum(widths[k] + 2 for k in [*range(keys), *p]) - 2 <= max_width
                   for p in parts)
        if not fits:
            return "\n".join(title + self._text_records(body, max_width))
        lines = []
        for p in parts:
            lines += ([""] if lines else []) + self._text_part([*range(keys), *p], body,
                                                              widths, max_width)
        return "\n".join(title + lines)

    def _text_part(self, cols, body, widths, max_width) -> list[str]:
        """Header, rule and rows of the columns ``cols``, two spaces apart (one when two
        would pass ``max_width``)."""
        cols = list(cols)
        sep = "  " if sum(widths[j] + 2 for j in cols) - 2 <= max_width else " "
        lines = [sep.join(pad(r[j], widths[j], self.align[j]) for j in cols).rstrip()
                 for r in [self.headers] + body]
        lines.insert(1, sep.join("-" * widths[j] for j in cols))
        return lines

    def _text_records(self, body, max_width) -> list[str]:
        """Each row as ``header: cell`` lines, the first column's flush left and the others
        indented, wrapped to ``max_width``."""
        lines = []
        for row in body:
            for j, (h, c) in enumerate(zip(self.headers, row)):
                if c or j == 0:
                    first = "" if j == 0 else "  "
                    lines += [first + ln for ln in fold(f"{h}: {c}", max_width - len(first),
                                                        "  ")]
        return lines

    def _repr_html_(self) -> str:
        def cell(tag: str, text: str, a: str) -> str:
            style = ' style="text-align:right"' if a == ">" else ' style="text-align:left"'
            return f"<{tag}{style}>{html.escape(text)}</{tag}>"
        head = "".join(cell("th", h, a) for h, a in zip(self.headers, self.align))
        body = "".join("<tr>" + "".join(cell("td", c, a) for c, a in zip(r, self.align))
                       + "</tr>\n" for r in self._cells())
        cap = f"<caption>{html.escape(self.title)}</caption>" if self.title else ""
        return (f'<div class="tf-table-wrap"><table class="tf-table">{cap}\n'
                f"<thead><tr>{head}</tr></thead>\n<tbody>\n{body}</tbody></table></div>")

    def __str__(self) -> str:
        return self.to_text()

    def __repr__(self) -> str:
        return self.to_text()


def _named(mapping, named: dict, what: str) -> dict:
    """One ``{name: value}`` dict from a positional mapping and keyword arguments."""
    if mapping is not None and not hasattr(mapping, "items"):
        raise TypeError(f"{what} takes a mapping of name -> value and/or keyword arguments, "
                        f"got {type(mapping).__name__}")
    items = {**(dict(mapping) if mapping is not None else {}), **named}
    if not items:
        raise ValueError(f"{what} needs at least one named value")
    return items


def shapes(mapping=None, /, *, title: str | None = None, **tensors) -> Table:
    """The shape of each named tensor, one row each, in the order given: the form in which a
    chapter shows what a step turned into what.

    ``shapes(input_ids=ids, hidden_states_l0=h)`` or, for names that are not identifiers,
    ``shapes({"x (tokens)": x})``. A value is anything with ``.shape`` (a tensor, an array);
    the row shows ``[1, 5]`` and the element count.

    Raises:
        TypeError: if ``mapping`` is not a mapping, or a value has no ``shape``.
        ValueError: if no tensor is named.
    """
    rows = []
    for name, t in _named(mapping, tensors, "shapes").items():
        if not hasattr(t, "shape"):
            raise TypeError(f"shapes: {name!r} must have a .shape (a tensor or an array), "
                            f"got {type(t).__name__}")
        dims = [int(d) for d in t.shape]
        n = 1
        for d in dims:
            n *= d
        rows.append([name, str(dims), n])
    return Table(rows, ["tensor", "shape", "elements"], title=title, align="<<>")


def _holds(value) -> str:
    """A claim's outcome as the table shows it: ``True`` / ``False``, or an agreement with
    its tolerance (``equal within 1e-6: True``)."""
    if isinstance(value, Agreement):
        return str(Agreement(value.max_abs_diff, value.tol))
    if hasattr(value, "numel"):                      # a torch tensor, without importing torch
        if value.numel() != 1:
            raise TypeError(f"a claim must be one boolean, got a tensor of shape "
                            f"{list(value.shape)}")
        value = value.item()
    if hasattr(value, "dtype") and getattr(value, "shape", None) == ():   # numpy scalar
        value = value.item()
    if not isinstance(value, bool):
        raise TypeError(f"a claim must be a bool, a one-element tensor or an Agreement "
                        f"(tokenflow.viz.agree), got {type(value).__name__}: {value!r}")
    return str(value)


def checks(mapping=None, /, *, title: str | None = None, **claims) -> Table:
    """Claims the chapter proves, one row each: the claim and whether it holds, as a table
    instead of one ``print`` per claim.

    ``checks({"K read == cache slots 0..4": torch.equal(a, b),
    "cached vs recompute": agree(x, y, 1e-5)})``: a value is a bool, a one-element tensor or
    an :class:`Agreement` (shown with its tolerance, ``equal within 1e-5: True``).

    Raises:
        TypeError: if ``mapping`` is not a mapping or a value is not one of those.
        ValueError: if no claim is given.
    """
    rows = [[name, _holds(v)] for name, v in _named(mapping, claims, "checks").items()]
    return Table(rows, ["claim", "holds"], title=title, align="<<")


# --------------------------------------------------------------------- agreement claims
def format_tolerance(tol: float) -> str:
    """A tolerance as the book prints it: ``1e-06 -> "1e-6"``, ``2.5e-05 -> "2.5e-5"``,
    ``0.01 -> "0.01"``, ``0 -> "0"``.

    Raises:
        ValueError: if ``tol`` is negative, NaN or not a number.
    """
    if isinstance(tol, bool) or not isinstance(tol, numbers.Real) or not tol >= 0:
        raise ValueError(f"tol must be a number >= 0, got {tol!r}")
    if tol == 0 or 1e-3 <= tol < 1e4:
        return f"{tol:g}"
    mantissa, exponent = f"{tol:.2e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def _as_float_array(x, name: str):
    import numpy as np
    if hasattr(x, "detach"):                    # a torch tensor, without importing torch
        x = x.detach().cpu().double().numpy()
    try:
        return np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be a number, a sequence of numbers, a numpy array or a "
                        f"tensor, got {type(x).__name__}") from exc


class Agreement:
    """What :func:`agree` returns: the claim "``what``: equal within ``tol``: True/False".

    Shows as that one line (``str``, ``repr``; a notebook cell ending with it prints it), is
    truthy when the two agree (``assert agree(a, b, 1e-6)``), and keeps the measured
    ``max_abs_diff`` for code, but prints it only when the claim fails: the digits of a
    difference below the tolerance are rounding noise that changes with the CPU's instruction
    set, the BLAS library and the thread count, so stored outputs never show them.
    """

    def __init__(self, max_abs_diff: float, tol: float, what: str | None = None):
        self.max_abs_diff = float(max_abs_diff)
        self.tol = float(tol)
        self.what = what
        self.ok = bool(self.max_abs_diff <= self.tol)   # NaN: False

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        head = f"{tr(self.what)}: " if self.what else ""
        text = tr(f"{head}equal within {format_tolerance(self.tol)}: {self.ok}")
        if not self.ok:
            text += f" (max |a - b| = {self.max_abs_diff:.2g})"
        return text

    __repr__ = __str__


def agree(a, b, tol: float, *, what: str | None = None) -> Agreement:
    """Whether ``a`` and ``b`` agree element-wise within the absolute tolerance ``tol``:
    ``max |a - b| <= tol``, as an :class:`Agreement` that prints as the claim
    (``"EP vs one process: equal within 1e-5: True"``) and is truthy when it holds.

    The one way the book prints that two computations agree (a loop vs a vectorised MoE, a
    cached vs a full forward, ...). ``a`` / ``b``: numbers, sequences, numpy arrays or torch
    tensors of the same shape (any float dtype; compared in float64). NaN anywhere: False.

    Raises:
        ValueError: if ``tol`` is negative or NaN, or the shapes differ.
        TypeError: if ``a`` or ``b`` is not numeric.
    """
    format_tolerance(tol)                               # validates tol
    x, y = _as_float_array(a, "a"), _as_float_array(b, "b")
    if x.shape != y.shape:
        raise ValueError(f"a and b must have the same shape, got {x.shape} and {y.shape}")
    import numpy as np
    diff = float(np.max(np.abs(x - y))) if x.size else 0.0
    return Agreement(diff, tol, what)


# what this module defines (every public name after the imports)
__all__ = [n for n in globals() if not n.startswith("_") and n not in _IMPORTED]
