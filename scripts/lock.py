"""Write requirements.txt, the full lock of the book's environment, from requirements.in.

    python scripts/lock.py                       # `make lock`: resolve, write requirements.txt
    python scripts/lock.py --upgrade             # let every package that is not pinned move
    python scripts/lock.py --torch-wheel PATH    # torch's metadata from a CPU wheel file

requirements.in holds the top-level pins and ``-e .[book,hf,test]``, so the declarations of
pyproject.toml are resolved with them. ``uv pip compile --universal`` writes one lock for Linux,
macOS and Windows and Python 3.11 to 3.13: a package only some of them need carries its
environment marker (``colorama ; sys_platform == 'win32'``), and each entry says what requires
it (``# via``). Versions already in requirements.txt are kept unless a declaration needs another
one (uv prefers the output file's pins; ``--upgrade`` drops that preference).

torch and the CPU rule: the default index's Linux torch is the CUDA build, whose metadata
requires nvidia-*, cuda-* and triton packages; resolved as published, the lock would pin them
for Linux. So the lock is compiled against the CPU build's metadata instead: the Requires-Dist
of the torch this Python has installed (the CPU wheel ``make`` puts into .venv on Linux; any
macOS or Windows wheel has the same) or of the wheel given with ``--torch-wheel``, handed to uv
as static dependency metadata of ``torch==<pin>``. The lock then pins ``torch==<pin>`` (pip
takes the CPU index's ``<pin>+cpu`` for it) and no CUDA package; the Makefile installs torch
from the CPU index before the lock. The script refuses a CUDA build's metadata, and a lock that
still names a CUDA package. tests/test_lock.py checks the result against the declarations.
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from email.parser import Parser
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "requirements.in"
LOCK = ROOT / "requirements.txt"
PYTHON = "3.11"                     # the oldest supported Python; --universal covers the newer
# Packages that only the CUDA build of torch pulls in; none may appear in the lock.
CUDA_PACKAGE = re.compile(r"^(nvidia-|cuda-|triton\b)", re.I)
PROLOGUE = """\
# The full lock of the book's environment: every package, its exact version, and what requires
# it. Generated from requirements.in (the top-level pins and this package's extras) by
# `make lock` (scripts/lock.py, uv pip compile --universal: Linux, macOS, Windows, Python
# 3.11-3.13); do not edit by hand. torch is locked with the CPU build's dependencies (no nvidia
# packages): on Linux install it from https://download.pytorch.org/whl/cpu before this file,
# as `make` does. tests/test_lock.py fails when this file and the declarations disagree.
"""


def torch_pin(source: Path = SOURCE) -> str:
    """The version requirements.in pins torch to."""
    for line in source.read_text(encoding="utf-8").splitlines():
        found = re.match(r"\s*torch==([^\s;#]+)", line)
        if found:
            return found.group(1)
    raise ValueError(f"{source} pins no torch==<version>")


def torch_metadata(wheel: Path | None = None) -> tuple[str, str, list[str]]:
    """(version, Requires-Python, Requires-Dist) of torch: from ``wheel`` if given, else from
    the torch installed in this Python. Raises ValueError for a CUDA build."""
    if wheel is not None:
        with zipfile.ZipFile(wheel) as zf:
            name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
            meta = Parser().parsestr(zf.read(name).decode("utf-8"))
    else:
        try:
            meta = metadata.metadata("torch")
        except metadata.PackageNotFoundError:
            raise ValueError("torch is not installed in this Python: run `make venv` first, "
                             "or pass --torch-wheel") from None
    requires = meta.get_all("Requires-Dist") or []
    cuda = [r for r in requires if CUDA_PACKAGE.match(r)]
    if cuda:
        raise ValueError(f"torch {meta['Version']} is a CUDA build (it requires {cuda[0]}, ...): "
                         "lock against the CPU build (--torch-wheel, or install it first)")
    return meta["Version"], meta.get("Requires-Python") or "", requires


def uv_config(version: str, requires_python: str, requires: list[str]) -> str:
    """uv.toml text giving ``torch==version`` the static metadata ``requires``."""
    def quote(s: str) -> str:
        return "'" + s.replace("'", '"') + "'"
    lines = ["[[dependency-metadata]]", 'name = "torch"', f'version = "{version}"']
    if requires_python:
        lines.append(f'requires-python = "{requires_python}"')
    lines.append("requires-dist = [" + ", ".join(quote(r) for r in requires) + "]")
    return "\n".join(lines) + "\n"


def _uv() -> list[str]:
    found = Path(sys.executable).with_name("uv")
    if found.exists():
        return [str(found)]
    if shutil.which("uv"):
        return [shutil.which("uv")]
    return [sys.executable, "-m", "uv"]


def compile_lock(wheel: Path | None = None, upgrade: bool = False, out: Path = LOCK) -> int:
    """Resolve requirements.in into ``out``; return the number of pinned packages."""
    pin = torch_pin()
    version, requires_python, requires = torch_metadata(wheel)
    if version.split("+")[0] != pin:
        raise ValueError(f"the torch metadata is of {version}, requirements.in pins {pin}")
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp, "uv.toml")
        config.write_text(uv_config(pin, requires_python, requires), encoding="utf-8")
        cmd = [*_uv(), "pip", "compile", "--universal", "--python-version", PYTHON,
               "--config-file", str(config), "--custom-compile-command", "make lock",
               "--quiet", str(SOURCE.relative_to(ROOT)), "-o", str(out)]
        if upgrade:
            cmd.append("--upgrade")
        subprocess.run(cmd, cwd=ROOT, check=True)
    text = out.read_text(encoding="utf-8")
    cuda = [line for line in text.splitlines() if CUDA_PACKAGE.match(line)]
    if cuda:
        raise ValueError(f"the lock names CUDA packages: {cuda[:3]}")
    out.write_text(PROLOGUE + text, encoding="utf-8")
    return sum(1 for line in text.splitlines() if re.match(r"[A-Za-z0-9]", line))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--torch-wheel", type=Path, help="a CPU torch wheel to read metadata from")
    parser.add_argument("--upgrade", action="store_true", help="let unpinned packages move")
    args = parser.parse_args(argv)
    try:
        count = compile_lock(args.torch_wheel, args.upgrade)
    except (ValueError, subprocess.CalledProcessError) as exc:
        print(f"lock: {exc}", file=sys.stderr)
        return 1
    print(f"{LOCK.relative_to(ROOT)}: {count} packages locked from {SOURCE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
