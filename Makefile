# Two commands matter: `make run` and `make test`. Both create .venv when it is missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# What is installed: STAMP what running needs (dcoded and its dependencies), TEST_STAMP that and
# the test extras (pytest, hypothesis, ruff, the loggers the tests read back...). Installing the
# test extras also satisfies STAMP; `make test` after `make run` still installs them.
STAMP := $(VENV)/.installed-run
TEST_STAMP := $(VENV)/.installed-test
PIP := $(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt
# dcoded itself, editable; without setuptools' notice on every editable install of a package
# mapped from another folder (conf/ is dcoded.conf): "be careful with folders ... named as
# your package", which the checkout is
EDITABLE := PYTHONWARNINGS="ignore:Editable installation" $(PIP) -e

.PHONY: install run test test-all lint format loads notebook compare bench paper paper-results paper-draw netem-cleanup clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --upgrade pip

# torch first, from the pin in constraints.txt (the CPU build where the index has it)
$(STAMP): $(BIN)/python pyproject.toml constraints.txt
	$(PIP) torch==2.13.0
	$(EDITABLE) .
	touch $(STAMP)

$(TEST_STAMP): $(BIN)/python pyproject.toml constraints.txt
	$(PIP) torch==2.13.0
	$(EDITABLE) '.[test]'
	touch $(STAMP) $(TEST_STAMP)

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

# A first comparison, about a minute on 2 cores: DDP, cdc at r = 1 and at its best coded r, and
# the XOR-free control, on an emulated bus (on loopback, saying so, without root or iproute2),
# then their ratios with what each means; ARGS for more overrides (cluster.topology=switch).
compare: $(STAMP)
	$(BIN)/python -m dcoded -m experiment=compare $(ARGS)

# The bench's multiruns (experiment=bench, bench_cdc, bench_cdc_ends) into bench/<date>_<time>/,
# then its table; ARGS="--read DIR" only reads a sweep folder of them.
bench: $(STAMP)
	$(BIN)/python -m dcoded.bench $(ARGS)

# The paper's tables and figures: stage 1 runs the sweeps (cached in paper/results/$(SIZE)),
# stage 2 only reads them and draws into paper/results/$(SIZE)/report/ (out of git: the
# shipped paper/REPORT.md, paper/figures and paper/tables are left as they are). SIZE=full for
# the full-size setting; MNIST=DIR to train on the MNIST IDX files in DIR instead of MNIST-sized
# synthetic data; BEYOND=1 also the studies beyond the paper (Figures 6-10, under the scale
# model: 77 minutes more on 2 cores); INTO_PAPER=1 draws over the shipped report instead
# (paper.draw --into-paper), as when rebuilding it for a commit: make paper INTO_PAPER=1.
SIZE ?= small
paper: paper-results paper-draw

paper-results: $(STAMP)
	$(BIN)/python -m paper.sweep --size $(SIZE) $(if $(MNIST),--mnist $(MNIST)) $(if $(BEYOND),--beyond) $(ARGS)

paper-draw: $(STAMP)
	$(BIN)/python -m paper.draw --size $(SIZE) $(if $(INTO_PAPER),--into-paper)

netem-cleanup: $(STAMP)
	$(BIN)/python -m dcoded.netem cleanup

# The fast tier: everything but the emulated network and the long real-process runs, on as
# many pytest processes as the machine has cores, up to 4 (pytest-xdist): minutes.
FAST := not slow and not netem
PARALLEL := -n auto --maxprocesses 4 --dist worksteal
test: $(TEST_STAMP)
	@$(BIN)/python -m pytest $(PARALLEL) -m '$(FAST)' $(ARGS); status=$$?; \
	echo "make test ran the fast tier (-m '$(FAST)'); make test-all runs every test" \
	  "(the slow and netem ones too, as CI does: about 25 minutes on 2 cores)"; exit $$status

# Every test, as CI runs it (.ci/run): the fast tier and the slow tests marked parallel_safe
# in parallel, then the other slow and netem tests one at a time (they time real processes
# and links). The netem tests need root and iproute2 (skipped elsewhere, with the reason).
test-all: $(TEST_STAMP)
	$(BIN)/python -m pytest $(PARALLEL) -m '($(FAST)) or parallel_safe' $(ARGS)
	$(BIN)/python -m pytest -m 'not ($(FAST)) and not parallel_safe' $(ARGS)

lint: $(TEST_STAMP)
	$(BIN)/ruff check dcoded tests paper
	$(BIN)/ruff format --check dcoded tests paper

format: $(TEST_STAMP)
	$(BIN)/ruff format dcoded tests paper
	$(BIN)/ruff check --fix dcoded tests paper

clean:
	rm -rf $(VENV) outputs multirun bench .pytest_cache .ruff_cache build *.egg-info
