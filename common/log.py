"""TensorBoard (and W&B / MLflow) logging, the LR-plan plot, figures saved as PNG, and the training
progress bar. Speech pictures (spectrograms, alignments) are in `speech/plots.py`.

Named `log.py`, not `logging.py`, so it never shadows the standard library module.
Only rank 0 logs: build `RunLogger(..., enabled=info.is_main)` and `Progress(..., enabled=...)`
everywhere and call them unconditionally; on other ranks every call is a no-op.

The logs folder follows the run folder's rules: a TensorBoard folder that cannot be written at start (no
permission, a file in its place, a full disk) is one line and exit 2 (`OutputPathError` / `DiskFullError`);
a write that fails later (a full disk: TensorBoard's writer thread reports ENOSPC at the next call) turns
that tracker off with one line, as a W&B or MLflow failure does, and training goes on: the checkpoints say
whether the disk is really full (their own one line, exit 2).
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from tqdm import tqdm

from common.atomic_write import atomic_output, disk_full, is_disk_full, save_png
from common.errors import OutputPathError
from common.schedulers import sample_curve, schedule_preview

if TYPE_CHECKING:  # matplotlib is imported where a figure is drawn: it costs every start-up ~0.5 s
    from matplotlib.figure import Figure

ArrayLike = torch.Tensor | np.ndarray


def _to_numpy(x: ArrayLike) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().float().cpu().numpy()
    return np.asarray(x)


TRACKERS = ("tensorboard", "wandb", "mlflow")  # what `--logger` / the `logger` key accept, in any combination
# What to pip install for each tracker (the hint a missing package gets). MLflow's client alone (mlflow-skinny) writes
# the run folder's SQLite store through SQLAlchemy and sets its tables up with alembic; the full `mlflow` package
# (which also brings `mlflow ui`) pins pyarrow below the version requirements.txt pins, so it goes into a venv of
# its own (README, "Trackers").
TRACKER_PACKAGES = {"wandb": "wandb", "mlflow": "mlflow-skinny sqlalchemy alembic"}
MLFLOW_DB = "mlflow.db"  # the run folder's MLflow store: <run_dir>/logs/mlflow.db (SQLite)
MLFLOW_OLD_STORE = "mlruns"  # the file store run folders had before: a resume keeps using it
CHECKPOINT_KEY = "trackers"  # the checkpoint counter that holds the trackers' run ids (`RunLogger.checkpoint_state`)
STEP_METRIC = "global_step"  # W&B's x axis: every scalar is logged with it (a resume may log steps W&B has seen)


def tracker_names(value: str | list | tuple | None) -> str:
    """The `logger` key / `--logger` in its one spelling: names of TRACKERS, comma-separated, in TRACKERS'
    order ("wandb, tensorboard" -> "tensorboard,wandb"). Anything else raises ValueError naming the key."""
    given = value.split(",") if isinstance(value, str) else list(value or [])
    names = [str(n).strip().lower() for n in given if str(n).strip()]
    unknown = [n for n in names if n not in TRACKERS]
    if unknown or not names:
        raise ValueError(f"logger: {', '.join(map(repr, unknown)) or 'nothing'} is not a tracker; give "
                         f"{', '.join(TRACKERS)} or several, comma-separated (e.g. --logger tensorboard,wandb)")
    return ",".join(n for n in TRACKERS if n in names)


LOGGER_HELP = (f"experiment trackers, comma-separated: {', '.join(TRACKERS)} (default tensorboard; W&B and MLflow "
               "write under <run_dir>/logs/; see common/API.md)")


def add_logger_arg(parser: argparse.ArgumentParser) -> None:
    """`--logger`, every trainer's flag for its `logger` key (checked by `tracker_names` when the config loads)."""
    parser.add_argument("--logger", default=None, metavar="NAMES", help=LOGGER_HELP)


def resumed_trackers(counters: dict | None) -> dict[str, str]:
    """The trackers' run ids a checkpoint's counters hold ({} for a checkpoint written without trackers)."""
    return dict((counters or {}).get(CHECKPOINT_KEY) or {})


