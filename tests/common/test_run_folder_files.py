"""A run folder's own files that are not what they should be (issue "Never lose a run, round 4", item 0):
`run.lock` as a link, a folder or a FIFO is refused in one line (exit 2) and never opened through (the link's
target keeps its bytes; a FIFO never blocks), also where the system has no `O_NOFOLLOW` (Windows: `os.lstat`
looks first) and where a link appears between that look and the open; a damaged `best.json` is moved aside
with one line and the run goes on; a `config.yaml` that is a folder stops the write (the VAE and the vocoder
save it through `common.config.save_config` on every start, `--resume auto` too) in one line."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from common import run_lock
from common.best_by import BestCheckpoints
from common.checkpoint import CheckpointManager
from common.config import save_config
from common.errors import UserError
from common.run_lock import LockFileError, RunLock, release_run_locks

POSIX_ONLY = pytest.mark.skipif(os.name == "nt", reason="symlinks and FIFOs need POSIX here")


@pytest.fixture(autouse=True)
def _release():
    yield
    release_run_locks()


def _make(kind: str, lock: Path, target: Path) -> None:
    if kind == "link":
        lock.symlink_to(target)
    elif kind == "folder":
        lock.mkdir()
    else:
        os.mkfifo(lock)


@POSIX_ONLY
@pytest.mark.parametrize("kind, said", [("link", "a symbolic link"), ("folder", "a folder"), ("fifo", "a FIFO")])
def test_a_run_lock_that_is_no_regular_file_is_refused_in_one_line(tmp_path, kind, said):
    target = tmp_path / "precious.txt"
    target.write_text("keep me\n")
    run = tmp_path / "run"
    run.mkdir()
    _make(kind, run / run_lock.LOCK_NAME, target)
    with pytest.raises(LockFileError) as info:  # a FIFO would block a plain open: the test would hang
        RunLock(run).acquire()
    message = str(info.value)
    assert isinstance(info.value, UserError) and "\n" not in message
    assert str(run / run_lock.LOCK_NAME) in message and said in message and "remove it" in message
    assert target.read_text() == "keep me\n"


@POSIX_ONLY
def test_without_o_nofollow_lstat_refuses_the_link(tmp_path, monkeypatch):
    """Windows has no O_NOFOLLOW: the look with os.lstat before the open is what refuses there."""
    monkeypatch.delattr(os, "O_NOFOLLOW", raising=False)
    target = tmp_path / "precious.txt"
    target.write_text("keep me\n")
    (tmp_path / run_lock.LOCK_NAME).symlink_to(target)
    with pytest.raises(LockFileError, match="symbolic link"):
        RunLock(tmp_path).acquire()
    assert target.read_text() == "keep me\n"


@POSIX_ONLY
def test_a_link_made_after_the_look_is_refused_by_the_open(tmp_path, monkeypatch):
    """O_NOFOLLOW closes the gap between os.lstat and os.open: a link that appears there is never followed."""
    target = tmp_path / "precious.txt"
    target.write_text("keep me\n")
    lock = tmp_path / run_lock.LOCK_NAME
    real_lstat = os.lstat
    calls = []

    def lstat_before_the_link(path, *args, **kwargs):
        calls.append(path)
        if len(calls) == 1:  # the look finds nothing; the link is made right after it
            lock.symlink_to(target)
            raise FileNotFoundError(path)
        return real_lstat(path, *args, **kwargs)

    monkeypatch.setattr(run_lock.os, "lstat", lstat_before_the_link)
    with pytest.raises(LockFileError, match="symbolic link"):
        RunLock(tmp_path).acquire()
    assert target.read_text() == "keep me\n"


def test_a_regular_run_lock_is_still_taken(tmp_path):
    lock = RunLock(tmp_path).acquire(log=pytest.fail)
    assert json.loads((tmp_path / run_lock.LOCK_NAME).read_text())["pid"] == os.getpid()
    lock.release()
    assert not (tmp_path / run_lock.LOCK_NAME).exists()


@pytest.mark.parametrize("content", [b"{\"metric\": 0.5, \"st", b"\xff\xfe garbage", b"[1, 2]", b"{\"metric\": \"low\"}",
                                     b"{\"metric\": NaN}", b"folder"])
def test_a_damaged_best_json_is_moved_aside_with_one_line_and_the_run_goes_on(tmp_path, content):
    best = tmp_path / "best.json"
    if content == b"folder":
        best.mkdir()
    else:
        best.write_bytes(content)
    lines = []
    manager = BestCheckpoints(tmp_path, "psnr", "psnr", lines.append, keep_last=2)
    assert manager.best_metric is None and len(lines) == 1 and "\n" not in lines[0], lines
    assert lines[0].startswith(f"warning: {best} is damaged") and "moved aside to best.json.damaged-" in lines[0]
    aside = list(tmp_path.glob("best.json.damaged-*"))
    assert len(aside) == 1 and not best.exists()
    manager.save({"step": 1}, 1, 20.0)  # the run goes on: the next validation is the best
    assert json.loads(best.read_text())["metric"] == 20.0 and (tmp_path / "best.pt").is_file()


def test_an_intact_best_json_is_read_as_before(tmp_path):
    (tmp_path / "best.json").write_text(json.dumps({"metric": 0.25, "step": 3, "mode": "min"}))
    manager = CheckpointManager(tmp_path, log=pytest.fail)
    assert manager.best_metric == 0.25 and not list(tmp_path.glob("*.damaged-*"))


def test_a_config_yaml_that_is_a_folder_stops_the_run_in_one_line(tmp_path):
    """Every trainer writes the resolved config on every start (`--resume auto` too) with save_config;
    the refusal comes before anything is written (common.atomic_write.atomic_output)."""
    (tmp_path / "config.yaml").mkdir()
    (tmp_path / "config.yaml" / "inside.txt").write_text("x")
    with pytest.raises(UserError) as info:
        save_config({"lr": 1e-4}, tmp_path)
    assert "\n" not in str(info.value) and str(tmp_path / "config.yaml") in str(info.value)
    assert "is a folder" in str(info.value)
    assert (tmp_path / "config.yaml" / "inside.txt").read_text() == "x" and not list(tmp_path.glob(".config.yaml.*"))
