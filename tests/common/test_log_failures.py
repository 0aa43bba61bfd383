"""The logs folder follows the run folder's rules (issue "Never lose a run, round 4", item 6): a TensorBoard
folder that cannot be written at start is one line and exit 2 (a full disk: the disk-full line); a full disk
later (ENOSPC from TensorBoard's writer thread, or from W&B / MLflow) turns that tracker off with one line,
no traceback, and the run goes on. The writers are monkeypatched: nothing fills a real disk."""

from __future__ import annotations

import errno
import threading
import types

import pytest

from common import exit_codes
from common import log as common_log
from common.atomic_write import DiskFullError
from common.errors import OutputPathError
from common.log import RunLogger


def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_logs_folder_that_cannot_be_written_is_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "logs").write_text("a file where the logs folder goes")
    assert exit_codes.run_main(lambda: RunLogger(tmp_path / "logs", say=pytest.fail) and 0) == exit_codes.BAD_INPUT
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: the logs folder {tmp_path / 'logs'} cannot be written (") and "\n" not in err, err


def test_a_full_disk_when_tensorboard_starts_is_the_disk_full_line(tmp_path, monkeypatch):
    import torch.utils.tensorboard as tb

    monkeypatch.setattr(tb, "SummaryWriter", _enospc)
    with pytest.raises(DiskFullError, match="disk full while writing") as info:
        RunLogger(tmp_path / "logs", say=pytest.fail)
    assert isinstance(info.value, OutputPathError) and "\n" not in str(info.value)


def test_a_full_disk_during_the_run_turns_tensorboard_off_with_one_line(tmp_path, monkeypatch, capsys):
    from tensorboard.summary.writer import record_writer

    lines = []
    log = RunLogger(tmp_path / "logs", say=lines.append)
    log.scalar("train/loss", 1.0, 1)
    log.flush()
    monkeypatch.setattr(record_writer.RecordWriter, "write", _enospc)  # in TensorBoard's writer thread
    for step in range(2, 5):
        log.scalars({"loss": 1.0, "lr": 0.1}, step, "train")
    log.flush()  # the thread's error comes back at the latest here
    log.scalar("train/loss", 1.0, 9)  # off: nothing more, nothing raised
    log.text("note", "x", 9)
    log.close()
    assert log.writer is None and len(lines) == 1, lines
    assert lines[0].startswith("logger: tensorboard failed (OSError: [Errno 28] No space left on device)"), lines
    assert "Traceback" not in capsys.readouterr().err  # the writer thread's traceback is not printed


@pytest.mark.parametrize("name", ["wandb", "mlflow"])
def test_a_full_disk_in_wandb_or_mlflow_turns_it_off_with_one_line(tmp_path, name):
    """The trackers' own `log` / `params`, with their package's writer replaced by one that finds the disk full."""
    (tmp_path / "config.yaml").write_text("lr: 0.1\n")
    lines = []
    log = RunLogger(tmp_path / "logs", say=lines.append)
    if name == "wandb":
        tracker = object.__new__(common_log._Wandb)
        tracker.run = types.SimpleNamespace(log=_enospc, config=None, finish=lambda: None)
        tracker.params = lambda params, path: None  # the config goes; the first scalars hit the full disk
    else:
        tracker = object.__new__(common_log._Mlflow)
        no_params = types.SimpleNamespace(data=types.SimpleNamespace(params={}))
        tracker.client = types.SimpleNamespace(get_run=lambda run_id: no_params, log_batch=_enospc,
                                               log_artifact=_enospc, set_terminated=lambda run_id: None)
    tracker.id = "run-1"
    log.trackers.append(tracker)
    log.scalar("train/loss", 1.0, 1)
    log.scalar("train/loss", 0.5, 2)  # off: no second line
    log.close()
    assert log.trackers == [] and len(lines) == 1, lines
    assert lines[0] == f"logger: {name} failed (OSError: [Errno 28] No space left on device); it logs nothing more in " \
                       "this run", lines
    assert list((tmp_path / "logs").glob("events.out.tfevents.*"))  # TensorBoard went on


def test_other_threads_exceptions_are_still_reported(tmp_path):
    RunLogger(tmp_path / "logs").close()  # installs the quiet hook
    seen = []
    previous = threading.excepthook
    try:
        threading.excepthook = seen.append
        common_log._quiet_tensorboard_thread_errors()  # wraps the current hook once more
        thread = threading.Thread(target=_enospc)
        thread.start()
        thread.join()
    finally:
        threading.excepthook = previous
    assert len(seen) == 1 and isinstance(seen[0].exc_value, OSError)
