"""`--logger tensorboard,wandb,mlflow` (common.log.RunLogger) through real resumed runs of the trainers, offline.

Each trainer trains a few steps with `--logger tensorboard,wandb,mlflow`, then `--resume auto` trains more;
the trackers' own files are read back: the W&B offline run files (`<run>/logs/wandb/offline-run-*/*.wandb`,
W&B's record log of protobuf records) and the MLflow file store (`MlflowClient(...).get_metric_history`).
Asserted: one run id in each tracker, the same one the checkpoint keeps, before and after the resume; every
metric's steps strictly increasing (no duplicates, no overlap) and continuing past the first run's steps.
A tracker whose package is missing is one line and the run goes on with TensorBoard; an unknown tracker
name is exit 2 with one line naming the key and the accepted values. Nothing here touches the network:
WANDB_MODE=offline, HOME/WANDB_DIR in tmp, MLFLOW_TRACKING_URI unset (the run folder's file store)."""

from __future__ import annotations

import builtins
import json
import struct
from pathlib import Path

import pytest

from common import exit_codes
from common.checkpoint import load_checkpoint
from common.log import RunLogger, resumed_trackers, tracker_names
from tests import test_run_contract as contract

pytest.importorskip("wandb")
pytest.importorskip("mlflow")

ALL = "tensorboard,wandb,mlflow"


@pytest.fixture(autouse=True)
def offline(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    for k, v in {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "HOME": str(home), "WANDB_DIR": str(home),
                 "WANDB_CONFIG_DIR": str(home), "WANDB_CACHE_DIR": str(home), "WANDB_DATA_DIR": str(home)}.items():
        monkeypatch.setenv(k, v)
    for k in ("MLFLOW_TRACKING_URI", "WANDB_API_KEY", "WANDB_PROJECT", "MLFLOW_EXPERIMENT_NAME", "WANDB_BASE_URL"):
        monkeypatch.delenv(k, raising=False)


# ----------------------------------------------------------------------------- reading the trackers back
def wandb_records(path: Path) -> list:
    """The protobuf records of a W&B run file: ':W&B' + 3 header bytes, then 32 KiB blocks of chunks, each
    `<crc:u32><length:u16><type:u8>` + data (type 1 full, 2 first, 3 middle, 4 last)."""
    from wandb.proto import wandb_internal_pb2 as pb

    raw = path.read_bytes()
    assert raw[:4] == b":W&B", path
    pos, buf, out = 7, b"", []
    while pos + 7 <= len(raw):
        left = 32768 - pos % 32768
        if left < 7:
            pos += left
            continue
        _, n, kind = struct.unpack("<IHB", raw[pos:pos + 7])
        pos += 7
        if kind == 0 and n == 0:  # zero padding to the block's end
            pos += left - 7
            continue
        buf += raw[pos:pos + n]
        pos += n
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(buf)
            out.append(rec)
            buf = b""
    return out


def wandb_history(run_dir: Path) -> tuple[set[str], dict[str, list[int]]]:
    """(run ids, metric -> global_step of each point) over every offline run folder, oldest first."""
    ids, steps = set(), {}
    files = sorted((run_dir / "logs" / "wandb").glob("offline-run-*/*.wandb"))
    assert files, f"no W&B offline run under {run_dir / 'logs' / 'wandb'}"
    for f in files:
        for rec in wandb_records(f):
            kind = rec.WhichOneof("record_type")
            if kind == "run":
                ids.add(rec.run.run_id)
            elif kind == "history":
                row = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in rec.history.item}
                for k in row:
                    if not k.startswith("_") and k != "global_step":
                        steps.setdefault(k, []).append(int(row["global_step"]))
    return ids, steps


