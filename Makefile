# The two contract commands: `make demo` (the whole stack on real input) and `make test`.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv test lint fmt demo protos bench clean

$(STAMP): pyproject.toml
	@command -v $(PY) >/dev/null || { echo "need $(PY)"; exit 1; }
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,torch]'
	touch $(STAMP)

venv: $(STAMP)

lint: venv
	$(BIN)/ruff check services tests bench scripts
	$(BIN)/ruff format --check services tests bench scripts

fmt: venv
	$(BIN)/ruff check --fix services tests bench scripts
	$(BIN)/ruff format services tests bench scripts

# The suite runs on PYTEST_WORKERS pytest-xdist processes, one test file per worker at a time
# (--dist loadfile: a file's module-scoped fixtures start once). Most tests wait on subprocesses and
# sockets, so 3 workers pay on 2 cores. Then the timing-sensitive tests (marked serial) run alone;
# exit status 5 (no serial test among those PYTEST_ARGS selects) is not a failure.
# PYTEST_WORKERS=0 runs the first part in this one process too.
PYTEST_WORKERS ?= 3
PYTEST := $(BIN)/python -m pytest -q -p no:cacheprovider
test: lint
	$(PYTEST) -n $(PYTEST_WORKERS) --dist loadfile -m "not serial" $(PYTEST_ARGS)
	$(PYTEST) -m serial $(PYTEST_ARGS); rc=$$?; [ $$rc = 0 ] || [ $$rc = 5 ]

protos: venv
	$(BIN)/python scripts/gen_protos.py

demo: venv
	$(BIN)/python -m fmtools.demo $(DEMO_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache
