#!/usr/bin/env bash
# Train NSF-HiFiGAN with vocoder/configs/base_hifi_rtx5090_optimized.yaml (one RTX 5090, 32 GB).
# Every argument goes to vocoder/train.py unchanged and wins over the config, e.g.
#   vocoder/train_rtx5090.sh --data_dir data/vocoder_bin --run_dir runs/vocoder_5090
#   vocoder/train_rtx5090.sh --data_dir data/vocoder_bin --set batch_size=24 --set max_updates=2
#   NPROC=2 vocoder/train_rtx5090.sh --data_dir data/vocoder_bin       # torchrun DDP on 2 GPUs
# Relative paths are read from the folder you run it in.
# Re-running continues the run (--resume auto is added unless you pass --resume, --init_from or --overwrite).
# PYTHON overrides the interpreter (default .venv/bin/python).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-$here/.venv/bin/python}"
[[ -x "$PYTHON" ]] || PYTHON=python3
CONFIG="$here/vocoder/configs/base_hifi_rtx5090_optimized.yaml"

source "$here/shell/resume_default.sh"

# Fewer allocator stalls; a sane number of CPU threads per process next to the DataLoader workers.
export PYTORCH_CUDA_ALLOC_CONF="${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}"

NPROC="${NPROC:-1}"
if [[ "$NPROC" -gt 1 ]]; then
  exec "$PYTHON" -m torch.distributed.run --standalone --nproc_per_node "$NPROC" "$here/vocoder/train.py" \
    --config "$CONFIG" "${RESUME[@]}" "$@"
fi
exec "$PYTHON" "$here/vocoder/train.py" --config "$CONFIG" "${RESUME[@]}" "$@"
