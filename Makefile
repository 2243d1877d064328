# dhp-planner: `make run` starts the planning service on 127.0.0.1:8000, `make example` plans an example batch,
# `make test` runs the test suite.
# Each creates the virtual environment on first use and installs what it needs: `make run` and
# `make example` only the service and the solvers (RUN_EXTRAS), `make test` and `make lint` every extra.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
RUN_EXTRAS ?= solver,service
EXTRAS ?= solver,service,bench,flexsp,trainer,megatron,jobs,ray,dev
comma := ,
TYPED ?= optimizer planning solver_models api jobs trainer bench
# The checkout's own modules byte-compiled at install, as pip does for what it installs from a wheel:
# where PYTHONDONTWRITEBYTECODE is set, every process would otherwise compile them from source again
# (about 180 ms of a fresh `dhp plan`, measured on the 2-core development machine).
PACKAGES := optimizer planning solver_models api jobs trainer bench
RUN_STAMP := $(VENV)/.installed-$(subst $(comma),-,$(RUN_EXTRAS))
STAMP := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))

.PHONY: run example test lint bench clean venv

venv: $(STAMP)

$(RUN_STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[$(RUN_EXTRAS)]'
	$(PY) -m compileall -q $(PACKAGES)
	touch $@

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[$(EXTRAS)]'
	$(PY) -m compileall -q $(PACKAGES)
	touch $@ $(RUN_STAMP)

run: $(RUN_STAMP)
	@echo "Starting the planning service on http://127.0.0.1:8000 (SQLite store under ./data); it prints where to look. Ctrl-C stops it."
	$(VENV)/bin/dhp serve --host 127.0.0.1 --port 8000

example: $(RUN_STAMP)
	$(VENV)/bin/dhp plan --batch examples/batch_video_512.json --cluster-preset h100-8x8 --model-preset qwen2-vl-7b --summary

test: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy $(TYPED)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
