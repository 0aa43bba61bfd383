"""`common.exit_codes.run_main` (the one failure -> exit code mapping of the trainers' `main`) and
`common.hardware.explain_oom` (a CUDA OOM becomes `OutOfMemory` with the advice)."""

from __future__ import annotations

import pytest

from common import exit_codes
from common.config import ConfigError
from common.guards import NonFiniteError
from common.hardware import OutOfMemory, explain_oom


def _raises(exc: BaseException):
    def body() -> int:
        raise exc
    return body


@pytest.mark.parametrize("exc, code", [
    (ConfigError("bad key"), exit_codes.BAD_INPUT),
    (FileNotFoundError("no data"), exit_codes.BAD_INPUT),
    (NonFiniteError("3 consecutive steps had non-finite values\nlast good checkpoint: x"), exit_codes.NON_FINITE),
    (OutOfMemory("CUDA out of memory in the step"), exit_codes.OUT_OF_MEMORY),
])
def test_run_main_prints_one_error_and_returns_the_documented_code(exc, code, capsys):
    cleaned = []
    rc = exit_codes.run_main(_raises(exc), (ConfigError, FileNotFoundError), lambda: cleaned.append(1))
    assert rc == code and cleaned == [1]
    assert capsys.readouterr().err == f"error: {exc}\n"


def _user_error_classes():
    """Every user-facing error class of the repo (one per module that defines one)."""
    from common.atomic_write import DiskFullError
    from common.checkpoint import CheckpointError
    from common.errors import InputNotFoundError
    from speech.audio import AudioError
    from tts.clone.data import DataError as CloneDataError
    from tts.clone.infer import VocoderMismatchError
    from tts.metadata import PrepareError as TtsPrepareError
    from tts.vits.data import DataError as VitsDataError
    from vae.data import BadImage
    from vocoder.data import DatasetError
    from vocoder.prepare_data import PrepareError

    return [ConfigError, DiskFullError, InputNotFoundError, AudioError, CheckpointError, CloneDataError, VocoderMismatchError,
            TtsPrepareError, VitsDataError, BadImage, DatasetError, PrepareError]


def test_a_user_error_is_exit_2_without_naming_its_class(capsys):
    """`run_main(body)` needs no tuple of error classes: every user-facing one derives from UserError (the
    checkpoint one is still named by `user_errors` until common/checkpoint.py derives it)."""
    from common.errors import UserError

    for cls in _user_error_classes():
        exc = cls("the input named here is wrong")
        assert exit_codes.run_main(_raises(exc)) == exit_codes.BAD_INPUT, cls
        assert capsys.readouterr().err == "error: the input named here is wrong\n", cls
        assert cls.__name__ == "CheckpointError" or isinstance(exc, UserError), cls


@pytest.mark.parametrize("bug", [ValueError("a bug"), RuntimeError("a bug"), OSError("a bug"), TypeError("a bug")])
def test_a_plain_exception_is_a_bug_not_exit_2(bug, capsys):
    """ValueError, RuntimeError, OSError raised by our own code are bugs: their traceback reaches the user."""
    cleaned = []
    with pytest.raises(type(bug)):
        exit_codes.run_main(_raises(bug), cleanup=lambda: cleaned.append(1))
    assert cleaned == [1] and capsys.readouterr().err == ""


def test_under_torchrun_only_rank_0_gives_the_non_finite_advice(capsys, monkeypatch):
    """Every rank raises NonFiniteError at the same step; the others do not know the checkpoint rank 0
    saved ("nothing good to resume" beside rank 0's path), so they exit 3 without a line of their own."""
    from common import distributed

    monkeypatch.setattr(distributed, "rank", lambda: 1)
    assert exit_codes.run_main(_raises(NonFiniteError("stopping; last good: none")), ()) == exit_codes.NON_FINITE
    assert capsys.readouterr().err == ""


def test_ctrl_c_outside_a_training_loop_is_one_line_and_exit_130(capsys):
    cleaned = []
    assert exit_codes.run_main(_raises(KeyboardInterrupt()), (ConfigError,), lambda: cleaned.append(1)) == 130
    assert cleaned == [1] and capsys.readouterr().err == "interrupted; run again to continue\n"


def test_run_main_returns_the_body_code_and_lets_bugs_through(capsys):
    assert exit_codes.run_main(lambda: exit_codes.INTERRUPTED, (ConfigError,)) == exit_codes.INTERRUPTED
    cleaned = []
    with pytest.raises(KeyError):
        exit_codes.run_main(_raises(KeyError("bug")), (ConfigError,), lambda: cleaned.append(1))
    assert cleaned == [1] and capsys.readouterr().err == ""


def test_explain_oom_turns_only_an_oom_into_out_of_memory():
    with pytest.raises(OutOfMemory, match=r"CUDA out of memory in the step at batch_size=8\.") as info:
        with explain_oom("the step", 8, {"accum_key": None, "resume": "--resume auto"}):
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert "--set batch_size=4" in str(info.value) and "Then --resume auto continues" in str(info.value)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        with explain_oom("the step", 8):
            raise RuntimeError("shape mismatch")
    with pytest.raises(OutOfMemory, match="^already explained$"):  # an explained one is not explained twice
        with explain_oom("the step", 8):
            raise OutOfMemory("already explained")


