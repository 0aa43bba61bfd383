#!/usr/bin/env bash
# Uzbek VITS on one RTX 5090 (or several: NPROC=2 tts/train_rtx5090.sh ... runs torchrun).
#   tts/train_rtx5090.sh --data_dir data/preprocessed --run_dir runs/uzbek_vits_rtx5090 [--resume auto] [--set k=v ...]
# Every argument goes to tts/train.py unchanged. PYTHON overrides the interpreter (default .venv/bin/python).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
py="${PYTHON:-$here/.venv/bin/python}"
if [ ! -x "$py" ]; then py="$(command -v python3)"; fi
cd "$here"
if [ "${NPROC:-1}" -gt 1 ]; then
  exec "$py" -m torch.distributed.run --standalone --nproc_per_node "$NPROC" tts/train.py \
    --config tts/configs/uzbek_vits_rtx5090.yaml "$@"
fi
exec "$py" tts/train.py --config tts/configs/uzbek_vits_rtx5090.yaml "$@"
