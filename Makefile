# Entry points: `make demo` (a first whole run in minutes), `make repro` and `make test`. Each builds .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch goes first and pinned: the CPU build; an unpinned torch pulls CUDA wheels.
TORCH_SPEC ?= torch==2.13.0

.PHONY: demo test test-fast repro repro-from val venv lint clean-venv

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(TORCH_SPEC)
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $@

# The tests run pinned as every stage does (digiq.kernels): what they compute in-process has a stage's bits.
PINNED := $(BIN)/python -m digiq.kernels --params params.yaml

test: venv
	$(PINNED) $(BIN)/python -m pytest -q

# While developing: every test but those marked slow (whole notebooks, DVC runs, several processes, a browser).
test-fast: venv
	$(PINNED) $(BIN)/python -m pytest -q -m "not slow"

# Every stage and notebook at params/presets/demo.yaml in a scratch copy (DEMO_DIR): this checkout's dvc.lock,
# metrics and notebooks stay as they are. Ends with the demo's results table and figures.
DEMO_DIR ?= /tmp/digiq-demo
demo: venv
	$(BIN)/python -m digiq.demo --workspace $(DEMO_DIR)

# dvc runs stage commands through the shell: put .venv first on PATH so `python` is ours.
repro: venv
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/dvc repro

# Start from imported data (docs/real-models.md, "Released Digi-Q / DigiRL data"):
#   make repro-from STAGE=critic DATA="data/imported/general data/imported/webshop"
repro-from: venv
	$(BIN)/python -m digiq.data start-at $(STAGE) $(DATA)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/dvc repro --single-item $$($(BIN)/python -m digiq.data upstream $(STAGE))
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/dvc repro --downstream $(STAGE)

# After `make repro`: the base, the paper's rows and the variants on the validation lists, where every
# choice is made (docs/experiments.md); one JSON per row in metrics/val/, read by `python -m digiq.report`.
VAL_ROWS ?= base digiq filtered_bc digirl_offline digiq_hierarchy digiq_frozen_text
SEEDS = $$($(BIN)/python -c 'from digiq.config import load_settings; print(load_settings().experiment.seeds)')
val: venv
	cat data/tasks/general_val.txt data/tasks/webshop_val.txt > data/val_tasks.txt
	for row in $(VAL_ROWS); do \
	  if [ $$row = base ]; then folders=data/models/base_policy; \
	  else folders="$$(for s in $$(seq 0 $$(($(SEEDS) - 1))); do echo data/models/actors/seed$$s/$$row; done)"; fi; \
	  $(BIN)/python -m digiq.evaluate --policy $$folders --tasks data/val_tasks.txt --out metrics/val/$$row.json || exit 1; \
	done

lint: venv
	$(BIN)/ruff check digiq tests benchmarks notebooks
	$(BIN)/ruff format --check digiq tests benchmarks

clean-venv:
	rm -rf $(VENV)
