#!/usr/bin/env bash
# Train the VAE with the RTX 5090 (32 GB, Blackwell sm_120) profile. Extra arguments are passed to
# vae/train_vae.py and override the profile; relative paths are read from the folder you run it in, e.g.
#   vae/train_rtx5090.sh --data_path data/vae --output_dir runs/vae
#   PROFILE=max_2048 vae/train_rtx5090.sh --resume_from runs/vae/checkpoint_last.pt
# Re-running continues the run (--resume auto is added unless you pass --resume, --init_from or --overwrite).
#   NPROC=2 vae/train_rtx5090.sh --data_path data/vae           # torchrun DDP on 2 GPUs
# PYTHON overrides the interpreter (default .venv/bin/python).
# Profiles: fast_768, standard_1024 (default), high_1536, max_2048, large_channel_z32 (vae/configs/).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$here/shell/resume_default.sh"

PROFILE="${PROFILE:-standard_1024}"
CONFIG="$here/vae/configs/${PROFILE}.yaml"
if [[ ! -f "$CONFIG" ]]; then
    echo "error: no profile '$PROFILE' ($CONFIG); choose one of: $(ls "$here/vae/configs" | sed -n 's/\.yaml$//p' | tr '\n' ' ')" >&2
    exit 2
fi
PYTHON="${PYTHON:-$here/.venv/bin/python}"
[[ -x "$PYTHON" ]] || PYTHON=python3

# Fewer allocator stalls with changing crop sizes; one set of CPU threads per process.
export PYTORCH_CUDA_ALLOC_CONF="${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}"

NPROC="${NPROC:-1}"
if [[ "$NPROC" -gt 1 ]]; then
    exec "$PYTHON" -m torch.distributed.run --standalone --nproc_per_node "$NPROC" "$here/vae/train_vae.py" --config "$CONFIG" "${RESUME[@]}" "$@"
fi
exec "$PYTHON" "$here/vae/train_vae.py" --config "$CONFIG" "${RESUME[@]}" "$@"
