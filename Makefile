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

test: lint
	$(BIN)/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

protos: venv
	$(BIN)/python scripts/gen_protos.py

demo: venv
	$(BIN)/python -m faultmesh.demo $(DEMO_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache
