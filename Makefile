# gpt2-deploy: `make export build-engine bench` from nothing; `make test` for the test suite.
# Each stage target depends on the one before; a stage whose inputs are unchanged does nothing.
#   make all PRESET=gpt2             the 124M shape (on a GPU)
#   make finetune ARGS="--model gpt2" extra CLI options for the stage commands
PY      ?= python3
VENV    ?= .venv
TRITON_VENV ?= .venv-triton
OPTIMUM_VENV ?= .venv-optimum
PRESET  ?= tiny
RUN     ?= $(PRESET)
ART     ?= artifacts
# torch: the CPU build of 2.13 unless a torch is already there (a CUDA torch you installed is kept;
# TORCH=... on the command line replaces it). TORCH_INDEX: the package index pip takes torch from,
# e.g. PyTorch's CPU wheel index, so a CPU machine never pulls a CUDA build (empty: pip's default).
TORCH       ?= torch==2.13.0
TORCH_INDEX ?=
EXTRAS      ?= cpu,quant,trt-rtx,serve,dev
ARGS        ?=
comma := ,
# the tiny preset's bench (a CPU's): batch 64 costs minutes there and shows nothing batch 8 does not
BENCH_ARGS  ?= $(if $(filter tiny,$(PRESET)),--batch 1$(comma)8)

CLI   := $(VENV)/bin/gpt2-deploy
STAGE := --preset $(PRESET) --run $(RUN) --artifacts $(ART) $(ARGS)

.PHONY: all install finetune export build-engine validate bench profile train-bench doctor lint test clean triton-env optimum-env compare-optimum FORCE
# the main job: every stage on the embedded default, end to end
all: finetune export build-engine validate bench

install: $(VENV)/.installed
# what was asked for: a change of EXTRAS, TORCH or TORCH_INDEX redoes the install
SPEC := $(TORCH) $(TORCH_INDEX) [$(EXTRAS)]
$(VENV)/.install-spec: FORCE
	@mkdir -p $(VENV)
	@echo '$(SPEC)' | cmp -s - $@ || echo '$(SPEC)' > $@

$(VENV)/.installed: pyproject.toml $(VENV)/.install-spec
	test -x $(VENV)/bin/python || $(PY) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	if [ "$(origin TORCH)" = "command line" ] || ! $(VENV)/bin/python -c "import torch" 2>/dev/null; then \
	  $(VENV)/bin/python -m pip install -q "$(TORCH)" $(if $(TORCH_INDEX),--index-url "$(TORCH_INDEX)"); fi
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
	$(CLI) bench $(STAGE) $(BENCH_ARGS)

# Triton Inference Server's Python backend stub (nvidia-pytriton's) is built against numpy 1: a venv of
# its own holds numpy 1 and the server, and sees this project's packages after its own
triton-env: install
	test -x $(TRITON_VENV)/bin/python || $(PY) -m venv $(TRITON_VENV)
	$(TRITON_VENV)/bin/python -m pip install -q "numpy<2" "ml_dtypes>=0.5,<0.6" nvidia-pytriton==0.7.0 --no-deps
	$(VENV)/bin/python -c "import site; print(f'import site; site.addsitedir({site.getsitepackages()[0]!r})')" \
	  > "$$($(TRITON_VENV)/bin/python -c 'import site; print(site.getsitepackages()[0])')/gpt2_deploy.pth"

# Optimum's own environment (its ONNX exporter needs transformers 4.x), and our CPU backends against its
# best on the run's checkpoint (python -m pipeline.optimum_compare; the ort target's fp32 and int8 first)
optimum-env:
	test -x $(OPTIMUM_VENV)/bin/python || $(PY) -m venv $(OPTIMUM_VENV)
	$(OPTIMUM_VENV)/bin/python -m pip install -q "$(TORCH)" $(if $(TORCH_INDEX),--index-url "$(TORCH_INDEX)")
	$(OPTIMUM_VENV)/bin/python -m pip install -q "transformers<4.58" "optimum-onnx[onnxruntime]==0.1.0"

compare-optimum: install optimum-env
	$(CLI) export $(STAGE) --target ort --precision fp32 --precision int8
	$(VENV)/bin/python -m pipeline.optimum_compare --run $(RUN) --artifacts $(ART) --optimum-python $(OPTIMUM_VENV)/bin/python

profile: install
	$(CLI) profile $(STAGE)

train-bench: install
	$(CLI) train-bench --artifacts $(ART) $(ARGS)

doctor: install
	$(CLI) doctor

# two processes, then the server tests alone: their queue and timeout windows are wall-clock
# seconds that the other process's load can close (a full-queue test once got 200 for its 429)
SERIAL_TESTS = tests/serve
test: lint
	$(VENV)/bin/python -m pytest -q -n 2 --dist loadfile $(SERIAL_TESTS:%=--ignore=%)
	$(VENV)/bin/python -m pytest -q $(SERIAL_TESTS)

# the settings are pyproject.toml's [tool.ruff]
lint: install
	$(VENV)/bin/ruff check pipeline serve tests

clean:
	rm -rf $(ART)/$(RUN)
