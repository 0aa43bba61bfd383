"""tts/train_main.py options: documented defaults, the presets, and unused options as errors."""

from __future__ import annotations

import pytest
import torch

from common.config import ConfigError
from common.precision import Precision
from tts.clone.evaluation import PlateauDetector
from tts.clone.options import UsageError, build_parser, device_notices, effective_block, resolve_config
from tts.clone.presets import FAST_CONVERGENCE, cap_gpu_memory
from tts.clone.train import main


def resolve(*argv: str):
    return resolve_config(build_parser().parse_args(list(argv)))


def test_defaults_are_the_documented_after_values():
    cfg = resolve().cfg
    assert (cfg.optim.lr, cfg.scheduler.name, cfg.scheduler.warmup_steps) == (2e-4, "cosine_with_warmup", 1000)
    assert (cfg.train.batch_size, cfg.train.grad_accum, cfg.train.num_workers) == (32, 1, 4)
    assert (cfg.optim.optimizer, cfg.optim.beta2, cfg.optim.eps, cfg.optim.clip_grad_norm) == ("adamw", 0.98, 1e-9, 1.0)
    assert (cfg.train.precision, cfg.model.size) == ("auto", "normal")


def test_fast_convergence_is_exactly_the_guides_after_values():
    cfg = resolve("--fast-convergence").cfg
    assert cfg.optim.lr == 1e-4 and cfg.scheduler.name == "cosine_with_warmup"
    assert cfg.train.batch_size == 48 and cfg.train.grad_accum == 8
    assert cfg.optim.beta2 == 0.98 and cfg.optim.eps == 1e-9
    assert cfg.optim.weight_decay == 1e-4 and cfg.optim.clip_grad_norm == 0.5
    assert cfg.train.num_workers == 16 and cfg.train.log_every == 50
    # the guide's schedule: save_step = max(2000, epochs * 10), val_step = max(500, epochs * 2)
    assert (cfg.train.save_every, cfg.train.validate_every) == (10000, 2000)  # 1000 epochs
    short = resolve("--fast-convergence", "--epochs", "30").cfg
    assert (short.train.save_every, short.train.validate_every) == (2000, 500)
    assert len(FAST_CONVERGENCE) == 10
    assert resolve("--fast-convergence").notices == []


def test_fast_convergence_values_are_defaults_that_typed_flags_replace_with_one_line_each():
    # the guide's "Maximum Performance Mode", word for word (its data flags aside)
    res = resolve("--fast-convergence", "--batch-size", "64", "--lr", "2e-4", "--max-gpu-memory", "0.95")
    cfg = res.cfg
    assert (cfg.train.batch_size, cfg.optim.lr, cfg.train.max_gpu_memory) == (64, 2e-4, 0.95)
    assert (cfg.train.grad_accum, cfg.optim.weight_decay, cfg.optim.clip_grad_norm, cfg.train.num_workers) == (
        8, 1e-4, 0.5, 16)
    assert sorted(res.notices) == ["--batch-size 64 replaces the --fast-convergence value 48",
                                   "--lr 0.0002 replaces the --fast-convergence value 0.0001"]
    res = resolve("--fast-convergence", "--set", "optim.clip_grad_norm=1.0", "--set", "train.validate_every=7")
    assert res.cfg.optim.clip_grad_norm == 1.0 and res.cfg.train.validate_every == 7
    assert len(res.notices) == 2 and "--set optim.clip_grad_norm 1.0 replaces the --fast-convergence value 0.5" in res.notices
    # the same value as the preset is not a replacement
    assert resolve("--fast-convergence", "--lr", "1e-4").notices == []
    # options the preset does not touch still apply
    cfg = resolve("--fast-convergence", "--warmup-steps", "500", "--num-workers", "2").cfg
    assert cfg.scheduler.warmup_steps == 500 and cfg.train.num_workers == 2


def test_fast_convergence_over_a_yaml_value_says_so(tmp_path):
    y = tmp_path / "c.yaml"
    y.write_text("train:\n  batch_size: 8\n")
    res = resolve("--config", str(y), "--fast-convergence")
    assert res.cfg.train.batch_size == 48
    assert res.notices == [f"--fast-convergence sets --batch-size = 48 over {y.resolve()}"]


def test_aggressive_lr_doubles_the_lr_with_a_longer_warmup():
    base = resolve("--lr", "3e-4", "--warmup-steps", "400").cfg
    aggr = resolve("--lr", "3e-4", "--warmup-steps", "400", "--aggressive-lr").cfg
    assert aggr.optim.lr == pytest.approx(2 * base.optim.lr)
    assert aggr.scheduler.warmup_steps == 2 * base.scheduler.warmup_steps == 800
    both = resolve("--fast-convergence", "--aggressive-lr").cfg
    assert both.optim.lr == pytest.approx(2e-4) and both.train.batch_size == 48
    with pytest.raises(UsageError, match="constant"):
        resolve("--aggressive-lr", "--scheduler", "constant")


