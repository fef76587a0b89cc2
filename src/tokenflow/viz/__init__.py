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
"""
from types import ModuleType as _ModuleType

from .lang import set_language, language, tr
from .fmt import (display_width, pad, format_bytes, say, Table, agree, Agreement, shapes,
                  checks)
from .static import (explore, precomputed_explorer, PrecomputedExplorer, MAX_OUTPUTS,
                     MAX_HTML_BYTES)
from .style import (setup_notebook, use_book_font)
from .diagram import (DIAGRAM_PATH, TRACE_NODE, Edge, Diagram, parse_mermaid, load_diagram,
                      token_flow_diagram, node_of, diagram_trace_table, trace_decode_step,
                      COLOUR_NAMES, arrow_actions_table)
from .hidden import (topk_bar, hidden_state_heatmap, residual_stream_plot, shape_flow,
                     tensor_table, hidden_state_sizes, size_table,
                     hidden_size_explorer, residual_stream_summary, residual_stream_explorer,
                     hidden_size_static, residual_stream_table, residual_stream_static)
from .attention import (attention_context_plot, attention_head_heatmap, kv_cache_growth_plot,
                        cache_per_sequence_plot, kv_cache_summary, kv_cache_explorer,
                        attention_explorer, attention_static, kv_cache_static, kv_per_token_view,
                        kv_cache_scale_table, kv_cache_scale_static,
                        kv_cache_scale_explorer)
from .moe import (moe_flow_diagram, routing_heatmap, dispatch_combine_diagram, expert_load_bar,
                  traffic_heatmap, routing_load_plot, moe_comm_bars, moe_routing_summary,
                  moe_routing_explorer, prob_text, moe_routing_static)
from .sampling import (vocab_scores, temperature_curves, sampling_bars, frequency_bars,
                       sampling_panel, sampling_explorer, sampling_static)
from .serving import (phase_times_plot, decode_batch_plot, arithmetic_intensity_plot,
                      serving_timeline, batch_composition_plot, batching_comparison_plot,
                      serving_counts, serving_panel, serving_view, SERVING_CONTROLS,
                      serving_explorer, serving_static, chunked_prefill_time_plot,
                      chunked_prefill_sentence)
from .serving_tables import (timeline_table, timeline_view, serving_summary_table,
                             workload_summary, step_table, batching_table, batching_times_table)
from .paging import (block_table_rows, block_table_figure, block_table_sentence,
                     kv_slot_usage, kv_slot_figure, kv_slot_table, kv_slot_sentence)
from .packing import (step_layout, packed_step_figure, mark_preemptions, packing_table,
                      packing_summary, preemption_report)
from .peer import peer_table, peer_summary, counterparts_table
from .lens import (logit_lens_heatmap, logit_lens_topk, logit_lens_explorer, logit_lens_static,
                   logit_lens_by_depth, logit_lens_summary, logit_lens_compare,
                   logit_lens_answers)
from .trace_tables import (decode_trace_summary, decode_trace_explorer, trace_table,
                           TRACE_SHAPES_WHERE, trace_shapes_table, trace_shapes_static,
                           trace_shapes_view, trace_shapes_explorer,
                           decode_trace_static, router_sentence, WEIGHT_PARTS,
                           step_bytes_table)
from .roofline import (lens_bars, roofline_summary, roofline_bars, roofline_panel,
                       roofline_explorer, roofline_table, roofline_static)
from .recap import line_figure

# every name imported above, none of the submodules
__all__ = sorted(_n for _n, _v in globals().items()
                 if not _n.startswith("_") and not isinstance(_v, _ModuleType))
