# lorafleet: `make up` brings up a local cluster, `make test` runs the tests.
# Both start from nothing: the virtual environment is (re)built when it is
# missing or older than pyproject.toml.

PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed
EXTRAS := test,servers,s3,hf

.PHONY: up test test-compose lint format venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(VENV)/bin/python -m pip install -q -e '.[$(EXTRAS)]'
	touch $(STAMP)

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/python -m pytest

# The stack of compose.yaml, built and run on a private Docker engine (needs root;
# installs Debian's docker.io and debootstrap when missing). See docs/compose.md.
test-compose: $(STAMP)
	$(VENV)/bin/python -m pytest -p no:cacheprovider -x --timeout 3600 tests/compose/e2e_stack.py

up: $(STAMP)
	$(VENV)/bin/lorafleet up

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
