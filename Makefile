# Fresh-machine set-up in one command each: `make run`, `make test` (needs only python3.11 and make).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEVSTAMP := $(VENV)/.installed-dev

.PHONY: run test test-all browser clean

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
	$(BIN)/dpeval run --defense rs --attack ig

test: $(DEVSTAMP) browser
	$(BIN)/python -m pytest -m "not slow" -q

test-all: $(DEVSTAMP) browser
	$(BIN)/python -m pytest -q

# The report test renders the page in headless Chromium. Install Debian's package when that is cheap
# (root with apt); otherwise that one test is skipped.
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1 || \
	    { apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1; }; } ; } || \
	  echo "chromium not installed: the report's browser test will be skipped"

clean:
	rm -rf $(VENV) dpeval-results .pytest_cache
