"""Worker processes that leave Ctrl-C and SIGTERM to the main process, and a pool that says which file a
killed worker was preparing.

Ctrl-C in a terminal sends SIGINT to every process of the foreground group: the main process and each
DataLoader or prepare worker. Left alone, a prepare worker prints its own KeyboardInterrupt traceback,
a DataLoader worker dies under a trainer that is still finishing its step (which then fails with
"worker exited unexpectedly" instead of saving), and a forked worker even runs the trainer's own
handler and prints its "saving a checkpoint" line again. So workers ignore SIGINT and SIGTERM: the
main process alone decides, and shuts them down (a worker whose parent is gone exits by itself).

A prepare worker the operating system kills (the out-of-memory killer, a `kill -9`) breaks the whole pool
(`BrokenProcessPool`, no word on which file). `process_pool` turns that into `WorkerKilled`, one line
(exit 2): the file(s) being prepared when it died, how many were done before (kept: every output is
written atomically, so the same command again continues), and what to do (fewer workers, or move the
file out of the input).
"""

from __future__ import annotations

import atexit
import functools
import multiprocessing
import os
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from common.atomic_write import DiskFullError
from common.errors import ConfigError

# What a per-file job (a prepare worker) never reports as "this file is bad": a full disk and a module that
# is not installed are not any file's fault, and every later file would fail the same way. A job's catch-all
# lets them through (`except RUN_ERRORS: raise` before `except Exception`), the pool re-raises them in the
# main process (same type), and the script's edge prints one line (`common.exit_codes.run_main`).
RUN_ERRORS: tuple[type[BaseException], ...] = (DiskFullError, ImportError)

T = TypeVar("T")


def file_progress(results: Iterable[T], total: int, desc: str, skipped: Callable[[T], bool],
                  skipped_before: int = 0) -> Iterator[T]:
    """`results` (one per file, as a prepare script's serial loop or `FilePool.map` yields them) passed through
    behind a bar over the files: done / total, rate, ETA and how many were skipped so far (`skipped(result)`,
    plus `skipped_before`, those refused before any work). Every prepare script shows its work through this one
    bar, so a long corpus shows when it will end and a growing skip count is seen while it grows, not only in
    the report at the end.

    Shown only where stderr is a terminal (tqdm's `disable=None`): a log file or a pipe gets no bar lines, and
    the script's own summary lines say the same at the end. The bar is closed (its line ended) before an error
    leaves, so the `error:` line `run_main` prints starts a line of its own."""
    from tqdm import tqdm  # imported where a bar is drawn

    count = skipped_before
    with tqdm(total=total, desc=desc, unit="file", disable=None, dynamic_ncols=True, mininterval=0.5) as bar:
        bar.set_postfix_str(f"skipped {count}", refresh=False)
        for result in results:
            if skipped(result):
                count += 1
                bar.set_postfix_str(f"skipped {count}", refresh=False)
            bar.update(1)
            yield result


class WorkerKilled(ConfigError):
    """A pool worker died without a Python error (killed by the operating system, most likely for memory):
    the message names the file(s) it was preparing and what to do. Exit 2, like a full disk."""


