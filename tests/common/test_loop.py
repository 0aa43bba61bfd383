"""common.loop's cadence, on a stand-in trainer: the one rule every trainer's run follows
(docs/conventions.md, "The training loop")."""

from __future__ import annotations

from common import loop
from common.log import Progress
from common.stopping import STOP_AT_STEP, TIME_LIMIT, RunStop
from common.training import DivergenceGuard, NonFiniteGuard


class Recorder:
    """A trainer that records what the loop asks of it; `per_epoch` batches per epoch."""

    def __init__(self, per_epoch: int) -> None:
        self.step = self.epoch = self.batch_in_epoch = 0
        self.per_epoch = per_epoch
        self.events: list[tuple] = []

    def train_step(self, batch: int) -> dict:
        self.events.append(("step", self.epoch, batch))
        return {"loss": 1.0}

    def validate(self) -> float:
        self.events.append(("validate", self.step))
        return 0.5

    def save(self, metric: float | None = None) -> None:
        self.events.append(("save", self.step, metric))


def run(t: Recorder, cadence: loop.Cadence, stop: RunStop, **hooks) -> str | None:
    return loop.run(t, cadence, stop, Progress(cadence.total_steps, enabled=False),
                    epoch_batches=lambda: range(t.batch_in_epoch, t.per_epoch), optimizers={"model": None},
                    guards={"model": NonFiniteGuard(3)}, divergence=DivergenceGuard([], 3),
                    log=lambda logs, bar: t.events.append(("log", t.step)) or {}, **hooks)


def test_the_plan_logs_validates_and_saves_on_its_cadence_and_at_its_end():
    t = Recorder(per_epoch=3)
    assert run(t, loop.Cadence(total_steps=5, log_every=2, validate_every=2), RunStop()) is None
    assert [e for e in t.events if e[0] == "step"] == [("step", 0, 0), ("step", 0, 1), ("step", 0, 2),
                                                      ("step", 1, 0), ("step", 1, 1)]  # epochs from their batches
    assert [e for e in t.events if e[0] == "log"] == [("log", 1), ("log", 2), ("log", 4), ("log", 5)]
    saves = [e for e in t.events if e[0] in ("validate", "save")]
    assert saves == [("validate", 2), ("save", 2, 0.5), ("validate", 4), ("save", 4, 0.5),
                     ("validate", 5), ("save", 5, 0.5)]  # the end validates once and saves once
    assert (t.step, t.epoch, t.batch_in_epoch) == (5, 1, 2)


def test_stop_at_step_saves_without_validating_and_a_time_limit_validates():
    t = Recorder(per_epoch=10)
    assert run(t, loop.Cadence(total_steps=9, log_every=100, validate_every=100), RunStop(stop_at_step=3)) == STOP_AT_STEP
    assert [e for e in t.events if e[0] in ("validate", "save")] == [("save", 3, None)]
    t = Recorder(per_epoch=10)
    assert run(t, loop.Cadence(total_steps=9, log_every=100), RunStop(time_limit_minutes=1e-9)) == TIME_LIMIT
    assert [e for e in t.events if e[0] in ("validate", "save")] == [("validate", 1), ("save", 1, 0.5)]


def test_planned_epochs_end_without_another_fetch_and_the_last_one_counts():
    t = Recorder(per_epoch=10)  # more batches than the plan's steps per epoch: never fetched
    ended: list[int] = []
    run(t, loop.Cadence(total_steps=6, log_every=100, save_every=2, steps_per_epoch=3), RunStop(),
        epoch_end=ended.append)
    assert [e[1:] for e in t.events if e[0] == "step"] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert ended == [1, 2] and (t.epoch, t.batch_in_epoch) == (2, 0)
    assert [e for e in t.events if e[0] in ("validate", "save")] == [("save", 2, None), ("save", 4, None),
                                                                     ("validate", 6), ("save", 6, 0.5)]


def test_a_step_s_sample_count_reaches_the_bar_and_not_the_log():
    """A trainer whose batches vary (a frame budget) reports `samples`: the bar counts them, the log
    point never sees the key (it is no metric)."""
    class Varying(Recorder):
        def train_step(self, batch: int) -> dict:
            return {"loss": 1.0, "samples": batch + 1}

    t, seen = Varying(per_epoch=3), []
    bar = Progress(3, enabled=False)
    loop.run(t, loop.Cadence(total_steps=3, log_every=1), RunStop(), bar, epoch_batches=lambda: range(3),
             optimizers={"model": None}, guards={"model": NonFiniteGuard(3)}, divergence=DivergenceGuard([], 3),
             log=lambda logs, _bar: seen.append(set(logs)) or {})
    assert seen == [{"loss"}] * 3 and list(bar._samples) == [1, 2, 3]
