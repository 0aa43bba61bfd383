"""A script run slowed down where a signal test needs time to hit the right moment:

- `python tests/slow_run.py SCRIPT ARGS...` runs SCRIPT as `python SCRIPT ARGS...` would, but every
  `torch.save` after a stop signal (a trainer's stop save) is announced on stdout ("saving after the stop
  signal") and takes 1.5 s longer, so a second signal lands during that save;
- `python tests/slow_run.py --slow MODULE:FUNCTION ARGS...` runs `MODULE.main(ARGS)` with every call of
  FUNCTION (a prepare script's per-file job, also in its forked worker processes) announced ("calling
  FUNCTION") and delayed by 0.3 s, so a Ctrl-C lands while some files are done and others are not.
"""

from __future__ import annotations

import functools
import importlib
import runpy
import signal
import sys
import time
from pathlib import Path

import torch

_real_save = torch.save


def _stopping() -> bool:
    """Whether a trainer's signal handler (`common.stopping.GracefulExit`) has seen a signal."""
    handler = signal.getsignal(signal.SIGTERM)
    return bool(getattr(getattr(handler, "__self__", None), "requested", False))


def _slow_save(*args, **kwargs):
    if _stopping():
        print("saving after the stop signal", flush=True)
        time.sleep(1.5)
    return _real_save(*args, **kwargs)


def _slow_down(target: str):
    """Slows MODULE:FUNCTION down; returns MODULE."""
    module_name, name = target.split(":")
    module = importlib.import_module(module_name)
    real = getattr(module, name)

    @functools.wraps(real)  # same module and name: a pool pickles it by reference, and finds it
    def slowed(*args, **kwargs):
        print(f"calling {name}", flush=True)
        time.sleep(0.3)
        return real(*args, **kwargs)
    setattr(module, name, slowed)
    return module


if __name__ == "__main__":
    sys.path[0] = str(Path(__file__).resolve().parents[1])  # import from the repository, as `python SCRIPT` does
    args = sys.argv[1:]
    if args[0] == "--slow":
        sys.exit(_slow_down(args[1]).main(args[2:]))
    torch.save = _slow_save
    sys.argv = args
    runpy.run_path(args[0], run_name="__main__")
