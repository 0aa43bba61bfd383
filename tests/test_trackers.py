"""`--logger tensorboard,wandb,mlflow` (common.log.RunLogger) through real resumed runs of the trainers, offline.

Each trainer trains a few steps with `--logger tensorboard,wandb,mlflow`, then `--resume auto` trains more;
the trackers' own files are read back: the W&B offline run files (`<run>/logs/wandb/offline-run-*/*.wandb`,
W&B's record log of protobuf records) and the run folder's MLflow store (`<run>/logs/mlflow.db`, opened with
MLflow's own `MlflowClient("sqlite:///…")`, as `mlflow ui --backend-store-uri` opens it). Asserted: one run id
in each tracker, the same one the checkpoint keeps, before and after the resume; every metric's steps strictly
increasing (no duplicates, no overlap) and continuing past the first run's steps; the resolved config as
hyperparameters by dotted keys (W&B config, MLflow params). A run folder with the file store of before
(`logs/mlruns`) keeps it on resume; a user's MLFLOW_TRACKING_URI is used.
A tracker whose package is missing is one line and the run goes on with TensorBoard; an unknown tracker
name is exit 2 with one line naming the key and the accepted values. Nothing here touches the network:
WANDB_MODE=offline, HOME/WANDB_DIR in tmp, MLFLOW_TRACKING_URI unset (the run folder's store)."""

from __future__ import annotations

import builtins
import importlib.util
import json
import re
import sqlite3
import struct
from pathlib import Path

import pytest

from common import exit_codes
from common.checkpoint import load_checkpoint
from common.log import MLFLOW_DB, RunLogger, flat_params, resumed_trackers, tracker_names
from tests import test_run_contract as contract

# Found, not imported, at collection: importing mlflow, wandb, sqlalchemy and alembic costs each test worker ~4 s
# whether or not it runs these tests. The run folder's MLflow store is SQLite (sqlalchemy, alembic: requirements-test.txt).
pytestmark = pytest.mark.skipif(
    missing := [m for m in ("wandb", "mlflow", "sqlalchemy", "alembic") if importlib.util.find_spec(m) is None],
    reason=f"not installed: {', '.join(missing)} (requirements-test.txt)")

ALL = "tensorboard,wandb,mlflow"


@pytest.fixture(autouse=True)
def offline(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    for k, v in {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "HOME": str(home), "WANDB_DIR": str(home),
                 "WANDB_CONFIG_DIR": str(home), "WANDB_CACHE_DIR": str(home), "WANDB_DATA_DIR": str(home)}.items():
        monkeypatch.setenv(k, v)
    for k in ("MLFLOW_TRACKING_URI", "WANDB_API_KEY", "WANDB_PROJECT", "MLFLOW_EXPERIMENT_NAME", "WANDB_BASE_URL",
              "MLFLOW_ALLOW_FILE_STORE"):
        monkeypatch.setenv(k, "")  # recorded, so that what a test (or RunLogger) sets is undone after it
        monkeypatch.delenv(k)


@pytest.fixture(scope="module", autouse=True)
def mlflow_tables(tmp_path_factory):
    """MLflow sets up a new SQLite store by running its ~70 schema migrations (seconds each time on a small CPU):
    the first store of this module is set up by MLflow for real, and every later one gets a copy of its tables
    (MLflow then checks their schema version, as for any store it opens)."""
    import sqlalchemy
    from mlflow.store.db import utils

    template = tmp_path_factory.mktemp("mlflow") / "template.db"
    engine = sqlalchemy.create_engine(f"sqlite:///{template}")
    utils._initialize_tables(engine)
    engine.dispose()

    def copy_tables(engine) -> None:
        with sqlite3.connect(template) as src, sqlite3.connect(engine.url.database) as dst:
            src.backup(dst)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(utils, "_initialize_tables", copy_tables)
        yield


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


def wandb_history(run_dir: Path, config: dict | None = None) -> tuple[set[str], dict[str, list[int]]]:
    """(run ids, metric -> global_step of each point) over every offline run folder, oldest first; `config`
    gets the run's config (its updates, in order)."""
    ids, steps = set(), {}
    files = sorted((run_dir / "logs" / "wandb").glob("offline-run-*/*.wandb"))
    assert files, f"no W&B offline run under {run_dir / 'logs' / 'wandb'}"
    for f in files:
        for rec in wandb_records(f):
            kind = rec.WhichOneof("record_type")
            if kind == "run":
                ids.add(rec.run.run_id)
            elif kind == "config" and config is not None:
                config.update({i.key: json.loads(i.value_json) for i in rec.config.update})
            elif kind == "history":
                row = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in rec.history.item}
                for k in row:
                    if not k.startswith("_") and k != "global_step":
                        steps.setdefault(k, []).append(int(row["global_step"]))
    return ids, steps


def mlflow_store_uri(run_dir: Path) -> str:
    """The run folder's MLflow store as `mlflow ui --backend-store-uri` takes it (the file store of before,
    where the run folder has one)."""
    old = run_dir / "logs" / "mlruns"
    return old.resolve().as_uri() if old.is_dir() else f"sqlite:///{(run_dir / 'logs' / MLFLOW_DB).resolve().as_posix()}"


