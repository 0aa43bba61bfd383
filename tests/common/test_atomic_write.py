"""common.atomic_write under Windows' rules: a file another program holds open cannot be replaced or removed
there. A brief hold is waited out; a lasting one is one line (exit 2), the destination keeping its old content."""

from __future__ import annotations

import pytest


# ------------------------------------------------------------------------------ Windows: a file held open
def _held_open_for(monkeypatch, failures: int | None) -> list[int]:
    """os.replace raising what Windows raises while another program holds the target open (PermissionError,
    WinError 32): `failures` times, or always (None); returns the call counter."""
    import os

    from common import atomic_write

    real, calls = os.replace, [0]

    def replace(src, dst):
        calls[0] += 1
        if failures is None or calls[0] <= failures:
            raise PermissionError(13, "The process cannot access the file because it is being used by another process")
        return real(src, dst)

    monkeypatch.setattr(atomic_write.os, "replace", replace)
    monkeypatch.setattr(atomic_write, "ON_WINDOWS", True)
    monkeypatch.setattr(atomic_write, "IN_USE_WAIT_S", 0.3)
    return calls


def test_a_brief_hold_on_windows_is_waited_out(tmp_path, monkeypatch):
    from common.atomic_write import write_text

    target = tmp_path / "config.yaml"
    target.write_text("old")
    calls = _held_open_for(monkeypatch, failures=2)
    write_text(target, "new")
    assert target.read_text() == "new" and calls[0] == 3
    assert [p.name for p in tmp_path.iterdir()] == ["config.yaml"]  # no temp file left


def test_a_file_held_open_for_good_is_one_line_and_the_old_content_stays(tmp_path, monkeypatch):
    from common.atomic_write import FileInUseError, write_text
    from common.errors import OutputPathError

    target = tmp_path / "best.pt"
    target.write_text("old")
    _held_open_for(monkeypatch, failures=None)
    with pytest.raises(FileInUseError, match=r"cannot replace .*best\.pt: another program holds it open") as caught:
        write_text(target, "new")
    assert isinstance(caught.value, OutputPathError)  # exit 2 with this one line, as a full disk
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["best.pt"]


def test_on_posix_a_permission_error_is_not_retried(tmp_path, monkeypatch):
    from common import atomic_write

    calls = _held_open_for(monkeypatch, failures=None)
    monkeypatch.setattr(atomic_write, "ON_WINDOWS", False)
    with pytest.raises(PermissionError):
        atomic_write.write_text(tmp_path / "x.txt", "new")
    assert calls[0] == 1


def test_rotation_keeps_going_when_an_old_checkpoint_is_held_open(tmp_path, monkeypatch, capsys):
    from pathlib import Path

    from common import atomic_write
    from common.checkpoint import CheckpointManager

    manager = CheckpointManager(tmp_path, keep_last=1, prefix="model")
    manager.save({"w": 1}, 1)
    monkeypatch.setattr(atomic_write, "ON_WINDOWS", True)
    monkeypatch.setattr(atomic_write, "IN_USE_WAIT_S", 0.2)
    real_unlink = Path.unlink

    def unlink(self, missing_ok=False):
        if self.name.startswith("model_") and "1" in self.name:
            raise PermissionError(13, "in use")
        return real_unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", unlink)
    manager.save({"w": 2}, 2)
    assert "warning: cannot remove" in capsys.readouterr().out
    assert manager.latest().name.startswith("model_") and len(manager.checkpoints()) == 2
