#!/usr/bin/env bash
# Installs espeak-ng and sox from Debian where they are missing (demo speech, tests).
set -euo pipefail
need=()
command -v espeak-ng >/dev/null || need+=(espeak-ng)
command -v sox >/dev/null || need+=(sox)
[ ${#need[@]} -eq 0 ] && exit 0
SUDO=""
[ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null && SUDO="sudo"
if ! command -v apt-get >/dev/null; then
  echo "error: please install ${need[*]} with your package manager (apt-get not found)" >&2
  exit 1
fi
echo "installing ${need[*]} (Debian packages) ..."
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
