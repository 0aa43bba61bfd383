"""The environment of a child process a test starts (a script run as a user would run it).

The child must import this checkout (REPO first on PYTHONPATH) and still see what the environment already
put on PYTHONPATH: on a machine where missing wheels are installed with `pip install --target /tmp/site`
and found through `PYTHONPATH=/tmp/site`, a child given `PYTHONPATH=REPO` alone cannot import them."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def pythonpath_with_repo(existing: str | None) -> str:
    """REPO, then `existing` (a PYTHONPATH value) when it is non-empty: an empty entry would add the
    child's working folder to its sys.path."""
    return f"{REPO}{os.pathsep}{existing}" if existing else str(REPO)


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment with REPO prepended to PYTHONPATH, and `extra` variables set."""
    return {**os.environ, "PYTHONPATH": pythonpath_with_repo(os.environ.get("PYTHONPATH")), **extra}
