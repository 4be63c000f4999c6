# Two commands from a fresh clone with only Python >= 3.11 and pip:
#   make serve   install everything, export the demo bundles, start the node on :8001/:8002
#                (TORCH=1 adds the PyTorch example: the torch extra and torchvision)
#   make test    run every check CI runs (nox -s tests)

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
MODELS ?= build/models
PACKAGES := core client gateway worker node export

.PHONY: serve test install lint proto reference clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# The export extras the shipped examples use: flax always (small); the torch extra and
# torchvision only with TORCH=1 (several GB: `make serve TORCH=1` adds examples/resnet50_torch).
comma := ,
EXPORT_EXTRAS := flax$(if $(TORCH),$(comma)torch)
TORCH_EXTRAS := $(if $(TORCH),'torchvision==0.27.1')
INSTALLED := $(VENV)/.installed$(if $(TORCH),-torch)

# One pip call for all six, so the exact sibling pins resolve against the editable checkouts.
$(INSTALLED): $(BIN)/python $(foreach p,$(PACKAGES),packages/$(p)/pyproject.toml)
	$(BIN)/pip install $(foreach p,$(filter-out export,$(PACKAGES)),-e packages/$(p)) \
		-e 'packages/export[$(EXPORT_EXTRAS)]' $(TORCH_EXTRAS)
	touch $@

install: $(INSTALLED)

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

# docs/reference/configuration.md from the configuration schemas (tests/test_config_reference.py
# fails when the committed file is stale).
reference: install
	$(BIN)/python tools/config_reference.py

clean:
	rm -rf $(VENV) .nox build dist
