#!/usr/bin/env bash
# Makes .venv with the PyTorch build for this machine's NVIDIA driver: shell/setup.sh [--cuda auto|cu126|cu128|cu130|cpu]
# [--dry-run] ... Everything is done by shell/setup_env.py (--help). `make setup` is the default Linux path
# and stays as it was (PyPI's torch); this is the explicit-build one. PYTHON picks the interpreter (>= 3.11).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
exec "${PYTHON:-python3}" "$here/setup_env.py" "$@"
