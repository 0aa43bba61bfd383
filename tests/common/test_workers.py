"""A prepare worker killed by the operating system (the out-of-memory killer: SIGKILL) is one line naming the
file it was on and what to do, exit 2, never a BrokenProcessPool traceback; what was prepared is kept and the
same command continues. The shared pool (`common.workers.process_pool`), then each prepare end to end."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from common import workers
from common.workers import WorkerKilled, process_pool
from tests.child_env import child_env
from tests.common.killing_worker import MARK, KillOnMarkedFile

REPO = Path(__file__).resolve().parents[2]


def _slow_square(x: int) -> int:
    time.sleep(0.05)
    return x * x


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_a_killed_worker_names_its_file_and_the_flag(monkeypatch, method):
    monkeypatch.setattr(workers, "_Tracked", KillOnMarkedFile)
    names = {i: f"{MARK}.wav" if i == 5 else f"f{i}.wav" for i in range(10)}
    got = []
    with pytest.raises(WorkerKilled) as info:
        with process_pool(2, mp_context=multiprocessing.get_context(method), label=names.get,
                          flag="--num_workers") as pool:
            got.extend(pool.map(_slow_square, range(10)))
    message = str(info.value)
    assert "\n" not in message
    assert f"while preparing {MARK}.wav" in message and "SIGKILL" in message and "memory" in message
    assert "--num_workers 1 (now 2)" in message and f"move {MARK}.wav out of the input" in message
    assert "of 10 at least" in message and "continues" in message
    assert not isinstance(info.value.__cause__, WorkerKilled)  # chained to the BrokenProcessPool, for a debugger


def test_the_pool_without_a_kill_is_plain_map(monkeypatch):
    with process_pool(2, mp_context=multiprocessing.get_context("spawn"), label=str) as pool:
        assert list(pool.map(_slow_square, range(5), chunksize=2)) == [0, 1, 4, 9, 16]


# ----------------------------------------------------------------------------- each prepare, end to end


def _tone(seconds: float, sr: int, f0: float = 150.0) -> np.ndarray:
    t = np.arange(int(seconds * sr)) / sr
    return (0.3 * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t)) * np.sin(2 * np.pi * f0 * t)).astype(np.float32)


def test_tts_prepare_with_a_killed_worker_says_so_and_continues(tmp_path, monkeypatch, capsys):
    from tts.prepare_data import main

    audio = tmp_path / "audio"
    audio.mkdir()
    ids = ["a0", "a1", MARK, "a3"]
    for i, name in enumerate(ids):
        sf.write(audio / f"{name}.wav", _tone(2.0, 22050, 120 + 10 * i), 22050, subtype="PCM_16")
    (tmp_path / "m.csv").write_text("".join(f"{n}|Bugun havo juda yaxshi edi.\n" for n in ids))
    argv = ["--metadata", str(tmp_path / "m.csv"), "--audio_dir", str(audio), "--output_dir", str(tmp_path / "out"),
            "--num_workers", "2", "--no_trim"]
    monkeypatch.setattr(workers, "_Tracked", KillOnMarkedFile)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: a worker process was killed (SIGKILL) while preparing ") and "\n" not in err
    assert f"{MARK}.wav" in err and "--num_workers 1 (now 2)" in err and "Traceback" not in err
    monkeypatch.undo()  # the same command again (the file no longer kills): it continues and finishes
    assert main(argv) == 0
    assert json.loads((tmp_path / "out" / "report.json").read_text())["kept"] == 4


def test_vae_prepare_with_a_killed_worker_says_so(tmp_path, monkeypatch, capsys):
    from PIL import Image

    from vae.prepare_data import main

    src = tmp_path / "img"
    src.mkdir()
    rng = np.random.default_rng(0)
    for name in ["i0", "i1", MARK, "i3", "i4"]:
        Image.fromarray(rng.integers(0, 255, (40, 40, 3), dtype=np.uint8)).save(src / f"{name}.png")
    argv = ["--mode", "preprocess", "--input_dir", str(src), "--output_dir", str(tmp_path / "out"),
            "--target_size", "32", "--min_size", "16", "--num_workers", "2"]
    monkeypatch.setattr(workers, "_Tracked", KillOnMarkedFile)
    assert main(argv) == 2
    out = capsys.readouterr().err.strip().splitlines()[-1]  # the error line goes to stderr
    assert out.startswith("error: a worker process was killed (SIGKILL) while preparing ")
    assert f"{MARK}.png" in out and "--num_workers 1 (now 2)" in out
    monkeypatch.undo()
    assert main(argv) == 0
    assert len(json.loads((tmp_path / "out" / "manifest.json").read_text())["files"]) == 5


def test_vocoder_prepare_with_a_killed_worker_says_so(tmp_path, monkeypatch, capsys):
    from tests.vocoder.conftest import TINY_YAML
    from vocoder.prepare_data import main

    src = tmp_path / "w"
    src.mkdir()
    for i, name in enumerate(["v0", MARK, "v2"]):
        sf.write(src / f"{name}.wav", _tone(0.8, 22050, 150 + 20 * i), 22050)
    argv = ["--config", str(TINY_YAML), "--input", str(src), "--output", str(tmp_path / "bin"), "--num_workers", "2",
            "--set", "val_num=1"]
    monkeypatch.setattr(workers, "_Tracked", KillOnMarkedFile)  # its workers are spawned: the wrapper is pickled
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: a worker process was killed (SIGKILL) while preparing ") and "\n" not in err
    assert f"{MARK}.wav" in err and "--num_workers 1 (now 2)" in err


HOLDS_A_LOADER = """
import sys
from common.data import make_loader
loader = make_loader(list(range(16)), batch_size=4, num_workers=2, persistent_workers=True)
for _ in range(2):
    for batch in loader:
        pass
KEEP = loader  # alive at exit, as a trainer in a reference cycle is
print("trained", flush=True)
"""


def test_a_process_that_ends_holding_a_persistent_loader_exits(tmp_path):
    """Loader workers ignore SIGTERM (the trainer decides), which multiprocessing's own exit hook sends them
    before it waits for them: without `end_ignoring_workers_at_exit` this child never ended."""
    script = tmp_path / "holds.py"
    script.write_text(HOLDS_A_LOADER)
    done = subprocess.run([sys.executable, str(script)], cwd=REPO, env=child_env(), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "trained", done.stderr[-2000:]
    assert "Traceback" not in done.stderr and "killed by signal" not in done.stderr, done.stderr[-2000:]
