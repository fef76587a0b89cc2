"""Presentation: every figure, table, widget, kernel-less explorer and the diagram.

The chapters import what they show from here (``from tokenflow.viz import ...``); the code
is split by topic, one module per chapter theme:

=================  ===========================================================
``lang``           :func:`set_language` and :func:`tr`: the viz layer's words in Chinese
``fmt``            text helpers: :class:`Table`, :func:`say`, :func:`format_bytes`, widths,
                   :func:`agree` (agreement printed as a claim with its tolerance)
``static``         :func:`explore`: one explorer, precomputed (sliders that work without a
                   kernel) or live (``ipywidgets``); :func:`precomputed_explorer`
``style``          notebook setup; registers the font every figure draws with (``fonts``)
``fonts``          the bundled font (Noto Sans CJK SC subset, OFL) and its rcParams
``diagram``        the token-flow diagram (Mermaid) and trace rows tied to its boxes
``hidden``         chapter 01: hidden states, the residual stream, sizes
``attention``      chapter 02: attention weights, KV cache growth and size
``moe``            chapter 03: routing, dispatch / combine, expert load, all-to-all
``sampling``       chapter 04: vocabulary scores, temperature, top-k / top-p
``serving``        chapter 05: phases, batching, the engine timeline, the serving explorer
``serving_tables`` chapter 05: workloads, steps, timelines and runs as tables
``paging``         chapter 05: block tables, KV slots paged vs reserved contiguously
``packing``        chapter 05: one step and whole runs padded vs packed, preemptions
``peer``           chapter 05: our engine next to vLLM on the same requests (stored run)
``lens``           chapter 06: the logit lens, its readings as tables and a sentence
``trace_tables``   chapters 00 and 06: trace events as tables
``roofline``       chapter 07: lenses and the roofline
``recap``          chapter 09: the whole line annotated with the book's numbers
=================  ===========================================================

Layering (checked by ``tests/test_layering.py``): nothing outside this package imports it;
it imports the model, inference, serving, parallel and analysis code it draws. matplotlib
and ipywidgets load with it.

Each module's ``__all__`` is the public names it defines. The package exports all of them for
the chapter modules (``diagram`` to ``recap``) and the helpers the chapters call from
``lang``, ``fmt``, ``static`` and ``style``; its ``__all__`` is every name so bound
(``tests/test_viz.py`` fails when a chapter module's public name is missing).
"""
from types import ModuleType as _ModuleType

from .lang import set_language, language, tr
from .fmt import (display_width, pad, format_bytes, say, Table, agree, Agreement, shapes,
                  checks)
from .static import (explore, precomputed_explorer, PrecomputedExplorer, MAX_OUTPUTS,
                     MAX_HTML_BYTES)
from .style import (setup_notebook, use_book_font)
from .diagram import *
from .hidden import *
from .attention import *
from .moe import *
from .sampling import *
from .serving import *
from .serving_tables import *
from .paging import *
from .packing import *
from .peer import *
from .lens import *
from .trace_tables import *
from .roofline import *
from .recap import *

# every name bound above, none of the submodules
__all__ = sorted(_n for _n, _v in globals().items()
                 if not _n.startswith("_") and not isinstance(_v, _ModuleType))
