# Two commands do everything on a fresh machine (as root, package registries only):
#   make demo   the example pipeline (hvdk8s pipeline run): 3 candidates on 2 ranks -> select -> serve -> load test
#   make test   the test suite, on the default stack (TensorFlow 2.21 / Keras 3.15), without the e2e scenarios
#   make test-e2e   the e2e scenarios (pytest -m e2e: whole jobs and benchmark runs of a minute or more each)
#   make docs   the documentation site (MkDocs, docs/), served live at http://127.0.0.1:8000
# Each runs `setup` first: Debian packages, .venv, the stack, Horovod built from source (patched, cached wheel).
#   make test-stack TF=2.18   the training core and Horovod's own Keras tests on another supported stack,
#                             in its own virtual environment (.venv-tf2.18) with its own cached Horovod wheel
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.hvdk8s-setup
PYTEST_ARGS ?=
TF ?= 2.18
SETUP_INPUTS := pyproject.toml scripts/setup.sh scripts/install-horovod.sh scripts/patches/horovod-0.28.1-tf2.21.patch
# The training core: Horovod's API and its own Keras tests (test_horovod_api runs ../shared/peer/horovod), fit,
# the optimizer, schedules, callbacks, mixed precision, checkpoints (a migrated Horovod script's resume included),
# elastic training; and a SavedModel exported on the default stack, loaded and called under the oldest.
CORE_TESTS := tests/test_keras_compat.py tests/test_horovod_api.py tests/test_training.py tests/test_fit_step.py tests/test_fused.py \
	tests/test_schedule.py tests/test_callbacks.py tests/test_mixed_precision.py tests/test_checkpoint.py \
	tests/test_resume_h5.py tests/test_elastic.py tests/test_overlap.py tests/test_savedmodel_compat.py

.PHONY: setup demo test test-e2e test-stack lint docs clean

setup: $(STAMP)

$(STAMP): $(SETUP_INPUTS) scripts/stacks/tf-2.21.txt
	HVDK8S_VENV=$(VENV) HVDK8S_TF=2.21 bash scripts/setup.sh
	touch $@

demo: setup
	PATH="$(abspath $(VENV))/bin:$$PATH" bash scripts/demo.sh

test: setup lint
	$(PY) -m pytest -n 2 --dist loadgroup --no-loadscope-reorder -m "not e2e" $(PYTEST_ARGS)

test-e2e: setup
	$(PY) -m pytest -n 2 --dist loadgroup --no-loadscope-reorder -m e2e $(PYTEST_ARGS)

# ruff (pyflakes, pycodestyle errors, import order; [tool.ruff]) and mypy (scripts/typecheck.py; [tool.mypy]),
# both configured in pyproject.toml; make test runs them first
lint: setup
	$(VENV)/bin/ruff check .
	$(PY) scripts/typecheck.py

.venv-tf%/.hvdk8s-setup: $(SETUP_INPUTS) scripts/stacks/tf-%.txt
	HVDK8S_VENV=.venv-tf$* HVDK8S_TF=$* bash scripts/setup.sh
	touch $@

test-stack: .venv-tf$(TF)/.hvdk8s-setup
	.venv-tf$(TF)/bin/python -m pytest -n 2 --dist loadgroup --no-loadscope-reorder $(PYTEST_ARGS) $(CORE_TESTS)

docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

clean:
	rm -rf out .pytest_cache
