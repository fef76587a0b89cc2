"""Shared fixtures: the trained tiny model (loaded once), the two editions
of the book (each built once per run, in parallel under pytest-xdist) and one headless Chromium
per test process; the order the files run in (longest first, see SLOW_FIRST); and the perturbed
CPU environment of the notebook kernels that nbval starts (NBVAL_KERNEL_ENV)."""
import os

import pytest
import torch

from tokenflow import load_pretrained

from helpers import NBVAL_KERNEL_ENV, random_model, wide_random_model

torch.set_num_threads(1)

# The longest files first. `make test` runs pytest-xdist with --dist loadfile: each worker gets
# whole files, the next one whenever it has fewer than two queued, so a long file handed out
# last runs alone at the end while the other worker idles. The Chinese browser test goes first
# (it waits for the zh build, the longest), the English one second (its worker builds the
# English edition meanwhile), then the other files that open a browser, build or run
# subprocesses, longest first (CPU seconds measured per file, Chromium's included: browser
# 130, browser_zh 112, nbval_sanitize 32, lab 24, workshop 20, slides 18, glyphs 16, i18n 15,
# browser_model_page 11), then the notebooks (nbval), then everything else in collection
# order (each under 5 s). Add a file here when it becomes one of the slowest
# (``--durations=40``).
SLOW_FIRST = ("tests/test_browser_zh.py", "tests/test_browser.py", "tests/test_nbval_sanitize.py",
              "tests/test_lab.py", "tests/test_workshop.py", "tests/test_slides.py",
              "tests/test_browser_glyphs.py", "tests/test_i18n.py",
              "tests/test_browser_model_page.py", "tests/test_book.py",
              "tests/test_expert_parallel.py", "tests/test_model_page.py")


# nbval re-runs every notebook in a kernel whose CPU code paths differ from the ones that
# wrote the stored outputs: ATen's portable kernels instead of AVX2 / AVX-512 ones, one thread.
# A stored output that depends on the host (last-bit rounding of a reduction, a timing that is
# not tagged nbval-ignore-output) then fails here, on the machine that wrote it, and not first
# on a reader's laptop. Notebooks print agreement as a claim (tokenflow.viz.agree) instead.
# The environment is NBVAL_KERNEL_ENV (tests/helpers.py, where the tests read it too).


def _perturb_nbval_kernels() -> None:
    """Make nbval start its kernels with :data:`NBVAL_KERNEL_ENV` added to the environment
    (nbval 0.11 starts each notebook's kernel through ``nbval.kernel.start_new_kernel``)."""
    try:
        import nbval.kernel as nbval_kernel
    except ImportError:                       # nbval not installed: no notebooks to run
        return
    start = nbval_kernel.start_new_kernel
    if getattr(start, "tokenflow_perturbed", False):
        return

    def start_perturbed(*args, **kwargs):
        kwargs["env"] = {**os.environ, **kwargs.get("env", {}), **NBVAL_KERNEL_ENV}
        return start(*args, **kwargs)

    start_perturbed.tokenflow_perturbed = True
    nbval_kernel.start_new_kernel = start_perturbed


def pytest_configure(config):
    _perturb_nbval_kernels()
    # xdist's loadfile/loadscope scheduler sends the files with the MOST tests first (unless
    # --no-loadscope-reorder): our longest files have one or two tests each, so it would start
    # them last. Keep the order set by pytest_collection_modifyitems below instead.
    if hasattr(config.option, "loadscopereorder") and \
            "--loadscope-reorder" not in config.invocation_params.args:
        config.option.loadscopereorder = False


def _run_order(item) -> tuple[int, int]:
    path = item.nodeid.split("::", 1)[0]
    if path in SLOW_FIRST:
        return (0, SLOW_FIRST.index(path))
    return (1, 0) if path.endswith(".ipynb") or path.startswith("notebooks/") else (2, 0)


def pytest_collection_modifyitems(config, items):
    # a stable sort: the tests of one file stay together and in their order
    items.sort(key=_run_order)


@pytest.fixture(scope="session")
def pretrained():
    """(model, tokenizer) of the shipped tiny model, eval mode."""
    return load_pretrained()


@pytest.fixture
def make_model():
    return random_model


@pytest.fixture(scope="module")
def model():
    """A random tiny MoE model with wide weights (clear greedy choices), one per test file; a
    file that needs another model (GQA and MLA, other sizes) defines its own ``model``."""
    return wide_random_model(seed=0)


@pytest.fixture(scope="session")
def traced_prompt(pretrained):
    """The running example traced with tensors kept: (model, tokenizer, tokens, trace)."""
    from tokenflow import Trace
    model, tok = pretrained
    prompt = "北京是中国的首"
    trace = Trace(keep_tensors=True)
    with torch.no_grad():
        model(torch.tensor([tok.encode(prompt)]), trace=trace)
    return model, tok, tok.tokens(prompt), trace


def _jupyter_book() -> str:
    import shutil
    import sys
    from pathlib import Path
    exe = Path(sys.executable).with_name("jupyter-book")
    if exe.exists():
        return str(exe)
    found = shutil.which("jupyter-book")
    assert found, "jupyter-book is not installed in this environment"
    return found


def _shared_dir(tmp_path_factory, worker_id):
    """One temporary folder for the whole test run: under pytest-xdist the parent of the
    workers' own folders (they all see it), else this process's base folder."""
    base = tmp_path_factory.getbasetemp()
    return base if worker_id == "master" else base.parent


