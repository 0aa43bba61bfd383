"""common.loop's cadence, on a stand-in trainer: the one rule every trainer's run follows
(docs/conventions.md, "The training loop"), the health scalars every trainer logs under the same names,
and the guards `fit` refuses to run without."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from common import loop
from common.demo import report, steps_figure
from common.distributed import DistInfo
from common.guards import DivergenceGuard, NonFiniteGuard
from common.log import Printer
from common.stopping import STOP_AT_STEP, TIME_LIMIT, RunStop


class Writer:
    def close(self) -> None:
        pass


class Checkpoints:
    """Records saves (with their metric) as the trainer's events; `store` as RunCheckpoints has it."""

    def __init__(self, events: list) -> None:
        self.events, self.last_good = events, None
        self.store = type("Store", (), {"dir": Path("ckpts"), "best_metric": None})()

    def save(self, metric: float | None = None) -> Path:
        self.events.append(("save", self.trainer.step, metric))
        self.last_good = Path(f"ckpts/{self.trainer.step}.pt")
        return self.last_good


class Recorder:
    """A trainer that records what the loop asks of it; `per_epoch` batches per epoch; `optimizers` of it
    (names -> a real optimizer, for the health scalars)."""

    def __init__(self, per_epoch: int, optimizers: tuple[str, ...] = ("model",)) -> None:
        self.step = self.epoch = self.batch_in_epoch = 0
        self.per_epoch = per_epoch
        self.events: list[tuple] = []
        self.logged: list[dict] = []
        w = torch.nn.Parameter(torch.zeros(1))
        self.optimizers = {name: torch.optim.SGD([w], lr=0.1 * (i + 1)) for i, name in enumerate(optimizers)}
        self.guards = {name: NonFiniteGuard(3) for name in optimizers}
        self.divergence = DivergenceGuard([], 3)
        self.writer, self.printer = Writer(), Printer(sink=lambda line: self.events.append(("line", str(line))))
        self.info = DistInfo(0, 1, 0, torch.device("cpu"), False)

    def batches(self):
        return range(self.batch_in_epoch, self.per_epoch)

    def train_step(self, batch: int) -> dict:
        self.events.append(("step", self.epoch, batch))
        return {"loss": 1.0}

    def validate(self) -> dict:
        self.events.append(("validate", self.step))
        return {"loss": 0.5, "mcd": torch.tensor(2.0), "_picture": {"mel": torch.zeros(2, 3)}}

    def log(self, logs: dict, progress) -> dict:
        self.events.append(("log", self.step))
        self.logged.append(logs)
        return {}


def fit(t: Recorder, cadence: loop.Cadence, stop: RunStop, **hooks) -> loop.RunResult:
    checkpoints = Checkpoints(t.events)
    checkpoints.trainer = t
    return loop.fit(t, cadence, stop, checkpoints, best_by="loss", show_progress=False, **hooks)


def test_the_plan_logs_validates_and_saves_on_its_cadence_and_at_its_end():
    t = Recorder(per_epoch=3)
    result = fit(t, loop.Cadence(total_steps=5, log_every=2, validate_every=2), RunStop())
    assert result.stopped is None and result.step == 5
    assert [e for e in t.events if e[0] == "step"] == [("step", 0, 0), ("step", 0, 1), ("step", 0, 2),
                                                      ("step", 1, 0), ("step", 1, 1)]  # epochs from their batches
    assert [e for e in t.events if e[0] == "log"] == [("log", 1), ("log", 2), ("log", 4), ("log", 5)]
    saves = [e for e in t.events if e[0] in ("validate", "save")]
    assert saves == [("validate", 2), ("save", 2, 0.5), ("validate", 4), ("save", 4, 0.5),
                     ("validate", 5), ("save", 5, 0.5)]  # the end validates once and saves once
    assert (t.step, t.epoch, t.batch_in_epoch) == (5, 1, 2)
    assert [v["step"] for v in result.validations] == [2, 4, 5] and result.last_good == str(Path("ckpts/5.pt"))
    assert result.validations[0] == {"step": 2, "loss": 0.5, "mcd": 2.0}  # numbers only: summary.json takes it
    json.dumps(result.to_dict())
    kind, line = t.events[-1]  # the closing line: steps, why it ended, wall time, latest and best checkpoints
    assert kind == "line" and re.fullmatch(rf"done at step 5 of 5 in \d+\.\d s; latest checkpoint "
                                           rf"{re.escape(str(Path('ckpts/5.pt')))}; best none yet", line), line


def test_the_closing_line_names_best_pt_with_its_value_and_a_readable_wall_time():
    result = loop.RunResult(5000, None, last_good="run/checkpoints/model_00005000.pt", best=0.81234, wall_s=7385.0)
    assert loop.closing_line(result, 5000, RunStop(), Path("run/checkpoints/best.pt"), "mrstft") == (
        f"done at step 5000 of 5000 in 2 h 03 min; latest checkpoint run/checkpoints/model_00005000.pt; "
        f"best {Path('run/checkpoints/best.pt')} (mrstft 0.8123)")
    assert [loop.duration_text(s) for s in (4.25, 42.4, 185.0)] == ["4.2 s", "42 s", "3 min 05 s"]


