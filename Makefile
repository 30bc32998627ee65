# Two commands matter: `make run` and `make test`. Both create .venv when it is missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-all lint format loads notebook bench paper paper-results paper-draw netem-cleanup clean

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

# JupyterLab is installed into .venv on first use, not by `make install` (the tests run the
# notebooks without it).
notebook: $(STAMP)
	$(BIN)/python -c "import jupyterlab" 2>/dev/null || $(BIN)/python -m pip install --quiet jupyterlab
	$(BIN)/jupyter lab notebooks/ $(ARGS)

# The bench's multiruns (experiment=bench, bench_cdc, bench_cdc_ends) into bench/<date>_<time>/,
# then its table; ARGS="--read DIR" only reads a sweep folder of them.
bench: $(STAMP)
	$(BIN)/python -m dcoded.bench $(ARGS)

# The paper's tables and figures: stage 1 runs the sweeps (cached in paper/results/$(SIZE)),
# stage 2 only reads them and draws. SIZE=full for the full-size setting; MNIST=DIR to train on
# the MNIST IDX files in DIR instead of MNIST-sized synthetic data; BEYOND=1 also the studies
# beyond the paper (Figures 6-10, under the scale model: 77 minutes more on 2 cores).
SIZE ?= small
paper: paper-results paper-draw

paper-results: $(STAMP)
	$(BIN)/python -m paper.sweep --size $(SIZE) $(if $(MNIST),--mnist $(MNIST)) $(if $(BEYOND),--beyond) $(ARGS)

paper-draw: $(STAMP)
	$(BIN)/python -m paper.draw --size $(SIZE)

netem-cleanup: $(STAMP)
	$(BIN)/python -m dcoded.netem cleanup

# The fast tier: everything but the emulated network and the long real-process runs, on as
# many pytest processes as the machine has cores, up to 4 (pytest-xdist): minutes.
FAST := not slow and not netem
PARALLEL := -n auto --maxprocesses 4 --dist worksteal
test: $(STAMP)
	@$(BIN)/python -m pytest $(PARALLEL) -m '$(FAST)' $(ARGS); status=$$?; \
	echo "make test ran the fast tier (-m '$(FAST)'); make test-all runs every test" \
	  "(the slow and netem ones too, as CI does: about 25 minutes on 2 cores)"; exit $$status

# Every test, as CI runs it (.ci/run): the fast tier and the slow tests marked parallel_safe
# in parallel, then the other slow and netem tests one at a time (they time real processes
# and links). The netem tests need root and iproute2 (skipped elsewhere, with the reason).
test-all: $(STAMP)
	$(BIN)/python -m pytest $(PARALLEL) -m '($(FAST)) or parallel_safe' $(ARGS)
	$(BIN)/python -m pytest -m 'not ($(FAST)) and not parallel_safe' $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check dcoded tests paper
	$(BIN)/ruff format --check dcoded tests paper

format: $(STAMP)
	$(BIN)/ruff format dcoded tests paper
	$(BIN)/ruff check --fix dcoded tests paper

clean:
	rm -rf $(VENV) outputs multirun bench .pytest_cache .ruff_cache build *.egg-info
