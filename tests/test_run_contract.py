"""The run-folder / exit-code / output-path contract (README "What happens when things go wrong"),
checked the same way for the four trainers, plus the output check of every other script.

Per trainer, one tiny run folder goes through: a second run while the first trains → exit 2 naming
the first (the run folder's lock); SIGTERM during training, then SIGINT during the stop save → the
second signal ignored with one line, exit 130 with a checkpoint, no traceback, lock released;
a plain re-run → exit 2 naming --resume auto and --overwrite; a truncated newest checkpoint and a
stale temp file → `--resume auto` skips (renames `*.corrupt`) and resumes from the intact one, the
temp file is gone; `--overwrite` → a new run, every old file kept under `overwritten-*/`."""

from __future__ import annotations

import importlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from common import exit_codes
from common.atomic_write import DiskFullError
from common.checkpoint import CheckpointManager, load_checkpoint, save_atomic
from tests.child_env import child_env
from tests.tts.test_clone_train import TINY_YAML as CLONE_TINY
from tests.tts.test_vits_train import TINY_YAML as VITS_TINY
from tests.tts.test_vits_train import _corpus
from tests.vae.helpers import TINY_CONFIG as VAE_TINY
from tests.vae.helpers import write_images
from tests.vocoder.conftest import TINY_YAML, tiny_config, write_tones

REPO = Path(__file__).resolve().parents[1]


def _sets(items) -> list[str]:
    return sum((["--set", s] for s in items), [])


# ----------------------------------------------------------------------------- the four trainers
@dataclass
class Trainer:
    name: str
    script: str
    main: Callable[[list[str]], int]
    argv: Callable[[Path, Path, int], list[str]]  # (data, run, steps) -> argv
    ckpt_dir: Callable[[Path], Path]
    bad_name: str  # a newer checkpoint name in that run's naming scheme

    def steps_of(self, ckpt: Path) -> int:
        return int(load_checkpoint(ckpt)["counters"]["step"])


def _vocoder_main(argv):
    from vocoder.train import main
    return main(argv)


def _vits_main(argv):
    from tts.vits.train import main
    return main(argv)


def _clone_main(argv):
    from tts.clone.train import main
    return main(argv)


def _vae_main(argv):
    from vae.train_vae import main
    return main(argv)


TRAINERS = {
    "vocoder": Trainer(
        "vocoder", "vocoder/train.py", _vocoder_main,
        lambda d, r, n: ["--config", str(TINY_YAML), "--data_dir", str(d["vocoder"]), "--run_dir", str(r),
                         "--device", "cpu", *_sets([f"max_updates={n}", "val_check_interval=100000"])],
        lambda r: r / "checkpoints", "model_09999999.pt"),
    "vits": Trainer(
        "vits", "tts/train.py", _vits_main,
        lambda d, r, n: ["--config", str(VITS_TINY), "--data_dir", str(d["tts"]), "--run_dir", str(r), "--device", "cpu",
                         *_sets([f"max_steps={n}", "save_step=100000"])],
        lambda r: r / "checkpoints", "vits_09999999.pt"),
    "clone": Trainer(
        "clone", "tts/train_main.py", _clone_main,
        lambda d, r, n: ["--config", str(CLONE_TINY), "--train-data", str(d["tts"]), "--checkpoint-dir", str(r),
                         "--model-size", "tiny",
                         "--batch-size", "2", "--num-workers", "0", "--precision", "32-true", "--scheduler", "constant",
                         *_sets(["train.log_interval=1", f"train.max_updates={n}", "train.val_check_interval=100000",
                                 "train.save_interval=100000", "val.at_start=false", "data.num_buckets=1",
                                 "data.ref_seconds=1.0", "val.batch_size=1", "train.device=cpu",
                                 f"data.cache_dir={d['tts'].parent / 'clone_cache'}"])],
        lambda r: r, "clone_09999999.pt"),
    "vae": Trainer(
        "vae", "vae/train_vae.py", _vae_main,
        lambda d, r, n: ["--config", str(VAE_TINY), "--data_path", str(d["vae"]), "--output_dir", str(r),
                         "--max_steps", str(n), "--no-export_diffusers", "--set", "device=cpu"],
        lambda r: r, "checkpoint_epoch_999.pt"),
}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    from vocoder.prepare_data import prepare

    root = tmp_path_factory.mktemp("contract_data")
    write_tones(root / "wavs", 5, 22050)
    prepare(tiny_config(), [root / "wavs"], root / "vocoder_bin", num_workers=0, log=lambda *a: None)
    write_images(root / "images", 10, size=48)
    return {"vocoder": root / "vocoder_bin", "tts": _corpus(root / "tts", ["anna"]), "vae": root / "images"}