@pytest.mark.parametrize("argv, match", [
    (["--scheduler", "constant", "--warmup-steps", "100"], "warmup"),
    (["--scheduler", "noam", "--set", "scheduler.gamma=0.999"], "gamma"),
    (["--scheduler", "exponential", "--set", "scheduler.min_ratio=0.1"], "min_ratio"),
    (["--num-workers", "0", "--set", "data.prefetch_factor=8"], "prefetch"),
    (["--scheduler", "noam", "--warmup-steps", "0"], "noam"),
    (["--epochs", "3", "--set", "train.max_updates=100"], "max_updates"),
])
def test_options_the_effective_configuration_does_not_use_are_errors(argv, match):
    with pytest.raises(UsageError, match=match):
        resolve(*argv)


@pytest.mark.parametrize("argv,match", [
    (["--max-gpu-memory", "1.5"], r"train\.max_gpu_memory \(--max-gpu-memory\): 1\.5 is out of range; it must be >= 0 and <= 1"),
    (["--batch-size", "0"], r"train\.batch_size \(--batch-size\): 0 is out of range; it must be >= 1"),
])
def test_flag_values_outside_their_declared_range_name_the_flag(argv, match):
    with pytest.raises(ConfigError, match=match):
        resolve(*argv)


def test_used_combinations_are_accepted():
    assert resolve("--scheduler", "exponential", "--set", "scheduler.gamma=0.999").cfg.scheduler.gamma == 0.999
    assert resolve("--scheduler", "noam", "--warmup-steps", "4000").cfg.scheduler.warmup_steps == 4000
    assert resolve("--scheduler", "constant").cfg.scheduler.name == "constant"


