"""What the four trainers do with a checkpoint that does not fit, and with a full disk while writing
their run files, checked the same way for all four:

- `--resume` after a change of model width: exit 2 with one line (`common.checkpoint.restore_state`'s
  message: what does not fit, and what to do), never a load_state_dict traceback;
- every checkpoint records the trainer that wrote it (`"trainer"`), which readers go by;
- `--init_from` another trainer's checkpoint: exit 2 naming the trainer that made it; a file of this
  trainer whose tensors mostly do not fit (another width): exit 2 with the share that matched
  (`common.checkpoint.MIN_INIT_SHARE`), never "loaded 0 tensors" and a run from scratch;
- the run files besides checkpoints (sample PNGs, metrics.jsonl, summary.json, lr_schedule.png) go
  through `common.atomic_write`: a full disk is one line, exit 2, and no partial file.
"""

from __future__ import annotations

import errno
import re
from pathlib import Path

import pytest
from PIL import Image

from common.checkpoint import MIN_INIT_SHARE
from tests.test_run_contract import TRAINERS, data  # noqa: F401 - module fixture: the four tiny datasets

# one change of model width per trainer (its tiny test model has the other value)
WIDER = {"vocoder": ["--set", "model_args.upsample_initial_channel=16"],
         "vits": ["--set", "model_args.hidden_channels=48"],
         "clone": ["--set", "model.ffn_mult=5"],
         "vae": ["--channels", "8", "16"]}
# --init_from: which other trainer's checkpoint each one is given
FOREIGN = {"vocoder": "vits", "vits": "vocoder", "clone": "vits", "vae": "vocoder"}
MADE_BY = {"vocoder": "a vocoder training checkpoint (vocoder/train.py)", "vits": "a VITS checkpoint (tts/train.py)",
           "clone": "a voice-cloning checkpoint (tts/train_main.py)", "vae": "a VAE checkpoint (vae/train_vae.py)"}


