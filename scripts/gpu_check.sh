#!/usr/bin/env bash
# Check the trainer half of the GPU path on one GPU, without vLLM (docs/cluster.md, "GPU check").
#   scripts/gpu_check.sh [--smoke] [--deepspeed-wheel PATH]
# Offline: a machine with torch and transformers needs nothing else but wheels/ holding
# DeepSpeed and requirements/gpu-check.txt (what `import deepspeed` loads beyond torch).
# The Python is $PYTHON, else the project's .venv, else python3; the checkout is importable
# without installing it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$ROOT/.venv/bin/python" ]]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
exec "$PYTHON" "$ROOT/scripts/gpu_check.py" "$@"