class _Wandb:
    """One W&B run under `folder` (`<folder>/wandb/`): offline where WANDB_MODE says so or no API key is found
    (never a login prompt), resumed by id. Scalars carry `STEP_METRIC`, W&B's x axis for all of them, so steps
    that an earlier attempt logged past the checkpoint (W&B keeps history: it cannot drop them) are never
    refused; W&B's own `_step` only counts log calls."""

    name = "wandb"

    def __init__(self, folder: Path, run_id: str | None, run_name: str, project: str, say: Callable) -> None:
        import wandb

        mode = os.environ.get("WANDB_MODE")
        if not mode and not _wandb_key_found():
            mode = "offline"
            say(f"logger: wandb has no API key (wandb login, or WANDB_API_KEY): logging offline under "
                f"{folder / 'wandb'}; `wandb sync` uploads it")
        self.run = wandb.init(dir=str(folder), id=run_id, resume="allow" if run_id else None, mode=mode,
                              project=os.environ.get("WANDB_PROJECT") or project, name=run_name, reinit="finish_previous",
                              settings=wandb.Settings(console="off"))
        self.run.define_metric(STEP_METRIC)
        self.run.define_metric("*", step_metric=STEP_METRIC)
        self.id = self.run.id

    def log(self, values: dict[str, float], step: int) -> None:
        self.run.log({**values, STEP_METRIC: step})

    def params(self, params: dict[str, str | int | float | bool | None], path: Path) -> None:
        """The resolved config as W&B config, by dotted keys (a resume may change a value: the latest wins)."""
        self.run.config.update(params, allow_val_change=True)

    def close(self) -> None:
        self.run.finish()


def _wandb_key_found() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path(os.environ.get("NETRC") or Path.home() / ".netrc")
    try:
        return "wandb" in netrc.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False


