"""`best.pt` by a metric the user names: `--best_by <metric>` (config key `best_by`) in every trainer.

Why one table: whether a metric is better lower or higher is a fact about the metric, not about the trainer
that measures it, so it is declared once here (`METRICS`), and the `CheckpointManager`'s mode comes from it:
nobody can rank PSNR by "min" by mistake. Each trainer declares which of these names its validation produces
and passes that list to `check_best_by` when its config loads, so an unknown metric, or one this run does not
measure, stops the run before anything is built (one line naming the key and the metrics it validates; exit 2).

`BestCheckpoints` is the `CheckpointManager` that writes `best.json` with `"by": <metric>` too, and, when a
resumed run ranks by another metric than the one its `best.json` names, forgets that best with one line
instead of comparing two different metrics' values.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from common.atomic_write import write_text
from common.checkpoint import CheckpointManager

# name -> "min" (lower is better) or "max" (higher is better): each metric's direction, declared once.
METRICS: dict[str, str] = {
    # audio against its recording
    "mrstft": "min",  # multi-resolution STFT distance (spectral convergence + log magnitude)
    "mel_l1": "min",  # L1 between log-mel spectrograms
    "f0_rmse": "min",  # F0 RMSE in cents on frames voiced in both (speech.pitch_metrics)
    "f0_median_error": "min",  # median |f0 difference| in cents there: a few octave jumps cannot swing it
    "f0_gross_error": "min",  # share of those frames more than 50 cents apart (misses and jumps)
    "vuv_error": "min",  # fraction of frames whose voicing differs (speech.pitch_metrics)
    "periodicity": "min",  # RMSE between periodicity tracks (speech.pitch_metrics)
    "pesq": "max",  # PESQ, wide band (1.04 .. 4.64)
    "mcd": "min",  # mel-cepstral distortion after DTW, dB
    "align_sharpness": "max",  # how sure and diagonal a text-to-audio alignment is, 0..1
    "dur_mae": "min",  # duration predictor's mean absolute error, frames per token
    "dur_err": "min",  # relative error of the predicted total length
    "speaker_sim": "max",  # cosine similarity of speaker embeddings, output against the recording
    "score": "min",  # a trainer's combined score of several of these (its docs give the formula)
    "loss": "min",  # a held-out loss
    # images against their originals
    "psnr": "max",  # dB
    "ssim": "max",  # 0..1
    "lpips": "min",  # learned perceptual distance
    "l1": "min",  # mean absolute pixel error
    "rfid": "min",  # Fréchet distance of Inception features, reconstructions against originals
}

def direction(name: str) -> str:
    """"min" or "max": how `name` ranks (KeyError for a name the table does not declare)."""
    return METRICS[name]


def check_best_by(name: Any, validated: Iterable[str], unavailable: Mapping[str, str] | None = None) -> str:
    """`name` when it is a declared metric that this run's validation produces (`validated`); otherwise
    ValueError, one line naming the key and the metrics this trainer validates. `unavailable` maps a metric the
    trainer can measure but this config does not to how to turn it on (e.g. {"pesq": "set valid_pesq: true"})."""
    validated = [m for m in validated if m in METRICS]
    listed = ", ".join(f"{m} ({'higher' if METRICS[m] == 'max' else 'lower'} is better)" for m in validated)
    if isinstance(name, str) and name in validated:
        return name
    if isinstance(name, str) and unavailable and name in unavailable:
        raise ValueError(f"best_by: {name} is not measured by this run ({unavailable[name]}); this trainer "
                         f"validates: {listed}")
    raise ValueError(f"best_by: {name!r} is not a metric this trainer validates; give one of: {listed}")


def best_by_help(validated: Iterable[str], default: str) -> str:
    """`--best_by`'s help for a trainer, from the metrics its validation can produce (the same list its config
    passes to `check_best_by`), so the help never offers a metric that trainer refuses."""
    names = [m for m in validated if m in METRICS]
    higher = [m for m in names if METRICS[m] == "max"]
    order = (f"higher is better for {', '.join(higher)}, lower for the rest" if higher else "lower is better")
    return (f"the held-out metric best.pt is chosen by (config key best_by, default {default}): one of "
            f"{', '.join(names)} ({order}); some need a setting, which the error names")


def add_best_by_arg(parser: argparse.ArgumentParser, validated: Iterable[str], default: str) -> None:
    """`--best_by`, a trainer's flag for its `best_by` key (checked by `check_best_by` when the config loads);
    `validated`: every metric the trainer can measure, for the help."""
    parser.add_argument("--best_by", default=None, metavar="METRIC", help=best_by_help(validated, default))


def best_value(result: Mapping | None, name: str) -> float | None:
    """The value `save` ranks best.pt by, from a validation's metrics (None: nothing measured this time)."""
    if not result:
        return None
    value = result.get(name)
    return None if value is None else float(value)


class BestCheckpoints(CheckpointManager):
    """A `CheckpointManager` ranking best.pt by the metric `by` (its mode from `METRICS`), with `"by"` in best.json.

    A best.json written by another metric (a resume with another `--best_by`) is forgotten with one line: the
    next validation's value becomes the best (best.pt is replaced then). A best.json without `"by"` (written
    before this key existed) was ranked by the trainer's default metric, `legacy_by`."""

    def __init__(self, ckpt_dir: str | Path, by: str, legacy_by: str, log: Callable[[str], None] = print,
                 **kwargs: Any) -> None:
        super().__init__(ckpt_dir, mode=direction(by), log=log, **kwargs)
        self.by = by
        if self.best_metric is None:
            return
        before = self.best_record.get("by", legacy_by)
        if before != by:
            log(f"best.pt: this run's best so far was by {before} ({self.best_metric:.4g}); best_by is now {by}, "
                f"so the best starts again at the next validation (values of two metrics are never compared)")
            self.forget_best()

    def save(self, state: dict, step: int, metric: float | None = None) -> Path:
        before = self.best_metric
        path = super().save(state, step, metric)
        if self.best_metric is not None and (before is None or self.best_metric != before):
            record = json.loads(self._best_file.read_text())
            write_text(self._best_file, json.dumps({**record, "by": self.by}))
        return path
