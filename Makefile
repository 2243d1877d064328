# dhp-planner: `make run` starts the planning service on 127.0.0.1:8000, `make example` plans an example batch,
# `make test` runs the test suite.
# Both create the virtual environment on first use and install what they need.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
EXTRAS ?= solver,service,bench,flexsp,trainer,jobs,ray,dev
comma := ,
TYPED ?= optimizer planning solver_models api jobs
STAMP := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))

.PHONY: run example test lint bench clean venv

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[$(EXTRAS)]'
	touch $@

run: $(STAMP)
	@echo "Starting the planning service on http://127.0.0.1:8000 (SQLite store under ./data); it prints where to look. Ctrl-C stops it."
	$(VENV)/bin/dhp serve --host 127.0.0.1 --port 8000

example: $(STAMP)
	$(VENV)/bin/dhp plan --batch examples/batch_video_512.json --cluster-preset h100-8x8 --model-preset qwen2-vl-7b --summary

test: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy $(TYPED)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
