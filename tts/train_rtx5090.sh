#!/usr/bin/env bash
# Uzbek VITS on one RTX 5090 (or several: NPROC=2 tts/train_rtx5090.sh ... runs torchrun).
#   tts/train_rtx5090.sh --data_dir data/preprocessed --run_dir runs/uzbek_vits_rtx5090 [--set k=v ...]
# Every argument goes to tts/train.py unchanged; relative paths are read from the folder you run it in.
# Re-running continues the run (--resume auto is added unless you pass --resume, --init_from or --overwrite).
# PYTHON overrides the interpreter (default .venv/bin/python).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="${PYTHON:-$here/.venv/bin/python}"
if [ ! -x "$py" ]; then py="$(command -v python3)"; fi
source "$here/shell/resume_default.sh"
CONFIG="$here/tts/vits/configs/uzbek_vits_rtx5090.yaml"
if [ "${NPROC:-1}" -gt 1 ]; then
  exec "$py" -m torch.distributed.run --standalone --nproc_per_node "$NPROC" "$here/tts/train.py" \
    --config "$CONFIG" "${RESUME[@]}" "$@"
fi
exec "$py" "$here/tts/train.py" --config "$CONFIG" "${RESUME[@]}" "$@"
