"""common.stopping: the one stop decision and failure advice every trainer's loop uses."""

from __future__ import annotations

import os
import signal

import pytest

import common.stopping as stopping
from common import exit_codes
from common.guards import NonFiniteError
from common.hardware import OutOfMemory
from common.stopping import SIGNAL, STOP_AT_STEP, TIME_LIMIT, GracefulExit, RunStop, exit_code


def test_graceful_exit_flags_sigterm():
    with GracefulExit() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested and stop.signal_name == "SIGTERM"


def test_a_second_signal_is_ignored_with_one_line(capsys):
    """It used to raise KeyboardInterrupt inside the stop save (tests/test_run_contract.py sends it for real)."""
    with GracefulExit() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)  # no KeyboardInterrupt
        assert stop.requested and stop.signal_name == "SIGTERM"
    out = capsys.readouterr().out
    assert "SIGTERM received: saving a checkpoint after this step, then exiting" in out
    assert out.strip().splitlines()[-1] == "SIGINT received again: ignored while the checkpoint is saved; exiting after it"


def test_a_signal_stops_at_this_step_with_the_interrupted_exit_code():
    with RunStop(stop_at_step=10) as stop:
        assert stop.check(1) is None
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.check(2) == SIGNAL
        assert stop.message(2) == "stopped by SIGTERM at step 2; checkpoint saved (continue with --resume auto)"
    assert exit_code(stop.reason) == exit_codes.INTERRUPTED
    assert signal.getsignal(signal.SIGTERM) is not stop.signals._handler  # handlers restored on exit


def test_stop_at_step_and_time_limit_exit_ok():
    with RunStop(stop_at_step=3) as stop:
        assert stop.check(2) is None and stop.check(3) == STOP_AT_STEP
    assert exit_code(stop.reason) == exit_codes.OK
    with RunStop(time_limit_minutes=1e-9) as stop:
        assert stop.check(1) == TIME_LIMIT
    assert exit_code(stop.reason) == exit_codes.OK and exit_code(None) == exit_codes.OK


def test_another_ranks_signal_stops_this_rank(monkeypatch):
    """The decision goes through any_rank: what one rank saw, every rank acts on."""
    monkeypatch.setattr(stopping, "any_rank", lambda flag: True)
    with RunStop(time_limit_minutes=60) as stop:
        assert stop.check(1) == SIGNAL and stop.message(1, "runs/x").startswith("stopped by signal at step 1")


def test_nonfinite_stop_names_the_last_good_checkpoint():
    with pytest.raises(NonFiniteError, match=r"(?s)3 consecutive.*last good checkpoint: runs/a\.pt.*--set lr=<lower>"):
        with RunStop(last_good=lambda: "runs/a.pt", lr_hint="--set lr=<lower>"):
            raise NonFiniteError("3 consecutive steps had non-finite losses")


def test_out_of_memory_becomes_the_advice():
    with pytest.raises(OutOfMemory, match="batch_size=4"):
        with RunStop(oom=("the test step", 8, {"accum_key": None})):
            raise RuntimeError("CUDA out of memory. Tried to allocate 2 GiB")
    with pytest.raises(RuntimeError, match="other"):  # any other error passes through unchanged
        with RunStop(oom=("the test step", 8, {})):
            raise RuntimeError("other")


def test_under_torchrun_the_ranks_agree_every_few_steps_not_every_step(monkeypatch):
    """The stop agreement is a collective (and a host sync on NCCL): under torchrun it runs every
    AGREE_EVERY steps and at stop_at_step, so a signal stops every rank at the same, slightly later step."""
    asked = []
    monkeypatch.setattr(stopping.distributed, "is_enabled", lambda: True)
    monkeypatch.setattr(stopping, "any_rank", lambda flag: asked.append(flag) or flag)
    with RunStop(stop_at_step=stopping.AGREE_EVERY * 2 + 3) as stop:
        stop.signals.requested = True  # this rank was signalled before step 1
        reasons = [stop.check(step) for step in range(1, stopping.AGREE_EVERY + 1)]
    assert reasons == [None] * (stopping.AGREE_EVERY - 1) + [SIGNAL] and len(asked) == 1
    asked.clear()
    with RunStop(stop_at_step=stopping.AGREE_EVERY + 3) as stop:
        assert [stop.check(s) for s in range(1, stopping.AGREE_EVERY + 4)][-1] == STOP_AT_STEP
    assert len(asked) == 2  # at step AGREE_EVERY and at stop_at_step, nowhere else