def _one_error(capsys) -> str:
    text = "".join(capsys.readouterr())
    errors = [ln for ln in text.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in text, text[-3000:]
    return errors[0]


@pytest.fixture(scope="module")
def runs(data, tmp_path_factory) -> dict[str, Path]:  # noqa: F811 - the imported fixture
    """One run folder per trainer after one step, with its checkpoint."""
    root = tmp_path_factory.mktemp("checkpoint_contract")
    for name, t in TRAINERS.items():
        assert t.main(t.argv(data, root / name, 1)) == 0, name
    return {name: root / name for name in TRAINERS}


def _checkpoint(name: str, run: Path) -> Path:
    found = sorted(TRAINERS[name].ckpt_dir(run).glob("*.pt"), key=lambda p: p.stat().st_mtime_ns)
    assert found, name
    return found[-1]


@pytest.mark.parametrize("name", list(TRAINERS))
def test_resume_with_another_model_width_is_one_line_exit_2(name, runs, data, capsys):  # noqa: F811
    t = TRAINERS[name]
    capsys.readouterr()
    assert t.main([*t.argv(data, runs[name], 2), *WIDER[name], "--resume", "auto"]) == 2
    error = _one_error(capsys)
    assert re.match(r"error: cannot resume from \S+\.pt: its \w+ weights do not fit this configuration \(", error), error
    assert "differ in shape, e.g. " in error and "--init_from" in error and MADE_BY[name] in error, error


@pytest.mark.parametrize("name", list(TRAINERS))
def test_a_checkpoint_records_the_trainer_that_wrote_it(name, runs):
    """The name readers go by (`common.checkpoint.checkpoint_kind`), not a guess from the file's keys."""
    from common.checkpoint import checkpoint_kind, load_checkpoint

    ckpt = load_checkpoint(_checkpoint(name, runs[name]))
    assert ckpt["trainer"] == name and checkpoint_kind(ckpt) == name


@pytest.mark.parametrize("name", list(TRAINERS))
def test_init_from_another_trainers_checkpoint_is_refused_naming_it(name, runs, data, tmp_path, capsys):  # noqa: F811
    t, other = TRAINERS[name], FOREIGN[name]
    given = _checkpoint(other, runs[other])
    capsys.readouterr()
    assert t.main([*t.argv(data, tmp_path / "run", 1), "--init_from", str(given)]) == 2
    error = _one_error(capsys)
    assert error.startswith(f"error: {given} is {MADE_BY[other]}, not {MADE_BY[name]}: use it with "), error
    assert not list(t.ckpt_dir(tmp_path / "run").glob("*.pt"))  # no run from scratch


@pytest.mark.parametrize("name", ["vocoder", "vits"])
def test_init_from_a_checkpoint_that_mostly_does_not_fit_is_refused(name, runs, data, tmp_path, capsys):  # noqa: F811
    t = TRAINERS[name]
    capsys.readouterr()
    argv = [*t.argv(data, tmp_path / "run", 1), *WIDER[name], "--init_from", str(_checkpoint(name, runs[name]))]
    assert t.main(argv) == 2
    error = _one_error(capsys)
    m = re.search(r"only (\d+) of this model's (\d+) tensors match it by name and shape \((\d+)%; at least "
                  rf"{MIN_INIT_SHARE:.0%} must", error)
    assert m and int(m.group(1)) < MIN_INIT_SHARE * int(m.group(2)), error
    assert MADE_BY[name] in error and "leave out --init_from" in error


# ------------------------------------------------------------------------- run files on a full disk
def _fill_disk_after_some_bytes(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def _partial_png(image, fp, *a, **k) -> None:
    Path(fp).write_bytes(b"\x89PNG" + b"\0" * 60)
    _fill_disk_after_some_bytes()


def _partial_sample_png(image, fp, *a, **k) -> None:
    """PIL's writer fills the disk in a sample picture (it also writes lr_schedule.png, through matplotlib)."""
    if not isinstance(fp, (str, Path)) or ".step_" not in Path(fp).name:  # TensorBoard encodes into memory
        return _real_image_save(image, fp, *a, **k)
    _partial_png(image, fp)


def _partial_append(fd: int, payload: bytes) -> None:
    import os

    os.write(fd, payload[: len(payload) // 2])
    _fill_disk_after_some_bytes()


_real_write_bytes = Path.write_bytes
_real_image_save = Image.Image.save


def _partial_summary(path: Path, payload: bytes):
    if ".summary.json." not in path.name:  # the temp file of summary.json; every other file is written
        return _real_write_bytes(path, payload)
    _real_write_bytes(path, payload[: len(payload) // 2])
    _fill_disk_after_some_bytes()


# case -> (trainer, extra flags, what to patch: (module path, attribute, replacement), the file named)
FULL_DISK = {
    "VAE sample PNG": ("vae", ["--save_samples_freq", "1"], ("PIL.Image", "Image.save", _partial_sample_png),
                       r"samples/step_\d+\.png"),
    "VAE metrics.jsonl": ("vae", ["--val_freq", "1"], ("common.atomic_write", "_write_all", _partial_append),
                          r"metrics\.jsonl"),
    "vocoder summary.json": ("vocoder", [], ("pathlib", "Path.write_bytes", _partial_summary), r"summary\.json"),
    "lr_schedule.png": ("vits", [], ("matplotlib.figure", "Figure.savefig", _partial_png), r"lr_schedule\.png"),
}


@pytest.mark.parametrize("case", list(FULL_DISK))
def test_a_full_disk_while_writing_run_files_is_one_line_exit_2(case, data, tmp_path, monkeypatch, capsys):  # noqa: F811
    import importlib

    name, extra, (module, attribute, replacement), written = FULL_DISK[case]
    owner = importlib.import_module(module)
    *parents, leaf = attribute.split(".")
    for part in parents:
        owner = getattr(owner, part)
    run = tmp_path / "run"
    if case == "VAE metrics.jsonl":
        (run / "metrics.jsonl").parent.mkdir(parents=True)
        (run / "metrics.jsonl").write_text('{"step": 0}\n')  # an earlier line: kept whole
    monkeypatch.setattr(owner, leaf, replacement)
    t = TRAINERS[name]
    assert t.main([*t.argv(data, run, 1), *extra]) == 2
    error = _one_error(capsys)
    assert re.fullmatch(rf"error: disk full while writing {re.escape(str(run))}/{written}: \d+ MiB free", error), error
    target = Path(error.split("writing ", 1)[1].rsplit(": ", 1)[0])
    if case == "VAE metrics.jsonl":
        assert target.read_text() == '{"step": 0}\n'  # cut back: no half line
    else:
        assert not target.exists()
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]
