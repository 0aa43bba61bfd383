"""Every numeric config field declares its allowed values once (common.ranges), and a value outside
them ends the run at load with exit 2 and one line naming the key and the range, never mid-run
with a traceback. The sweep sets every int/float field of every trainer schema to 0, -1 and a
string; the command-line cases are the ones that used to crash or run wrongly."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import types
import typing
from pathlib import Path

import pytest
import yaml

from common.config import ConfigError, load_config
from common.ranges import Length, Range
from tts.clone.config import CloneConfig
from tts.vits.config import TrainConfig, VitsArgs
from vae.config import VAEConfig
from vocoder.config import VocoderConfig

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = {  # name: (schema, a config it loads, the prefix of its keys on the command line)
    "vocoder": (VocoderConfig, ROOT / "vocoder/configs/demo.yaml", ""),
    "vits": (TrainConfig, ROOT / "tts/vits/configs/demo.yaml", ""),
    "vits model_args": (VitsArgs, ROOT / "tts/vits/configs/demo.yaml", "model_args."),
    "cloning": (CloneConfig, ROOT / "tts/clone/configs/clone_demo.yaml", ""),
    "vae": (VAEConfig, ROOT / "vae/configs/demo.yaml", ""),
}
TOP = {VitsArgs: TrainConfig}  # a schema built inside another one's field


def _numeric(tp: typing.Any, depth: int = 0) -> tuple[typing.Any, int] | None:
    """The int/float part of a field type (through Optional, unions with a Literal and lists) and
    how many lists deep it sits; None for a field that holds no number."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        base = typing.get_args(tp)[0]
        return (tp, depth) if base in (int, float) else _numeric(base, depth)
    if origin in (typing.Union, types.UnionType):
        found = [n for a in typing.get_args(tp) if (n := _numeric(a, depth))]
        return found[0] if found else None
    if origin is list:
        return _numeric(typing.get_args(tp)[0], depth + 1)
    return (tp, depth) if tp in (int, float) else None


def numeric_fields(schema: type, prefix: str = "") -> list[tuple[str, typing.Any, int, tuple]]:
    """(dotted key, number type, list depth, the field's own Annotated rules) of every numeric leaf."""
    out = []
    hints = typing.get_type_hints(schema, include_extras=True)
    for f in dataclasses.fields(schema):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            out += numeric_fields(tp, f"{prefix}{f.name}.")
        elif found := _numeric(tp):
            outer = tp.__metadata__ if typing.get_origin(tp) is typing.Annotated else ()
            out.append((prefix + f.name, *found, outer))
    return out


def _range(tp: typing.Any) -> Range | None:
    if typing.get_origin(tp) is not typing.Annotated:
        return None
    return next((r for r in tp.__metadata__ if isinstance(r, Range)), None)


def _load(name: str, key: str, value: typing.Any):
    schema, _, prefix = SCHEMAS[name]
    text = yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("\n...").strip()
    return load_config(None, TOP.get(schema, schema), [f"{prefix}{key}={text}"])  # over the defaults: no YAML


@pytest.mark.parametrize("name", SCHEMAS)
def test_every_numeric_field_declares_its_range(name: str) -> None:
    """An int or float field without a Range is unchecked by accident: AnyInt/AnyFloat say it on purpose."""
    fields = numeric_fields(SCHEMAS[name][0])
    assert len(fields) >= 15
    undeclared = [key for key, tp, _, _ in fields if _range(tp) is None]
    assert not undeclared, f"{name}: numeric fields with no declared range: {undeclared}"


@pytest.mark.parametrize("name", SCHEMAS)
def test_sweep_zero_minus_one_and_wrong_type(name: str) -> None:
    """0, -1 and a string into every numeric field: refused at load naming the key (and the range) when
    the declared range excludes them; when it admits them the config loads, or a rule between two
    fields refuses it, also as a ConfigError. Nothing else escapes: that would be a traceback."""
    refused = admitted = 0
    for key, tp, depth, outer in numeric_fields(SCHEMAS[name][0]):
        rng = _range(tp)
        for bad in (0, -1, "abc"):
            value = bad
            for _ in range(depth):
                value = [value] * next((r.n for r in outer if isinstance(r, Length)), 1)
            out_of_range = isinstance(bad, str) or not rng.admits(bad)
            try:
                _load(name, key, value)
            except ConfigError as exc:
                message = str(exc)
                if out_of_range:
                    assert f"{SCHEMAS[name][2]}{key}" in message, (key, bad, message)
                    if not isinstance(bad, str):
                        assert rng.words() in message, (key, bad, message)
                refused += 1
                continue
            assert not out_of_range, f"{name}: {key}={value!r} loaded although its range is {rng.words()}"
            admitted += 1
    assert refused > admitted > 0


