PY ?= python3

.PHONY: setup quickstart test lint bench

setup:
	./scripts/setup

quickstart: setup
	stoker quickstart

test: setup
	$(PY) -m pytest -q

lint:
	ruff check src tests examples benchmarks
