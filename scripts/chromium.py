"""Which Chromium the book's browser work uses: the browser tests (tests/conftest.py) and the
handout printer (scripts/slides.py) both ask :func:`find_chromium`, so they agree."""
from __future__ import annotations

import os
import shutil
from pathlib import Path


def find_chromium(playwright_executable: str | None = None) -> str | None:
    """The Chromium to drive: $TOKENFLOW_CHROMIUM if set (None if no such file), else
    ``chromium`` on PATH, /usr/bin/chromium, then ``playwright_executable`` (Playwright's own
    build, if installed); None if there is none."""
    if os.environ.get("TOKENFLOW_CHROMIUM"):            # the reader's choice, and only it
        exe = os.environ["TOKENFLOW_CHROMIUM"]
        return exe if Path(exe).is_file() else None
    for exe in (shutil.which("chromium"), "/usr/bin/chromium", playwright_executable):
        if exe and Path(exe).is_file():
            return str(exe)
    return None
