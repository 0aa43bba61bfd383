"""Listen, look and compare in a browser: `python -m serve [CHECKPOINT_OR_EXPORT ...]` (`make serve`).

Loads each checkpoint or export given (the trainer is read from the file: VITS, cloning, vocoder, VAE) and
serves the page and the HTTP API of serve/app.py on http://127.0.0.1:8000 (docs/serve.md). With no path, the
demo's outputs under runs/ that exist (`make demo`).
"""

from __future__ import annotations

import argparse
import errno
import os
import socket
import sys
from pathlib import Path

import torch

from common import exit_codes
from common.checkpoint import resolve_checkpoint_arg
from common.cli import FlagParser
from common.errors import ConfigError
from common.ranges import Range

# What `make demo` leaves (tts/targets.mk, tts/clone_targets.mk, vocoder/targets.mk, vae/targets.mk).
# A run folder stands for its best.pt (else its newest checkpoint): common.checkpoint.resolve_checkpoint_arg.
DEMO_OUTPUTS = ("runs/tts_demo", "runs/tts_clone_demo", "runs/vocoder_demo/export", "runs/vae_demo/vae_final.pt")
# The numbers a flag may take, checked before anything loads (one line naming the flag, exit 2). The upper
# bounds are what still means something: --max_pixels beyond 2**28 (268 Mpx) would hold about 20 GiB for the
# image alone (vae.reconstruct.BYTES_PER_PIXEL).
FLAG_RANGES = {"port": Range(0, 65535), "threads": Range(1, 1024), "max_upload_mb": Range(0, 4096, min_open=True),
               "max_audio_seconds": Range(0, 3600, min_open=True), "max_pixels": Range(1, 2**28),
               "max_text_chars": Range(1, 10**6), "max_memory_gb": Range(0, 2**20, min_open=True),
               "queue": Range(1, 1000), "body_timeout": Range(0, 3600, min_open=True)}


