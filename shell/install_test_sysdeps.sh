#!/usr/bin/env bash
# Installs what only the tests need from Debian, where it is missing: chromium, the headless browser the
# page's end-to-end tests (tests/serve/test_browser.py) drive through Playwright. Run by `make test`.
set -euo pipefail
command -v chromium >/dev/null && exit 0
SUDO=""
[ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null && SUDO="sudo"
if ! command -v apt-get >/dev/null; then
  echo "note: install chromium with your package manager for the browser tests (apt-get not found);" \
       "without it they skip (and fail under CI=true)" >&2
  exit 0
fi
echo "installing chromium (Debian package, for the browser tests) ..."
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