def test_unknown_config_key_names_the_closest_valid_one(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  batch_sise: 8\n")
    with pytest.raises(ConfigError, match="batch_size"):
        resolve("--config", str(bad))


def test_yaml_values_and_flag_precedence(tmp_path):
    y = tmp_path / "c.yaml"
    y.write_text("train:\n  batch_size: 8\n  num_workers: 1\nscheduler:\n  name: constant\n")
    res = resolve("--config", str(y), "--batch-size", "12")
    assert res.cfg.train.batch_size == 12 and res.cfg.train.num_workers == 1
    with pytest.raises(UsageError, match="warmup"):  # a YAML-set constant schedule + a warmup flag
        resolve("--config", str(y), "--warmup-steps", "10")


def test_max_gpu_memory_on_cpu_is_a_notice_and_the_block_lists_the_effective_values():
    res = resolve("--max-gpu-memory", "0.5", "--batch-size", "6", "--grad-accum", "4", "--num-workers", "2",
                  "--scheduler", "noam", "--warmup-steps", "50", "--precision", "32-true")
    notes = device_notices(res, torch.device("cpu"))
    assert any("--max-gpu-memory 0.5 ignored" in n for n in notes)
    res.notices.extend(notes)
    block = effective_block(res, torch.device("cpu"), Precision("32-true", "cpu"), 1_000_000, 10, 100,
                            [(16, 64)], 1)
    for text in ("batch", "6 per step", "effective batch  24", "LR", "0.0002", "workers",
                 "grad-accum", "noam", "precision", "32-true", "--max-gpu-memory 0.5 ignored"):
        assert text in block, text


def test_main_reports_usage_errors_cleanly(capsys):
    assert main(["--scheduler", "constant", "--warmup-steps", "5", "--train-data", "x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "warmup" in err and "Traceback" not in err
    assert main(["--train-data", "/nonexistent/folder"]) == 2
    assert "no such file or folder" in capsys.readouterr().err


def test_plateau_detector_reports_once_with_a_reason():
    p = PlateauDetector(patience=3, min_delta=0.01)
    assert p.update(1.0, 100, lr_ratio=1.0, train_trend=-0.1) is None
    assert p.update(0.9, 200, 1.0, -0.1) is None
    msgs = [p.update(0.899, s, 1.0, -0.1) for s in (300, 400, 500, 600)]
    assert msgs[:2] == [None, None] and "over-fitting" in msgs[2] and msgs[3] is None
    q = PlateauDetector(patience=1, min_delta=0.01)
    q.update(1.0, 1, 1.0, None)
    assert "near its floor" in q.update(1.0, 2, lr_ratio=0.05, train_trend=None)
    r = PlateauDetector(patience=1, min_delta=0.01)
    r.update(1.0, 1, 1.0, None)
    assert "--aggressive-lr" in r.update(1.0, 2, lr_ratio=0.9, train_trend=0.0)


def test_max_gpu_memory_caps_the_cuda_allocator(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, d: calls.append((f, d)))
    cuda = torch.device("cuda", 0)
    assert cap_gpu_memory(0.95, cuda) is None and calls == [(0.95, cuda)]
    assert cap_gpu_memory(0.0, cuda) is None and len(calls) == 1  # 0 = no cap
    note = cap_gpu_memory(0.95, torch.device("cpu"))
    assert len(calls) == 1 and note.startswith("--max-gpu-memory 0.95 ignored: this run is on the CPU")


def test_the_guides_aggressive_training_command_runs_as_written():
    cfg = resolve("--aggressive-lr", "--batch-size", "56", "--grad-accum", "6", "--num-workers", "20").cfg
    assert (cfg.train.batch_size, cfg.train.grad_accum, cfg.train.num_workers) == (56, 6, 20)
    assert cfg.optim.lr == pytest.approx(4e-4) and cfg.scheduler.warmup_steps == 2000


def test_the_guides_standard_command_takes_two_prepared_folders(tmp_path):
    from tts.clone.data import DataError, resolve_manifests

    train_dir, eval_dir = tmp_path / "dataset_train", tmp_path / "dataset_eval"
    for d in (train_dir, eval_dir):
        d.mkdir()
        (d / "train.jsonl").write_text("{}\n")
        (d / "eval.jsonl").write_text("{}\n")
    args = build_parser().parse_args(["--train-data", str(train_dir), "--val-data", str(eval_dir),
                                      "--checkpoint-dir", str(tmp_path / "checkpoints")])
    cfg = resolve_config(args).cfg
    assert resolve_manifests(cfg.data.train, cfg.data.val) == (train_dir / "train.jsonl", eval_dir / "eval.jsonl")
    (eval_dir / "eval.jsonl").unlink()
    with pytest.raises(DataError, match="--val-data"):
        resolve_manifests(cfg.data.train, cfg.data.val)


def test_one_precedence_rule_yaml_card_preset_fast_convergence_flags_set(tmp_path):
    from common.config import explicit_keys
    from common.presets import apply_preset
    from tts.clone.presets import CARD_PRESETS

    y = tmp_path / "c.yaml"
    y.write_text("train:\n  batch_size: 8\n  grad_accum: 2\n  precision: 16-mixed\n")
    res = resolve("--config", str(y), "--fast-convergence", "--num-workers", "3", "--set", "train.num_workers=5")
    apply_preset(res.cfg, "rtx5090", CARD_PRESETS, log=lambda _line: None)
    t = res.cfg.train
    assert (t.batch_size, t.grad_accum) == (48, 8)  # --fast-convergence over the YAML and over the card
    assert t.num_workers == 5  # --set over the flag over both presets
    assert t.precision == "bf16-mixed" and res.cfg.data.ref_seconds == 3.0  # the card over the YAML
    assert explicit_keys(res.cfg)["train.batch_size"] == "--fast-convergence"



@pytest.mark.parametrize("flag", ["--checkpoint-dir", "--run_dir"])
def test_run_folder_errors_name_the_flag_the_user_typed(flag, tmp_path, capsys):
    taken = tmp_path / "a_file"
    taken.write_text("not a folder")
    (tmp_path / "data").mkdir()  # beside the run folder: one inside its data is refused first (check_apart)
    assert main(["--train-data", str(tmp_path / "data"), flag, str(taken)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {flag} {taken}: this is an existing file, not a folder") and "Traceback" not in err
    other = {"--checkpoint-dir": "--run_dir", "--run_dir": "--checkpoint-dir"}[flag]
    assert other not in err


def test_optim_fused_and_batched_ns_reach_the_optimizer():
    """optim.fused and optim.batched_ns (common.muon.build_optimizer; the refusal for an optimizer without a kernel is tested in
    tests/common/test_muon.py) reaches the AdamW and MuonAdamW the trainer builds."""
    import torch

    from tts.clone.build import build_clone_optimizer
    from tts.clone.config import CloneConfig

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    cfg = CloneConfig()
    cfg.optim.fused = True
    assert build_clone_optimizer(cfg, model).defaults["fused"] is True
    cfg.optim.optimizer = "muon_adamw"
    assert build_clone_optimizer(cfg, model).fused is True
    cfg.optim.fused, cfg.optim.batched_ns = None, True
    opt = build_clone_optimizer(cfg, model)
    assert opt.fused is False and opt.batched_ns is True  # fused: the CPU default
