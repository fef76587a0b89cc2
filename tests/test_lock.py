"""requirements.txt, the lock, agrees with what is declared: requirements.in's pins and
pyproject.toml's dependencies and extras (scripts/lock.py writes it: `make lock`).

- every pin of requirements.in is in the lock at the same version;
- every dependency pyproject.toml declares (the package's own and each extra's) is in the lock,
  at a version its range allows;
- the lock has no CUDA package (torch locked with the CPU build's dependencies) and pins torch
  exactly as requirements.in does;
- nothing is in the lock that nothing requires: each entry's ``# via`` names requirements.in,
  this package or other entries, back to requirements.in, and each named requirer really
  requires it (requirements.in lists it, pyproject.toml declares it, or the requirer's installed
  metadata names it); and every entry that applies to this Python is reached from
  requirements.in through the installed packages' metadata.
"""
from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "requirements.in"
LOCK = ROOT / "requirements.txt"
PYPROJECT = ROOT / "pyproject.toml"
SELF = "tokenflow"
CUDA_PACKAGE = re.compile(r"^(nvidia-|cuda-|triton$)")


def parse_lock(text: str) -> dict[str, dict]:
    """name -> {"versions": [...], "markers": [...], "via": {...}} of a uv pip compile output.
    The editable line ``-e .`` is this package (version None)."""
    entries: dict[str, dict] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("-e "):
            current = entries.setdefault(SELF, {"versions": [], "markers": [], "via": set()})
            continue
        found = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+?)(?:\s*;\s*(.+))?$", line)
        if found:
            name = canonicalize_name(found.group(1))
            current = entries.setdefault(name, {"versions": [], "markers": [], "via": set()})
            current["versions"].append(found.group(2))
            current["markers"].append(found.group(3))
            continue
        via = re.match(r"^\s+#\s+(?:via\s+)?(\S.*)$", line)
        if via and current is not None and via.group(1) != "via":
            requirer = via.group(1).strip()
            current["via"].add(requirer if requirer.startswith("-r ") else
                               canonicalize_name(requirer.split("[")[0]))
        elif line.strip() and not line.lstrip().startswith("#"):
            raise AssertionError(f"a line of the lock that is not a pin: {line!r}")
    return entries


def parse_source(text: str) -> dict[str, Requirement]:
    reqs = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            req = Requirement(line)
            reqs[canonicalize_name(req.name)] = req
    return reqs


def declared(pyproject: dict) -> list[tuple[str, Requirement]]:
    """(where, requirement) of every dependency pyproject.toml declares, self-references of the
    extras (``tokenflow[viz]``) left out."""
    project = pyproject["project"]
    out = [("dependencies", Requirement(r)) for r in project.get("dependencies", [])]
    for extra, reqs in project.get("optional-dependencies", {}).items():
        out += [(f"[{extra}]", Requirement(r)) for r in reqs]
    return [(where, r) for where, r in out if canonicalize_name(r.name) != SELF]


@pytest.fixture(scope="module")
def lock():
    return parse_lock(LOCK.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def source():
    return parse_source(SOURCE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def pyproject():
    return tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))


def pins_problems(source: dict[str, Requirement], lock: dict[str, dict]) -> list[str]:
    problems = []
    for name, req in source.items():
        pin = [s.version for s in req.specifier if s.operator == "=="]
        if len(pin) != 1:
            problems.append(f"requirements.in: {req} is not one exact pin")
        elif name not in lock:
            problems.append(f"requirements.in pins {req}, the lock has no {name}")
        elif lock[name]["versions"] != pin:
            problems.append(f"requirements.in pins {req}, the lock {lock[name]['versions']}")
    return problems


def declaration_problems(decl: list[tuple[str, Requirement]], lock: dict[str, dict]) -> list[str]:
    problems = []
    for where, req in decl:
        name = canonicalize_name(req.name)
        if name not in lock:
            problems.append(f"pyproject {where} declares {req}, the lock has no {name}")
            continue
        for version in lock[name]["versions"]:
            if not req.specifier.contains(Version(version), prereleases=True):
                problems.append(f"pyproject {where} declares {req}, the lock has {version}")
    return problems


def cuda_problems(lock: dict[str, dict], source: dict[str, Requirement]) -> list[str]:
    problems = [f"{name}: a CUDA package in the lock" for name in lock if CUDA_PACKAGE.match(name)]
    torch = lock.get("torch", {"versions": [], "markers": []})
    want = [s.version for s in source["torch"].specifier] if "torch" in source else []
    if torch["versions"] != want or torch["markers"] != [None]:
        problems.append(f"torch: one line torch=={want} without a marker or a local version "
                        f"label expected, the lock has {torch['versions']} {torch['markers']}")
    return problems


def _requires(name: str) -> set[str] | None:
    """Names of every requirement (any extra) of the installed distribution, None if absent."""
    try:
        return {canonicalize_name(Requirement(r).name) for r in metadata.requires(name) or []}
    except metadata.PackageNotFoundError:
        return None


