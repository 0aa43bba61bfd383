"""The failure contract every trainer keeps, tested once over all four trainers:

- a non-finite stop exits 3; no checkpoint is written while the non-finite counter is above 0, so
  every checkpoint on disk is finite (module buffers such as BatchNorm statistics included: a
  skipped step leaves none behind) and the newest is the state before the streak, named in the
  final message;
- an optimizer hyper-parameter given explicitly on resume (the lowered LR the message recommends)
  replaces the checkpoint's in every param group and the scheduler's base, with one log line;
  without one the checkpoint's state stands (the trainers' bitwise resume tests cover that);
- a run that ends inside a non-finite streak shorter than the limit also exits 3, naming the last
  good checkpoint, and saves nothing after it;
- divergence that stays finite (a learning rate of 1e30) stops the same way, exit 3, with the last
  good checkpoint from before the blow-up; a checkpoint holding such weights is refused by resume and
  by inference with one line, exit 2.

Each trainer runs tiny on CPU: steps 1, 2 good, step 3 non-finite (isolated), step 4 good, then
non-finite from step 5 with max 2 in a row, so the run stops in step 6 with step 4 newest.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from common.checkpoint import MAX_WEIGHT, diverged, load_checkpoint, save_atomic
from common.training import apply_optimizer_overrides
from tests.tts.test_clone_train import TINY_YAML as CLONE_TINY
from tests.tts.test_clone_train import corpus  # noqa: F401 - module fixture (espeak-ng corpus)
from tests.tts.test_vits_train import TINY_YAML as VITS_TINY
from tests.tts.test_vits_train import data_one  # noqa: F401 - module fixture (VITS corpus)
from tests.vae.conftest import _one_thread, image_dir  # noqa: F401 - fixtures: one torch thread (autouse), 10 PNGs
from tests.vae.helpers import TINY_CONFIG
from tests.vocoder.conftest import TINY_YAML, tiny_data  # noqa: F401 - session fixture

LOW_LR = 1e-5


def _bad(step: int) -> bool:
    """Which optimizer steps (1-based) get a non-finite loss."""
    return step == 3 or step >= 5


def _sets(*pairs: str) -> list[str]:
    return [a for p in pairs for a in ("--set", p)]


# ------------------------------------------------------------------------------- one adapter per trainer
class Vocoder:
    name = "vocoder"
    keys = {"generator": "generator", "discriminator": "discriminator"}

    def __init__(self, data: Path, run: Path) -> None:
        self.run = run
        self.args = ["--config", str(TINY_YAML), "--data_dir", str(data), "--run_dir", str(run), "--device", "cpu",
                     *_sets("val_check_interval=1", "max_nonfinite_steps=2")]

    def poison(self, monkeypatch) -> None:
        from vocoder.data import VocoderDataset

        original, seen = VocoderDataset.__getitem__, {"n": 0}

        def getitem(ds, key):
            item = original(ds, key)
            if ds.train:
                seen["n"] += 1
                if _bad((seen["n"] + 1) // 2):  # batch_size 2
                    item["mel"] = torch.full_like(item["mel"], math.nan)
            return item
        monkeypatch.setattr(VocoderDataset, "__getitem__", getitem)

    def train(self, *extra: str, steps: int = 10) -> int:
        from vocoder.train import main

        return main([*self.args, *_sets(f"max_updates={steps}"), *extra])

    # with the critics off, the saturated generator's loss stays finite at lr 1e30: the run that used to
    # train on with weights near 1e29 and exit 0
    huge_lr = _sets("generator_optimizer_args.lr=1e30", "discriminator_optimizer_args.lr=1e30",
                    "discriminator_train_start_steps=1000")
    stays_finite = True
    resume_flag = "--resume"

    def resume_low_lr(self) -> int:
        from vocoder.train import main

        return main([*self.args, "--resume", "auto", *_sets("max_updates=5", f"generator_optimizer_args.lr={LOW_LR}")])

    def checkpoints(self) -> list[Path]:
        return sorted((self.run / "checkpoints").glob("model_*.pt"))

    changed = ("generator",)


class Vits:
    name = "vits"
    changed = ("generator", "discriminator")  # `lr` sets both networks' LR

    def __init__(self, data: Path, run: Path) -> None:
        self.run = run
        self.args = ["--config", str(VITS_TINY), "--data_dir", str(data), "--run_dir", str(run), "--device", "cpu",
                     *_sets("save_step=1", "max_nonfinite_steps=2")]

    def poison(self, monkeypatch) -> None:
        from tts.vits import train as train_mod

        real = train_mod.VitsTrainer._generator_losses

        def losses(trainer, *a, **k):
            out = real(trainer, *a, **k)
            if _bad(trainer.step + 1):
                out["total"] = out["total"] * math.nan
            return out
        monkeypatch.setattr(train_mod.VitsTrainer, "_generator_losses", losses)

    def train(self, *extra: str, steps: int = 10) -> int:
        from tts.vits.train import main

        return main([*self.args, *_sets(f"max_steps={steps}"), *extra])

    huge_lr = _sets("lr=1e30")
    resume_flag = "--resume"

    def resume_low_lr(self) -> int:
        from tts.vits.train import main

        return main([*self.args, "--resume", "auto", *_sets("max_steps=5", f"lr={LOW_LR}")])

    def checkpoints(self) -> list[Path]:
        return sorted((self.run / "checkpoints").glob("vits_*.pt"))


class Clone:
    name = "train_main"
    changed = ("optimizer",)
    schedulers = {"optimizer": "optimizer"}  # checkpoint names: optimizer name -> its scheduler's

    def __init__(self, data: Path, run: Path) -> None:
        self.run = run
        self.args = ["--config", str(CLONE_TINY), "--train-data", str(data), "--checkpoint-dir", str(run),
                     "--model-size", "tiny", "--batch-size", "4", "--num-workers", "0", "--precision", "32-true",
                     "--lr", "3e-3", "--warmup-steps", "2",
                     *_sets("val.batch_size=4",
                            f"data.cache_dir={data.parent / 'cache'}", "val.sentences=[]", "val.at_start=false",
                            "train.save_interval=1", "train.val_check_interval=100", "train.max_nonfinite=2")]

    def poison(self, monkeypatch) -> None:
        from tts.clone.model import VoiceCloneTTS

        original, calls = VoiceCloneTTS.losses, {"n": 0}

        def losses(model, out, batch, weights):
            result = original(model, out, batch, weights)
            if model.training:
                calls["n"] += 1  # grad_accum 1: one call per step
                if _bad(calls["n"]):
                    result["loss"] = result["loss"] * math.nan
            return result
        monkeypatch.setattr(VoiceCloneTTS, "losses", losses)

    def train(self, *extra: str, steps: int = 10) -> int:
        from tts.clone.train import main

        return main([*self.args, *_sets(f"train.max_updates={steps}"), *extra])

    huge_lr = ["--lr", "1e30"]
    resume_flag = "--resume"

    def resume_low_lr(self) -> int:
        from tts.clone.train import main

        return main([*self.args, "--resume", "auto", "--lr", str(LOW_LR), *_sets("train.max_updates=5")])

    def checkpoints(self) -> list[Path]:
        return sorted(self.run.glob("clone_*.pt"))


class Vae:
    name = "vae"
    changed = ("vae", "disc")  # the discriminator's LR follows learning_rate unless disc_learning_rate is set

    def __init__(self, data: Path, run: Path) -> None:
        self.run = run
        self.args = ["--config", str(TINY_CONFIG), "--data_path", str(data), "--output_dir", str(run),
                     "--no-export_diffusers", "--num_epochs", "3", *_sets("save_every_steps=1", "max_nonfinite=2")]

    def poison(self, monkeypatch) -> None:
        from vae.data import ImageDataset

        original, seen = ImageDataset.__getitem__, {"n": 0}

        def getitem(ds, key):
            x = original(ds, key)
            if ds.train:
                seen["n"] += 1
                if _bad((seen["n"] + 1) // 2):  # batch_size 2: a NaN image reaches the BatchNorm critic
                    x = torch.full_like(x, math.nan)
            return x
        monkeypatch.setattr(ImageDataset, "__getitem__", getitem)

    def train(self, *extra: str, steps: int | None = None) -> int:
        from vae.train_vae import main

        return main([*self.args, *(["--max_steps", str(steps)] if steps else []), *extra])

    huge_lr = ["--learning_rate", "1e30"]
    resume_flag = "--resume_from"

    def resume_low_lr(self) -> int:
        from vae.train_vae import main

        return main([*self.args, "--resume_from", "auto", "--learning_rate", str(LOW_LR), "--stop_at_step", "5"])

    def checkpoints(self) -> list[Path]:
        return sorted(self.run.glob("checkpoint_*.pt"))


TRAINERS = {"vocoder": (Vocoder, "tiny_data"), "vits": (Vits, "data_one"), "train_main": (Clone, "corpus"),
            "vae": (Vae, "image_dir")}


def _finite(obj) -> bool:
    if isinstance(obj, torch.Tensor):
        return not obj.is_floating_point() or bool(torch.isfinite(obj).all())
    if isinstance(obj, dict):
        return all(_finite(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return all(_finite(v) for v in obj)
    return True


@pytest.mark.parametrize("which", list(TRAINERS))
def test_nonfinite_stop_then_resume_with_a_lower_lr(which, request, tmp_path, monkeypatch, capsys):
    cls, fixture = TRAINERS[which]
    t = cls(request.getfixturevalue(fixture), tmp_path / "run")
    with monkeypatch.context() as m:
        t.poison(m)
        assert t.train() == 3  # common.exit_codes.NON_FINITE
    printed = "".join(capsys.readouterr())
    assert "consecutive steps had non-finite" in printed
    files = t.checkpoints()
    assert files, "the good steps before the streak were saved"
    for path in files:  # all finite: weights, optimizer moments, EMA, BatchNorm running statistics
        ckpt = load_checkpoint(path)
        assert _finite({k: ckpt[k] for k in ("models", "optimizers", "ema")}), path.name
    newest = max(files, key=lambda p: (load_checkpoint(p)["counters"]["step"], p.stat().st_mtime))
    assert load_checkpoint(newest)["counters"]["step"] == 4  # the step before the streak; nothing after it
    assert f"last good checkpoint: {newest}" in printed

    old = load_checkpoint(newest)
    assert t.resume_low_lr() == 0  # the message's advice: lower LR, --resume auto
    printed = "".join(capsys.readouterr())
    assert printed.count("replacing the checkpoint's values") == 1
    after = load_checkpoint(max(t.checkpoints(), key=lambda p: (load_checkpoint(p)["counters"]["step"],
                                                                p.stat().st_mtime)))
    assert after["counters"]["step"] == 5
    for name, opt in after["optimizers"].items():
        groups, sched = opt["param_groups"], after["schedulers"][getattr(t, "schedulers", {}).get(name, name)]
        if name in t.changed:
            assert all(g["initial_lr"] == LOW_LR and 0 < g["lr"] <= LOW_LR for g in groups), name
            assert sched["base_lrs"] == [LOW_LR] * len(groups), name
        else:
            assert [g["initial_lr"] for g in groups] == [g["initial_lr"] for g in old["optimizers"][name]["param_groups"]]


def test_apply_optimizer_overrides_keeps_the_schedule_position():
    from common.muon import MuonAdamW
    from common.schedulers import build_scheduler

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    opt = MuonAdamW(model, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)
    sched = build_scheduler(opt, "cosine_with_warmup", warmup_steps=2, total_steps=10)
    for _ in range(4):
        opt.step()
        sched.step()
    factor = opt.param_groups[0]["lr"] / 1e-3
    assert apply_optimizer_overrides({"o": opt}, {"o": sched}, {"o": {}}) is None  # nothing given: untouched
    line = apply_optimizer_overrides({"o": opt}, {"o": sched}, {"o": {"lr": 2e-4, "betas": (0.5, 0.9)}})
    assert line == ("resume: given on the command line, replacing the checkpoint's values: o lr 0.001 -> 0.0002; "
                    "o betas (0.9, 0.99) -> (0.5, 0.9)")
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([2e-4 * factor] * 2)  # Muon and AdamW groups
    assert sched.base_lrs == [2e-4, 2e-4] and sched.get_last_lr() == [g["lr"] for g in opt.param_groups]
    assert opt.param_groups[1]["betas"] == (0.5, 0.9) and "betas" not in opt.param_groups[0]
    sched.step()  # the schedule continues from the new base
    assert opt.param_groups[1]["lr"] == pytest.approx(2e-4 * sched.lr_lambdas[1](5))


def test_a_resume_whose_lr_schedule_has_another_length_says_so():
    """The schedule's function is code, not in the checkpoint: a resume planned over another length
    (max_updates, epochs, data size, GPU count) moves the LR at the restored step. Said in one line; a
    resume with the same plan says nothing and stays bitwise."""
    from common.schedulers import build_scheduler

    def at_step_50(total: int, state: dict | None = None):
        opt = torch.optim.AdamW(torch.nn.Linear(4, 1).parameters(), lr=1e-3)
        sched = build_scheduler(opt, "cosine_with_warmup", warmup_steps=2, total_steps=total)
        if state is None:
            for _ in range(50):
                opt.step()
                sched.step()
        else:
            opt.load_state_dict(state["opt"])
            sched.load_state_dict(state["sched"])
        return opt, sched

    opt, sched = at_step_50(100)
    saved = {"opt": opt.state_dict(), "sched": sched.state_dict()}
    assert apply_optimizer_overrides(*map(lambda x: {"g": x}, at_step_50(100, saved)), {"g": {}}) is None
    opt, sched = at_step_50(300, saved)
    had, now = opt.param_groups[0]["lr"], 1e-3 * sched.lr_lambdas[0](50)
    assert now > 1.5 * had  # the longer plan is earlier in its decay
    line = apply_optimizer_overrides({"g": opt}, {"g": sched}, {"g": {}})
    assert line == (f"resume: g lr at step 50 {had:g} -> {now:g} (this run's LR schedule: its planned length "
                    "differs from the checkpoint's run; it applies from the next step)")


def _newest(t) -> Path:
    return max(t.checkpoints(), key=lambda p: (load_checkpoint(p)["counters"]["step"], p.stat().st_mtime))


@pytest.mark.parametrize("which", list(TRAINERS))
def test_ending_inside_a_streak_and_finite_divergence_exit_3_and_diverged_weights_are_refused(
        which, request, tmp_path, monkeypatch, capsys):
    cls, fixture = TRAINERS[which]
    t = cls(request.getfixturevalue(fixture), tmp_path / "run")

    # 1. The plan ends inside a non-finite streak shorter than the limit (the last step, 1 < 2): exit 3,
    #    nothing saved from the streak, the last good checkpoint named.
    with monkeypatch.context() as m:
        t.poison(m)
        m.setattr(sys.modules[__name__], "_bad", lambda step: step == 6)
        assert t.train(steps=6) == 3
    printed = "".join(capsys.readouterr())
    assert "the run ended inside a streak of 1 non-finite step(s)" in printed, printed[-2000:]
    good = _newest(t)
    assert load_checkpoint(good)["counters"]["step"] == 5
    assert f"last good checkpoint: {good}" in printed

    # 2. Resumed at a learning rate of 1e30: weights near 1e29 after one step, every value finite. Exit 3,
    #    and the checkpoint named is still the one from before the blow-up: nothing was saved after it.
    assert t.train(t.resume_flag, "auto", *t.huge_lr, steps=20) == 3
    printed = "".join(capsys.readouterr())
    assert f"last good checkpoint: {good}" in printed, printed[-2000:]
    if getattr(t, "stays_finite", False):
        assert "2 consecutive steps diverged while staying finite (the weight norm" in printed, printed[-2000:]
    assert _newest(t) == good and load_checkpoint(good)["counters"]["step"] == 5
    assert all(diverged(load_checkpoint(p)) is None for p in t.checkpoints())

    # 3. A checkpoint a diverged run saved before the guard existed: refused in one line, exit 2, by resume
    #    (and, for the cloning model, by inference), instead of crashing on its weights.
    ckpt = load_checkpoint(good)
    for weights in ckpt["models"].values():
        for v in weights.values():
            if v.is_floating_point():
                v.mul_(MAX_WEIGHT * 1e21)
    bad = save_atomic(ckpt, good.with_name("diverged.pt"))
    refusal = f"error: {bad}: its weights are not a trained model"
    assert t.train(t.resume_flag, str(bad), steps=8) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(refusal) and len(err.splitlines()) == 1, err
    if which == "train_main":
        from tts.clone.infer import main as infer_clone

        assert infer_clone(["--checkpoint", str(bad), "--reference", str(tmp_path / "none.wav"), "--text", "salom",
                            "--output", str(tmp_path / "out.wav")]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(refusal) and len(err.splitlines()) == 1, err


def test_a_resume_applies_muon_weight_decay_to_the_muon_groups_only():
    """vocoder `muon_weight_decay` given on resume: the Muon half's weight decay, after `weight_decay` (both
    halves, the config's rule: weight_decay is Muon's too unless muon_weight_decay is set)."""
    from common.config import load_config
    from common.muon import MuonAdamW
    from common.training import optimizer_overrides
    from vocoder.config import VocoderConfig

    rtx = Path(__file__).resolve().parents[1] / "vocoder" / "configs" / "base_hifi_rtx5090_optimized.yaml"
    cfg = load_config(rtx, VocoderConfig, ["generator_optimizer_args.weight_decay=0.01",
                                           "generator_optimizer_args.muon_weight_decay=0.2"])
    opt = MuonAdamW(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 1)), lr=1e-3)
    over = optimizer_overrides(cfg, cfg.optimizer_spec())["generator"]
    assert list(over) == ["weight_decay", "muon_weight_decay"]
    apply_optimizer_overrides({"generator": opt}, {}, {"generator": over})
    assert [(g["use_muon"], g["weight_decay"]) for g in opt.param_groups] == [(True, 0.2), (False, 0.01)]