def test_range_words_and_bounds() -> None:
    assert Range(min=1).words() == ">= 1"
    assert Range(0, 1, max_open=True).words() == ">= 0 and < 1"
    assert Range(min=0, min_open=True).admits(1e-9) and not Range(min=0, min_open=True).admits(0.0)
    assert not Range().admits(float("nan")) and not Range().admits(float("inf")) and Range().admits(-5)


def test_range_message_names_the_flag_the_user_typed(tmp_path: Path) -> None:
    """A flag's value is checked like a --set's, and the message names that flag."""
    with pytest.raises(ConfigError, match=r"train\.batch_size \(--batch-size\): 0 is out of range; it must be >= 1"):
        load_config(SCHEMAS["cloning"][1], CloneConfig, extra={"train.batch_size": 0},
                    extra_sources={"train.batch_size": "--batch-size"})


def _vocoder(tmp: Path, setting: str) -> list[str]:
    return ["--config", str(SCHEMAS["vocoder"][1]), "--data_dir", str(tmp / "data"), "--run_dir",
            str(tmp / "run"), "--set", setting]


def _vits(tmp: Path, setting: str) -> list[str]:
    return ["--config", str(SCHEMAS["vits"][1]), "--data_dir", str(tmp / "data"), "--run_dir",
            str(tmp / "run"), "--set", setting]


def _cloning(tmp: Path, setting: str) -> list[str]:
    return ["--config", str(SCHEMAS["cloning"][1]), "--train-data", str(tmp / "data"), "--checkpoint-dir",
            str(tmp / "run"), "--set", setting]


def _vae(tmp: Path, setting: str) -> list[str]:
    return ["--config", str(SCHEMAS["vae"][1]), "--run_dir", str(tmp / "run"), "--set", setting]


CLI_CASES = [  # the values that crashed mid-run or were silently changed, and where they are caught
    ("vits", "lr=-1", "lr"), ("vits", "save_n_checkpoints=0", "save_n_checkpoints"),
    ("vits", "save_step=-1", "save_step"), ("vits", "print_step=0", "print_step"),
    ("vits", "max_steps=-5", "max_steps"), ("vits", "model_args.segment_frames=0", "model_args.segment_frames"),
    ("vits", "betas=[0.8]", "betas"), ("vits", "batch_size=0", "batch_size"),
    ("vocoder", "generator_optimizer_args.lr=-1", "generator_optimizer_args.lr"),
    ("vocoder", "save_n_checkpoints=0", "save_n_checkpoints"), ("vocoder", "pl_trainer_precision=fp8", "fp8"),
    ("cloning", "train.save_n_checkpoints=0", "train.save_n_checkpoints"),
    ("cloning", "audio.n_mels=0", "audio.n_mels"), ("cloning", "data.num_buckets=0", "data.num_buckets"),
    ("vae", "save_n_checkpoints=0", "save_n_checkpoints"), ("vae", "learning_rate=-1", "learning_rate"),
]


@pytest.mark.parametrize("trainer,setting,named", CLI_CASES)
def test_bad_values_exit_2_before_any_work(trainer: str, setting: str, named: str, tmp_path: Path,
                                           capsys: pytest.CaptureFixture) -> None:
    """Through each trainer's real `main`: exit 2, one `error:` line naming the key, nothing written."""
    if trainer == "vocoder":
        from vocoder.train import main
        argv = _vocoder(tmp_path, setting)
    elif trainer == "vits":
        from tts.vits.train import main
        argv = _vits(tmp_path, setting)
    elif trainer == "cloning":
        from tts.clone.train import main
        argv = _cloning(tmp_path, setting)
    else:
        from vae.train_vae import main
        argv = _vae(tmp_path, setting)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and named in err[0], err
    assert not (tmp_path / "run").exists()


def test_a_real_process_gets_one_line_and_no_traceback(tmp_path: Path) -> None:
    """print_step=0 used to be a ZeroDivisionError at the first step."""
    proc = subprocess.run([sys.executable, str(ROOT / "tts/train.py"), *_vits(tmp_path, "print_step=0")],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "log_every (--set print_step=0): 0 is out of range; it must be >= 1" in proc.stderr
