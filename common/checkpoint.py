"""Checkpoints that never lose a run: atomic writes, rotation, best-by-metric, exact resume.

Why these rules:
- atomic: a crash or a full disk mid-write must leave the previous checkpoint intact, so we write
  a temp file in the same folder and `os.replace` it (atomic on one filesystem).
- intact: a checkpoint's bytes can change on disk after it was written (a failing disk, a bad copy);
  `torch.load` does not notice, so every load and every `--resume auto` candidate is checked against
  the CRC-32 that torch's zip writer stores for each record, and a damaged file is never used.
- weights_only: a checkpoint is data, never code; `torch.load(weights_only=True)` refuses pickled
  objects, and we turn that refusal into a message a user understands.
- exact resume: models, EMA, every optimizer/scheduler, the GradScaler, counters, the data
  position and every rank's RNG are saved, so N steps straight == N/2 + resume + N/2, bitwise.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import stat
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from torch import nn

from common import distributed
from common.atomic_write import FileInUseError, atomic_output, remove, replace, write_text
from common.config import config_to_dict
from common.distributed import unwrap as _unwrap
from common.errors import ConfigError, UserError
from common.guards import saving_blocked
from common.log import resumed_trackers
from common.training import apply_optimizer_overrides, optimizer_overrides

T = TypeVar("T")


class CheckpointError(UserError, RuntimeError):
    """A checkpoint that cannot be used, with the reason and what to do."""


# ---------------------------------------------------------------------------------------------
# Atomic save / safe load
# ---------------------------------------------------------------------------------------------
def save_atomic(obj: Any, path: str | Path, note: str = "; earlier checkpoints are intact") -> Path:
    """`torch.save` through `common.atomic_write.atomic_output` (temp file beside `path`, fsync, rename):
    a crash or a full disk mid-write leaves the previous file intact; a full disk is DiskFullError
    (one line ending in `note`, exit 2)."""
    with atomic_output(path, fsync=True, note=note) as tmp:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
    return Path(path)


def second_name(saved: Path, path: Path, state: dict) -> Path:
    """`path` (best.pt) as a hard link to the checkpoint just `saved`: the same bytes without writing a
    GB again (rotation unlinking `saved` leaves `path` whole); a full `save_atomic` of `state` where
    the filesystem has no hard links."""
    try:
        with atomic_output(path) as tmp:
            tmp.unlink()
            os.link(saved, tmp)
    except OSError:  # no hard links here (a full disk is DiskFullError, not caught)
        save_atomic(state, path)
    return path


def inflating_records(archive: zipfile.ZipFile, file_size: int) -> str | None:
    """Why a zip's index (read alone, no record is) says reading it would take more memory than the file
    holds, or None. `torch.save` stores every record uncompressed, so a record's size is the bytes it
    occupies in the file; `torch.load` allocates each record's declared size before reading it. A
    compressed record (a 2 MB deflate stream inflates to GBs), a record declaring more bytes than it
    stores, or records declaring more bytes in all than the file has (records overlapping) are refused
    before anything is read: a file torch.save wrote never looks like that."""
    infos = archive.infolist()
    declared = sum(info.file_size for info in infos)
    packed = [info for info in infos if info.compress_type != zipfile.ZIP_STORED]
    if packed:
        return (f"not a file torch.save wrote: {len(packed)} of its {len(infos)} zip records are compressed (e.g. "
                f"{packed[0].filename}, zip method {packed[0].compress_type}) and would inflate to {_mib(declared)} "
                f"from a {_mib(file_size)} file, while torch.save stores records uncompressed; refused before "
                "inflating them")
    short = next((info for info in infos if info.file_size != info.compress_size), None)
    if short is not None:
        return (f"not a file torch.save wrote: its zip record {short.filename} declares {_mib(short.file_size)} "
                f"but stores {_mib(short.compress_size)}; refused before reading it")
    if declared > file_size:
        return (f"not a file torch.save wrote: its zip records declare {_mib(declared)} in all, more than the "
                f"{_mib(file_size)} file holds (records overlap); refused before reading them")
    return None


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n} bytes"


def damage(path: str | Path) -> str | None:
    """Why the bytes of a zip-format checkpoint (torch.save's format since 1.6) are not the bytes that
    were written, or None when every record matches its stored CRC-32. Reads the whole file (about
    1 s per GB), after `inflating_records` has read the zip's index alone. A file that is not a zip
    (truncated before its index, or torch's legacy format) gets None here: `torch.load` judges it."""
    try:
        if not zipfile.is_zipfile(path):
            return None
        with zipfile.ZipFile(path) as archive:
            inflated = inflating_records(archive, os.path.getsize(path))
            if inflated is not None:  # before testzip, which would inflate them
                return inflated
            bad = archive.testzip()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError) as exc:
        return f"damaged: its zip records do not read back ({type(exc).__name__}: {str(exc)[:120]})"
    if bad is not None:
        return f"damaged: record {bad} fails its CRC-32 check (its bytes changed after it was written)"
    return None


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu",
                    plain_data: tuple[type, ...] = ()) -> dict:
    """A checkpoint, read weights-only (tensors and plain data; pickled code is refused with one clear
    message). `plain_data`: further classes the file may hold that build no code when read (e.g.
    `pathlib.PosixPath` in the hyper-parameters of older Lightning checkpoints)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(missing_checkpoint(path))
    problem = damage(path)
    if problem is not None:
        raise CheckpointError(f"{path}: {problem}; use another checkpoint (an earlier one of the run, or a fresh copy)")
    try:
        with torch.serialization.safe_globals(list(plain_data)):
            obj = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - every failure becomes one clear message
        text = str(exc)
        if "Weights only load failed" in text or "weights_only" in text or "Unsupported global" in text:
            raise CheckpointError(
                f"{path}: refused to load: the file contains pickled code or objects, not only tensors "
                "and plain data. Checkpoints are loaded with weights_only=True for safety; re-save it "
                "as a plain state_dict from a trusted environment."
            ) from None
        raise CheckpointError(f"{path}: not a readable PyTorch checkpoint ({type(exc).__name__}: {text[:120]}); a file "
                              "cut short (an interrupted copy or download) reads like this: fetch it again, or use "
                              "another checkpoint") from None
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path}: expected a dict checkpoint, got {type(obj).__name__}")
    problem = diverged(obj)
    if problem is not None:
        raise CheckpointError(f"{path}: its weights are not a trained model ({problem}): the run had diverged when "
                              "it was saved; use an earlier checkpoint of the run")
    return obj


# A stored weight or buffer beyond this is a diverged run, not a model: the largest |value| in the demo runs'
# checkpoints of every trainer is 7.4 (a mel mean kept as a buffer; weights stay below 3), a diverged
# run (learning rate 1e30) stores values near 1e29, and such weights crash inference (durations, lengths,
# spectrograms overflow) instead of saying what is wrong.
MAX_WEIGHT = 1e8


def diverged(ckpt: dict) -> str | None:
    """Why the weights of a checkpoint in our layout ("models", "ema") are not a usable model, or None:
    a non-finite value, or one beyond `MAX_WEIGHT`. Other layouts (published checkpoints) pass."""
    stack = [(group, ckpt.get(group)) for group in ("models", "ema")]
    while stack:
        name, obj = stack.pop()
        if isinstance(obj, dict):
            stack.extend((f"{name}.{k}", v) for k, v in obj.items())
        elif isinstance(obj, torch.Tensor) and obj.is_floating_point() and obj.numel():
            lo, hi = (float(v) for v in torch.aminmax(obj))  # one pass, no copy; a NaN comes out as NaN
            largest = max(-lo, hi)
            if not math.isfinite(lo + hi):
                return f"{name} has non-finite values"
            if largest > MAX_WEIGHT:
                return f"{name} holds values up to {largest:.3g}"
    return None


# ---------------------------------------------------------------------------------------------
# Which trainer wrote a checkpoint: for messages when a file is given to the wrong script
# ---------------------------------------------------------------------------------------------
TRAINER_FIELD = "trainer"  # the name of the trainer that wrote a checkpoint (`make_state(trainer=...)`)


def checkpoint_kind(ckpt: dict) -> str | None:
    """Which kind of file `ckpt` is: the trainer it records (`TRAINER_FIELD`); for a file that records none
    (written before checkpoints recorded it, an export, a published release) the kind a trainer recognises
    it as (`common.trainers.recognise`: each trainer's own guess from its layouts); None when none does."""
    name = ckpt.get(TRAINER_FIELD)
    if isinstance(name, str) and name:
        return name
    from common.trainers import recognise

    return recognise(ckpt)


def describe_kind(kind: str) -> tuple[str, str]:
    """(what a file of `kind` is, the scripts that take it), as its trainer declares them; a kind no
    trainer here declares (a newer trainer's file) is named as it is recorded."""
    from common.trainers import file_kinds

    return file_kinds().get(kind) or (f"a checkpoint of the '{kind}' trainer",
                                      f"the scripts of the '{kind}' trainer")


def _made_by_note(ckpt: dict) -> str:
    """'; the file is <what made it>' for a file a trainer of this repo made, else ''."""
    kind = checkpoint_kind(ckpt)
    return f"; the file is {describe_kind(kind)[0]}" if kind else ""


def refuse_other_kind(path: str | Path, ckpt: dict, *accepted: str) -> None:
    """CheckpointError when `ckpt` is another kind of file than the `accepted` ones (a trainer's name or
    another kind it declares; the first one is named in the message): the message says which trainer made
    it and which scripts use it, instead of a config or shape error deep inside the loader. A file no
    trainer made or recognises is left to the caller's own layout checks."""
    kind = checkpoint_kind(ckpt)
    if kind is not None and kind not in accepted:
        what, use = describe_kind(kind)
        raise CheckpointError(f"{path} is {what}, not {describe_kind(accepted[0])[0]}: use it with {use}")


def saved_config(path: str | Path, ckpt: dict, build: Callable[[dict], T]) -> T:
    """The typed config a checkpoint was trained with: `build(ckpt["config"])`. A saved config that is not a
    mapping, or that the schema refuses, is one CheckpointError naming the file (a damaged or hand-edited
    file), not an AttributeError or a message that blames a command-line flag the user never gave."""
    saved = ckpt.get("config", {})
    if not isinstance(saved, dict):
        raise CheckpointError(f"{path}: its saved config is a {type(saved).__name__}, not a mapping of config keys: "
                              "the file is damaged or was edited; use another checkpoint of the run")
    try:
        return build(saved)
    except ConfigError as e:
        raise CheckpointError(f"{path}: its saved config does not load ({e}); the file is damaged or was edited, "
                              "or a newer version of this code wrote it") from None


# ---------------------------------------------------------------------------------------------
# RNG state of python / numpy / torch / cuda
# ---------------------------------------------------------------------------------------------
def capture_rng() -> dict:
    np_state = np.random.get_state()
    state = {
        "python": random.getstate(),
        # numpy arrays are not allowed by weights_only loading, so store the key as a tensor.
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict) -> None:
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    kind, keys, *rest = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), *rest))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ---------------------------------------------------------------------------------------------
# The one checkpoint layout
# ---------------------------------------------------------------------------------------------
def make_state(
    models: dict[str, nn.Module],
    optimizers: dict[str, torch.optim.Optimizer] | None = None,
    schedulers: dict[str, Any] | None = None,
    scaler: torch.amp.GradScaler | None = None,
    ema: dict[str, Any] | None = None,
    counters: dict[str, Any] | None = None,
    config: dict | None = None,
    extra: dict | None = None,
    trainer: str | None = None,
) -> dict:
    """Call on every rank (it gathers each rank's RNG), then save on the main rank. `trainer`: the name of
    the trainer that writes it (its `TrainerInfo.name`), stored as given in `TRAINER_FIELD` so that a
    reader can tell which trainer wrote the file (`checkpoint_kind`)."""
    rng_all = distributed.gather_objects(capture_rng())
    state = {
        **({TRAINER_FIELD: trainer} if trainer else {}),
        "models": {k: _unwrap(m).state_dict() for k, m in models.items()},
        "optimizers": {k: o.state_dict() for k, o in (optimizers or {}).items()},
        "schedulers": {k: s.state_dict() for k, s in (schedulers or {}).items()},
        "scaler": scaler.state_dict() if scaler is not None else None,
        "ema": {k: e.state_dict() for k, e in (ema or {}).items()},
        "counters": dict(counters or {}),
        "rng": {str(rank): s for rank, s in enumerate(rng_all)},
        "config": config or {},
    }
    if extra:
        state["extra"] = extra
    return state


