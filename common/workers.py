"""Worker processes that leave Ctrl-C and SIGTERM to the main process.

Ctrl-C in a terminal sends SIGINT to every process of the foreground group: the main process and each
DataLoader or prepare worker. Left alone, a prepare worker prints its own KeyboardInterrupt traceback,
a DataLoader worker dies under a trainer that is still finishing its step (which then fails with
"worker exited unexpectedly" instead of saving), and a forked worker even runs the trainer's own
handler and prints its "saving a checkpoint" line again. So workers ignore SIGINT and SIGTERM: the
main process alone decides, and shuts them down (a worker whose parent is gone exits by itself).
"""

from __future__ import annotations

import functools
import signal
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from typing import Any

from common.atomic_write import DiskFullError

# What a per-file job (a prepare worker) never reports as "this file is bad": a full disk and a module that
# is not installed are not any file's fault, and every later file would fail the same way. A job's catch-all
# lets them through (`except RUN_ERRORS: raise` before `except Exception`), the pool re-raises them in the
# main process (same type), and the script's edge prints one line (`common.exit_codes.run_main`).
RUN_ERRORS: tuple[type[BaseException], ...] = (DiskFullError, ImportError)


def ignore_stop_signals(*_: Any) -> None:
    """SIGINT and SIGTERM ignored in this (worker) process: a DataLoader `worker_init_fn`, a pool initializer."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)


def _start_worker(initializer: Callable[[], None] | None) -> None:
    ignore_stop_signals()
    if initializer is not None:
        initializer()


@contextmanager
def process_pool(max_workers: int, initializer: Callable[[], None] | None = None,
                 mp_context: Any = None) -> Iterator[ProcessPoolExecutor]:
    """A `ProcessPoolExecutor` whose workers ignore SIGINT/SIGTERM (then run `initializer`). When the
    block is left by an error or Ctrl-C, the jobs not started yet are cancelled: the executor's own
    exit would first run the whole queue, so Ctrl-C would take effect only when everything was done.
    The jobs already running finish (a file each, written atomically), then the exception goes on."""
    pool = ProcessPoolExecutor(max_workers=max_workers, mp_context=mp_context,
                               initializer=functools.partial(_start_worker, initializer))
    try:
        yield pool
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