def build_parser() -> argparse.ArgumentParser:
    p = FlagParser(prog="python -m serve", description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoints", nargs="*", help="checkpoints / exports of any trainer (default: the demo's outputs)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only; "
                   "0.0.0.0 opens it to the network: give --token too)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (0: any free one, printed at start)")
    p.add_argument("--allow_host", action="append", default=[], metavar="NAME",
                   help="another host name the server answers to (this machine's name on the network); repeatable")
    p.add_argument("--token", default=os.environ.get("SERVE_TOKEN") or None,
                   help="a secret every request but the page itself must carry (Authorization: Bearer TOKEN); the "
                   "page gets it from the address printed at start (default: $SERVE_TOKEN, else none)")
    p.add_argument("--device", default="", help="cuda / cpu (default: cuda if available)")
    p.add_argument("--precision", default="32-true", help="the VAE's autocast, as vae/reconstruct.py --precision "
                   "(32-true | bf16-mixed | 16-mixed); the speech models run in float32, as their scripts do")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (torch.set_num_threads)")
    p.add_argument("--max_upload_mb", type=float, default=20.0, help="largest upload accepted (MB)")
    p.add_argument("--max_audio_seconds", type=float, default=60.0, help="longest recording accepted (seconds)")
    p.add_argument("--max_pixels", type=int, default=4096 * 4096, help="largest image accepted (pixels, read "
                   "from its header before decoding)")
    p.add_argument("--max_text_chars", type=int, default=5000, help="longest text accepted (characters)")
    p.add_argument("--max_memory_gb", type=float, default=None, help="memory one reconstruction may use (estimated "
                   "before it runs: larger ones are tiled, or refused); default: 80%% of the GPU, or half the RAM")
    p.add_argument("--queue", type=int, default=4, help="requests that may wait for or run on one model (more: 503)")
    p.add_argument("--body_timeout", type=float, default=30.0, help="seconds a request body may stall before the "
                   "request is dropped (408)")
    return p


def check_numbers(args: argparse.Namespace) -> None:
    """Every numeric flag inside FLAG_RANGES, else ConfigError naming it (a nan, a negative port, a huge limit)."""
    for name, allowed in FLAG_RANGES.items():
        value = getattr(args, name)
        if value is not None:
            allowed.check(value, f"--{name}", "command line")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def body() -> int:
        check_numbers(args)
        given = args.checkpoints or [p for p in DEMO_OUTPUTS if Path(p).exists()]
        paths = [str(resolve_checkpoint_arg(p, "checkpoint")) for p in given]  # a run folder: its best.pt
        if not paths:
            raise ConfigError("no checkpoints given and no demo outputs under runs/: run `make demo` first, or give "
                              "checkpoints: python -m serve runs/uzbek_vits/checkpoints/best.pt ...")
        if args.threads:
            torch.set_num_threads(args.threads)
        from serve.app import create_app
        from serve.guard import WILDCARDS, Access, is_loopback
        from serve.models import Limits, load_models

        with bind(args.host, args.port) as sock:  # before minutes of loading: a port in use answers at once
            if not is_loopback(args.host):
                print(f"warning: --host {args.host} opens the server to the network: "
                      + ("every request but the page needs the token" if args.token else
                         "anyone who can reach this machine can use it (no --token)"), flush=True)
            device = parse_device(args.device)
            models = load_models(paths, device, args.precision)  # a missing f0 extractor package: run_main says which
            for m in models.values():
                print(f"  {m.id:<10} {m.label}")
            limits = Limits(int(args.max_upload_mb * 2**20), args.max_audio_seconds, args.max_pixels,
                            args.max_text_chars, memory_bytes(args.max_memory_gb, device), args.queue, args.body_timeout)
            access = Access.for_bind(args.host, tuple(args.allow_host), args.token)
            shown = "127.0.0.1" if args.host in WILDCARDS else args.host
            shown = f"[{shown}]" if ":" in shown else shown
            print(f"serving {len(models)} model(s) on {device}: open http://{shown}:{sock.getsockname()[1]}/"
                  + (f"#token={args.token}" if args.token else ""), flush=True)
            run_server(create_app(models, limits, access), sock)
        return 0

    return exit_codes.run_main(body)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on `host`:`port`, or one line saying why not (ConfigError): uvicorn would log the bind
    error and exit 1, so the server binds here and hands uvicorn the socket."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as e:
        raise ConfigError(f"--host {host}: not an address or a name this machine can resolve ({e.strerror}); "
                          "give 127.0.0.1, 0.0.0.0 or one of this machine's addresses") from None
    sock = socket.socket(family, kind, proto)
    try:
        if os.name != "nt":  # a restarted server may reuse its port at once; on Windows this would share it instead
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as e:
        sock.close()
        hint = {errno.EADDRINUSE: "another program listens there: stop it, or give another --port (0: any free one)",
                errno.EADDRNOTAVAIL: "that address is not one of this machine's: give 127.0.0.1 or 0.0.0.0",
                errno.EACCES: "ports below 1024 need administrator rights: give --port 8000"}.get(e.errno, "")
        raise ConfigError(f"--host {host} --port {port}: cannot listen there ({e.strerror or e})"
                          + (f"; {hint}" if hint else "")) from None
    return sock


def run_server(app, sock: socket.socket) -> None:
    """Serve `app` on `sock` until SIGINT/SIGTERM, which first cancels every request in flight (each ends at its next
    sentence or tile and answers 409), so the server stops within a few seconds instead of finishing them."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame) -> None:
            app.state.cancel_all()
            super().handle_exit(sig, frame)

    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5)
    Server(config).run(sockets=[sock])


def memory_bytes(gigabytes: float | None, device: torch.device) -> int:
    """--max_memory_gb in bytes; by default 80 % of the GPU's memory, or half the RAM on the CPU."""
    if gigabytes is not None:
        return int(gigabytes * 2**30)
    if device.type == "cuda":
        return int(0.8 * torch.cuda.get_device_properties(device).total_memory)
    import psutil

    return psutil.virtual_memory().total // 2


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