def mlflow_runs(run_dir: Path) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_store_uri(run_dir))
    return [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]


def mlflow_history(run_dir: Path) -> tuple[set[str], dict[str, list[int]]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_store_uri(run_dir))
    runs = mlflow_runs(run_dir)
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
    # the closing line, the same in every trainer and the last it prints: steps, why it ended, wall time, latest
    # and best checkpoints
    closing = re.fullmatch(rf"done at step {total} of {total} in [^;]+; latest checkpoint (\S+); best (.+)",
                           out.out.strip().splitlines()[-1])
    assert closing, out.out[-2000:]
    assert Path(closing[1]).is_file() and trainer.steps_of(Path(closing[1])) == total
    best = closing[2].split(" (")[0]
    assert best == "none yet" or Path(best).name == "best.pt" and Path(best).is_file(), closing[0]
    assert not [line for line in (out.out + out.err).splitlines()  # every tracker started
                if line.startswith(("logger: wandb ", "logger: mlflow "))]

    w_config: dict = {}
    w_ids, w_steps = wandb_history(run, w_config)
    assert w_ids == {ids["wandb"]}
    assert len(list((run / "logs" / "wandb").glob("offline-run-*"))) == 2  # one folder per attempt, one id
    check_one_curve(w_steps, first, total, "W&B")
    m_ids, m_steps = mlflow_history(run)
    assert m_ids == {ids["mlflow"]}
    check_one_curve(m_steps, first, total, "MLflow")
    assert set(m_steps) == set(w_steps)  # the same tags in both (and in TensorBoard: same calls)
    config = flat_params(run / "config.yaml")  # both trackers' hyperparameters, by dotted keys (the VAE's is flat)
    assert config and set(config) <= set(w_config), sorted(set(config) - set(w_config))[:5]
    assert all(w_config[k] == v for k, v in config.items())  # W&B: the latest attempt's values
    assert set(mlflow_runs(run)[0].data.params) == set(config)  # MLflow: the first attempt's (params never change)
    assert (run / "logs" / MLFLOW_DB).is_file() and not (run / "logs" / "mlruns").exists()
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


@pytest.mark.parametrize("store", ["sqlite", "file store of before"])
def test_mlflow_resume_from_an_older_checkpoint_drops_the_later_points(tmp_path, store):
    """As TensorBoard's purge_step: what an attempt logged after the checkpoint it is resumed from goes. A run folder
    that already has the file store (written before the SQLite store) keeps using it, so its run continues."""
    from mlflow.tracking import MlflowClient

    if store != "sqlite":
        (tmp_path / "logs" / "mlruns").mkdir(parents=True)
    (tmp_path / "config.yaml").write_text("lr: 0.1\nmodel_args:\n  channels: [8, 16]\n  name: tiny\n")
    log = RunLogger(tmp_path / "logs", trackers="mlflow", project="t", say=pytest.fail)
    for s in range(1, 9):
        log.scalar("train/loss", float(s), s)
    state = log.checkpoint_state()
    log.close()
    log = RunLogger(tmp_path / "logs", trackers="mlflow", resume=resumed_trackers(state), purge_step=4, project="t",
                    say=pytest.fail)
    for s in range(5, 7):
        log.scalar("train/loss", -float(s), s)
    log.close()
    ids, steps = mlflow_history(tmp_path)
    assert ids == {state["trackers"]["mlflow"]} and steps == {"train/loss": [1, 2, 3, 4, 5, 6]}
    assert (tmp_path / "logs" / MLFLOW_DB).is_file() == (store == "sqlite")
    # as `mlflow ui --backend-store-uri <uri>` reads it: the run, its params by dotted keys, its latest metric
    client = MlflowClient(tracking_uri=mlflow_store_uri(tmp_path))
    run = client.get_run(state["trackers"]["mlflow"])
    assert run.data.params == {"lr": "0.1", "model_args.channels": "[8, 16]", "model_args.name": "tiny"}
    assert run.data.metrics == {"train/loss": -6.0} and run.info.status == "FINISHED"
    assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["config.yaml"]
    assert not (tmp_path / "mlruns").exists()  # nothing beside the run folder (MLflow's default is ./mlruns)


def test_mlflow_tracking_uri_of_a_file_store_is_used_with_one_line(tmp_path, monkeypatch):
    """MLflow 3 refuses a file store unless MLFLOW_ALLOW_FILE_STORE=true; a user who names one gets it."""
    from mlflow.tracking import MlflowClient

    uri = (tmp_path / "elsewhere").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    lines = []
    log = RunLogger(tmp_path / "logs", trackers="mlflow", project="t", say=lines.append)
    log.scalar("train/loss", 1.0, 1)
    log.close()
    assert len(lines) == 1 and lines[0].startswith(f"logger: mlflow logs to the file store MLFLOW_TRACKING_URI names "
                                                   f"({uri})"), lines
    runs = MlflowClient(tracking_uri=uri).search_runs([MlflowClient(tracking_uri=uri).get_experiment_by_name("t")
                                                       .experiment_id])
    assert [r.info.run_id for r in runs] == [log.ids["mlflow"]] and not (tmp_path / "logs" / MLFLOW_DB).exists()


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
