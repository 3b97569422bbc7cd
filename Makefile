# gpt2-deploy: `make export build-engine bench` from nothing; `make test` for the test suite.
# Each stage target depends on the one before; a stage whose inputs are unchanged does nothing.
#   make all PRESET=gpt2             the 124M shape (on a GPU)
#   make finetune ARGS="--model gpt2" extra CLI options for the stage commands
PY      ?= python3
VENV    ?= .venv
PRESET  ?= tiny
RUN     ?= $(PRESET)
ART     ?= artifacts
# The CPU build unless a torch is already there: keep a CUDA torch you installed yourself.
TORCH   ?= torch==2.13.0
EXTRAS  ?= cpu,quant,trt-rtx,serve,dev
ARGS    ?=

CLI   := $(VENV)/bin/gpt2-deploy
STAGE := --preset $(PRESET) --run $(RUN) --artifacts $(ART) $(ARGS)

.PHONY: all install finetune export build-engine validate bench profile train-bench doctor test clean
# the main job: every stage on the embedded default, end to end
all: finetune export build-engine validate bench

install: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	test -x $(VENV)/bin/python || $(PY) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(VENV)/bin/python -c "import torch" 2>/dev/null || $(VENV)/bin/python -m pip install -q "$(TORCH)"
	$(VENV)/bin/python -m pip install -q -e ".[$(EXTRAS)]"
	touch $@

finetune: install
	$(CLI) finetune $(STAGE)

export: finetune
	$(CLI) export $(STAGE)

build-engine: export
	$(CLI) build-engine $(STAGE)

validate: export
	$(CLI) validate $(STAGE)

bench: export
	$(CLI) bench $(STAGE)

profile: install
	$(CLI) profile $(STAGE)

train-bench: install
	$(CLI) train-bench --artifacts $(ART) $(ARGS)

doctor: install
	$(CLI) doctor

test: install
	$(VENV)/bin/python -m pytest -q

clean:
	rm -rf $(ART)/$(RUN)