def test_stop_at_step_saves_without_validating_and_a_time_limit_validates():
    t = Recorder(per_epoch=10)
    result = fit(t, loop.Cadence(total_steps=9, log_every=100, validate_every=100), RunStop(stop_at_step=3))
    assert result.stopped == STOP_AT_STEP
    assert [e for e in t.events if e[0] in ("validate", "save")] == [("save", 3, None)]
    line = t.events[-1][1]
    assert line.startswith("stopped by stop_at_step at step 3 of 9 in ") and line.endswith(
        f"; latest checkpoint {Path('ckpts/3.pt')}; best none yet; continue with --resume auto"), line
    t = Recorder(per_epoch=10)
    assert fit(t, loop.Cadence(total_steps=9, log_every=100), RunStop(time_limit_minutes=1e-9)).stopped == TIME_LIMIT
    assert [e for e in t.events if e[0] in ("validate", "save")] == [("validate", 1), ("save", 1, 0.5)]


def test_planned_epochs_end_without_another_fetch_and_the_last_one_counts():
    t = Recorder(per_epoch=10)  # more batches than the plan's steps per epoch: never fetched
    ended: list[int] = []
    fit(t, loop.Cadence(total_steps=6, log_every=100, save_every=2, steps_per_epoch=3), RunStop(),
        epoch_end=ended.append)
    assert [e[1:] for e in t.events if e[0] == "step"] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert ended == [1, 2] and (t.epoch, t.batch_in_epoch) == (2, 0)
    assert [e for e in t.events if e[0] in ("validate", "save")] == [("save", 2, None), ("save", 4, None),
                                                                     ("validate", 6), ("save", 6, 0.5)]


def test_a_time_boxed_run_that_stops_early_says_so_in_its_summary_and_its_demo_figure(tmp_path):
    """Under load a demo hit max_minutes at step 959 of its 1700 and nothing said so: the result carries the
    plan, summary.json keeps it, and the demo's steps figure fails naming the reason."""
    t = Recorder(per_epoch=10)
    result = fit(t, loop.Cadence(total_steps=9, log_every=100), RunStop(time_limit_minutes=1e-9))
    assert (result.step, result.planned, result.stopped) == (1, 9, TIME_LIMIT)
    result.save(tmp_path / "summary.json")
    summary = json.loads((tmp_path / "summary.json").read_text())
    said: list[str] = []
    assert not report([steps_figure(summary["step"], summary["planned"], summary["stopped"])], "demo", said.append)
    assert "stopped by max_minutes, thresholds are for 9" in said[1] and "FAIL" in said[1]
    full = fit(Recorder(per_epoch=10), loop.Cadence(total_steps=3, log_every=100), RunStop())
    assert steps_figure(full.step, full.planned, full.stopped).ok


def test_a_step_s_sample_count_reaches_the_bar_and_not_the_log():
    """A trainer whose batches vary (a frame budget) reports `samples`: the bar counts them, the log
    point never sees the key (it is no metric)."""
    class Varying(Recorder):
        def train_step(self, batch: int) -> dict:
            return {"loss": 1.0, "samples": batch + 1}

    t = Varying(per_epoch=3)
    fit(t, loop.Cadence(total_steps=3, log_every=1), RunStop())
    assert all("loss" in logs and "samples" not in logs for logs in t.logged) and len(t.logged) == 3


def test_health_scalars_have_one_name_per_thing():
    """One optimizer: `lr`, `skipped_steps`; several: `lr_<name>`, `skipped_<name>`; always the data wait
    and samples/s: the same names in every trainer's TensorBoard."""
    one = Recorder(per_epoch=2)
    fit(one, loop.Cadence(total_steps=1, log_every=1), RunStop())
    assert {"lr", "skipped_steps", "data_wait_fraction", "samples_per_s"} <= set(one.logged[0])
    two = Recorder(per_epoch=2, optimizers=("generator", "discriminator"))
    result = fit(two, loop.Cadence(total_steps=1, log_every=1), RunStop())
    assert {"lr_generator", "lr_discriminator", "skipped_generator", "skipped_discriminator"} <= set(two.logged[0])
    assert two.logged[0]["lr_discriminator"] == pytest.approx(0.2) and result.skipped == {"generator": 0,
                                                                                          "discriminator": 0}


def test_fit_refuses_a_missing_or_shared_guard_and_no_divergence_guard():
    t = Recorder(per_epoch=2, optimizers=("generator", "discriminator"))
    del t.guards["discriminator"]  # its critic's NaN streak would go unnoticed
    with pytest.raises(ValueError, match="discriminator"):
        fit(t, loop.Cadence(total_steps=2, log_every=1), RunStop())
    t.guards["discriminator"] = t.guards["generator"]  # one guard for two optimizers: a check by names only
    with pytest.raises(ValueError, match="shared"):
        fit(t, loop.Cadence(total_steps=2, log_every=1), RunStop())
    t.guards["discriminator"], t.divergence = NonFiniteGuard(3), None
    with pytest.raises(ValueError, match="divergence"):
        fit(t, loop.Cadence(total_steps=2, log_every=1), RunStop())
    assert not [e for e in t.events if e[0] == "step"]  # refused before the first step


def test_cadence_keys_read_from_a_config_section():
    keys = loop.CadenceKeys(log_every=7, validate_every=0, save_every=3, max_minutes=None, stop_at_step=4)
    assert loop.Cadence.of(keys, 10) == loop.Cadence(total_steps=10, log_every=7, validate_every=0, save_every=3)
    stop = RunStop.of(keys, type("Cfg", (), {"batch_size": 8})(), "a step")
    assert (stop.time_limit_minutes, stop.stop_at_step, stop.oom[1]) == (None, 4, 8)
