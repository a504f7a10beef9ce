# lorafleet: `make up` brings up a local cluster, `make test` runs the tests.
# Both start from nothing: the virtual environment is (re)built when it is
# missing or older than pyproject.toml.

PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed
EXTRAS := test,servers,s3,hf

.PHONY: up test lint format venv clean

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