def test_sigterm_during_start_up_is_one_line_and_exit_130_not_a_silent_143(tmp_path):
    """A trainer's start-up (data scan, model build) runs before the loop's saving handler exists."""
    import os
    import signal
    import subprocess
    import sys
    import time
    ready = tmp_path / "ready"
    script = ("import time, pathlib\nfrom common import exit_codes\n"
              f"def body():\n    pathlib.Path({str(ready)!r}).write_text('x')\n    time.sleep(60)\n    return 0\n"
              "raise SystemExit(exit_codes.run_main(body, (ValueError,)))\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True,
                            cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    deadline = time.time() + 60
    while not ready.exists() and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == exit_codes.INTERRUPTED and err == exit_codes.INTERRUPTED_LINE + "\n"
    before = signal.getsignal(signal.SIGTERM)
    assert exit_codes.run_main(lambda: 0, (ValueError,)) == 0
    assert signal.getsignal(signal.SIGTERM) is before  # run_main puts the caller's handler back


class _StillTerminated(Exception):
    """Raised by the test's own SIGTERM handler: a prepare that does not install one fails the test
    with this instead of killing pytest."""


@pytest.mark.parametrize("module, patched, argv", [
    ("vocoder.prepare_data", "prepare", ["--input", "{tmp}/in", "--output", "{tmp}/bin"]),
    ("tts.prepare_data", "prepare", ["--metadata", "{tmp}/in/metadata.csv", "--audio_dir", "{tmp}/in", "--output_dir",
                                     "{tmp}/out"]),
    ("vae.prepare_data", "preprocess", ["--mode", "preprocess", "--input_dir", "{tmp}/in", "--output_dir", "{tmp}/out"]),
])
def test_prepare_scripts_stopped_by_sigterm_say_so_and_exit_130(module, patched, argv, tmp_path, monkeypatch, capsys):
    """A scheduler's stop during a long preprocessing run: one line and 130 (run again to continue),
    not a silent 143; the caller's handler is put back afterwards."""
    import importlib
    import os
    import signal

    def terminated(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("SIGTERM was not delivered")

    def outer(signum, frame):
        raise _StillTerminated

    (tmp_path / "in").mkdir()  # outputs beside the input, never inside it (refused: common.run_dir.check_apart)
    mod = importlib.import_module(module)
    monkeypatch.setattr(mod, patched, terminated)
    before = signal.signal(signal.SIGTERM, outer)
    try:
        rc = mod.main([a.format(tmp=tmp_path) for a in argv])
        assert signal.getsignal(signal.SIGTERM) is outer
    finally:
        signal.signal(signal.SIGTERM, before)
    assert rc == exit_codes.INTERRUPTED
    assert capsys.readouterr().err.strip().endswith(exit_codes.INTERRUPTED_LINE)


@pytest.mark.parametrize("exc, words", [
    (ModuleNotFoundError("No module named 'parselmouth'"),  # raised by hand: only the message names it
     ["error: the Python module 'parselmouth' is not installed", "`pip install praat-parselmouth==",
      "`pip install -r requirements.txt`"]),
    (ModuleNotFoundError("No module named 'soxr'", name="soxr"), ["'soxr' is not installed", "`pip install soxr=="]),
    (ModuleNotFoundError("No module named 'yaml.cyaml'", name="yaml.cyaml"), ["`pip install PyYAML=="]),
    (ImportError("cannot import name 'x' from 'librosa'", name="librosa"),
     ["error: the Python module 'librosa' does not import", "`pip install -r requirements.txt`"]),
    (ImportError("numba needs numpy 2.3 or less"), ["a required Python module does not import (numba needs"]),
])
def test_a_missing_module_is_one_line_naming_it_and_what_to_install(exc, words, capsys):
    cleaned = []
    rc = exit_codes.run_main(_raises(exc), (ConfigError,), lambda: cleaned.append(1))
    err = capsys.readouterr().err
    assert rc == exit_codes.BAD_INPUT and cleaned == [1]
    assert err.count("\n") == 1 and all(w in err for w in words), err


@pytest.mark.parametrize("exc", [ModuleNotFoundError("No module named 'common.gone'", name="common.gone"),
                                 ImportError("cannot import name 'x' from 'vocoder.model'", name="vocoder.model")])
def test_a_failed_import_of_our_own_modules_is_a_bug_with_its_traceback(exc, capsys):
    with pytest.raises(ImportError):
        exit_codes.run_main(_raises(exc), (ConfigError,))
    assert capsys.readouterr().err == ""


def _import_parselmouth_fails(_: int) -> None:
    raise ModuleNotFoundError("No module named 'parselmouth'", name="parselmouth")


def test_a_workers_module_not_found_error_reaches_the_main_process_as_itself():
    """Prepare scripts rely on it: the pool re-raises the worker's exception, type and module name intact,
    so the script's edge can name what to install."""
    import multiprocessing

    from common.workers import process_pool

    with pytest.raises(ModuleNotFoundError) as info:
        with process_pool(2, mp_context=multiprocessing.get_context("spawn")) as pool:
            list(pool.map(_import_parselmouth_fails, range(4)))
    assert info.value.name == "parselmouth"
