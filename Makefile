# Two commands do everything on a fresh machine (as root, package registries only):
#   make demo   the example pipeline (hvdk8s pipeline run): 3 candidates on 2 ranks -> select -> serve -> load test
#   make test   the test suite
# Both run `setup` first: Debian packages, .venv, TensorFlow, Horovod built from source (cached wheel).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.hvdk8s-setup
PYTEST_ARGS ?=

.PHONY: setup demo test clean

setup: $(STAMP)

$(STAMP): pyproject.toml scripts/setup.sh
	HVDK8S_VENV=$(VENV) bash scripts/setup.sh
	touch $@

demo: setup
	PATH="$(abspath $(VENV))/bin:$$PATH" bash scripts/demo.sh

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

clean:
	rm -rf out .pytest_cache