class _Mlflow:
    """One MLflow run, resumed by id, in the store `mlflow_store` picks: the run folder's own SQLite file
    (`<folder>/mlflow.db`, artifacts in `<folder>/mlartifacts`), the file store of a run folder written before
    (`<folder>/mlruns`), or the one MLFLOW_TRACKING_URI names. In a run folder's own store a resume first drops
    what an earlier attempt logged after the checkpoint's step (as TensorBoard's `purge_step` does), so each
    metric stays one curve."""

    name = "mlflow"

    def __init__(self, folder: Path, run_id: str | None, run_name: str, project: str, say: Callable,
                 purge_after: int | None) -> None:
        uri, own_store, note = mlflow_store(folder)
        if note:
            say(note)
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(uri)
        run = None
        if run_id:
            try:
                run = self.client.get_run(run_id)
            except Exception:  # noqa: BLE001 (any store's "not found")
                say(f"logger: mlflow run {run_id} of the checkpoint is not in {uri}: starting a new run")
        if run is None:
            name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or project
            exp = self.client.get_experiment_by_name(name)
            artifacts = (folder / "mlartifacts").resolve().as_uri() if own_store and uri.startswith("sqlite") else None
            exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(name, artifacts)
            run = self.client.create_run(exp_id, run_name=run_name)
        else:
            self.client.update_run(run.info.run_id, status="RUNNING")
            if own_store and purge_after is not None:
                if uri.startswith("sqlite"):
                    _purge_sqlite_metrics(folder / MLFLOW_DB, run.info.run_id, purge_after)
                else:
                    _purge_metrics(folder / MLFLOW_OLD_STORE, run.info.experiment_id, run.info.run_id, purge_after)
        self.id = run.info.run_id

    def log(self, values: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        ms = int(time.time() * 1000)
        self.client.log_batch(self.id, metrics=[Metric(k, v, ms, step) for k, v in values.items()])

    def params(self, params: dict[str, str | int | float | bool | None], path: Path) -> None:
        """The resolved config as MLflow params (dotted keys, in batches of MLflow's 100), and config.yaml as an
        artifact. MLflow never changes a logged param, so a resume logs only the keys the run has not seen: a
        setting a resume changed (a longer plan) keeps its first attempt's value in the params, and config.yaml
        (the artifact, replaced by each attempt) holds the latest."""
        from mlflow.entities import Param

        logged = self.client.get_run(self.id).data.params
        items = [Param(k, _param_text(v)) for k, v in params.items() if k not in logged and len(k) <= MLFLOW_KEY_CHARS]
        for i in range(0, len(items), MLFLOW_PARAMS_PER_BATCH):
            self.client.log_batch(self.id, params=items[i:i + MLFLOW_PARAMS_PER_BATCH])
        self.client.log_artifact(self.id, str(path))

    def close(self) -> None:
        self.client.set_terminated(self.id)


# MLflow's limits (mlflow.utils.validation): a param value holds at most 6000 characters, a key 250, and one
# log_batch call at most 100 params
MLFLOW_VALUE_CHARS, MLFLOW_KEY_CHARS, MLFLOW_PARAMS_PER_BATCH = 6000, 250, 100


def _param_text(value: object) -> str:
    """A param's value as MLflow stores it (a string), cut to its limit with "..." where longer."""
    text = str(value)
    return text if len(text) <= MLFLOW_VALUE_CHARS else text[:MLFLOW_VALUE_CHARS - 3] + "..."


def mlflow_store(folder: Path) -> tuple[str, bool, str | None]:
    """(tracking URI, whether it is the run folder's own store, a line to say or None) for a run whose logs
    folder is `folder`.

    - MLFLOW_TRACKING_URI set: that store, the user's choice. A file store there (a path or file://) is one that
      MLflow 3 refuses unless MLFLOW_ALLOW_FILE_STORE=true; it was asked for by name, so that is set (where the
      user left it unset) and one line says so.
    - a run folder that already holds the file store (`mlruns/`, written before the SQLite store): it is kept,
      so a resumed run continues its own MLflow run (MLFLOW_ALLOW_FILE_STORE set for it, as above).
    - otherwise the run folder's SQLite file, `sqlite:///<folder>/mlflow.db`: what `mlflow ui
      --backend-store-uri` opens, MLflow's own default store."""
    uri = os.environ.get("MLFLOW_TRACKING_URI", "").strip()
    if uri:
        scheme = uri.split(":", 1)[0].lower() if ":" in uri else ""
        if len(scheme) <= 1 or scheme == "file":  # a path (a drive letter on Windows) or file://
            if os.environ.get("MLFLOW_ALLOW_FILE_STORE") is None:
                os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
                return uri, False, (f"logger: mlflow logs to the file store MLFLOW_TRACKING_URI names ({uri}), which "
                                    "MLflow 3 deprecates (MLFLOW_ALLOW_FILE_STORE=true set for it); a sqlite:/// URI "
                                    "is MLflow's own store")
        return uri, False, None
    old = folder / MLFLOW_OLD_STORE
    if old.is_dir():
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        return old.resolve().as_uri(), True, None
    for module in ("sqlalchemy", "alembic"):  # else MLflow says only that "sqlite" is an unsupported scheme
        if importlib.util.find_spec(module) is None:
            raise ModuleNotFoundError(f"No module named '{module}'", name=module)
    folder.mkdir(parents=True, exist_ok=True)
    return "sqlite:///" + (folder / MLFLOW_DB).resolve().as_posix(), True, None


def _purge_sqlite_metrics(db: Path, run_id: str, after: int) -> None:
    """Drop the points of step > `after` from the run's metrics in the run folder's SQLite store, and set each
    metric's latest value (what MLflow's run list shows) back to its newest remaining point. SQL on MLflow's
    tables `metrics` and `latest_metrics` (its schema since MLflow 1.x), as MLflow has no call that deletes points."""
    import sqlite3

    con = sqlite3.connect(db)
    try:
        with con:
            gone = con.execute("DELETE FROM metrics WHERE run_uuid = ? AND step > ?", (run_id, after)).rowcount
            if gone:
                con.execute("DELETE FROM latest_metrics WHERE run_uuid = ?", (run_id,))
                con.execute(
                    "INSERT OR REPLACE INTO latest_metrics (key, value, timestamp, step, is_nan, run_uuid) "
                    "SELECT key, value, timestamp, step, is_nan, run_uuid FROM metrics m WHERE run_uuid = ? AND NOT "
                    "EXISTS (SELECT 1 FROM metrics n WHERE n.run_uuid = m.run_uuid AND n.key = m.key AND (n.step > "
                    "m.step OR (n.step = m.step AND (n.timestamp > m.timestamp OR (n.timestamp = m.timestamp AND "
                    "n.value > m.value)))))", (run_id,))
    finally:
        con.close()


def _purge_metrics(root: Path, experiment_id: str, run_id: str, after: int) -> None:
    """Drop the points of step > `after` from a file store's metric files (lines "<time> <value> <step>")."""
    for f in (root / experiment_id / run_id / "metrics").rglob("*"):
        if f.is_file():
            lines = f.read_text(encoding="utf-8").splitlines()
            kept = [line for line in lines if len(line.split()) < 3 or int(line.split()[2]) <= after]
            if len(kept) != len(lines):
                f.write_text("".join(line + "\n" for line in kept), encoding="utf-8")


def flat_params(config: Path) -> dict[str, str | int | float | bool | None]:
    """The resolved config (the run folder's config.yaml) as hyperparameters by dotted keys
    (`model_args.upsample_initial_channel`): what W&B's config and MLflow's params hold, so runs can be compared
    and filtered by any key. Lists stay one value; an empty section is one key holding {}."""
    import yaml

    out: dict[str, str | int | float | bool | None] = {}

    def walk(value: object, key: str) -> None:
        if isinstance(value, dict) and value:
            for k, v in value.items():
                walk(v, f"{key}.{k}" if key else str(k))
        elif key:
            out[key] = value if isinstance(value, str | int | float | bool | None) else str(value)

    walk(yaml.safe_load(config.read_text(encoding="utf-8")) or {}, "")
    return out


class RunLogger:
    """A thin wrapper over `SummaryWriter` that accepts tensors and does nothing when disabled; with `trackers`
    it also sends every scalar to W&B and/or MLflow (images, audio, figures and text: TensorBoard only)."""

    def __init__(self, log_dir: str | Path, enabled: bool = True, purge_step: int | None = None,
                 trackers: str = "tensorboard", resume: dict[str, str] | None = None, project: str = "runs",
                 say: Callable[[str], object] = print):
        """`purge_step`: a resumed run's step. TensorBoard then drops what an earlier attempt logged from
        that step on (a resume from an older checkpoint would otherwise draw two overlapping curves).
        `trackers`: `tracker_names` spelling. `resume`: the run ids a checkpoint holds (`resumed_trackers`), so a
        resumed run continues the same W&B / MLflow run. `project`: the W&B project / MLflow experiment (the
        trainer's name; WANDB_PROJECT / MLFLOW_EXPERIMENT_NAME override it); the run is named after the run
        folder. A tracker whose package is missing or that fails to start is one `say` line; the run goes on,
        with TensorBoard at least."""
        self.enabled = enabled
        self.writer = None
        self.trackers: list = []
        self.ids = dict(resume or {})  # kept for trackers not used now: a later resume with them continues
        self._config_sent = False
        self._say = say
        self.notices: list[str] = []  # the trackers that did not start: `fit` repeats them as start-up's last lines
        self.log_dir = log_dir = Path(log_dir)
        if not enabled:
            return
        names = tracker_names(trackers).split(",")
        for name in names[1 if names[0] == "tensorboard" else 0:]:
            self._start(name, log_dir, project, purge_step, say)
        if "tensorboard" in names or not self.trackers:
            self.writer = _tensorboard_writer(log_dir, purge_step)

    def _tb(self, write: Callable) -> None:
        """`write(writer)` on TensorBoard's writer; an OSError (a full disk, a folder made unwritable) turns
        TensorBoard off with one line and the run goes on (the next checkpoint says whether the disk is full)."""
        if self.writer is None:
            return
        try:
            write(self.writer)
        except OSError as exc:
            writer, self.writer = self.writer, None
            self._say(f"logger: tensorboard failed ({_first_line(exc)}); it logs nothing more in this run")
            try:
                writer.close()
            except Exception:  # noqa: BLE001 (its file is already broken: nothing more to save)
                pass

    def _start(self, name: str, log_dir: Path, project: str, purge_step: int | None, say: Callable) -> None:
        run_name, run_id = log_dir.resolve().parent.name, self.ids.get(name)
        try:
            if name == "wandb":
                tracker = _Wandb(log_dir, run_id, run_name, project, say)
            else:
                tracker = _Mlflow(log_dir, run_id, run_name, project, say, purge_step)
        except ImportError as exc:
            module = (exc.name or name).split(".")[0]
            what = "is not installed" if module == name else f"needs {module}, which is not installed"
            self.notices.append(f"logger: {name} {what} ({exc}): pip install {TRACKER_PACKAGES[name]}; "
                                "training goes on with TensorBoard")
            say(self.notices[-1])
            return
        except Exception as exc:  # noqa: BLE001 (a tracker must never stop a run)
            self.notices.append(f"logger: {name} did not start ({_first_line(exc)}); training goes on with TensorBoard")
            say(self.notices[-1])
            return
        self.trackers.append(tracker)
        self.ids[name] = tracker.id

    def checkpoint_state(self) -> dict:
        """What a checkpoint's counters keep so that `--resume` continues the same tracker runs
        ({CHECKPOINT_KEY: {tracker: run id}}, or {} when no tracker has a run)."""
        return {CHECKPOINT_KEY: dict(self.ids)} if self.ids else {}

    def _track(self, values: dict[str, float], step: int) -> None:
        """Scalars to each tracker; one that fails is one line and is dropped (the run goes on)."""
        if not self._config_sent:
            self._config_sent = True
            config = self.log_dir.parent / "config.yaml"  # the run folder's (written before the first step)
            params = flat_params(config) if config.is_file() else None
            for t in self.trackers if params is not None else ():
                self._guard(t, t.params, params, config)
        for t in list(self.trackers):
            self._guard(t, t.log, values, int(step))

    def _guard(self, tracker, fn: Callable, *args) -> None:
        try:
            fn(*args)
        except Exception as exc:  # noqa: BLE001 (a tracker must never stop a run)
            self._say(f"logger: {tracker.name} failed ({_first_line(exc)}); it logs nothing more in this run")
            self.trackers.remove(tracker)

    def scalar(self, tag: str, value: float | torch.Tensor, step: int) -> None:
        self._tb(lambda w: w.add_scalar(tag, float(value), step))
        if self.trackers:
            self._track({tag: float(value)}, step)

    def scalars(self, values: dict, step: int, prefix: str = "") -> None:
        """Log a dict of numbers; all tensors are moved to the host in one transfer (one sync)."""
        if self.writer is None and not self.trackers:
            return
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        floats = {k: v for k, v in values.items() if not isinstance(v, torch.Tensor)}
        tensors = {k: v for k, v in values.items() if isinstance(v, torch.Tensor)}
        if tensors:
            stacked = torch.stack([t.detach().float().reshape(()).to(next(iter(tensors.values())).device)
                                   for t in tensors.values()])
            floats.update(zip(tensors, stacked.cpu().tolist()))
        if self.writer is not None:
            self._tb(lambda w: [w.add_scalar(prefix + k, float(v), step) for k, v in floats.items()])
        if self.trackers:
            self._track({prefix + k: float(v) for k, v in floats.items()}, step)

    def audio(self, tag: str, wav: ArrayLike, sr: int, step: int) -> None:
        """A mono clip; samples are clipped to [-1, 1] (TensorBoard would wrap around otherwise)."""
        if self.writer is not None:
            x = np.clip(_to_numpy(wav).astype(np.float32).reshape(-1), -1.0, 1.0)
            self._tb(lambda w: w.add_audio(tag, torch.from_numpy(x), step, sample_rate=int(sr)))

    def image(self, tag: str, img: ArrayLike, step: int) -> None:
        """CHW float in [0, 1] (clamped), HWC (or CHW) uint8, or a 2-D grayscale HW array."""
        if self.writer is None:
            return
        x = _to_numpy(img) if not (isinstance(img, torch.Tensor) and img.dtype == torch.uint8) \
            else img.cpu().numpy()
        if x.ndim == 2:
            fmt = "HW"
        elif x.ndim == 3 and x.dtype == np.uint8:
            fmt = "CHW" if x.shape[0] in (1, 3, 4) and x.shape[-1] not in (1, 3, 4) else "HWC"
        elif x.ndim == 3:
            fmt = "CHW"
        else:
            raise ValueError(f"RunLogger.image('{tag}'): expected CHW float or HWC uint8, got shape {x.shape}")
        if x.dtype != np.uint8:
            x = np.clip(x.astype(np.float32), 0.0, 1.0)
        self._tb(lambda w: w.add_image(tag, x, step, dataformats=fmt))

    def figure(self, tag: str, fig: Figure, step: int) -> None:
        """Render a matplotlib figure as an image and close it (always, so figures never pile up)."""
        if self.writer is not None:
            rgb = _rgb(fig)
            self._tb(lambda w: w.add_image(tag, rgb, step, dataformats="HWC"))
        _close(fig)

    def text(self, tag: str, text: str, step: int = 0) -> None:
        self._tb(lambda w: w.add_text(tag, text, step))

    def flush(self) -> None:
        self._tb(lambda w: w.flush())

    def close(self) -> None:
        self._tb(lambda w: w.close())
        self.writer = None
        for t in list(self.trackers):
            self._guard(t, t.close)
        self.trackers = []

    def __enter__(self) -> RunLogger:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _tensorboard_writer(log_dir: Path, purge_step: int | None):
    """TensorBoard's `SummaryWriter` on `log_dir`; a folder it cannot write is one line (exit 2), as every output
    location of a run is (a full disk: `DiskFullError`)."""
    from torch.utils.tensorboard import SummaryWriter  # import only where it is used

    _quiet_tensorboard_thread_errors()
    try:
        return SummaryWriter(log_dir=str(log_dir), purge_step=purge_step or None)
    except OSError as exc:
        if is_disk_full(exc):
            raise disk_full(log_dir / "events.out.tfevents.*", "; nothing was trained yet") from None
        raise OutputPathError(f"the logs folder {log_dir} cannot be written ({_first_line(exc)}); make it a writable "
                              "folder (or move aside what is in its place), or choose another run folder") from None


def _quiet_tensorboard_thread_errors() -> None:
    """TensorBoard writes its events in a thread of its own, which keeps a write error (a full disk) for the next
    call and re-raises it, so Python would also print that thread's traceback; `RunLogger._tb` says it in one
    line at that next call. Installed once; every other thread's exception is reported as before."""
    previous = threading.excepthook
    if getattr(previous, "quiet_tensorboard", False):
        return

    def hook(args: threading.ExceptHookArgs) -> None:
        if type(args.thread).__name__ == "_AsyncWriterThread" and isinstance(args.exc_value, OSError):
            return
        previous(args)

    hook.quiet_tensorboard = True
    threading.excepthook = hook


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


def new_figure(**kwargs) -> Figure:
    """A matplotlib `Figure(**kwargs)` on its own Agg canvas: no pyplot, no display, no global figure list."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(**kwargs)
    FigureCanvasAgg(fig)
    return fig


def _rgb(fig: Figure) -> np.ndarray:
    """The figure drawn on an Agg canvas, as HWC uint8 RGB."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3]


def _close(fig: Figure) -> None:
    """Close a figure pyplot knows about; figures made with `Figure()` need nothing."""
    if getattr(fig.canvas, "manager", None) is not None and "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close(fig)


# ----------------------------------------------------------------------------- plots (speech ones: speech/plots.py)
# Built with `Figure` + the Agg canvas directly, never pyplot: no display, no global figure list.


def plot_lr_schedule(curves: dict[str, Callable[[int], float]], total_steps: int, title: str = "") -> Figure:
    """Each named `step -> lr` curve over the whole plan of `total_steps` updates (a log y axis when
    the curves span more than two decades and never touch 0, so such a decay stays readable)."""
    fig = new_figure(figsize=(6, 3), dpi=100)
    ax = fig.add_subplot()
    lo, hi = float("inf"), 0.0
    for name, fn in curves.items():
        steps, lrs = sample_curve(fn, total_steps)
        lo, hi = min(lo, min(lrs)), max(hi, max(lrs))
        ax.plot(steps, lrs, label=name)
    if lo > 0 and hi / lo > 100:
        ax.set_yscale("log")
    ax.set_xlabel("optimizer update")
    ax.set_ylabel("learning rate")
    ax.set_xlim(0, max(1, total_steps - 1))
    if len(curves) > 1:
        ax.legend()
    if title:
        ax.set_title(title)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


def report_lr_plan(curves: dict[str, Callable[[int], float]], total_steps: int, keys: str,
                   run_dir: str | Path | None, logger: RunLogger | None = None, say: Callable[[str], object] = print,
                   title: str = "") -> list[str]:
    """Start-of-run view of the whole LR plan: prints each curve's `schedule_preview` lines (with the
    warning naming `keys` when the lr collapses before half the plan), writes `lr_schedule.png` into
    `run_dir` and the same figure to TensorBoard (`lr_schedule`). Call it on rank 0 only."""
    groups: dict[tuple[float, ...], list[str]] = {}  # identical curves (G and D alike) share one line
    first: dict[tuple[float, ...], Callable[[int], float]] = {}
    for name, fn in curves.items():
        key = tuple(sample_curve(fn, total_steps)[1])
        groups.setdefault(key, []).append(name)
        first.setdefault(key, fn)
    lines = [line for key, names in groups.items()
             for line in schedule_preview(first[key], total_steps, keys, " = ".join(names))]
    for line in lines:
        say(line)
    fig = plot_lr_schedule(curves, total_steps, title)
    if run_dir is not None:
        with atomic_output(Path(run_dir) / "lr_schedule.png") as tmp:
            fig.savefig(tmp, format="png")
    if logger is not None:
        logger.figure("lr_schedule", fig, 0)
        logger.text("lr_schedule", "\n\n".join(lines), 0)
    return lines


def save_figure(fig: Figure, path: str | Path, colors: int = 64) -> Path:
    """Write a figure as a palette PNG (creating the folder) and close it; returns the path.
    `colors` palette entries: a spectrogram figure drops from ~80 KB (RGB) to a few tens of KB,
    small enough to commit under docs/, with no visible loss at 64 colours."""
    from PIL import Image  # import only where it is used

    save_png(Image.fromarray(_rgb(fig)).quantize(colors=colors), path, optimize=True)
    _close(fig)
    return Path(path)


# ----------------------------------------------------------------------------- progress


def peak_memory_gib(device: torch.device | None = None) -> float:
    """Peak CUDA memory allocated on a CUDA `device` (allocator statistics, no device sync), else the
    process's peak RSS, in GiB (the progress bar and a trainer's memory scalar)."""
    if device is not None and device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1024**3
    return peak_rss_gib()


def peak_rss_gib() -> float:
    """This process's peak resident memory in GiB: `resource` where it exists (Linux, macOS), else psutil's
    peak working set (Windows has no `resource` module), else 0.0 (nothing to read it with)."""
    try:
        import resource
    except ImportError:
        try:
            import psutil
        except ImportError:
            return 0.0
        info = psutil.Process().memory_info()
        return getattr(info, "peak_wset", info.rss) / 1024**3
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return rss / (1024**3 if sys.platform == "darwin" else 1024**2)  # macOS reports bytes


def _memory_text() -> str:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return f"{peak_memory_gib(torch.device('cuda')):.1f}G"
    return f"{peak_memory_gib():.1f}G rss"


def _fmt(v) -> str:
    if isinstance(v, torch.Tensor):  # a CUDA tensor here costs a sync: pass floats you already have
        v = v.item()
    if isinstance(v, bool) or isinstance(v, int | np.integer):
        return str(v)
    if isinstance(v, float | np.floating):
        return f"{v:.3g}" if v != 0 else "0"
    return str(v)


class Progress:
    """A tqdm bar for the training loop: it/s and ETA (tqdm's), samples/s, memory, data wait.

    `update(step, data_s, step_s, samples=None, **metrics)`: `step` is the global step after this update,
    `data_s` the seconds spent waiting for the batch and `step_s` the seconds of compute. `samples`: what
    this step held, where batches vary (a frame budget makes long utterances a smaller batch): samples/s
    is then the window's samples over its busy seconds, not the step rate times `samples_per_step`.
    The data-wait fraction sum(data_s) / sum(data_s + step_s) over the last `window` updates
    says whether the GPU is starved by the DataLoader (more workers / prefetch help) or not.
    Nothing here synchronises the GPU; measure `step_s` where you already sync (or accept
    that without a sync it measures launch time).
    """

    def __init__(self, total_steps: int, initial: int = 0, samples_per_step: int = 1,
                 enabled: bool = True, desc: str = "train", window: int = 50):
        self.samples_per_step = samples_per_step
        self._times: collections.deque[tuple[float, float]] = collections.deque(maxlen=window)
        self._samples: collections.deque[int | None] = collections.deque(maxlen=window)
        # A terminal redraws every second; a log file or pipe gets one line per 30 s, not 30 lines
        # (TQDM_MININTERVAL, tqdm's own variable, sets another interval).
        mininterval = float(os.environ.get("TQDM_MININTERVAL", 1.0 if sys.stderr.isatty() else 30.0))
        self.bar = (tqdm(total=total_steps, initial=initial, desc=desc, dynamic_ncols=True,
                         mininterval=mininterval, smoothing=0.1, file=sys.stderr) if enabled else None)

    @property
    def data_wait_fraction(self) -> float:
        data = sum(d for d, _ in self._times)
        total = data + sum(s for _, s in self._times)
        return data / total if total > 0 else 0.0

    def samples_per_second(self) -> float | None:
        """tqdm's smoothed step rate times samples per step (None before the rate is known); with every
        step's count reported, the window's samples over its busy seconds."""
        if self._samples and None not in self._samples:
            busy = sum(d + s for d, s in self._times)
            return sum(self._samples) / busy if busy > 0 else None
        rate = self.bar.format_dict.get("rate") if self.bar is not None else None
        if rate is None and self._times:
            busy = sum(d + s for d, s in self._times)
            rate = len(self._times) / busy if busy > 0 else None
        return rate * self.samples_per_step if rate else None

    def update(self, step: int, data_s: float = 0.0, step_s: float = 0.0, samples: int | None = None,
               **metrics) -> None:
        self._times.append((float(data_s), float(step_s)))
        self._samples.append(samples)
        if self.bar is None:
            return
        parts = [f"{k}={_fmt(v)}" for k, v in metrics.items()]
        sps = self.samples_per_second()
        if sps is not None:
            parts.append(f"{sps:.3g} samples/s")
        parts.append(f"mem={_memory_text()}")
        parts.append(f"data_wait={self.data_wait_fraction:.0%}")
        self.bar.set_postfix_str(" ".join(parts), refresh=False)
        self.bar.update(step - self.bar.n)

    def write(self, msg: str) -> None:
        """Print a line without breaking the bar (nothing when disabled, like every other call)."""
        if self.bar is not None:
            self.bar.write(msg)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class Printer:
    """Every trainer's `log` function: one line to stdout on rank 0 alone (`enabled`), through the
    progress bar while one is up (`bar`: the line does not glue to it), or to `sink` when one is given
    (tests and benchmarks pass a list's append or a silent function)."""

    def __init__(self, enabled: bool = True, sink: Callable[..., None] | None = None) -> None:
        self.enabled, self.sink = enabled, sink
        self.bar: Progress | None = None

    def __call__(self, msg: object = "", *args, **kwargs) -> None:
        if not self.enabled:
            return
        if self.sink is not None:
            self.sink(msg)
        elif self.bar is not None and self.bar.bar is not None:
            self.bar.write(str(msg))
        else:
            print(msg, flush=True)
