#!/usr/bin/env bash
# Multi-node GRPO with rhymectl under Slurm: one torchrun per node, one rank per GPU.
# Run:   sbatch sample_configs/slurm.sh sample_configs/gpu-7b.yaml [key=value ...]
# After a preemption or crash: sbatch sample_configs/slurm.sh CONFIG --resume
#SBATCH --job-name=rhymectl
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=64
#SBATCH --time=24:00:00
set -euo pipefail
CONFIG=${1:?usage: sbatch slurm.sh CONFIG [key=value ...]}; shift
HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export VLLM_ENABLE_V1_MULTIPROCESSING=0   # the engine lives in the trainer's process
# Fail in seconds, with one line, on a bad config, data set, model, vLLM release or TP size.
rhymectl train "$CONFIG" "$@" --nproc $((SLURM_NNODES * 8)) --dry-run > /dev/null
srun torchrun \
  --nnodes="$SLURM_NNODES" --nproc_per_node=8 \
  --rdzv_id="$SLURM_JOB_ID" --rdzv_backend=c10d --rdzv_endpoint="$HEAD:29500" \
  -m rhymectl train "$CONFIG" "$@"