# How an optimizer runs (torch's fused or foreach kernels, `fused` keys) is this run's choice, not the checkpoint's
KERNEL_KEYS = ("fused", "foreach")


def this_runs_kernels(optimizer: torch.optim.Optimizer, saved: dict) -> dict:
    """`saved` (an optimizer's state dict) with each param group's kernel flags set to `optimizer`'s: torch's
    `load_state_dict` puts the saved groups back whole, so a `fused` key changed on resume changed nothing
    (and the step counts are placed for the kernel that runs now: on the device for fused)."""
    groups = saved.get("param_groups") if isinstance(saved, dict) else None
    if not isinstance(groups, list) or len(groups) != len(optimizer.param_groups):
        return saved  # load_state_dict says what does not fit
    return {**saved, "param_groups": [{**g, **{k: now[k] for k in KERNEL_KEYS if k in now}} if isinstance(g, dict)
                                      else g for g, now in zip(groups, optimizer.param_groups)]}


def restore_state(
    ckpt: dict,
    models: dict[str, nn.Module],
    optimizers: dict[str, torch.optim.Optimizer] | None = None,
    schedulers: dict[str, Any] | None = None,
    scaler: torch.amp.GradScaler | None = None,
    ema: dict[str, Any] | None = None,
    rank: int = 0,
    source: str | Path = "the checkpoint",
) -> dict:
    """Restores everything given plus this rank's RNG; returns the counters. A checkpoint that does not
    fit (another model width, another optimizer layout, another trainer's file) is CheckpointError
    (exit 2) naming `source` and what differs, the same message for every trainer."""
    found = ckpt.get("models", {})
    for name, model in models.items():
        if name not in found:
            raise CheckpointError(f"cannot resume from {source}: it has no weights for '{name}' (has: {list(found)})"
                                  f"{_made_by_note(ckpt)}")
        try:
            _unwrap(model).load_state_dict(found[name])
        except RuntimeError:
            detail = fit_summary(_unwrap(model).state_dict(), found[name])
            raise does_not_fit(source, f"its {name} weights do not fit", detail, ckpt) from None
    for group, kind, objs in (("optimizers", "optimizer", optimizers), ("schedulers", "scheduler", schedulers),
                              ("ema", "EMA", ema)):
        for name, obj in (objs or {}).items():
            if name not in ckpt.get(group, {}):
                raise CheckpointError(f"cannot resume from {source}: it has no {kind} state for '{name}'; "
                                      "start a new run from its weights with --init_from")
            saved = ckpt[group][name]
            try:
                obj.load_state_dict(this_runs_kernels(obj, saved) if kind == "optimizer" else saved)
            except (RuntimeError, ValueError, KeyError, TypeError) as exc:
                raise does_not_fit(source, f"its {kind} state for '{name}' does not fit",
                                   str(exc).strip().splitlines()[0][:300], ckpt) from None
    if scaler is not None and ckpt.get("scaler"):
        scaler.load_state_dict(ckpt["scaler"])
    rng = ckpt.get("rng", {})
    if str(rank) in rng:
        restore_rng(rng[str(rank)])
    elif rng:
        # More ranks now than when saved: derive a distinct but deterministic state per rank.
        restore_rng(rng["0"])
        torch.manual_seed(torch.initial_seed() + rank)
    return dict(ckpt.get("counters", {}))


