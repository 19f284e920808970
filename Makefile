# Switchboard — every target sets itself up; `make run` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install run test test-fast lint typecheck docs bench all clean browser

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit("Python 3.11+ is required (found %s)" % sys.version.split()[0]) if sys.version_info < (3, 11) else None'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/switchboard run

test: $(STAMP)
	$(BIN)/pytest -n 2 --dist loadfile

test-fast: $(STAMP)
	$(BIN)/pytest -m "not chaos and not browser"

lint: $(STAMP)
	$(BIN)/ruff check switchboard tests bench
	$(BIN)/ruff format --check switchboard tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

bench: $(STAMP)
	$(BIN)/python -m bench

all: lint typecheck docs test

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache site
