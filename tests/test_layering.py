"""The package's layering, read from the code's own imports (ARCHITECTURE.md, section 1).

    viz                                    draws; nothing else imports it
    analysis  serving  parallel  interop   measure, serve, split, convert
    inference  explain                     generate / sampling / phases; what chapters open up
    model                                  what a token passes through
    config                                 what a model is (ModelConfig, presets, HF configs)
    validate                               the argument checks every part shares

Every ``import`` and ``from ... import`` counts, module level or inside a function, since a
lazy import is still a dependency. The rules are checked on the real graph, and each rule is
shown to fire on the real graph with one wrong import added.
"""
import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "tokenflow"

# which top-level parts of tokenflow each part may import (itself always allowed)
# ``validate`` (the argument checks every entry point shares) imports nothing from tokenflow
# and every part may import it; ``config`` imports only ``validate`` and every part above it may
# import it; ``explain`` (what the chapters open up) sees only the model.
ALLOWED = {
    "validate": set(),
    "config": set(),
    "model": set(),
    "explain": {"model"},
    "inference": {"model"},
    "serving": {"model", "inference"},
    "parallel": {"model", "inference", "analysis", "interop", "explain"},
    "analysis": {"model", "inference", "serving", "parallel", "explain"},
    "interop": {"model", "tokenizer"},
    "tokenizer": set(),
    "train": {"model", "interop", "tokenizer"},
    "check": {"model", "inference", "interop", "tokenizer", "viz"},
    "viz": {"model", "inference", "serving", "parallel", "analysis", "interop", "tokenizer",
            "explain"},
}
for _part, _allowed in ALLOWED.items():
    if _part != "validate":
        _allowed.add("validate")
    if _part not in ("validate", "config"):
        _allowed.add("config")


def module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _resolve(mod: str, is_pkg: bool, node: ast.ImportFrom) -> list[str]:
    if node.level == 0:
        base = node.module or ""
    else:
        pkg = mod.split(".") if is_pkg else mod.split(".")[:-1]
        pkg = pkg[:len(pkg) - (node.level - 1)]
        base = ".".join(pkg + ([node.module] if node.module else []))
    # `from pkg import submodule` names the submodule itself
    return [
        f"{base}.{a.name}"
        if (SRC.parent / Path(*f"{base}.{a.name}".split("."))).with_suffix(".py").exists()
        or (SRC.parent / Path(*f"{base}.{a.name}".split("."))).is_dir()
        else base
        for a in node.names
    ]


def import_graph() -> dict[str, set[str]]:
    """{module: tokenflow modules it imports}, from every .py file under src/tokenflow."""
    graph = {}
    for path in sorted(SRC.rglob("*.py")):
        mod = module_name(path)
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name.startswith("tokenflow")}
            elif isinstance(node, ast.ImportFrom):
                deps |= {d for d in _resolve(mod, path.name == "__init__.py", node)
                         if d.startswith("tokenflow")}
        graph[mod] = deps - {mod}
    return graph


def part(mod: str) -> str:
    """The top-level part of tokenflow a module belongs to ('' for the package root)."""
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else ""


