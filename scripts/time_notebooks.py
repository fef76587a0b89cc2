"""Measure how long each participant notebook takes to run, for book/workshop.md's timetables:
``python scripts/time_notebooks.py`` writes book/notebook_run_times.json.

Each notebook of ``_build/participant/`` (written first by scripts/participant_notebooks.py) runs
top to bottom in a fresh kernel (nbclient), one after the other; the time is wall-clock seconds
from the kernel's start to the last cell's end: what a room waits for on "Run All".
tests/test_workshop.py checks the timetables against the file.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "book" / "notebook_run_times.json"


def run_time(path: Path, timeout: int = 300) -> float:
    """Seconds to run notebook ``path`` top to bottom in a fresh kernel (its folder as cwd)."""
    import nbformat
    from nbclient import NotebookClient
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    NotebookClient(nb, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--note", default="", help="how loaded the machine was, e.g. 'shared, load 6'")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT / "scripts"))
    import participant_notebooks
    seconds = {}
    for p in participant_notebooks.write_all():
        seconds[p.stem] = round(run_time(p), 1)
        print(f"{p.stem}: {seconds[p.stem]} s", flush=True)
    data = {"what": "wall-clock seconds to run each participant notebook top to bottom in a fresh "
                    "kernel (nbclient), kernel start included",
            "measured": datetime.date.today().isoformat(),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python "
                       f"{platform.python_version()}" + (f"; {args.note}" if args.note else ""),
            "seconds": seconds}
    args.out.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