def mlflow_history(run_dir: Path) -> tuple[set[str], dict[str, list[int]]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient((run_dir / "logs" / "mlruns").resolve().as_uri())
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    steps = {}
    for r in runs:
        for key in r.data.metrics:
            steps[key] = [m.step for m in sorted(client.get_metric_history(r.info.run_id, key),
                                                  key=lambda m: (m.timestamp, m.step))]
    return {r.info.run_id for r in runs}, steps


def check_one_curve(steps: dict[str, list[int]], first_end: int, end: int, what: str) -> None:
    assert steps, f"{what}: no metric"
    for key, s in steps.items():
        assert s == sorted(set(s)), f"{what} {key}: steps not strictly increasing: {s}"
    logged = sorted({x for s in steps.values() for x in s})
    assert logged[0] <= first_end < logged[-1] <= end, f"{what}: steps {logged} (resumed after {first_end})"


# ----------------------------------------------------------------------------- the trainers, resumed
TRAINERS = contract.TRAINERS  # the four trainers' tiny CLIs
data = contract.data  # their data (a module fixture)
STEPS = {"vocoder": (3, 5), "vits": (2, 4), "clone": (2, 4), "vae": (2, 4)}


def _ckpt_ids(trainer, run: Path) -> dict:
    ckpts = [p for p in trainer.ckpt_dir(run).glob("*.pt") if p.name not in ("best.pt", "vae_final.pt")]
    newest = max(ckpts, key=trainer.steps_of)
    return resumed_trackers(load_checkpoint(newest)["counters"])


@pytest.mark.parametrize("name", list(STEPS))
def test_a_resumed_run_continues_the_same_tracker_runs(name, data, tmp_path, capsys):
    trainer = TRAINERS[name]
    first, total = STEPS[name]
    run = tmp_path / "run"
    assert trainer.main([*trainer.argv(data, run, first), "--logger", ALL]) == 0
    ids = _ckpt_ids(trainer, run)
    assert set(ids) == {"wandb", "mlflow"}, ids
    assert trainer.main([*trainer.argv(data, run, total), "--logger", ALL, "--resume", "auto"]) == 0
    assert _ckpt_ids(trainer, run) == ids
    out = capsys.readouterr()
    assert not [line for line in (out.out + out.err).splitlines()  # every tracker started
                if line.startswith(("logger: wandb ", "logger: mlflow "))]

    w_ids, w_steps = wandb_history(run)
    assert w_ids == {ids["wandb"]}
    assert len(list((run / "logs" / "wandb").glob("offline-run-*"))) == 2  # one folder per attempt, one id
    check_one_curve(w_steps, first, total, "W&B")
    m_ids, m_steps = mlflow_history(run)
    assert m_ids == {ids["mlflow"]}
    check_one_curve(m_steps, first, total, "MLflow")
    assert set(m_steps) == set(w_steps)  # the same tags in both (and in TensorBoard: same calls)
    assert list((run / "logs").glob("events.out.tfevents.*"))


def test_a_missing_tracker_package_is_one_line_and_tensorboard_goes_on(data, tmp_path, capsys, monkeypatch):
    real_import = builtins.__import__

    def no_wandb(name, *args, **kwargs):
        if name == "wandb" or name.startswith("wandb."):
            raise ImportError(f"No module named '{name}'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_wandb)
    trainer = TRAINERS["vocoder"]
    run = tmp_path / "run"
    assert trainer.main([*trainer.argv(data, run, 2), "--logger", "wandb"]) == 0
    out = capsys.readouterr().out.splitlines()
    lines = [line for line in out if line.startswith("logger: wandb ")]
    assert lines == ["logger: wandb is not installed (No module named 'wandb'): pip install wandb; "
                     "training goes on with TensorBoard"]
    # said again as start-up's last line, after the config and the sizes, where a user still reads
    note = out.index("NOTE " + lines[0])
    assert note > max(i for i, line in enumerate(out) if line.startswith("run dir: "))
    assert list((run / "logs").glob("events.out.tfevents.*"))
    assert not (run / "logs" / "wandb").exists()
    assert _ckpt_ids(trainer, run) == {}


@pytest.mark.parametrize("name", list(STEPS))
def test_an_unknown_tracker_is_exit_2_naming_the_key(name, data, tmp_path, capsys):
    trainer = TRAINERS[name]
    assert trainer.main([*trainer.argv(data, tmp_path / "run", 1), "--logger", "tensorboard,neptune"]) \
        == exit_codes.BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "logger" in err[0] and "'neptune'" in err[0], err
    assert "tensorboard, wandb, mlflow" in err[0]
    assert not list((tmp_path / "run").rglob("*.pt"))


def test_tracker_names_one_spelling():
    assert tracker_names("wandb, TensorBoard") == "tensorboard,wandb"
    assert tracker_names(["mlflow", "wandb", "mlflow"]) == "wandb,mlflow"
    for bad in ("", "tb", "wandb,comet"):
        with pytest.raises(ValueError, match="logger"):
            tracker_names(bad)


def test_mlflow_resume_from_an_older_checkpoint_drops_the_later_points(tmp_path):
    """As TensorBoard's purge_step: what an attempt logged after the checkpoint it is resumed from goes."""
    log = RunLogger(tmp_path / "logs", trackers="mlflow", project="t")
    for s in range(1, 9):
        log.scalar("train/loss", float(s), s)
    state = log.checkpoint_state()
    log.close()
    log = RunLogger(tmp_path / "logs", trackers="mlflow", resume=resumed_trackers(state), purge_step=4, project="t")
    for s in range(5, 7):
        log.scalar("train/loss", -float(s), s)
    log.close()
    ids, steps = mlflow_history(tmp_path)
    assert ids == {state["trackers"]["mlflow"]} and steps == {"train/loss": [1, 2, 3, 4, 5, 6]}


def test_disabled_logger_starts_no_tracker(tmp_path):
    log = RunLogger(tmp_path / "logs", enabled=False, trackers=ALL, resume={"wandb": "abc"})
    log.scalars({"a": 1.0}, 1)
    assert log.trackers == [] and not (tmp_path / "logs").exists()
    log.close()


def test_a_tracker_that_fails_to_start_is_one_line_and_tensorboard_goes_on(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "nosuchscheme://nowhere")  # no store for this scheme: no network
    lines = []
    log = RunLogger(tmp_path / "logs", trackers="mlflow", say=lines.append)
    log.scalar("train/loss", 1.0, 1)
    log.close()
    assert len(lines) == 1 and lines[0].startswith("logger: mlflow did not start (") \
        and lines[0].endswith("training goes on with TensorBoard"), lines
    assert log.checkpoint_state() == {} and list((tmp_path / "logs").glob("events.out.tfevents.*"))
