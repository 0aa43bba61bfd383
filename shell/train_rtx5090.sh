#!/usr/bin/env bash
# Runs one trainer with its RTX 5090 preset: shell/train_rtx5090.sh {vocoder|tts|vae} [extra args]
# Extra args go to that trainer unchanged (e.g. --set max_updates=1000, --resume auto).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
usage() {
  echo "usage: $0 {vocoder|tts|vae} [extra trainer args]" >&2
  echo "  vocoder  NSF-HiFiGAN with vocoder/configs/base_hifi_rtx5090_optimized.yaml" >&2
  echo "  tts      Uzbek VITS with tts/vits/configs/uzbek_vits_rtx5090.yaml" >&2
  echo "  vae      KL-VAE with the RTX 5090 profile" >&2
  exit 2
}
[ $# -ge 1 ] || usage
trainer="$1"; shift
case "$trainer" in
  vocoder|tts|vae) exec bash "$here/$trainer/train_rtx5090.sh" "$@" ;;
  -h|--help) usage ;;
  *) echo "error: unknown trainer '$trainer'" >&2; usage ;;
esac
