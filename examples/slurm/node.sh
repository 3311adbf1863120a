#!/bin/bash
# One node's part of a multi-node zoexec run: torchrun with the c10d rendezvous, the
# same line on every node (examples/slurm/zoexec.sbatch starts it with srun, one task
# per node). The arguments are zoexec's: run PLAN --out DIR ...
#   NNODES          nodes in the job (default: Slurm's)
#   NPROC_PER_NODE  ranks on this node: its GPUs (default 8)
#   RDZV_ENDPOINT   HOST:PORT where the nodes meet (the first node's address)
#   RDZV_ID         the job's id, the same on every node (default: Slurm's job id)
#   TORCHRUN        the torchrun to run (default: torchrun on PATH)
#   TORCHRUN_OPTIONS  more torchrun options, e.g. --max-restarts 3
set -euo pipefail
NNODES=${NNODES:-${SLURM_JOB_NUM_NODES:?set NNODES}}
RDZV_ENDPOINT=${RDZV_ENDPOINT:?set RDZV_ENDPOINT to HOST:PORT of the first node}
# shellcheck disable=SC2086  # TORCHRUN_OPTIONS: several words
exec "${TORCHRUN:-torchrun}" --nnodes "$NNODES" --nproc-per-node "${NPROC_PER_NODE:-8}" \
    --rdzv-backend c10d --rdzv-endpoint "$RDZV_ENDPOINT" \
    --rdzv-id "${RDZV_ID:-${SLURM_JOB_ID:-zoexec}}" ${TORCHRUN_OPTIONS:-} \
    -m zoexec.cli "$@"
