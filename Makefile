# Two commands matter: `make run` and `make test`. Both create .venv when it is missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-fast lint format loads bench netem-cleanup clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml constraints.txt
	$(BIN)/python -m pip install --quiet -c constraints.txt torch==2.13.0
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/python -m dcoded $(ARGS)

loads: $(STAMP)
	$(BIN)/python -m dcoded.coding $(ARGS)

bench: $(STAMP)
	$(BIN)/python -m dcoded.bench $(ARGS)

netem-cleanup: $(STAMP)
	$(BIN)/python -m dcoded.netem cleanup

test: $(STAMP)
	$(BIN)/python -m pytest $(ARGS)

test-fast: $(STAMP)
	$(BIN)/python -m pytest -m 'not slow' $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check dcoded tests
	$(BIN)/ruff format --check dcoded tests

format: $(STAMP)
	$(BIN)/ruff format dcoded tests
	$(BIN)/ruff check --fix dcoded tests

clean:
	rm -rf $(VENV) outputs multirun bench .pytest_cache .ruff_cache build *.egg-info