def ignore_stop_signals(*_: Any) -> None:
    """SIGINT and SIGTERM ignored in this (worker) process: a DataLoader `worker_init_fn`, a pool initializer."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)


def end_ignoring_workers_at_exit() -> None:
    """Called where loader workers that ignore SIGTERM are started (`common.data.make_loader`): at the
    process's exit, its daemonic children (DataLoader workers) are killed. multiprocessing's own exit hook
    stops them with SIGTERM, which they ignore, then waits for them: a process that still held a loader with
    persistent workers when it ended (a trainer kept alive by a reference cycle) waited forever."""
    atexit.unregister(_kill_daemonic_children)  # registered once, and after multiprocessing's hook: it runs first
    atexit.register(_kill_daemonic_children)


def _kill_daemonic_children() -> None:
    children = [c for c in multiprocessing.active_children() if c.daemon]
    if children and hasattr(signal, "SIGCHLD"):  # torch's SIGCHLD handler would call each a failed worker
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for child in children:
        child.kill()


def _start_worker(initializer: Callable[[], None] | None) -> None:
    ignore_stop_signals()
    if initializer is not None:
        initializer()


class _Tracked:
    """`fn` over `(label, job)` pairs in a worker: `<marker_dir>/<pid>` holds the label of the job this
    worker is running, and is removed when the job returns (or raises). A worker killed mid-job leaves its
    file behind: that is how the main process learns which file it was. Picklable (spawn-safe)."""

    def __init__(self, fn: Callable[[Any], Any], marker_dir: str):
        self.fn = fn
        self.marker_dir = marker_dir

    def __call__(self, item: tuple[str, Any]) -> Any:
        label, job = item
        marker = Path(self.marker_dir) / str(os.getpid())
        try:
            marker.write_text(label, encoding="utf-8")
        except OSError:  # the temp folder is only for the message: never a reason to fail the file
            pass
        try:
            return self.fn(job)
        finally:
            try:
                marker.unlink()
            except OSError:
                pass


class FilePool:
    """What `process_pool` yields: `map(fn, jobs, chunksize)` as `ProcessPoolExecutor.map`, each job
    labelled (by the pool's `label`) for the message a killed worker gets. `executor` is the pool itself."""

    def __init__(self, executor: ProcessPoolExecutor, marker_dir: str, label: Callable[[Any], str] | None):
        self.executor = executor
        self.marker_dir = marker_dir
        self.label = label or (lambda job: "")
        self.total = self.done = 0

    def map(self, fn: Callable[[Any], Any], jobs: Iterable[Any], chunksize: int = 1) -> Iterator[Any]:
        jobs = list(jobs)
        self.total += len(jobs)
        results = self.executor.map(_Tracked(fn, self.marker_dir), [(str(self.label(j)), j) for j in jobs],
                                    chunksize=chunksize)
        return self._counted(results)

    def _counted(self, results: Iterator[Any]) -> Iterator[Any]:
        for result in results:
            self.done += 1
            yield result

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self.executor.shutdown(wait=wait, cancel_futures=cancel_futures)


def _how_it_died(exitcodes: list[int | None]) -> tuple[str, str]:
    """(what happened, the likely cause) from the dead workers' exit codes (-9: SIGKILL, the OOM killer's)."""
    for code in exitcodes:
        if code is not None and code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            if -code == getattr(signal, "SIGKILL", 9):
                return f"was killed ({name})", "most likely by the operating system for lack of memory"
            return f"died ({name})", "a crash in a library it called, or a kill"
    return "died without a Python error", "most likely killed by the operating system for lack of memory"


def killed_message(labels: list[str], how: tuple[str, str], done: int, total: int, workers: int,
                   flag: str | None) -> str:
    """The one line for a worker that died mid-job (`WorkerKilled`): the file(s), what happened, what is
    kept, what to do."""
    labels = [x for x in labels if x]
    if len(labels) == 1:
        what = f" while preparing {labels[0]}"
    elif labels:
        shown = ", ".join(labels[:3]) + (f" and {len(labels) - 3} more" if len(labels) > 3 else "")
        what = f" while preparing one of {shown}"
    else:
        what = ""
    fewer = f"{flag} {max(1, workers // 2)} (now {workers})" if flag else f"fewer workers (now {workers})"
    skip = (f", or move {labels[0] if len(labels) == 1 else 'that file'} out of the input (an unusually long "
            f"or large file)") if labels else ""
    return (f"a worker process {how[0]}{what}, {how[1]}; the files finished before it are kept ({done} of "
            f"{total} at least) and the same command continues with the rest: run it again with {fewer}{skip}")


@contextmanager
def process_pool(max_workers: int, initializer: Callable[[], None] | None = None, mp_context: Any = None, *,
                 label: Callable[[Any], str] | None = None, flag: str | None = None) -> Iterator[FilePool]:
    """A pool (`FilePool`: `map` as `ProcessPoolExecutor`'s) whose workers ignore SIGINT/SIGTERM (then run
    `initializer`). When the block is left by an error or Ctrl-C, the jobs not started yet are cancelled:
    the executor's own exit would first run the whole queue, so Ctrl-C would take effect only when
    everything was done. The jobs already running finish (a file each, written atomically), then the
    exception goes on. A worker that dies mid-job (the out-of-memory killer) is `WorkerKilled`: one line
    naming the file(s) it was on (`label(job)`, e.g. its path) and `flag`, the setting that sets the
    number of workers (`--num_workers`)."""
    marker_dir = tempfile.mkdtemp(prefix="workers-")
    executor = ProcessPoolExecutor(max_workers=max_workers, mp_context=mp_context,
                                   initializer=functools.partial(_start_worker, initializer))
    pool = FilePool(executor, marker_dir, label)
    try:
        try:
            yield pool
        except BrokenProcessPool as e:
            processes = list((getattr(executor, "_processes", None) or {}).items())  # before shutdown drops them
            executor.shutdown(wait=True, cancel_futures=True)
            markers = {m.name: m.read_text(encoding="utf-8", errors="replace")
                       for m in sorted(Path(marker_dir).iterdir())}  # the jobs that never returned
            codes = [p.exitcode for pid, p in processes if str(pid) in markers or not markers]
            labels = list(markers.values())
            raise WorkerKilled(killed_message(labels, _how_it_died(codes), pool.done, pool.total, max_workers,
                                              flag)) from e
        except BaseException:
            executor.shutdown(wait=True, cancel_futures=True)
            raise
        executor.shutdown(wait=True)
    finally:
        shutil.rmtree(marker_dir, ignore_errors=True)