def via_problems(lock: dict[str, dict], source: dict[str, Requirement],
                 decl: list[tuple[str, Requirement]], requires=_requires) -> list[str]:
    """Each entry is required by what its ``# via`` names, and the chain reaches
    requirements.in. ``requires(name)``: the names ``name``'s metadata requires, or None when
    unknown (not installed: the annotation is then taken as written)."""
    declared_names = {canonicalize_name(r.name) for _, r in decl}
    problems = []
    for name, entry in lock.items():
        if not entry["via"]:
            problems.append(f"{name}: nothing requires it (no '# via')")
        for requirer in entry["via"]:
            if requirer.startswith("-r "):
                if requirer != f"-r {SOURCE.name}":
                    problems.append(f"{name}: via {requirer}, not {SOURCE.name}")
                elif name != SELF and name not in source:
                    problems.append(f"{name}: via {SOURCE.name}, which does not list it")
            elif requirer not in lock:
                problems.append(f"{name}: via {requirer}, which is not in the lock")
            elif requirer == SELF:
                if name not in declared_names:
                    problems.append(f"{name}: via {SELF}, whose pyproject.toml does not declare it")
            elif (names := requires(requirer)) is not None and name not in names:
                problems.append(f"{name}: via {requirer}, whose metadata does not require it")
    reached, todo = set(), [f"-r {SOURCE.name}"]
    while todo:
        node = todo.pop()
        for name, entry in lock.items():
            if node in entry["via"] and name not in reached:
                reached.add(name)
                todo.append(name)
    problems += [f"{name}: not reached from {SOURCE.name}" for name in sorted(set(lock) - reached)]
    return problems


def _closure(roots: list[Requirement]) -> set[str]:
    """Names of every installed distribution ``roots`` require here (markers evaluated for this
    Python, extras followed), through the installed metadata."""
    seen: set[tuple[str, frozenset]] = set()
    names: set[str] = set()
    todo = [(canonicalize_name(r.name), frozenset(r.extras)) for r in roots]
    while todo:
        name, extras = todo.pop()
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        names.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for text in requires:
            req = Requirement(text)
            if req.marker and not any(req.marker.evaluate({"extra": e})
                                      for e in (extras or {""}) | {""}):
                continue
            todo.append((canonicalize_name(req.name), frozenset(req.extras)))
    return names


def test_every_pin_of_requirements_in_is_locked_at_its_version(source, lock):
    assert source, "requirements.in pins nothing"
    problems = pins_problems(source, lock)
    assert not problems, "\n".join(problems) + "\n(run `make lock`)"


def test_every_declared_dependency_is_locked_in_its_range(pyproject, lock):
    decl = declared(pyproject)
    assert decl
    problems = declaration_problems(decl, lock)
    assert not problems, "\n".join(problems) + "\n(run `make lock`)"


def test_the_lock_has_no_cuda_package_and_pins_torch_as_requirements_in(lock, source):
    problems = cuda_problems(lock, source)
    assert not problems, "\n".join(problems)


def test_nothing_in_the_lock_that_nothing_requires(lock, source, pyproject):
    problems = via_problems(lock, source, declared(pyproject))
    assert not problems, "\n".join(problems) + "\n(run `make lock`)"


def test_what_applies_here_is_reached_through_the_installed_metadata(lock):
    """The annotations aside: from ``-e .[book,hf,test]`` and the pins, the installed packages'
    own metadata reaches every entry whose marker holds on this Python."""
    roots = [Requirement(f"{SELF}[book,hf,test]"), *parse_source(SOURCE.read_text()).values()]
    missing = [name for name in lock if _requires(name) is None and name != SELF]
    here = {name for name, e in lock.items()
            if any(m is None or Marker(m).evaluate() for m in e["markers"]) or name == SELF}
    assert not (set(missing) & here), (f"not installed here: {sorted(set(missing) & here)}: "
                                       "install the lock (make venv)")
    orphans = sorted(here - _closure(roots))
    assert not orphans, f"in the lock, required by nothing installed here: {orphans}"


# --- the checks themselves catch what they are for ------------------------------------------
LOCK_TEXT = """\
-e .
    # via -r requirements.in
alpha==1.0
    # via
    #   -r requirements.in
    #   tokenflow
beta==2.0 ; sys_platform == 'win32'
    # via alpha
torch==2.13.0
    # via -r requirements.in
"""


def _fake_requires(name):
    return {"alpha": {"beta"}}.get(name, set())


def test_the_checks_pass_a_consistent_lock():
    lock = parse_lock(LOCK_TEXT)
    source = parse_source("alpha==1.0\ntorch==2.13.0\n")
    decl = [("dependencies", Requirement("alpha>=1"))]
    assert lock["beta"]["markers"] == ["sys_platform == 'win32'"]
    assert not pins_problems(source, lock)
    assert not declaration_problems(decl, lock)
    assert not cuda_problems(lock, source)
    assert not via_problems(lock, source, decl, requires=_fake_requires)


def test_the_checks_catch_a_changed_pin_range_cuda_package_and_orphan():
    source = parse_source("alpha==1.1\ntorch==2.13.0\n")
    assert pins_problems(source, parse_lock(LOCK_TEXT)) == [
        "requirements.in pins alpha==1.1, the lock ['1.0']"]
    decl = [("[hf]", Requirement("alpha>=1.5")), ("[test]", Requirement("gamma"))]
    assert len(declaration_problems(decl, parse_lock(LOCK_TEXT))) == 2
    cuda = parse_lock(LOCK_TEXT.replace("torch==2.13.0", "torch==2.13.0+cpu")
                      + "nvidia-nccl-cu13==2.29.7\n    # via torch\n")
    assert len(cuda_problems(cuda, source)) == 2
    orphan = parse_lock(LOCK_TEXT + "delta==3.0\n    # via epsilon\n")
    problems = via_problems(orphan, parse_source("alpha==1.0\ntorch==2.13.0\n"),
                            [("dependencies", Requirement("alpha"))], requires=_fake_requires)
    assert "delta: via epsilon, which is not in the lock" in problems
    assert "delta: not reached from requirements.in" in problems
    lying = parse_lock(LOCK_TEXT.replace("# via alpha", "# via torch"))
    assert via_problems(lying, parse_source("alpha==1.0\ntorch==2.13.0\n"),
                        [("dependencies", Requirement("alpha"))],
                        requires=lambda n: {"torch": {"filelock"}}.get(n, set())) == [
        "beta: via torch, whose metadata does not require it"]
