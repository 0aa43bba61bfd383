"""The exit codes every script of the repo uses, so a launcher or a cluster scheduler can tell
what happened without reading the log (documented once in the README), and `run_main`, the one
place that turns a trainer's failures into them."""

from __future__ import annotations

import contextlib
import multiprocessing
import signal
import sys
from collections.abc import Callable, Iterator

from common import distributed
from common.errors import UserError, missing_dependency_message
from common.guards import NonFiniteError
from common.hardware import OutOfMemory
from common.run_lock import release_run_locks

OK = 0  # training (or the script's job) completed
BAD_INPUT = 2  # bad input, config, flag or output location: fix it and run again
NON_FINITE = 3  # stopped on a streak of non-finite losses/gradients; the last good checkpoint is named
OUT_OF_MEMORY = 4  # CUDA out of memory; the message says which settings to lower
INTERRUPTED = 130  # SIGINT/SIGTERM: a checkpoint was saved first, `--resume auto` continues

INTERRUPTED_LINE = "interrupted; run again to continue"


def interrupted() -> int:
    """Ctrl-C outside a training loop (a prepare script, a trainer's start-up): one line, no traceback,
    exit INTERRUPTED. Nothing is half-written (every file goes through `common.atomic_write`), so
    running the same command again continues: a prepare skips the files it finished."""
    print(INTERRUPTED_LINE, file=sys.stderr)
    return INTERRUPTED


def missing_dependency(exc: ImportError) -> int:
    """A third-party module that is not installed (or does not import): one `error:` line naming it and
    what to install, exit BAD_INPUT, whichever file was being processed. A failed import of the repo's own
    modules is a bug: `exc` is raised again, with its traceback. For a script's `except ImportError`."""
    message = missing_dependency_message(exc)
    if message is None:
        raise exc
    print(f"error: {message}", file=sys.stderr)
    return BAD_INPUT


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM (a scheduler's stop, `kill`) outside the training loop acts as Ctrl-C does: one line and
    exit 130 instead of a silent 143 during start-up. The loop installs its own saving handler on top."""
    try:
        old = signal.signal(signal.SIGTERM, _raise_interrupt)
    except ValueError:  # not the main thread: signals cannot be caught here
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def stop_loader_workers() -> None:
    """Kill this process's daemonic child processes that are still alive: DataLoader workers (the only daemonic
    children a script here starts). They ignore SIGTERM (`common.workers`: the trainer alone decides), so the
    `terminate()` Python sends its daemonic children at exit does not stop them, and the exit would wait for
    them forever: a loader whose iteration ended with an error (a damaged prepared file, a bug) leaves its
    workers waiting for indices. They only read data; a daemonic child never outlives its parent anyway.
    torch's SIGCHLD handler, which would report their end as a worker failure, is set aside meanwhile."""
    children = [child for child in multiprocessing.active_children() if child.daemon]
    if not children:
        return
    sigchld = getattr(signal, "SIGCHLD", None)  # none on Windows
    try:
        old = signal.signal(sigchld, signal.SIG_DFL) if sigchld is not None else None
    except ValueError:  # not the main thread
        old = None
    try:
        for child in children:
            child.kill()
        for child in children:
            child.join(timeout=5)
    finally:
        if old is not None:
            signal.signal(sigchld, old)


def user_errors(extra: tuple[type[BaseException], ...] = ()) -> tuple[type[BaseException], ...]:
    """The exception classes that are the user's to fix (exit BAD_INPUT): `common.errors.UserError`, plus
    `extra` (classes of third-party code a script names as bad input)."""
    return (UserError, *extra)


def run_main(body: Callable[[], int], bad_input: tuple[type[BaseException], ...] = (),
             cleanup: Callable[[], None] | None = None) -> int:
    """Run a script's `main` body and return its exit code; every script's `main` ends here. A failure the
    README documents prints one `error: <message>` to stderr and becomes its code: a `common.errors.UserError`
    (or one of `bad_input`, kept for older callers) -> BAD_INPUT,
    `common.guards.NonFiniteError` -> NON_FINITE, `common.hardware.OutOfMemory` -> OUT_OF_MEMORY
    (the trainer raises these two with the whole advice in the message), Ctrl-C outside the training loop
    (whose own handler saves and exits 130) -> `interrupted()`, and SIGTERM there too; a third-party module
    that is missing -> `missing_dependency` (BAD_INPUT, the module and what to install). Anything else propagates
    with its traceback: it is a bug, not a user error. `cleanup` runs in every case, then the run
    folder's lock (`common.run_lock`) is released and DataLoader workers still alive are stopped
    (`stop_loader_workers`: else the exit after an error in the loop waits for them forever)."""
    bad_input = user_errors(bad_input)
    try:
        with sigterm_interrupts():
            return body()
    except bad_input as e:
        print(f"error: {e}", file=sys.stderr)
        return BAD_INPUT
    except NonFiniteError as e:
        if distributed.rank() == 0:  # every rank stops at the same step (the guards agree across ranks); only
            print(f"error: {e}", file=sys.stderr)  # rank 0, which saves, can name the last good checkpoint
        return NON_FINITE
    except OutOfMemory as e:
        print(f"error: {e}", file=sys.stderr)
        return OUT_OF_MEMORY
    except ImportError as e:
        return missing_dependency(e)
    except KeyboardInterrupt:
        return interrupted()
    finally:
        try:
            if cleanup is not None:
                cleanup()
        finally:
            release_run_locks()
            stop_loader_workers()