class _Process:
    """A script run as its own process (as a user runs it), its stdout and stderr collected as they come;
    with `new_session`, in its own process group, which `ctrl_c()` signals whole, as a terminal does."""

    def __init__(self, argv: list[str], new_session: bool = False) -> None:
        # The progress bar redraws every 30 s off a terminal: ask for a redraw every 0.1 s here.
        env = child_env(OMP_NUM_THREADS="1", TQDM_MININTERVAL="0.1")
        # SIGINT at its default, as in a terminal: a shell's background job (`make test &`) starts with SIGINT
        # ignored, and a Python child keeps that instead of raising KeyboardInterrupt on Ctrl-C.
        self.proc = subprocess.Popen([sys.executable, *argv], cwd=REPO, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, start_new_session=new_session,
                                     preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        self.chunks: list[bytes] = []
        self.reader = threading.Thread(
            target=lambda: [self.chunks.append(c) for c in iter(lambda: self.proc.stdout.read1(4096), b"")],
            daemon=True)
        self.reader.start()

    @property
    def text(self) -> str:
        return b"".join(self.chunks).decode(errors="replace")

    def wait_for(self, seen: Callable[[str], object], deadline: float) -> bool:
        """Waits until `seen(output so far)` is true (True), or the process ended or time ran out (False)."""
        while time.time() < deadline and self.proc.poll() is None:
            if seen(self.text):
                return True
            time.sleep(0.05)
        return False

    def ctrl_c(self) -> None:
        os.killpg(self.proc.pid, signal.SIGINT)

    def finish(self, timeout: float) -> tuple[int, str]:
        try:
            rc = self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        self.reader.join(timeout=5)
        return rc, self.text


def _run_until_first_step_then_sigterm(argv: list[str], steps: int, timeout: float = 180,
                                       while_running: Callable[[int], None] | None = None,
                                       during_save: signal.Signals | None = None) -> tuple[int, str]:
    """Starts the trainer as a process, sends SIGTERM once it has logged a training step (first calling
    `while_running(pid)`, while it trains); with `during_save`, runs it through `tests/slow_run.py`
    and sends that second signal while the stop save is in progress."""
    run = _Process([str(REPO / "tests" / "slow_run.py"), *argv] if during_save is not None else argv)
    # a progress bar "N/steps" or a log line that starts with "step N" (not start-up text that
    # mentions a step, such as the VAE's GAN-phase report)
    started = re.compile(rf"(\b[1-9]\d*/{steps}\b)|(^step [1-9]\d*[: ])", re.M)
    deadline = time.time() + timeout
    if run.wait_for(started.search, deadline):
        try:
            if while_running is not None:
                while_running(run.proc.pid)
        finally:
            run.proc.send_signal(signal.SIGTERM)
    if during_save is not None and run.wait_for(lambda out: "saving after the stop signal" in out, deadline):
        run.proc.send_signal(during_save)
    return run.finish(timeout)


@pytest.mark.parametrize("name", list(TRAINERS))
def test_run_folder_contract(name, data, tmp_path, capsys):
    t = TRAINERS[name]
    run = tmp_path / "run"
    ckpts = t.ckpt_dir(run)

    # 1. A second run on the folder while the first trains: refused in one line naming the first (its lock).
    #    Then SIGTERM: a checkpoint is saved, exit 130, the lock is gone.
    second: dict[str, object] = {}

    def start_a_second_run(pid: int) -> None:
        capsys.readouterr()
        second["rc"] = t.main([*t.argv(data, run, 2), "--resume", "auto"])
        second["err"] = capsys.readouterr().err.strip()
        second["pid"] = pid

    rc, out = _run_until_first_step_then_sigterm([t.script, *t.argv(data, run, 500)], steps=500,
                                                 while_running=start_a_second_run, during_save=signal.SIGINT)
    assert second["rc"] == exit_codes.BAD_INPUT, second
    assert re.fullmatch(rf"error: \S+ is in use by another run \(pid {second['pid']} on .*", second["err"]), second
    assert rc == exit_codes.INTERRUPTED, out[-3000:]
    assert out.count("SIGINT received again: ignored while the checkpoint is saved; exiting after it") == 1, out[-3000:]
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out[-3000:]
    assert not (run / "run.lock").exists()
    saved = sorted(p for p in ckpts.glob("*.pt") if p.name not in ("best.pt", "vae_final.pt"))
    assert saved, out[-3000:]
    intact = max(saved, key=lambda p: p.stat().st_mtime)
    step = t.steps_of(intact)
    assert 1 <= step < 500

    # 2. The same command again, without --resume: refused in one line, nothing touched.
    before = {p.name: p.stat().st_mtime_ns for p in ckpts.glob("*.pt")}
    capsys.readouterr()
    assert t.main(t.argv(data, run, step + 1)) == exit_codes.BAD_INPUT
    err = capsys.readouterr().err.strip()
    assert "--resume auto" in err and "--overwrite" in err and len(err.splitlines()) == 1, err
    assert {p.name: p.stat().st_mtime_ns for p in ckpts.glob("*.pt")} == before

    # 3. A truncated newest checkpoint, a damaged one before it (20 kB of random bytes in its middle) and
    #    a temp file left by a kill mid-save: --resume auto warns, renames both bad files *.corrupt,
    #    resumes from the intact one; the temp file is removed.
    bad = ckpts / t.bad_name
    blob = intact.read_bytes()
    bad.write_bytes(blob[: len(blob) // 2])
    os.utime(bad, ns=(intact.stat().st_mtime_ns + 2 * 10**9,) * 2)
    damaged = ckpts / t.bad_name.replace("999.pt", "998.pt")
    middle = len(blob) // 2 - 10_000
    damaged.write_bytes(blob[:middle] + os.urandom(20_000) + blob[middle + 20_000:])
    os.utime(damaged, ns=(intact.stat().st_mtime_ns + 10**9,) * 2)
    stale = ckpts / f".{t.bad_name}.k3j9x2.tmp"
    stale.write_bytes(b"partial")
    assert t.main([*t.argv(data, run, step + 1), "--resume", "auto"]) == exit_codes.OK
    out = capsys.readouterr()
    text = out.out + out.err
    assert re.search(rf"warning: skipping \S*{re.escape(t.bad_name)}: truncated", text), text[-3000:]
    assert f"resumed {intact}" in text or f"resumed from {intact}" in text, text[-3000:]
    assert re.search(rf"warning: skipping \S*{re.escape(damaged.name)}: damaged: ", text), text[-3000:]
    assert (ckpts / (t.bad_name + ".corrupt")).is_file() and not bad.exists()
    assert (ckpts / (damaged.name + ".corrupt")).is_file() and not damaged.exists()
    assert not stale.exists()
    assert any(t.steps_of(p) == step + 1 for p in ckpts.glob("*.pt") if p.name not in ("vae_final.pt",))

    # 4. --overwrite starts over and keeps every old file, moved aside.
    old = {p.name for p in ckpts.iterdir() if p.is_file()}
    assert t.main([*t.argv(data, run, 1), "--overwrite"]) == exit_codes.OK
    aside = list(run.glob("overwritten-*"))
    assert len(aside) == 1
    kept = {p.name for p in t.ckpt_dir(aside[0]).iterdir() if p.is_file()}
    assert old <= kept and t.bad_name + ".corrupt" in kept
    assert all(t.steps_of(p) == 1 for p in ckpts.glob("*.pt") if p.name not in ("best.pt", "vae_final.pt"))
    assert not (run / "run.lock").exists()  # each in-process run above released it


def test_resume_auto_with_every_checkpoint_damaged_is_exit_2_not_a_fresh_start(data, tmp_path, capsys):
    t = TRAINERS["vocoder"]
    run = tmp_path / "run"
    assert t.main(t.argv(data, run, 1)) == exit_codes.OK
    (only,) = t.ckpt_dir(run).glob("model_*.pt")
    blob = only.read_bytes()
    middle = len(blob) // 2 - 10_000
    only.write_bytes(blob[:middle] + os.urandom(20_000) + blob[middle + 20_000:])
    for _ in range(2):  # the second start finds only the renamed file: still refused
        capsys.readouterr()
        assert t.main([*t.argv(data, run, 2), "--resume", "auto"]) == exit_codes.BAD_INPUT
        err = capsys.readouterr().err
        assert re.search(rf"error: --resume auto: no intact checkpoint in \S+, found (only )?{only.name}", err), err
        assert "--overwrite" in err and not list(t.ckpt_dir(run).glob("model_*.pt"))


# ----------------------------------------------------------------------------- Ctrl-C in a prepare
def _prepare_inputs(name: str, data: dict[str, Path], tmp: Path) -> list[str]:
    """Enough input files that a Ctrl-C after the third file leaves some undone, also with two workers
    (a process pool already holds the next few jobs when the signal comes, and those still run)."""
    if name == "vocoder":  # one worker (the vocoder's pool spawns, so it would not be slowed down)
        return ["--config", str(TINY_YAML), "--set", "val_num=1", "--input", str(data["vocoder"].parent / "wavs"),
                "--num_workers", "0"]
    if name == "tts":
        raw, audio = data["tts"].parent, tmp / "audio"
        lines = []
        for copy in range(3):
            for line in (raw / "metadata.csv").read_text(encoding="utf-8").splitlines():
                stem, text = line.split("|")
                (audio / f"{stem}_{copy}.wav").parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(raw / "audio" / f"{stem}.wav", audio / f"{stem}_{copy}.wav")
                lines.append(f"{stem}_{copy}|{text}")
        (tmp / "metadata.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
        return ["--metadata", str(tmp / "metadata.csv"), "--audio_dir", str(audio), "--speaker_from_path",
                "--set", "data.eval_split_size=1", "--num_workers", "2", "--no_trim"]
    write_images(tmp / "images", 32, size=40)
    return ["--mode", "preprocess", "--input_dir", str(tmp / "images"), "--target_size", "32", "--num_workers", "2"]


# per prepare script: its per-file job (slowed down by tests/slow_run.py), its output flag, the files it writes
PREPARES = {"vocoder": ("vocoder.prepare_data:process_file", "--output", "items/*/*"),
            "tts": ("tts.prepare_data:process_item", "--output_dir", "wavs/*.wav"),
            "vae": ("vae.prepare_data:process_one", "--output_dir", "images/*.png")}


@pytest.mark.parametrize("name", list(PREPARES))
def test_ctrl_c_in_a_prepare_is_one_line_and_exit_130_then_the_same_command_continues(name, data, tmp_path):
    """Ctrl-C (SIGINT to the whole process group, workers included) once some files are done: one line,
    exit 130, no traceback; the same command again keeps every finished file and does the rest."""
    target, out_flag, outputs = PREPARES[name]
    out = tmp_path / "prepared"
    argv = [*_prepare_inputs(name, data, tmp_path), out_flag, str(out)]
    run = _Process([str(REPO / "tests" / "slow_run.py"), "--slow", target, *argv], new_session=True)
    assert run.wait_for(lambda text: text.count(f"calling {target.split(':')[1]}") >= 3, time.time() + 120), run.text
    run.ctrl_c()
    rc, text = run.finish(timeout=60)
    assert rc == exit_codes.INTERRUPTED, text
    assert text.count(exit_codes.INTERRUPTED_LINE) == 1 and "Traceback" not in text, text
    done = {p: p.stat().st_mtime_ns for p in out.glob(outputs)}
    assert done, text

    main = importlib.import_module(target.split(":")[0]).main
    assert main(argv) == exit_codes.OK
    assert all(p.stat().st_mtime_ns == t for p, t in done.items())  # kept, not made again
    assert len(list(out.glob(outputs))) > len(done)


# ----------------------------------------------------------------------------- bad output locations
def _script_cases(tmp: Path) -> dict[str, tuple[Callable[[list[str]], int], list[str]]]:
    from tts import export_onnx, infer_clone, synthesize
    from tts import prepare_data as tts_prepare
    from vae import prepare_data as vae_prepare
    from vae import reconstruct
    from vocoder import export as voc_export
    from vocoder import infer as voc_infer
    from vocoder import prepare_data as voc_prepare

    blocker = tmp / "a_file"
    blocker.write_text("x")
    under = str(blocker / "sub")  # a path under a regular file: cannot be created
    folder = str(tmp)  # an existing folder given as an output *file*
    missing = str(tmp / "missing")
    return {
        "vocoder/train.py": (_vocoder_main, ["--data_dir", missing, "--run_dir", under]),
        "vocoder/train.py /proc": (_vocoder_main, ["--data_dir", missing, "--run_dir", "/proc/no_such_9a/run"]),
        "tts/train.py": (_vits_main, ["--data_dir", missing, "--run_dir", under]),
        "tts/train_main.py": (_clone_main, ["--train-data", missing, "--checkpoint-dir", under]),
        "vae/train_vae.py": (_vae_main, ["--config", str(VAE_TINY), "--data_path", missing, "--output_dir", under]),
        "vae/train_vae.py file as folder": (_vae_main, ["--config", str(VAE_TINY), "--data_path", missing,
                                                        "--output_dir", str(blocker)]),
        "vocoder/prepare_data.py": (voc_prepare.main, ["--input", missing, "--output", under]),
        "vocoder/infer.py": (voc_infer.main, ["--model", missing, "--input", missing, "--output", under]),
        "vocoder/export.py": (voc_export.main, ["--ckpt", missing, "--out", under]),
        "tts/prepare_data.py": (tts_prepare.main, ["--metadata", missing, "--audio_dir", missing, "--output_dir", under]),
        "tts/synthesize.py": (synthesize.main, ["--checkpoint", missing, "--text", "salom", "--out", folder]),
        "tts/infer_clone.py": (infer_clone.main, ["--checkpoint", missing, "--reference", missing, "--text", "salom",
                                                  "--output", under + ".wav"]),
        "tts/export_onnx.py": (export_onnx.main, ["--checkpoint", missing, "--out", under + ".onnx"]),
        "vae/prepare_data.py": (vae_prepare.main, ["--mode", "preprocess", "--input_dir", folder, "--output_dir", under]),
        "vae/prepare_data.py folder": (vae_prepare.main, ["--mode", "validate", "--input_dir", folder,
                                                          "--output_file", folder]),
        "vae/prepare_data.py /dev/full": (vae_prepare.main, ["--mode", "validate", "--input_dir", folder,
                                                             "--output_file", "/dev/full"]),
        "vae/reconstruct.py": (reconstruct.main, ["--checkpoint", missing, "--input", str(blocker), "--output", folder]),
    }


CASES = ["vocoder/train.py", "vocoder/train.py /proc", "tts/train.py", "tts/train_main.py", "vae/train_vae.py",
         "vae/train_vae.py file as folder", "vocoder/prepare_data.py", "vocoder/infer.py", "vocoder/export.py",
         "tts/prepare_data.py", "tts/synthesize.py", "tts/infer_clone.py", "tts/export_onnx.py",
         "vae/prepare_data.py", "vae/prepare_data.py folder", "vae/prepare_data.py /dev/full", "vae/reconstruct.py"]


@pytest.mark.parametrize("case", CASES)
def test_unusable_output_location_is_one_line_and_exit_2(case, tmp_path, capsys):
    if case.endswith("/dev/full") and not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    main, argv = _script_cases(tmp_path)[case]
    assert main(argv) == exit_codes.BAD_INPUT
    out = capsys.readouterr()
    text = (out.out + out.err).strip()
    error_lines = [ln for ln in text.splitlines() if ln.startswith("error:")]
    assert len(error_lines) == 1 and "Traceback" not in text, text
    assert re.search(r"--(run_dir|checkpoint-dir|output_dir|output_file|output|out|out_dir) ", error_lines[0]), text


# ----------------------------------------------------------------------------- full disk during a save
def _enospc_after(n_bytes: int):
    real_save = torch.save

    def save(obj, f, *a, **k):
        f.write(b"\0" * n_bytes)  # some bytes reach the temp file, then the disk is full
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    return real_save, save


def test_disk_full_during_save_keeps_the_old_file_and_removes_the_temp(tmp_path, monkeypatch):
    target = tmp_path / "model_00000002.pt"
    save_atomic({"w": torch.ones(3)}, target)
    _, fake = _enospc_after(100)
    monkeypatch.setattr(torch, "save", fake)
    with pytest.raises(DiskFullError, match=rf"^disk full while writing {re.escape(str(target))}: \d+ MiB free; "
                                            "earlier checkpoints are intact$"):
        save_atomic({"w": torch.zeros(3)}, target)
    monkeypatch.undo()
    assert torch.equal(load_checkpoint(target)["w"], torch.ones(3))
    assert [p.name for p in tmp_path.iterdir()] == [target.name]  # no temp file left


def test_disk_full_in_a_trainer_is_exit_2_with_the_message(data, tmp_path, monkeypatch, capsys):
    t = TRAINERS["vocoder"]
    _, fake = _enospc_after(10)
    monkeypatch.setattr(torch, "save", fake)
    assert t.main(t.argv(data, tmp_path / "run", 1)) == exit_codes.BAD_INPUT
    err = capsys.readouterr().err
    assert re.search(r"error: disk full while writing \S+model_00000001\.pt: \d+ MiB free; earlier checkpoints "
                     r"are intact", err), err
    assert not list((tmp_path / "run" / "checkpoints").glob("*"))


# ----------------------------------------------------------------------------- rotation
def test_rotation_never_deletes_another_runs_checkpoints(tmp_path):
    for step in (1, 2, 3):
        save_atomic({"step": step}, tmp_path / f"model_{step:08d}.pt")  # an earlier run's files
    m = CheckpointManager(tmp_path, keep_last=2)
    for step in (10, 11, 12):
        m.save({"step": step}, step)
    names = sorted(p.name for p in tmp_path.glob("model_*.pt"))
    assert names == [f"model_{s:08d}.pt" for s in (1, 2, 3, 11, 12)]


def test_rotation_of_a_resumed_run_includes_its_earlier_files(tmp_path):
    from common.checkpoint import resolve_resume

    for step in (1, 2, 3):
        save_atomic({"step": step}, tmp_path / f"model_{step:08d}.pt")
    m = CheckpointManager(tmp_path, keep_last=2)
    assert resolve_resume("auto", tmp_path, m) == tmp_path / "model_00000003.pt"
    m.save({"step": 4}, 4)
    assert sorted(p.name for p in tmp_path.glob("model_*.pt")) == ["model_00000003.pt", "model_00000004.pt"]


# ----------------------------------------------------------------------------- launchers
def _bat_forwarded_args(bat_text: str, command_line: str) -> list[str]:
    """Replays the statements of shell/train_rtx5090.bat that build ARGS from the command line
    (`set "ARGS=%*"` and `call set "ARGS=%%ARGS:*%1=%%"`) and returns what the trainer's .bat receives."""
    first = command_line.split()[0]
    env: dict[str, str] = {}
    lines = [ln.strip() for ln in bat_text.splitlines()]
    start = lines.index(":run")
    for ln in lines[start + 1:]:
        if m := re.fullmatch(r'set "(\w+)=%\*"', ln):
            env[m[1]] = command_line
        elif m := re.fullmatch(r'call set "(\w+)=%%(\w+):\*%1=%%"', ln):
            value = env[m[2]]
            cut = value.lower().find(first.lower())
            env[m[1]] = value[cut + len(first):] if cut >= 0 else value
        elif m := re.fullmatch(r'call "%HERE%\\%TRAINER%\\train_rtx5090\.bat" %(\w+)%', ln):
            return shlex.split(env[m[1]])
        elif ln.lower().startswith(("shift", "goto", "if ")):
            raise AssertionError(f"argument handling this test does not replay: {ln}")
    raise AssertionError("no call of the trainer's .bat found")


def test_shell_bat_passes_set_key_value_through_intact():
    bat = (REPO / "shell" / "train_rtx5090.bat").read_text()
    args = ["--data_dir", "my data", "--set", "batch_size=8", "--set", "model_args.resblock_kernel_sizes=[3,7]",
            "--resume", "auto"]
    line = "vocoder " + " ".join(shlex.quote(a) if " " not in a else f'"{a}"' for a in args)
    assert _bat_forwarded_args(bat, line) == args
    for trainer in ("vocoder", "tts", "vae"):
        twin = (REPO / trainer / "train_rtx5090.bat").read_text()
        assert "%*" in twin and "resume_default.bat" in twin and "cd /d" not in twin


@pytest.fixture
def fake_python(tmp_path) -> Path:
    """A stand-in interpreter that records its working folder and arguments."""
    stub = tmp_path / "bin" / "python"
    stub.parent.mkdir()
    stub.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$PWD" "$@" > "$RECORD"\n')
    stub.chmod(0o755)
    return stub


@pytest.mark.parametrize("trainer", ["vocoder", "tts", "vae"])
@pytest.mark.parametrize("extra", [[], ["--overwrite"], ["--resume", "x.pt"]])
def test_launchers_keep_the_users_folder_and_add_resume_auto_one_way(trainer, extra, fake_python, tmp_path):
    record = tmp_path / "argv.txt"
    env = {**os.environ, "PYTHON": str(fake_python), "RECORD": str(record)}
    user_dir = tmp_path / "me"
    user_dir.mkdir()
    subprocess.run(["bash", str(REPO / "shell" / "train_rtx5090.sh"), trainer, "--data_dir", "my_data", *extra],
                   cwd=user_dir, env=env, check=True, timeout=60)
    cwd, *argv = record.read_text().splitlines()
    assert cwd == str(user_dir)  # relative paths such as my_data are read from here
    assert argv[-2 - len(extra):] == ["--data_dir", "my_data", *extra]
    n_auto = sum(1 for a, b in zip(argv, argv[1:]) if (a, b) == ("--resume", "auto"))
    assert n_auto == (0 if extra else 1)
