#!/usr/bin/env bash
# Downloads the wheels of bench/gpu/wheels.txt for a machine with no network into .whl/ (ignored by git),
# for the given CPython version (default 3.12, the lent GPU machine's), Linux x86-64.
#   shell/gpu_wheels.sh [3.12]      then carry .whl/ to that machine: shell/gpu_check.sh installs from it
set -euo pipefail
cd "$(dirname "$0")/.."
PYVER=${1:-3.12}
[[ "$PYVER" =~ ^3\.[0-9]+$ ]] || { echo "usage: shell/gpu_wheels.sh [PYTHON_VERSION like 3.12], got '$PYVER'" >&2; exit 2; }
mkdir -p .whl
rm -f .whl/*.whl  # this script's folder: two versions of one wheel would stop the install
plat=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  plat+=(--platform "$p")
done
grep -v '^\s*#' bench/gpu/wheels.txt | grep -v '^\s*$' | python3 -m pip download -q --no-deps --only-binary=:all: \
  --python-version "$PYVER" --implementation cp "${plat[@]}" -d .whl -r /dev/stdin
echo "gpu_wheels: $(ls .whl/*.whl | wc -l) wheels for CPython $PYVER in .whl/ ($(du -sh .whl | cut -f1))"
