#!/usr/bin/env bash
# Multi-node GRPO with rhymectl under Slurm: one torchrun per node, one rank per GPU.
# Run:   sbatch sample_configs/slurm.sh sample_configs/gpu-7b.yaml [key=value ...]
#        (from the repository root, on a filesystem every node mounts: run.dir lives there)
# Every start passes --resume: the first one starts the run, a requeued one continues it
# from its last checkpoint. 120 s before the time limit Slurm sends USR1 to this script,
# which stops the ranks (SIGTERM through srun and torchrun; the steps since the last
# checkpoint are redone on resume) and puts the job back in the queue.
# Set the node count and GPUs per node below; the script reads them back from Slurm.
#SBATCH --job-name=rhymectl
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=64
#SBATCH --time=24:00:00
#SBATCH --requeue
#SBATCH --signal=B:USR1@120
#SBATCH --open-mode=append
set -euo pipefail
CONFIG=${1:?usage: sbatch slurm.sh CONFIG [key=value ...]}; shift

# The project's environment (make setup TARGET=gpu) and an offline Hugging Face cache:
# compute nodes often have no network, and model.path / data.path are local copies.
# shellcheck disable=SC1091
source "${RHYMECTL_VENV:-$SLURM_SUBMIT_DIR/.venv}/bin/activate"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
export VLLM_ENABLE_V1_MULTIPROCESSING=0   # the engine lives in the trainer's process

# GPUs per node as Slurm granted them (SLURM_GPUS_PER_NODE may read "h100:8").
GPUS=${SLURM_GPUS_ON_NODE:-}
if [[ -z $GPUS && -n ${SLURM_GPUS_PER_NODE:-} ]]; then GPUS=${SLURM_GPUS_PER_NODE##*:}; fi
if ! [[ $GPUS =~ ^[1-9][0-9]*$ ]]; then
  echo "error: Slurm reports no GPUs on this node (SLURM_GPUS_ON_NODE='${SLURM_GPUS_ON_NODE:-}'," \
       "SLURM_GPUS_PER_NODE='${SLURM_GPUS_PER_NODE:-}'); request them with #SBATCH --gpus-per-node=N" >&2
  exit 2
fi
mapfile -t NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
HEAD=${NODES[0]}            # hosts the rendezvous; every node must reach HEAD:RDZV_PORT
RDZV_PORT=${RDZV_PORT:-29500}

# Fail in seconds, with one line, on a bad config, data set, model, vLLM release, TP size
# (a TP group must fit in one node) or a run directory that is not this run's.
rhymectl train "$CONFIG" "$@" --resume --nproc "$GPUS" --nnodes "$SLURM_NNODES" --dry-run > /dev/null

requeue() {
  echo "rhymectl: time limit near; stopping the ranks and requeueing job $SLURM_JOB_ID" >&2
  kill -TERM "$STEP" 2>/dev/null || true   # srun passes it to torchrun, torchrun to the ranks
  wait "$STEP" || true
  scontrol requeue "$SLURM_JOB_ID"
  exit 0
}
trap requeue USR1

# From Slurm 22.05 srun no longer inherits sbatch's --cpus-per-task: without asking again,
# every rank of a node (engine loop, tokenisers, drafter threads, ZeRO-3 hooks) shares one CPU.
CPUS=()
if [[ -n ${SLURM_CPUS_PER_TASK:-} ]]; then CPUS=(--cpus-per-task="$SLURM_CPUS_PER_TASK"); fi
srun --kill-on-bad-exit=1 "${CPUS[@]}" python -m pipeline.loop.torchrun \
  --nnodes="$SLURM_NNODES" --nproc_per_node="$GPUS" \
  --rdzv_id="$SLURM_JOB_ID-${SLURM_RESTART_COUNT:-0}" --rdzv_backend=c10d \
  --rdzv_endpoint="$HEAD:$RDZV_PORT" \
  -m rhymectl train "$CONFIG" "$@" --resume &
STEP=$!
wait "$STEP"   # returns early when USR1 arrives: the trap takes over