# ---------------------------------------------------------------------------------------------
# Rotation + best
# ---------------------------------------------------------------------------------------------
def read_best_record(path: Path, log: Callable[[str], object] = print) -> dict:
    """The record `best.json` keeps ({"metric": float, "step": int, "mode": ...}), or {} when there is none.

    Why never a traceback: best.json is a few bytes beside the checkpoints, and a kill on a file system
    without atomic rename, a bad copy or a hand edit can damage it; the run's checkpoints are intact, only
    the best-so-far value is lost. So a file that is not a JSON object with a finite number (or null) as its
    `metric` — or no regular file at all (a folder, a link, a FIFO, which is never opened: it would block) — is
    renamed aside as `best.json.damaged-<time>` with one line, and the best starts again at the next validation."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        why = f"unreadable ({exc.strerror or exc})"
    else:
        why = None if stat.S_ISREG(st.st_mode) else "not a regular file"
    record = None
    if why is None:
        try:
            record = json.loads(path.read_bytes().decode("utf-8"))
        except (OSError, ValueError, RecursionError) as exc:
            why = f"not readable JSON ({type(exc).__name__})"
        else:
            metric = record.get("metric") if isinstance(record, dict) else None
            if not isinstance(record, dict):
                why = "not a JSON object"
            elif metric is not None and (isinstance(metric, bool) or not isinstance(metric, int | float)
                                         or not math.isfinite(metric)):
                why = f"its metric is {metric!r}, not a finite number"
    if why is None:
        return record
    if distributed.rank() != 0:  # rank 0 alone moves it and says so
        return {}
    aside = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        os.replace(path, aside)
        moved = f"moved aside to {aside.name}"
    except OSError as exc:
        moved = f"could not be moved aside ({exc.strerror or exc}); it is left as it is"
    log(f"warning: {path} is damaged ({why}) and {moved}; the checkpoints are intact and the best checkpoint "
        "is chosen again from the next validation on")
    return {}


def ranking_start(save_best_after: int, phase_start: int) -> int:
    """The first step whose checkpoint may become best.pt: `save_best_after`, but never a checkpoint from before
    the run's last training phase (a GAN recipe's critics switching on at `phase_start`).

    Why: a held-out distance such as MR-STFT often rises while the critics teach what it does not measure (pitch,
    sharpness); ranked across the switch, best.pt stays the last generator-only checkpoint, which is not what
    the recipe trains (a demo's best.pt was step 1800 of a run whose critics start at 2000). The
    checkpoint at step `phase_start` has had no step with the critics yet (the step that sees
    ``step >= phase_start`` is the next one), so the ranking starts one step after it. 0: no later phase."""
    return max(save_best_after, phase_start + 1) if phase_start > 0 else save_best_after


def ranking_start_note(save_best_after: int, phase_start: int, phase_key: str) -> str | None:
    """One line when a config asks to rank best.pt from before its last phase (`ranking_start` moves it), else None."""
    start = ranking_start(save_best_after, phase_start)
    if start == save_best_after:
        return None
    return (f"note: save_best_after {save_best_after} is before the critics start ({phase_key} {phase_start}): "
            f"best.pt is ranked from step {start} on, so no checkpoint from before the critics competes with one "
            f"trained with them")


BEST_NAME = "best.pt"
BEST_DIR = "checkpoints"  # every trainer's best.pt is <run folder>/checkpoints/best.pt (RUN_BEST)
RUN_BEST = f"{BEST_DIR}/{BEST_NAME}"


class CheckpointManager:
    """Keeps the last `keep_last` step checkpoints plus `best.pt` (by a metric, after
    `save_best_after` steps). The best value lives in `best.json` so it survives restarts; a best recorded
    before `save_best_after` (a resumed run whose ranking now starts later, `ranking_start`) no longer competes.

    `best_dir` is where best.pt and best.json go when the step checkpoints live elsewhere (a trainer may keep
    them in the run folder itself, but every trainer's best.pt is `<run>/checkpoints/best.pt`, one place users
    learn once). A run from before that keeps its best.json beside its checkpoints: it is
    read from there when `best_dir` has none, so a resume keeps its best so far."""

    def __init__(
        self,
        ckpt_dir: str | Path,
        keep_last: int = 5,
        save_best_after: int = 0,
        mode: str = "min",
        prefix: str = "model",
        name_fn: Any = None,
        log: Callable[[str], object] = print,
        best_dir: str | Path | None = None,
    ) -> None:
        if mode not in ("min", "max"):
            raise ValueError("mode must be 'min' or 'max'")
        if keep_last < 1:
            raise ValueError(f"keep_last (save_n_checkpoints) must be >= 1, got {keep_last}")
        self.dir = Path(ckpt_dir)
        self.keep_last = keep_last
        self.save_best_after = save_best_after
        self.mode = mode
        self.prefix = prefix
        self.name_fn = name_fn or (lambda step: f"{prefix}_{step:08d}.pt")
        self.best_dir = Path(best_dir) if best_dir is not None else self.dir
        self._best_file = self.best_dir / "best.json"
        self.log = log
        self.best_metric: float | None = None
        # Rotation deletes only files of this run: the ones this manager wrote, plus the earlier ones
        # of the run it resumed (`adopt`). A checkpoint from another run in the folder is never touched.
        self._ours: set[str] = set()
        earlier = self.dir / "best.json"  # an older run's record, beside its checkpoints
        record_file = earlier if not self._best_file.is_file() and earlier.is_file() else self._best_file
        self.best_record: dict = read_best_record(record_file, log)
        self.best_metric = self.best_record.get("metric")
        if self.best_metric is not None and self.best_record.get("step", save_best_after) < save_best_after:
            log(f"best.pt: the best so far is from step {self.best_record['step']}, before this run ranks from "
                f"(step {save_best_after}): it is replaced at the next validation")
            self.forget_best()

    def _pattern(self) -> re.Pattern:
        probe = self.name_fn(123456789)
        head, tail = probe.split("123456789")
        return re.compile(re.escape(head) + r"(\d+)" + re.escape(tail) + "$")

    def checkpoints(self) -> list[tuple[int, Path]]:
        if not self.dir.is_dir():
            return []
        pat = self._pattern()
        found = [(int(m.group(1)), p) for p in self.dir.iterdir() if (m := pat.match(p.name))]
        return sorted(found)

    def latest(self) -> Path | None:
        ckpts = self.checkpoints()
        return ckpts[-1][1] if ckpts else None

    def adopt(self, resumed: str | Path) -> None:
        """Resuming `resumed` (a file in this folder) makes its run's earlier checkpoints ours to rotate:
        numbered files up to its number, or, for an unnumbered file, those not newer than it."""
        resumed = Path(resumed)
        if resumed.resolve().parent != self.dir.resolve():
            return
        m = self._pattern().match(resumed.name)
        for step, p in self.checkpoints():
            if (step <= int(m.group(1))) if m else p.stat().st_mtime_ns <= resumed.stat().st_mtime_ns:
                self._ours.add(p.name)

    def forget_best(self) -> None:
        """The metric changes meaning (a next training stage at another resolution: PSNR at another crop size), so the
        best so far (its files kept aside by the caller) no longer competes with the next value."""
        self.best_metric = None

    by = "metric"  # what best.pt is ranked by, as the "new best" line names it (`BestCheckpoints`: the metric's name)

    @property
    def best_path(self) -> Path | None:
        """best.pt, where a validation has made one (the closing line names it)."""
        path = self.dir / "best.pt"
        return path if path.is_file() else None

    def is_better(self, metric: float) -> bool:
        if self.best_metric is None:
            return True
        return metric < self.best_metric if self.mode == "min" else metric > self.best_metric

    def save(self, state: dict, step: int, metric: float | None = None) -> Path:
        path = save_atomic(state, self.dir / self.name_fn(step))
        self._ours.add(path.name)
        ours = [p for _, p in self.checkpoints() if p.name in self._ours]
        for old in ours[: -self.keep_last]:
            try:
                remove(old)
            except FileInUseError as exc:  # an old checkpoint left behind costs disk, not the run
                print(f"warning: {exc}; it stays", flush=True)
            self._ours.discard(old.name)
        if metric is not None and step >= self.save_best_after and np.isfinite(metric) and self.is_better(metric):
            self.best_dir.mkdir(parents=True, exist_ok=True)
            second_name(path, self.best_dir / BEST_NAME, state)
            before, self.best_metric = self.best_metric, float(metric)
            write_text(self._best_file, json.dumps({"metric": self.best_metric, "step": step, "mode": self.mode}))
            # a line each time, so the log says when the model last improved (and a run that stopped improving shows)
            self.log(f"new best at step {step}: {self.by} {self.best_metric:.4g}"
                     f"{f' (was {before:.4g})' if before is not None else ''} -> {self.best_dir / BEST_NAME}")
        return path


def verify_checkpoint(path: str | Path) -> str | None:
    """None when `path` is a complete, intact checkpoint, else why not (truncated, damaged, not a
    checkpoint). Every record's CRC-32 is checked (`damage`), then the file is opened memory-mapped.
    A file refused for holding pickled code counts as intact here: `load_checkpoint` then refuses it
    with its own message."""
    problem = damage(path)
    if problem is not None:
        return problem
    try:
        try:
            torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as exc:
            if "mmap" not in str(exc):
                raise
            torch.load(path, map_location="cpu", weights_only=True)  # an old, non-zip file
    except Exception as exc:  # noqa: BLE001 - any failure means "cannot resume from this file"
        text = str(exc)
        if "Weights only load failed" in text or "Unsupported global" in text:
            return None
        return f"truncated or unreadable ({type(exc).__name__}: {text.splitlines()[0][:160] if text else ''})"
    return None


def resolve_resume(arg: str | None, ckpt_dir: str | Path, manager: CheckpointManager | None = None,
                   extra_names: tuple[str, ...] = (), log=print) -> Path | None:
    """`--resume auto` → the newest intact checkpoint of the run (or None when the run has none yet);
    a path must exist. Under torchrun rank 0 alone looks (and renames a damaged file) and every rank
    takes its answer, which every rank must see: a run folder on a disk that all nodes share; else
    CheckpointError on every rank. Call on every rank (collectives)."""
    if not arg:
        return None
    manager = manager or CheckpointManager(ckpt_dir)
    answer = None
    if distributed.rank() == 0:
        try:
            found = _find_resume(arg, ckpt_dir, manager, extra_names, log)
            answer = ("", str(found) if found else None)
        except CheckpointError as exc:
            answer = (str(exc), None)
    error, found = distributed.broadcast_object(answer)
    if error:
        raise CheckpointError(error)
    path = Path(found) if found else None
    blind = [r for r, unseen in enumerate(distributed.gather_objects(path is not None and not path.is_file())) if unseen]
    if blind:
        raise CheckpointError(f"--resume {arg}: rank 0 resumes {path}, which rank(s) {blind} cannot see; every rank "
                              "reads the run folder: put it on a disk that all nodes share (the same path on each)")
    if path is not None:
        manager.adopt(path)
    return path


def _find_resume(arg: str, ckpt_dir: str | Path, manager: CheckpointManager, extra_names: tuple[str, ...],
                 log) -> Path | None:
    """resolve_resume's search (rank 0).

    With `auto`, a newest file that is not intact (a kill or a full disk mid-write on a filesystem
    without atomic rename, a copy cut short, bytes changed on disk) is renamed `<name>.corrupt`, named
    in a warning, and the one before it is tried. When no intact one is left but damaged ones were
    found (now or by an earlier start: `*.corrupt` files), the run must not quietly start again from
    step 0: CheckpointError (exit 2) says what was found and what to do. `extra_names` are unnumbered
    files that compete by modification time (e.g. a trainer's `checkpoint_last.pt`)."""
    if arg == "auto":
        candidates = [p for _, p in manager.checkpoints()]
        extras = [manager.dir / n for n in extra_names if (manager.dir / n).is_file()]
        if extras:
            candidates = sorted(candidates + extras, key=lambda p: p.stat().st_mtime_ns)
        damaged = []
        for path in reversed(candidates):
            problem = verify_checkpoint(path)
            if problem is None:
                return path
            bad = path.with_name(path.name + ".corrupt")
            replace(path, bad)
            damaged.append(f"{path.name} ({problem})")
            log(f"warning: skipping {path}: {problem}; renamed it to {bad.name} and trying the checkpoint before it")
        earlier = sorted(p.name for p in manager.dir.glob("*.corrupt")) if manager.dir.is_dir() else []
        if damaged or earlier:
            found = "; ".join(damaged) if damaged else "only " + ", ".join(earlier)
            raise CheckpointError(
                f"--resume auto: no intact checkpoint in {manager.dir}, found {found}"
                f"{' (each renamed *.corrupt)' if damaged else ''}. Put an intact copy back and resume from it "
                "(--resume PATH), or start over with --overwrite (every old file is moved aside, nothing deleted)")
        return None
    path = Path(arg)
    if not path.is_file():
        raise CheckpointError(f"--resume {arg}: no such checkpoint file (use --resume auto to pick the latest in {ckpt_dir})")
    return path


# ---------------------------------------------------------------------------------------------
# A checkpoint named the way users name it: a file, a run folder, or a best.pt not written yet
# ---------------------------------------------------------------------------------------------
_STEP_NAME = re.compile(r"_(\d{8})\.pt$")  # the rotated step checkpoints: <prefix>_00001200.pt


def best_in_run(run: Path) -> Path | None:
    """A run folder's best.pt: `<run>/checkpoints/best.pt`, or beside the checkpoints, where a run from before kept it."""
    for path in (run / RUN_BEST, run / BEST_NAME):
        if path.is_file():
            return path
    return None


def run_checkpoints(run: Path) -> list[Path]:
    """The checkpoint files of a run folder (`checkpoints/` and the folder itself), newest first; best.pt,
    which is a second name of one of them, is not listed."""
    found = [p for folder in (run / BEST_DIR, run) if folder.is_dir() for p in folder.glob("*.pt")
             if p.name != BEST_NAME and p.is_file()]
    return sorted(found, key=lambda p: p.stat().st_mtime_ns, reverse=True)


def run_folder_of(path: Path) -> Path:
    """The run folder a path in it names: `<run>/checkpoints/x` -> `<run>`, `<run>/x` -> `<run>`."""
    return path.parent.parent if path.parent.name == BEST_DIR else path.parent


def why_no_best(run: Path, newest: Path | None) -> str:
    """Why a run folder has no best.pt, as far as its files say: the run's `save_best_after` (from its
    config.yaml) against the step its newest checkpoint reached, else that no validation has ranked one yet."""
    step = int(m.group(1)) if newest is not None and (m := _STEP_NAME.search(newest.name)) else None
    after = None
    try:
        import yaml

        saved = yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8")) or {}
        after = saved.get("save_best_after", (saved.get("train") or {}).get("save_best_after"))
    except (OSError, ValueError, AttributeError, yaml.YAMLError):
        pass  # no readable config: the general reason below
    reached = f"the run has reached step {step}" if step is not None else "the run is young"
    if isinstance(after, int) and after > 0 and (step is None or step < after):
        return f"best.pt is written from step save_best_after={after} on and {reached}"
    return "best.pt is written at the first validation that measures the run's best_by metric, and none has yet"


def missing_checkpoint(path: Path) -> str:
    """The message for a checkpoint path that is not there: for `…/best.pt`, why the run has none yet and
    the newest checkpoint it does have; otherwise the newest checkpoint of the folder it names, if any."""
    run = run_folder_of(path)
    newest = run_checkpoints(run) if run.is_dir() else []
    text = f"checkpoint not found: {path}"
    if path.name == BEST_NAME and run.is_dir():
        text += f" ({why_no_best(run, newest[0] if newest else None)})"
    if newest:
        return (f"{text}; the newest checkpoint there is {newest[0]}: pass it, or the run folder {run} "
                "(which picks best.pt, else the newest checkpoint)")
    return text


def resolve_checkpoint_arg(arg: str | Path, flag: str = "--checkpoint", log: Callable[[str], object] = print) -> Path:
    """The checkpoint a script's checkpoint flag names, the ways users name one: a file; a run folder (or its
    `checkpoints/`): its best.pt, else its newest checkpoint, with one line saying which; a `best.pt` path of a
    run that keeps it elsewhere (a run from before `checkpoints/best.pt`, which kept it beside its checkpoints). A missing best.pt
    is refused by `load_checkpoint`'s message (why there is none yet, and the newest checkpoint). A folder
    holding no `.pt` file (an export, another format's folder) comes back as it is, for its loader."""
    path = Path(arg)
    if path.is_file():
        return path
    if path.is_dir() or path.name == BEST_NAME:
        run = path if path.is_dir() else run_folder_of(path)
        if path.is_dir() and path.name == BEST_DIR and not (path / BEST_DIR).is_dir():
            run = path.parent
        if not run.is_dir():
            return path
        best = best_in_run(run)
        if best is not None:
            log(f"{flag} {arg}: using {best} (the run's best.pt)")
            return best
        newest = run_checkpoints(run)
        if path.is_dir() and newest:
            log(f"{flag} {arg}: using {newest[0]}, the run's newest checkpoint (no best.pt yet: "
                f"{why_no_best(run, newest[0])})")
            return newest[0]
    return path


# ---------------------------------------------------------------------------------------------
# One run's saving and resuming, written once for every trainer
# ---------------------------------------------------------------------------------------------
GUARDS_FIELD = "guards"  # the one place of every guard's state: {optimizer name: state, "divergence": state}


def upgrade_layout(ckpt: dict, optimizer_names: list[str]) -> dict:
    """`ckpt` in the one layout: schedulers keyed by their optimizer's name (a one-optimizer run wrote its one
    schedule as "scheduler" before), the data position as `batch_in_epoch` (`micro_in_epoch` was one spelling).
    Guards are read by `read_guards`. Returns a shallow copy; `ckpt` is left as it was."""
    out = dict(ckpt)
    schedulers = dict(out.get("schedulers", {}))
    if len(optimizer_names) == 1 and list(schedulers) == ["scheduler"] != optimizer_names:
        out["schedulers"] = {optimizer_names[0]: schedulers["scheduler"]}
    counters = dict(out.get("counters", {}))
    if "batch_in_epoch" not in counters and "micro_in_epoch" in counters:
        counters["batch_in_epoch"] = counters["micro_in_epoch"]
    out["counters"] = counters
    return out


def read_guards(ckpt: dict, optimizer_names: list[str]) -> dict[str, dict | None]:
    """Every guard's state in `ckpt`, by optimizer name plus "divergence": from the one layout (`guards`), or
    from the four written before it (tested with files the trainers wrote then), where the first optimizer
    is the generator / the model and the second its critic: `counters.g_guard` / `counters.d_guard`; one
    `counters.guard` for both networks; `extra.guard` alone; `extra.guard` / `extra.d_guard`; the divergence
    guard in `counters` or `extra` (absent before it existed: its window fills again)."""
    if GUARDS_FIELD in ckpt:
        return dict(ckpt[GUARDS_FIELD])
    counters, extra = ckpt.get("counters", {}), ckpt.get("extra", {})
    first = counters.get("g_guard", counters.get("guard", extra.get("guard")))
    second = counters.get("d_guard", extra.get("d_guard", first))
    found = dict(zip(optimizer_names, (first, second)))
    found["divergence"] = counters.get("divergence", extra.get("divergence"))
    return found


class RunCheckpoints:
    """Saving and resuming one run, the same for every trainer (DESIGN.md, "The shape of a trainer").

    `store` is where files go (a `CheckpointManager`: rotation and best.pt; or any object with its `save`,
    `dir` and `best_metric`). `save(metric)` writes nothing inside a non-finite or diverging streak (one line
    naming the last good checkpoint), else the one layout: the trainer's models, optimizers, schedulers,
    scaler and `ema`, its position and trackers under `counters`, every guard under `guards`, its own
    `state()` under `extra` (schedulers under their optimizer's name); then every rank waits for rank 0's write. `resume(path)` restores all of it
    exactly (`read_guards` also reads the layouts written before this one), applies the optimizer values
    given now (`optimizer_spec`: {optimizer: {hyper-parameter: (config keys, value)}}, see
    `common.training.optimizer_overrides`) and says where it resumed."""

    def __init__(self, trainer: Any, store: Any, kind: str, *, ema: Callable[[], dict | None] | None = None,
                 optimizer_spec: dict | None = None, map_location: str | torch.device = "cpu",
                 counters: Callable[[], dict] | None = None) -> None:
        self.trainer, self.store, self.kind = trainer, store, kind
        self.counters = counters  # a trainer's own counters beside its position (e.g. a resolution stage)
        self.emas = ema or (lambda: None)  # {name: EMA} as it is now (a trainer may replace its EMA object)
        self.optimizer_spec, self.map_location = optimizer_spec, map_location
        self.last_good: Path | None = None  # the newest checkpoint known to hold a good state

    def save(self, metric: float | None = None) -> Path | None:
        t = self.trainer
        if saving_blocked(*t.guards.values(), t.divergence):
            t.printer(f"step {t.step}: no checkpoint while steps are non-finite or diverging "
                      f"(last good: {self.last_good or 'none'})")
            return None
        state = self.state()
        path = self.store.save(state, t.step, metric) if t.info.is_main else None
        self.last_good = path or self.last_good
        distributed.barrier()  # no rank runs ahead (or tears the process group down) while rank 0 writes
        return path

    def state(self) -> dict:
        """The whole checkpoint (call on every rank: it gathers every rank's RNG)."""
        t = self.trainer
        counters = {"step": t.step, "epoch": t.epoch, "batch_in_epoch": t.batch_in_epoch,
                    **(self.counters() if self.counters else {}), **t.writer.checkpoint_state()}
        state = make_state(t.models, t.optimizers, t.schedulers, t.precision.scaler, self.emas(), counters,
                           config_to_dict(t.cfg), extra=t.state(), trainer=self.kind)
        state[GUARDS_FIELD] = {**{name: g.state_dict() for name, g in t.guards.items()},
                               "divergence": t.divergence.state_dict()}
        return state

    def resume(self, path: str | Path, ckpt: dict | None = None) -> dict:
        """Continue the run saved in `path` exactly; returns its checkpoint (read here unless given)."""
        t, path = self.trainer, Path(path)
        ckpt = upgrade_layout(load_checkpoint(path, map_location=self.map_location) if ckpt is None else ckpt,
                              list(t.optimizers))
        counters = restore_state(ckpt, t.models, t.optimizers, t.schedulers, t.precision.scaler, self.emas(),
                                 rank=t.info.rank, source=path)
        t.step, t.epoch, t.batch_in_epoch = int(counters["step"]), int(counters["epoch"]), int(counters["batch_in_epoch"])
        guards = read_guards(ckpt, list(t.optimizers))
        for name, guard in t.guards.items():
            if guards.get(name) is not None:
                guard.load_state_dict(guards[name])
        t.divergence.load_state_dict(guards.get("divergence"))
        t.trackers = resumed_trackers(counters)
        t.load_state(ckpt)
        self.last_good = path
        t.printer(f"resumed from {path} at step {t.step} (epoch {t.epoch}, batch {t.batch_in_epoch})")
        if self.optimizer_spec:
            changed = apply_optimizer_overrides(t.optimizers, t.schedulers, optimizer_overrides(t.cfg, self.optimizer_spec))
            if changed:
                t.printer(changed)
        return ckpt


# ---------------------------------------------------------------------------------------------
# --init_from: weights only, tolerant of changed layers
# ---------------------------------------------------------------------------------------------
@dataclass
class InitReport:
    loaded: list[str] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)  # "name: ckpt (a,b) vs model (c,d)"
    missing: list[str] = field(default_factory=list)  # in the model, not in the checkpoint
    unexpected: list[str] = field(default_factory=list)  # in the checkpoint, not in the model
    ignored: list[str] = field(default_factory=list)  # skipped on request

    def __str__(self) -> str:
        lines = [f"init_from: loaded {len(self.loaded)} tensors"]
        for title, items in (
            ("re-initialised (shape differs)", self.mismatched),
            ("re-initialised (not in checkpoint)", self.missing),
            ("ignored on request", self.ignored),
            ("unused from checkpoint", self.unexpected),
        ):
            if items:
                lines.append(f"  {title}: {len(items)}")
                lines.extend(f"    - {name}" for name in items)
        return "\n".join(lines)


# Why a share: a start from weights is meant to keep what was learned. Real fine-tuning changes a few
# layers (another vocabulary or speaker count, other mel bins, a wider feed-forward) and keeps most
# tensors; a file of another trainer or another model family matches none, and another model width
# almost none. Below half, the run would mostly train from scratch while its log said "init_from", so
# it is refused (exit 2) and the user decides: the right file, or no --init_from at all.
MIN_INIT_SHARE = 0.5  # of the trained network's tensors (by count) that --init_from must load


def compare_state(own: dict[str, torch.Tensor], state: dict[str, torch.Tensor], ignore: tuple[str, ...] = ()
                  ) -> InitReport:
    """Which tensors of `state` fit a model whose state_dict is `own` (name and shape), and which do not."""
    report = InitReport()
    for name, tensor in state.items():
        if any(pat and pat in name for pat in ignore):
            report.ignored.append(name)
        elif name not in own:
            report.unexpected.append(name)
        elif own[name].shape != getattr(tensor, "shape", None):
            report.mismatched.append(f"{name}: checkpoint {tuple(getattr(tensor, 'shape', ()))} "
                                     f"vs model {tuple(own[name].shape)}")
        else:
            report.loaded.append(name)
    report.missing = [n for n in own if n not in state and not any(p and p in n for p in ignore)]
    return report


def fit_summary(own: dict[str, torch.Tensor], state: dict[str, torch.Tensor]) -> str:
    """One line on why `state` does not load into a model whose state_dict is `own`."""
    r = compare_state(own, state)
    parts = [f"{len(items)} {what}, e.g. {items[0]}" for items, what in (
        (r.mismatched, "tensors differ in shape"), (r.missing, "of the model's tensors are not in it"),
        (r.unexpected, "of its tensors are not in the model")) if items]
    return "; ".join(parts) or "load_state_dict failed"


def does_not_fit(source: str | Path, what: str, detail: str, ckpt: dict) -> CheckpointError:
    """The one message every trainer gives when `--resume` meets a checkpoint its model or optimizers
    cannot take (another model width, optimizer, critic set, or another trainer's file); `what` is
    e.g. "its generator weights do not fit"."""
    return CheckpointError(
        f"cannot resume from {source}: {what} this configuration ({detail}){_made_by_note(ckpt)}. "
        "Resume with the settings it was saved with (config.yaml in its run folder), or start a new run "
        "from its weights with --init_from (layers that differ are re-initialised and listed)")


def load_matching(model: nn.Module, state_dict: dict[str, torch.Tensor], ignore: tuple[str, ...] = (),
                  strict_shapes: bool = False, *, source: str | Path | None = None,
                  ckpt: dict | None = None) -> InitReport:
    """Loads every tensor whose name and shape match; lists the rest by name. With `strict_shapes`, a
    shape mismatch is an error instead (fine-tuning that must match). With `source` (the `--init_from`
    file, given for the network a run trains, not for its critics), a file of which fewer than
    `MIN_INIT_SHARE` of the model's tensors load is CheckpointError (exit 2) before anything is loaded; `ckpt` (the whole file) lets the message say which trainer made it."""
    model = _unwrap(model)
    own = model.state_dict()
    report = compare_state(own, state_dict, ignore)
    if strict_shapes and report.mismatched:
        raise CheckpointError(f"shape mismatch with strict shapes: {report.mismatched[0]}")
    considered = len(report.loaded) + len(report.mismatched) + len(report.missing)
    if source is not None and considered and len(report.loaded) < MIN_INIT_SHARE * considered:
        raise CheckpointError(
            f"--init_from {source}: only {len(report.loaded)} of this model's {considered} tensors match it by name "
            f"and shape ({len(report.loaded) / considered:.0%}; at least {MIN_INIT_SHARE:.0%} must, or the run would "
            f"train mostly from scratch){_made_by_note(ckpt or {})}. Start from a checkpoint of this trainer with "
            "the same model size, or leave out --init_from to train from scratch")
    model.load_state_dict({name: state_dict[name] for name in report.loaded}, strict=False)
    return report