def _once(shared, name: str, make) -> None:
    """Run ``make()`` once per test run, whichever process asks first: the others wait on the
    file lock ``<name>.lock`` (the filelock package: also where fcntl does not exist, Windows)
    and skip it once ``<name>.done`` exists."""
    from filelock import FileLock
    with FileLock(shared / f"{name}.lock"):
        if not (shared / f"{name}.done").exists():
            make()
            (shared / f"{name}.done").touch()


def _fetch_widget_js(shared) -> None:
    """scripts/fetch_widget_js.sh (idempotent), once per run, before either edition builds."""
    import subprocess
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    _once(shared, "widget-js", lambda: subprocess.run(
        ["bash", str(root / "scripts" / "fetch_widget_js.sh")], cwd=root, check=True))


@pytest.fixture(scope="session")
def book_html_dir(tmp_path_factory, worker_id):
    """``_build/html`` of the book, built strictly (``jupyter-book build -W -n --keep-going``)
    into a temporary folder ONCE per test run: under pytest-xdist the workers share one build
    (the first builds under a file lock, the others wait and reuse it). Used by
    tests/test_book.py and tests/test_browser.py. With $TOKENFLOW_BOOK_HTML set to an existing
    ``_build/html`` folder, that one is used instead (no build: for working on the tests)."""
    import os
    import subprocess
    import time
    from pathlib import Path
    if os.environ.get("TOKENFLOW_BOOK_HTML"):
        return Path(os.environ["TOKENFLOW_BOOK_HTML"]).resolve()
    root = Path(__file__).resolve().parents[1]
    shared = _shared_dir(tmp_path_factory, worker_id)
    out = shared / "book"

    def build():
        cmd = [_jupyter_book(), "build", "-W", "-n", "--keep-going", "--path-output", str(out),
               "."]
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
        assert proc.returncode == 0, (
            f"{' '.join(cmd)} exited {proc.returncode}\n--- stdout ---\n"
            f"{proc.stdout[-8000:]}\n--- stderr ---\n{proc.stderr[-8000:]}")
        print(f"book built in {time.perf_counter() - start:.1f} s")

    _fetch_widget_js(shared)
    _once(shared, "book", build)
    html = out / "_build" / "html"
    assert html.is_dir(), f"no HTML output in {out}"
    return html


@pytest.fixture(scope="session")
def zh_html_dir(request, tmp_path_factory, worker_id):
    """The Chinese edition built strictly (``scripts/i18n.py build``) ONCE per test run and
    placed in ``zh/`` of the English build, as ``make book`` lays them out (so the language
    switch links resolve). It builds into a folder of its own first, so it never waits for the
    English build (under pytest-xdist another worker builds that one at the same time); workers
    share it through file locks, as :func:`book_html_dir`. With $TOKENFLOW_BOOK_HTML set, its
    ``zh/`` folder is used (built by ``make book``)."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    if os.environ.get("TOKENFLOW_BOOK_HTML"):
        return Path(os.environ["TOKENFLOW_BOOK_HTML"]).resolve() / "zh"
    root = Path(__file__).resolve().parents[1]
    shared = _shared_dir(tmp_path_factory, worker_id)
    built = shared / "zh-html"

    def build():
        cmd = [sys.executable, str(root / "scripts" / "i18n.py"), "build", "--dest",
               str(built), "--staging", str(shared / "zh-staging")]
        proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
        assert proc.returncode == 0, f"{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}"

    _fetch_widget_js(shared)
    _once(shared, "zh", build)
    dest = request.getfixturevalue("book_html_dir") / "zh"
    _once(shared, "zh-placed", lambda: built.rename(dest))   # same file system: a move
    assert (dest / "index.html").exists() or any(dest.rglob("*.html")), f"no zh HTML in {dest}"
    return dest


@pytest.fixture(scope="session")
def browser():
    """Headless Chromium driven by Playwright, started once per test process and shared by
    tests/test_browser.py and tests/test_browser_zh.py: $TOKENFLOW_CHROMIUM, else ``chromium``
    on PATH (Debian's), else Playwright's own Chromium (``python -m playwright install
    chromium``), else the tests error with :data:`CHROMIUM_HELP` (``make test`` tries the
    three ways first, see the Makefile's ``chromium`` target). It resolves no host name but
    127.0.0.1, so a page of the book cannot reach the network: the tests serve the book there
    and report any other request as blocked."""
    from playwright.sync_api import sync_playwright
    args = ["--no-sandbox", "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"]
    with sync_playwright() as p:
        exe = find_chromium(p.chromium.executable_path)
        if exe is None:
            pytest.fail(CHROMIUM_HELP, pytrace=False)
        b = p.chromium.launch(executable_path=exe, args=args)
        yield b
        b.close()


CHROMIUM_HELP = (
    "no Chromium for the browser tests (tests/test_browser.py, tests/test_browser_zh.py). "
    "Any one of these provides it: (1) put a `chromium` on PATH (or set TOKENFLOW_CHROMIUM to "
    "its path); (2) as root on Debian/Ubuntu: `apt-get install chromium`; (3) "
    "`.venv/bin/python -m playwright install chromium` (downloads Playwright's own build). "
    "`make test` tries 1, 2 (as root with apt-get) and 3 itself. To run the other tests "
    "without a browser: add `-k 'not browser'`.")


def find_chromium(playwright_executable: str | None = None) -> str | None:
    """scripts/chromium.py's :func:`find_chromium` (one lookup for the tests and the handout)."""
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "scripts" / "chromium.py"
    spec = importlib.util.spec_from_file_location("tokenflow_chromium", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.find_chromium(playwright_executable)
