# Two entry points, both usable on a fresh machine with Python 3.11:
#   make lab   - set up .venv, fetch MNIST, open the course in JupyterLab
#   make test  - set up .venv, then run every test, nbval on every solution included
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Jupyter refuses to start as root unless told; containers and CI run as root.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)

.PHONY: lab test labs bench book rehearse-hub clean

# Where the packages come from. pip reads its own variables from the environment:
#   make lab PIP_INDEX_URL=https://pypi.tuna.tsinghua.edu.cn/simple   (a PyPI mirror)
# TORCH_INDEX, when set, is where torch and torchvision (the pinned versions) come
# from, before the rest; CPU-only wheels (no CUDA libraries: a few hundred MB instead
# of several GB; that index cannot be reached from the development machines):
#   make lab TORCH_INDEX=https://download.pytorch.org/whl/cpu
# book/zh_CN/setup.md (installing from inside China) and book/setup.md say more.
TORCH_INDEX ?=
TORCH_PINS := grep -E '^(torch|torchvision)==' env/requirements.txt

# The runtime and the labs' rooms (labkit), and the course tooling (coursetools, in
# tooling/: build-labs, i18n, the book, times), both editable; the learner image
# installs labkit alone (Dockerfile).
$(STAMP): env/requirements.txt pyproject.toml tooling/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(if $(TORCH_INDEX),$(TORCH_PINS) | xargs $(BIN)/python -m pip install --quiet --index-url "$(TORCH_INDEX)")
	$(BIN)/python -m pip install --quiet -r env/requirements.txt
	$(BIN)/python -m pip install --quiet --no-deps -e . -e tooling
	touch $(STAMP)

# MNIST from torchvision's hosts, or from $LABKIT_MNIST_MIRROR (a folder holding the
# four .gz files, or a mirror's URL): make lab LABKIT_MNIST_MIRROR=~/Downloads/mnist
lab: $(STAMP)
	$(BIN)/labkit data prepare || echo "MNIST is not ready yet: the labs will say what to do."
	$(BIN)/jupyter lab --notebook-dir=. --ServerApp.default_url=/lab/tree/labs $(ROOT_FLAG)

# The data first (downloaded through torchvision when missing, only verified when
# present, as in CI), then every test in quick mode with the network off: the suite
# must pass offline in well under 30 minutes. Three pytest-xdist workers, a file each
# at a time (a notebook's cells stay in order in one kernel), the longest files first
# (tests/conftest.py): much of the suite waits on ranks, rendezvous and kernels (the
# book's build alone keeps two cores 40 % busy), so three workers fit two cores: they
# kept them 89-92 % busy over a whole run.
# TEST_WORKERS=0: serial.
TEST_WORKERS ?= 3
test: $(STAMP)
	$(BIN)/labkit data prepare
	LABKIT_QUICK=1 LABKIT_OFFLINE=1 MPLBACKEND=agg $(BIN)/python -m pytest tests \
		-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder \
		--nbval-lax --nbval-current-env --nbval-cell-timeout=300 \
		--nbval-sanitize-with tests/nbval_sanitize.cfg --durations=40 solutions

labs: $(STAMP)
	$(BIN)/labkit build-labs

# The course book: every solution executed (full mode; LABKIT_QUICK=1 for quick) and
# cached, into build/book/<mode>/html (English; Chinese in its zh_CN/), with an
# instructor bundle beside it.
book: $(STAMP)
	$(BIN)/labkit data prepare
	$(BIN)/labkit book

bench: $(STAMP)
	$(BIN)/labkit data prepare
	for name in $$($(BIN)/python -c "from labkit.labs import BENCHMARKS; print(*BENCHMARKS)"); do \
		$(BIN)/labkit bench $$name || exit 1; done

# A classroom rehearsed on this machine, as root: K learners on a real JupyterHub run
# lab 03 at once (env/jupyterhub/rehearse.py; report in build/hub/report-K<K>.json).
# K: the learners this machine will hold on the day (CI runs K=2: tests/course/test_hub.py).
K ?= 8
rehearse-hub: $(STAMP)
	$(BIN)/labkit data prepare
	$(BIN)/python env/jupyterhub/rehearse.py --learners $(K)

clean:
	rm -rf $(VENV) .pytest_cache
