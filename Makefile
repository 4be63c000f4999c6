# Two commands from a fresh clone with only Python >= 3.11 and pip:
#   make serve   install everything, export the demo bundles, start the node on :8001/:8002
#   make test    run every check CI runs (nox -s tests)

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
MODELS ?= build/models
PACKAGES := core client gateway worker node export

.PHONY: serve test install lint proto clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# One pip call for all six, so the exact sibling pins resolve against the editable checkouts.
$(VENV)/.installed: $(BIN)/python $(foreach p,$(PACKAGES),packages/$(p)/pyproject.toml)
	$(BIN)/pip install $(foreach p,$(PACKAGES),-e packages/$(p))
	touch $@

install: $(VENV)/.installed

serve: install
	$(BIN)/python tools/serve.py --venv $(VENV) --models $(MODELS)

test: $(BIN)/python
	$(BIN)/pip install --quiet 'nox>=2024.10.9'
	$(BIN)/nox -s tests

lint: $(BIN)/python
	$(BIN)/pip install --quiet 'nox>=2024.10.9'
	$(BIN)/nox -s lint

proto: $(BIN)/python
	$(BIN)/pip install --quiet 'nox>=2024.10.9'
	$(BIN)/nox -s proto

clean:
	rm -rf $(VENV) .nox build dist
