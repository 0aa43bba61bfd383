#!/usr/bin/env bash
# Uzbek VITS on one RTX 5090 (or several: NPROC=2 tts/train_rtx5090.sh ... runs torchrun).
#   tts/train_rtx5090.sh --data_dir data/preprocessed --run_dir runs/uzbek_vits_rtx5090 [--set k=v ...]
# Every argument goes to tts/train.py unchanged; relative paths are read from the folder you run it in.
# Re-running continues the run (--resume auto is added unless you pass --resume, --init_from or --overwrite).
# PYTHON overrides the interpreter (default .venv/bin/python).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-$here/.venv/bin/python}"
[[ -x "$PYTHON" ]] || PYTHON=python3
source "$here/shell/resume_default.sh"
CONFIG="$here/tts/vits/configs/uzbek_vits_rtx5090.yaml"
NPROC="${NPROC:-1}"
if [[ "$NPROC" -gt 1 ]]; then
  exec "$PYTHON" -m torch.distributed.run --standalone --nproc_per_node "$NPROC" "$here/tts/train.py" \
    --config "$CONFIG" "${RESUME[@]}" "$@"
fi
exec "$PYTHON" "$here/tts/train.py" --config "$CONFIG" "${RESUME[@]}" "$@"
