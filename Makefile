# Fresh-machine set-up in one command each: `make run`, `make test` (needs only python3.11 and make).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEVSTAMP := $(VENV)/.installed-dev

.PHONY: run test test-all clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e .
	touch $@

$(DEVSTAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[dev,distributed]'
	touch $(STAMP) $@

run: $(STAMP)
	$(BIN)/dpeval run --defense dpsgd --attack none

test: $(DEVSTAMP)
	$(BIN)/python -m pytest -m "not slow" -q

test-all: $(DEVSTAMP)
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) dpeval-results .pytest_cache
