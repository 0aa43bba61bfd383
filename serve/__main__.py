"""Listen, look and compare in a browser: `python -m serve [CHECKPOINT_OR_EXPORT ...]` (`make serve`).

Loads each checkpoint or export given (the trainer is read from the file: VITS, cloning, vocoder, VAE) and
serves the page and the HTTP API of serve/app.py on http://127.0.0.1:8000 (docs/serve.md). With no path, the
demo's outputs under runs/ that exist (`make demo`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from common import exit_codes
from common.errors import ConfigError

# What `make demo` leaves (tts/targets.mk, tts/clone_targets.mk, vocoder/targets.mk, vae/targets.mk).
DEMO_OUTPUTS = ("runs/tts_demo/checkpoints/best.pt", "runs/tts_clone_demo/best.pt", "runs/vocoder_demo/export",
                "runs/vae_demo/vae_final.pt")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m serve", description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoints", nargs="*", help="checkpoints / exports of any trainer (default: the demo's outputs)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only; "
                   "0.0.0.0 opens it to the network, with no login)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--device", default="", help="cuda / cpu (default: cuda if available)")
    p.add_argument("--precision", default="32-true", help="the VAE's autocast, as vae/reconstruct.py --precision "
                   "(32-true | bf16-mixed | 16-mixed); the speech models run in float32, as their scripts do")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (torch.set_num_threads)")
    p.add_argument("--max_upload_mb", type=float, default=20.0, help="largest upload accepted (MB)")
    p.add_argument("--max_audio_seconds", type=float, default=60.0, help="longest recording accepted (seconds)")
    p.add_argument("--max_pixels", type=int, default=4096 * 4096, help="largest image accepted (pixels, read "
                   "from its header before decoding)")
    p.add_argument("--max_text_chars", type=int, default=5000, help="longest text accepted (characters)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def body() -> int:
        paths = args.checkpoints or [p for p in DEMO_OUTPUTS if Path(p).exists()]
        if not paths:
            raise ConfigError("no checkpoints given and no demo outputs under runs/: run `make demo` first, or give "
                              "checkpoints: python -m serve runs/uzbek_vits/checkpoints/best.pt ...")
        if min(args.max_upload_mb, args.max_audio_seconds, args.max_pixels, args.max_text_chars) <= 0:
            raise ConfigError("--max_upload_mb, --max_audio_seconds, --max_pixels and --max_text_chars must be > 0")
        if args.threads:
            torch.set_num_threads(args.threads)
        import uvicorn  # after the checks: a mistyped flag answers at once

        from serve.app import create_app
        from serve.models import Limits, load_models

        device = parse_device(args.device)
        models = load_models(paths, device, args.precision)  # a missing f0 extractor package: run_main says which
        for m in models.values():
            print(f"  {m.id:<10} {m.label}")
        limits = Limits(int(args.max_upload_mb * 2**20), args.max_audio_seconds, args.max_pixels, args.max_text_chars)
        print(f"serving {len(models)} model(s) on {device}: open http://{args.host}:{args.port}/", flush=True)
        uvicorn.run(create_app(models, limits), host=args.host, port=args.port, log_level="warning")
        return 0

    return exit_codes.run_main(body)


def parse_device(name: str) -> torch.device:
    """--device → a torch device (default: cuda if available); a name torch does not know is the user's to fix."""
    try:
        device = torch.device(name or ("cuda" if torch.cuda.is_available() else "cpu"))
    except RuntimeError as e:
        raise ConfigError(f"--device {name!r}: {e}; give cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {name}: this torch sees no CUDA GPU; give --device cpu")
    return device

if __name__ == "__main__":
    sys.exit(main())