def layering_violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports that break ALLOWED (the package root ``tokenflow/__init__.py`` re-exports the
    public API and is exempt; nothing may import the root except through its submodules)."""
    bad = []
    for mod, deps in graph.items():
        src = part(mod)
        if not src:
            continue
        for dep in deps:
            dst = part(dep)
            if dst == src:
                continue
            if dst == "" or dst not in ALLOWED.get(src, set()):
                bad.append(f"{mod} imports {dep}")
    return sorted(bad)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Import cycles between modules (Tarjan's strongly connected components of size > 1,
    or a module importing itself)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


@pytest.fixture(scope="module")
def graph():
    return import_graph()


def test_graph_sees_the_packages(graph):
    # a sanity check that the parser resolves relative and absolute imports
    assert "tokenflow.model.kv_cache" in graph["tokenflow.model.attention"]
    assert "tokenflow.config" in graph["tokenflow.interop.checkpoint"]
    assert {part(m) for m in graph} >= {"model", "inference", "serving", "parallel", "analysis",
                                         "interop", "viz"}


def test_layering_holds(graph):
    assert layering_violations(graph) == []


def test_no_import_cycles(graph):
    assert cycles(graph) == []


def test_nothing_outside_viz_imports_viz(graph):
    assert [m for m, deps in graph.items() if part(m) not in ("viz", "", "check")
            and any(part(d) == "viz" for d in deps)] == []


@pytest.mark.parametrize("src,dst", [
    ("tokenflow.model.attention", "tokenflow.analysis.costmodel"),   # model -> analysis
    ("tokenflow.model.kv_cache", "tokenflow.viz.fmt"),               # model -> viz
    ("tokenflow.inference.generate", "tokenflow.serving.engine"),    # inference -> serving
    ("tokenflow.analysis.trace", "tokenflow.viz.fmt"),               # analysis -> viz
    ("tokenflow.serving.runner", "tokenflow.interop.checkpoint"),    # serving -> interop
    ("tokenflow.model.moe", "tokenflow.explain.moe"),                # model -> explain
    ("tokenflow.explain.trace", "tokenflow.inference.generate"),     # explain -> inference
    ("tokenflow.validate", "tokenflow.config.model_config"),         # validate -> anything
    ("tokenflow.config.model_config", "tokenflow.model.ffn"),        # config -> model
    ("tokenflow.config.hf_config", "tokenflow.interop.hf_models"),   # config -> interop
])
def test_an_upward_import_is_caught(graph, src, dst):
    planted = {m: set(d) for m, d in graph.items()}
    planted[src].add(dst)
    assert f"{src} imports {dst}" in layering_violations(planted)


def test_a_cycle_is_caught(graph):
    planted = {m: set(d) for m, d in graph.items()}
    planted["tokenflow.interop.hf_models"].add("tokenflow.interop.hf_export")  # the old cycle
    assert ["tokenflow.interop.hf_export", "tokenflow.interop.hf_models"] in cycles(planted)


def test_explain_sees_only_the_model(graph):
    used = {part(d) for m, deps in graph.items() if part(m) == "explain" for d in deps}
    assert used <= {"explain", "model", "config", "validate"} and "model" in used


def test_the_model_sees_only_its_config(graph):
    used = {part(d) for m, deps in graph.items() if part(m) == "model" for d in deps}
    assert used <= {"model", "config", "validate"} and "config" in used


def test_the_moved_modules_keep_their_old_import_paths():
    """``tokenflow.model.config`` and ``tokenflow.model.hf_config`` (the paths chapters, tests
    and docs use) are the modules that now live in ``tokenflow.config``."""
    import importlib

    from tokenflow.config import OLD_PATHS
    assert OLD_PATHS
    for old, new in OLD_PATHS.items():
        assert importlib.import_module(old) is importlib.import_module(new), old
    from tokenflow.model.config import ModelConfig, preset
    from tokenflow.model.hf_config import parse_hf_config
    import tokenflow
    assert ModelConfig is tokenflow.ModelConfig and preset is tokenflow.preset
    assert parse_hf_config is tokenflow.config.parse_hf_config


def test_the_moved_names_keep_their_old_import_paths():
    import importlib

    import tokenflow.explain as explain
    for module, names in explain.OLD_PATHS.items():
        mod = importlib.import_module(module)
        for name in names:
            assert getattr(mod, name) is getattr(explain, name), f"{module}.{name}"


def test_viz_exports_every_name_the_chapters_import_from_it():
    """``tokenflow.viz.__all__`` is derived from its imports; every name a notebook imports
    from ``tokenflow.viz`` is in it, and it names no submodule."""
    import json
    import re
    import types

    import tokenflow.viz as viz
    used = set()
    for nb in (SRC.parents[1] / "notebooks").glob("*.ipynb"):
        for cell in json.loads(nb.read_text(encoding="utf-8"))["cells"]:
            src = "".join(cell["source"])
            for m in re.finditer(r"from tokenflow\.viz import (\([^)]*\)|[^\n;#]*)", src):
                used |= {n for n in re.split(r"[(),\s]+", re.sub(r"#.*", "", m.group(1)))
                         if n.isidentifier()}
    assert used and used <= set(viz.__all__), sorted(used - set(viz.__all__))
    assert not [n for n in viz.__all__ if isinstance(getattr(viz, n), types.ModuleType)]
    assert len(viz.__all__) == len(set(viz.__all__)) >= 119
