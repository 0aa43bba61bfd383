"""tts/train.py end to end on a tiny synthetic corpus: steps, exact resume, non-finite handling,
--init_from with another vocabulary / speaker count, synthesize CLI, ONNX export, the RTX 5090
launcher script; the speed keys: compile (decoder and critics compiled in place, checkpoint keys
unchanged, batches padded to a few bucket shapes), channels_last (the period critics' Conv2d; the
1-D convs cannot), deterministic, and cudnn_benchmark on the CPU."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from common import exit_codes
from common.checkpoint import CheckpointManager, load_checkpoint, save_atomic
from common.config import file_overrides, load_config
from common.distributed import setup_distributed
from common.guards import NonFiniteError
from tests.common.test_resume_ddp import run_torchrun
from tts.prepare_data import prepare
from tts.vits import export_onnx, synthesize
from tts.vits import train as train_mod
from tts.vits.config import TrainConfig

ROOT = Path(__file__).resolve().parents[2]
SR = 22050
TEXTS = ["salom dunyo", "bugun havo yaxshi", "kitob oʻqiymiz", "choy ichamiz", "men uyga boraman",
         "bu yaxshi kun"]
# the tiny preset, made smaller still, batch 2; no eval, no test sentences: only the training machinery is tested
TINY_YAML = ROOT / "tts" / "vits" / "configs" / "tiny.yaml"
# its sizes as --set, for a script that names its own config (tts/train_rtx5090.sh); its lr_gamma and cudnn_benchmark
# only give the tests the schema's defaults, and such a run keeps its config's (as make gpu-check's dry run does)
TINY_SETS = file_overrides(TINY_YAML, skip=("lr_gamma", "cudnn_benchmark"))


def _corpus(root: Path, speakers: list[str]) -> Path:
    audio = root / "audio"
    audio.mkdir(parents=True)
    rng = np.random.default_rng(0)
    lines = []
    for s, spk in enumerate(speakers):
        for i, text in enumerate(TEXTS):
            t = np.arange(int(1.3 * SR)) / SR
            f0 = 110 + 40 * s + 10 * i
            wav = (0.3 * np.sin(2 * np.pi * f0 * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 4 * t))
                   + 0.01 * rng.standard_normal(len(t))).astype(np.float32)
            (audio / spk).mkdir(exist_ok=True)
            sf.write(audio / spk / f"{i:02d}.wav", wav, SR, subtype="PCM_16")
            lines.append(f"{spk}/{i:02d}|{text}")
    (root / "metadata.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    cfg = TrainConfig()
    cfg.data.eval_split_size = 1
    cfg.data.trim_silence = False  # tones: no speech for the Silero VAD to keep
    out = root / "prepared"
    prepare(root / "metadata.csv", audio, out, cfg, quiet=True, speaker_from_path=True)
    return out


@pytest.fixture(scope="module")
def data_one(tmp_path_factory) -> Path:
    return _corpus(tmp_path_factory.mktemp("one"), ["anna"])


@pytest.fixture(scope="module")
def data_two(tmp_path_factory) -> Path:
    return _corpus(tmp_path_factory.mktemp("two"), ["anna", "bobur"])


def _args(data: Path, run: Path, *extra: str, steps: int) -> list[str]:
    sets = [f"max_steps={steps}", *extra]
    return ["--config", str(TINY_YAML), "--data_dir", str(data), "--run_dir", str(run), "--device", "cpu",
            *sum((["--set", s] for s in sets), [])]


def _states(ckpt: Path) -> dict:
    c = load_checkpoint(ckpt)
    return {"models": c["models"], "optimizers": c["optimizers"], "counters": c["counters"]}


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b


@pytest.fixture(scope="module")
def straight_run(data_one, tmp_path_factory) -> Path:
    """4 steps in one go (crosses an epoch boundary: 5 items, batch 2, drop_last → 2 per epoch)."""
    run = tmp_path_factory.mktemp("straight")
    assert train_mod.main(_args(data_one, run, steps=4)) == 0
    return run


def test_steps_and_exact_resume(straight_run, data_one, tmp_path, capsys):
    ckpts = sorted((straight_run / "checkpoints").glob("vits_*.pt"))
    assert [p.name for p in ckpts] == ["vits_00000002.pt", "vits_00000004.pt"]
    # 2 steps, stop, resume, 2 more → bitwise the same weights, optimizer moments and counters
    run = tmp_path / "resumed"
    assert train_mod.main(_args(data_one, run, steps=2)) == 0
    out = capsys.readouterr().out
    assert "parameters: generator" in out and "used at inference" in out
    assert "lr_generator = lr_discriminator plan over 2 updates" in out and (run / "lr_schedule.png").is_file()
    assert "grad_norm_g=" in out and "clipped_g=" in out  # pre-clip norm and clipped fraction per line
    assert train_mod.main(_args(data_one, run, steps=4) + ["--resume", "auto"]) == 0
    assert "resumed from" in capsys.readouterr().out
    a = _states(straight_run / "checkpoints" / "vits_00000004.pt")
    b = _states(run / "checkpoints" / "vits_00000004.pt")
    assert a["counters"]["step"] == 4 and a["counters"]["epoch"] == 1 and a["counters"]["batch_in_epoch"] == 2
    assert _equal(a, b)
    first = _states(straight_run / "checkpoints" / "vits_00000002.pt")
    assert not _equal(first["models"], a["models"])  # training changed the weights


def test_frame_budget_batches_train_and_resume_exactly(data_one, tmp_path, capsys):
    """max_frames_per_batch below one item's frames: each item is a batch alone (a step per item, not
    per 2 of batch 2); 1 step, stop, resume to 2 → bitwise the 2 straight steps."""
    budget = ("max_frames_per_batch=1",)
    straight, run = tmp_path / "straight", tmp_path / "resumed"
    assert train_mod.main(_args(data_one, straight, *budget, steps=2)) == 0
    n = re.search(r"data: (\d+) train / .* (\d+) steps per epoch", capsys.readouterr().out)
    assert n and n[1] == n[2]
    assert train_mod.main(_args(data_one, run, *budget, steps=1)) == 0
    assert train_mod.main(_args(data_one, run, *budget, steps=2) + ["--resume", "auto"]) == 0
    a = _states(straight / "checkpoints" / "vits_00000002.pt")
    b = _states(run / "checkpoints" / "vits_00000002.pt")
    assert a["counters"]["batch_in_epoch"] == 2 and _equal(a, b)


def test_nonfinite_steps_skip_then_stop(data_one, tmp_path, monkeypatch, capsys):
    run = tmp_path / "nan"
    real = train_mod.VitsTrainer._generator_losses

    def poisoned(self, *args, **kwargs):
        losses = real(self, *args, **kwargs)
        if self.step >= 2:  # steps 3, 4, ... produce NaN
            losses["total"] = losses["total"] * float("nan")
        return losses

    monkeypatch.setattr(train_mod.VitsTrainer, "_generator_losses", poisoned)
    good = None
    cfg = load_config(TINY_YAML, TrainConfig, ["max_steps=20", "max_nonfinite_steps=3"],
                      extra={"data_dir": str(data_one), "run_dir": str(run)})
    trainer = train_mod.VitsTrainer(cfg, setup_distributed("cpu"))
    with pytest.raises(NonFiniteError, match="3 consecutive"):
        try:
            trainer.fit()
        finally:
            good = {k: v.clone() for k, v in trainer.generator.state_dict().items()}
    # steps 3, 4 and 5 skipped; the streak is judged on the device's counters when they are read (the log after
    # step 5), so the run stops there
    assert trainer.step == 5
    assert trainer.guards["generator"].skipped_total == 3
    assert all(torch.isfinite(v).all() for v in good.values() if v.is_floating_point())  # never stepped on NaN
    ckpts = sorted((run / "checkpoints").glob("vits_*.pt"))
    assert [p.name for p in ckpts] == ["vits_00000002.pt"]  # the last good one, nothing newer
    state = load_checkpoint(ckpts[0])
    assert all(torch.isfinite(v).all() for v in state["models"]["generator"].values() if v.is_floating_point())
    # the CLI exits non-zero
    monkeypatch.setattr(train_mod.VitsTrainer, "_generator_losses", poisoned)
    assert train_mod.main(_args(data_one, tmp_path / "nan2", "max_nonfinite_steps=2", steps=20)) == 3
    assert "consecutive steps had non-finite" in capsys.readouterr().err


def test_init_from_other_vocabulary_and_speakers(straight_run, data_two, tmp_path, capsys):
    src = load_checkpoint(straight_run / "checkpoints" / "vits_00000004.pt")
    emb = src["models"]["generator"]["enc_p.emb.weight"]
    src["models"]["generator"]["enc_p.emb.weight"] = torch.cat([emb, torch.randn(5, emb.size(1))])  # bigger vocab
    ckpt = save_atomic(src, tmp_path / "other_vocab.pt")
    cfg = load_config(TINY_YAML, TrainConfig, ["max_steps=1"],
                      extra={"data_dir": str(data_two), "run_dir": str(tmp_path / "ft")})
    trainer = train_mod.VitsTrainer(cfg, setup_distributed("cpu"), init_from=str(ckpt))
    out = capsys.readouterr().out
    assert "enc_p.emb.weight: checkpoint (44, 32) vs model (39, 32)" in out
    assert "re-initialised (not in checkpoint)" in out and "emb_g.weight" in out  # 1 → 2 speakers
    gen = trainer.generator.state_dict()
    assert trainer.generator.n_speakers == 2
    assert torch.equal(gen["dec.conv_pre.weight"], src["models"]["generator"]["dec.conv_pre.weight"])
    assert not torch.equal(gen["enc_p.emb.weight"], emb[: gen["enc_p.emb.weight"].size(0)])
    trainer.fit()
    assert (tmp_path / "ft" / "checkpoints" / "vits_00000001.pt").is_file()


def test_synthesize_cli_and_onnx_export(straight_run, tmp_path, capsys):
    ckpt = straight_run / "checkpoints" / "vits_00000004.pt"
    out = tmp_path / "s.wav"
    with pytest.warns(UserWarning, match="U\\+2603"):
        rc = synthesize.main(["--checkpoint", str(ckpt), "--text", "Салом, 25 ☃ дунё!", "--out", str(out),
                              "--speaker", "anna", "--length_scale", "1.2"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "RTF" in printed and "salom, yigirma besh" in printed
    wav, sr = sf.read(out)
    assert sr == SR and len(wav) > 0 and len(wav) % 256 == 0
    assert synthesize.main(["--checkpoint", str(ckpt), "--text", "a", "--speaker", "nobody"]) == 2
    # the scales a flag leaves out are the checkpoint config's, as in the ONNX export and the samples
    slow = load_checkpoint(ckpt)
    slow["config"]["length_scale"] = 2.0
    slow_ckpt = save_atomic(slow, tmp_path / "slow.pt")
    lengths = {}
    for name, path, flags in (("config 2.0", slow_ckpt, []), ("flag 1.0", slow_ckpt, ["--length_scale", "1.0"])):
        assert synthesize.main(["--checkpoint", str(path), "--text", "Salom dunyo.", "--out", str(tmp_path / f"{name}.wav"),
                                "--noise_scale", "0", "--noise_scale_w", "0", *flags]) == 0
        lengths[name] = len(sf.read(tmp_path / f"{name}.wav")[0])
    assert lengths["config 2.0"] > 1.6 * lengths["flag 1.0"]
    capsys.readouterr()

    onnx_path = tmp_path / "m.onnx"
    assert export_onnx.main(["--checkpoint", str(ckpt), "--out", str(onnx_path)]) == 0
    assert "onnxruntime matches PyTorch" in capsys.readouterr().out
    # and once more by hand, on a sentence of another length, with all noise at 0
    model, cfg, _ = synthesize.load_generator(ckpt)
    import onnxruntime as ort

    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    x = synthesize.text_to_input("Ertaga soat 9:30 da uchrashamiz.", cfg.data.add_blank)
    got = export_onnx.run_onnx(sess, x, (0.0, 1.0, 0.0))
    ref, _, _ = model.infer(x, torch.tensor([x.size(1)]), None, 0.0, 1.0, 0.0)
    assert got.shape == tuple(ref.shape) and np.abs(got - ref.numpy()).max() < 1e-3


def test_train_rtx5090_sh_tiny_run(data_one, tmp_path):
    run = tmp_path / "sh"
    sets = sum((["--set", s] for s in [*TINY_SETS, "max_steps=1"]), [])
    env = {**os.environ, "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(ROOT / "tts" / "train_rtx5090.sh"), "--data_dir", str(data_one),
                           "--run_dir", str(run), "--device", "cpu", *sets],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "uzbek_vits_rtx5090" in proc.stdout  # the RTX 5090 config was used
    assert (run / "checkpoints" / "vits_00000001.pt").is_file()


@pytest.mark.filterwarnings("ignore:Seems like `optimizer.step\\(\\)` has been overridden")
def test_gradient_clipping_really_clips_and_bf16_losses_are_fp32(data_one, tmp_path):
    cfg = load_config(TINY_YAML, TrainConfig, ["max_steps=1", "clip_grad_norm=0.01",
                                          "precision=bf16-mixed"],
                      extra={"data_dir": str(data_one), "run_dir": str(tmp_path / "clip")})
    trainer = train_mod.VitsTrainer(cfg, setup_distributed("cpu"))
    seen = {}
    for name, opt in (("g", trainer.g_opt), ("d", trainer.d_opt)):
        real_step = opt.step

        def step(*a, _name=name, _opt=opt, _real=real_step, **k):
            grads = [p.grad for group in _opt.param_groups for p in group["params"] if p.grad is not None]
            seen[_name] = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))
            return _real(*a, **k)

        opt.step = step
    metrics = trainer.train_step(next(iter(trainer.loader)))
    assert trainer.precision.amp_dtype == torch.bfloat16
    assert all(v.dtype == torch.float32 and torch.isfinite(v) for k, v in metrics.items() if k.startswith("loss"))
    assert float(metrics["grad_norm_g"]) > 0.01 and float(metrics["grad_norm_d"]) > 0.01  # before clipping
    assert seen["g"] <= 0.01 * 1.001 and seen["d"] <= 0.01 * 1.001  # what the optimizers saw


def test_c_stft_adds_the_multi_resolution_stft_loss_to_the_generator(data_one, tmp_path):
    """c_stft = 0 is the paper's objective (no term); > 0 adds the MR-STFT distance of the decoded
    segment, weighted, to the generator's total."""
    def first_step(c_stft: float) -> dict:
        cfg = load_config(TINY_YAML, TrainConfig, ["max_steps=1", f"c_stft={c_stft}"],
                          extra={"data_dir": str(data_one), "run_dir": str(tmp_path / f"stft{c_stft}")})
        torch.manual_seed(0)
        trainer = train_mod.VitsTrainer(cfg, setup_distributed("cpu"))
        return trainer.train_step(next(iter(trainer.loader)))

    plain, with_stft = first_step(0.0), first_step(2.0)
    assert "loss_stft" not in plain
    assert float(with_stft["loss_stft"]) > 0 and torch.isfinite(with_stft["loss_stft"])
    parts = sum(float(v) for k, v in with_stft.items() if k.startswith("loss_") and k not in ("loss_total", "loss_disc"))
    assert abs(parts - float(with_stft["loss_total"])) < 1e-3 * abs(parts)


def _trainer(data: Path, run: Path, *sets: str) -> train_mod.VitsTrainer:
    cfg = load_config(TINY_YAML, TrainConfig, ["max_steps=4", *sets],
                      extra={"data_dir": str(data), "run_dir": str(run)})
    torch.manual_seed(0)
    return train_mod.VitsTrainer(cfg, setup_distributed("cpu"))


def test_c_energy_adds_the_frame_energy_loss(data_one, tmp_path):
    """c_energy = 0 adds nothing; > 0 adds the weighted frame-energy L1 to the generator's total."""
    plain = _trainer(data_one, tmp_path / "e0").train_step
    trainer = _trainer(data_one, tmp_path / "e1", "c_energy=3.0")
    batch = next(iter(trainer.loader))
    assert "loss_energy" not in plain(batch)
    metrics = trainer.train_step(batch)
    assert float(metrics["loss_energy"]) > 0 and torch.isfinite(metrics["loss_energy"])
    parts = sum(float(v) for k, v in metrics.items() if k.startswith("loss_") and k not in ("loss_total", "loss_disc"))
    assert abs(parts - float(metrics["loss_total"])) < 1e-3 * abs(parts)


def test_discriminator_waits_for_its_start_step(data_one, tmp_path):
    """Before discriminator_train_start_steps the critics neither train nor enter the generator's loss
    (and D's schedule waits); from that step on both do. A negative value is refused by name."""
    trainer = _trainer(data_one, tmp_path / "warm", "discriminator_train_start_steps=2")
    d0 = {k: v.clone() for k, v in trainer.discriminator.state_dict().items()}
    g0 = {k: v.clone() for k, v in trainer.generator.state_dict().items()}
    batch = next(iter(trainer.loader))
    metrics = trainer.train_step(batch)
    trainer.step += 1
    assert not {"loss_fm", "loss_gen", "loss_disc"} & set(metrics)
    assert all(torch.equal(v, trainer.discriminator.state_dict()[k]) for k, v in d0.items())  # D untouched
    assert any(not torch.equal(v, trainer.generator.state_dict()[k]) for k, v in g0.items())  # G learned
    assert trainer.d_sched.last_epoch == 0 and trainer.g_sched.last_epoch == 1
    trainer.train_step(batch)
    trainer.step += 1
    metrics = trainer.train_step(batch)  # step 2: the critics join
    assert {"loss_fm", "loss_gen", "loss_disc"} <= set(metrics)
    assert any(not torch.equal(v, trainer.discriminator.state_dict()[k]) for k, v in d0.items())
    assert trainer.d_sched.last_epoch == 1
    with pytest.raises(Exception, match="discriminator_train_start_steps"):
        _trainer(data_one, tmp_path / "neg", "discriminator_train_start_steps=-1")


def test_lr_plan_shows_the_critics_schedule_from_their_start(data_one, tmp_path, capsys):
    """The printed plan: lr_d is 0 before discriminator_train_start_steps and starts its schedule there."""
    assert train_mod.main(_args(data_one, tmp_path / "plan", "discriminator_train_start_steps=2", "lr_scheduler_per=step",
                                "lr_gamma=0.5", steps=4)) == 0
    out = capsys.readouterr().out
    d_line = next(line for line in out.splitlines() if line.startswith("lr_discriminator plan"))
    g_line = next(line for line in out.splitlines() if line.startswith("lr_generator plan"))
    assert "| 25% 0 (0x) |" in d_line and "100% 0.0001 (0.5x)" in d_line  # updates 1 and 3: before D, D's second
    assert "100% 2.5e-05" in g_line  # G: 2e-4 * 0.5^3


def test_a_signal_on_another_rank_stops_this_one_at_the_same_step(data_one, tmp_path, monkeypatch, capsys):
    """The stop decision goes through any_rank: when another DDP rank was signalled (any_rank says
    True though this rank saw nothing), this rank stops too, at that step, saves and says so."""
    import common.stopping as stopping

    monkeypatch.setattr(stopping, "any_rank", lambda flag: True)
    run = tmp_path / "r"
    assert train_mod.main(_args(data_one, run, "save_step=100", steps=6)) == exit_codes.INTERRUPTED
    out = capsys.readouterr().out
    assert "stopped by signal at step 1" in out
    assert (run / "checkpoints" / "vits_00000001.pt").is_file()


@pytest.fixture()
def eager_compile(monkeypatch):
    """torch.compile with dynamo's 'eager' backend: the graph capture of our modules is tested,
    inductor's code generation (minutes on this CPU) is not."""
    real = torch.nn.Module.compile
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kw: real(self, backend="eager"))


def test_compile_channels_last_deterministic_one_run(data_one, tmp_path, eager_compile, capsys):
    sets = ["max_steps=1", "compile=true", "channels_last=true", "deterministic=true",
            "data.num_buckets=2", "batch_size=1"]
    cfg = load_config(TINY_YAML, TrainConfig, sets, extra={"data_dir": str(data_one), "run_dir": str(tmp_path / "run")})
    try:
        trainer = train_mod.VitsTrainer(cfg, setup_distributed("cpu"))
        out = capsys.readouterr().out
        assert torch.are_deterministic_algorithms_enabled()
        assert "applied: deterministic algorithms on" in out
        # channels_last: the period critics' 4-D weights; the 1-D convs are named as not applicable
        assert "channels_last on the period critics' " in out and "1-D convs" in out
        conv2d = next(m for m in trainer.discriminator.modules() if isinstance(m, torch.nn.Conv2d))
        assert conv2d.parametrizations.weight.original1.is_contiguous(memory_format=torch.channels_last)
        # compile: in place on the decoder and every critic
        assert trainer.generator.dec._compiled_call_impl is not None
        assert all(d._compiled_call_impl is not None for d in trainer.discriminator.discriminators)
        # compile → bucket shapes: every batch of an epoch has one of the few allowed shapes
        allowed = set(trainer.shapes.shapes())
        assert 1 <= len(allowed) <= 2 and "bucket shapes" in out
        trainer.sampler.set_epoch(0)
        for batch in trainer.loader:
            assert (batch["ids"].size(1), batch["spec"].size(2)) in allowed
            assert int(batch["spec_len"].max()) <= batch["spec"].size(2)
        trainer.fit()
        assert trainer.step == 1
    finally:
        torch.use_deterministic_algorithms(False)
    # checkpoint keys are the plain ones: a fresh, uncompiled model loads them strictly
    ckpt = load_checkpoint(sorted((tmp_path / "run" / "checkpoints").glob("vits_*.pt"))[-1])
    gen, disc = train_mod.build_models(cfg, 1)
    gen.load_state_dict(ckpt["models"]["generator"])
    disc.load_state_dict(ckpt["models"]["discriminator"])


def test_without_compile_or_cuda_benchmark_batches_pad_to_the_longest(data_one, tmp_path):
    cfg = load_config(TINY_YAML, TrainConfig, ["cudnn_benchmark=true"],
                      extra={"data_dir": str(data_one), "run_dir": str(tmp_path / "run")})
    trainer = train_mod.VitsTrainer(cfg, setup_distributed("cpu"))
    assert trainer.shapes is None  # cudnn.benchmark is a CUDA setting: on the CPU nothing to tune
    assert any("cudnn_benchmark requested but this is not a CUDA device" in n for n in trainer.precision.notes)


def test_two_processes_end_a_run_together_when_the_last_step_was_saved_but_not_evaluated(data_one, tmp_path):
    """torchrun, 2 gloo processes: the last step (2) is a save step and no evaluation ran at it, so the
    end of the run evaluates (rank 0 only) and saves again. Whether to save must be every rank's
    decision: it was rank 0's evaluation result, so rank 0 saved alone (a collective the others never
    joined) and the run failed at its last checkpoint."""
    run = tmp_path / "ddp"
    sets = ["max_steps=2", "run_eval=true", "save_step=2", "val_check_interval=0"]
    run_torchrun(["--master_port", "29533", "-m", "tts.vits.train", "--config", str(TINY_YAML), "--data_dir", str(data_one), "--run_dir", str(run),
                  "--device", "cpu", *sum((["--set", s] for s in sets), [])])
    ckpt = load_checkpoint(CheckpointManager(run / "checkpoints", prefix="vits").latest())
    assert ckpt["counters"]["step"] == 2


def test_an_unknown_test_speaker_is_refused_at_start(data_two, tmp_path, capsys):
    """A typo in test_speaker gave speaker 0's test sentences at every evaluation, silently."""
    assert train_mod.main(_args(data_two, tmp_path / "r", "test_speaker=bobbur", steps=1)) == 2
    assert "test_speaker 'bobbur' is not a speaker of" in capsys.readouterr().err


def test_a_prepare_only_data_key_on_the_training_command_line_is_noted(data_one, tmp_path, capsys):
    """data.max_audio_len filters utterances when the data is prepared; given to training it changes nothing,
    and one line says so."""
    assert train_mod.main(_args(data_one, tmp_path / "r", "data.max_audio_len=8", steps=1)) == 0
    assert ("note: data.max_audio_len (--set data.max_audio_len=8): read when the data is prepared "
            "(tts/prepare_data.py)") in capsys.readouterr().out


def test_optimizer_fused_reaches_both_optimizers_and_a_resume_with_it_changed(data_one, tmp_path, capsys):
    """optimizer_fused (common.muon.build_optimizer): torch's fused AdamW kernel; set on a resume it takes
    effect (the saved param groups would otherwise bring the old kernel back: common.checkpoint.this_runs_kernels)."""
    run = tmp_path / "r"
    assert train_mod.main(_args(data_one, run, "save_step=1", steps=1)) == 0
    groups = lambda step: [g for name in ("generator", "discriminator")  # noqa: E731
                           for g in load_checkpoint(run / "checkpoints" / f"vits_{step:08d}.pt")["optimizers"][name]
                           ["param_groups"]]
    assert not any(g["fused"] for g in groups(1))  # the CPU default: the per-tensor path
    assert train_mod.main(_args(data_one, run, "save_step=1", "optimizer_fused=true", steps=2)
                          + ["--resume", "auto"]) == 0
    assert all(g["fused"] is True for g in groups(2))
    capsys.readouterr()  # optimizer_batched_ns is Muon's: with AdamW one line, exit 2
    assert train_mod.main(_args(data_one, tmp_path / "x", "optimizer_batched_ns=true", steps=1)) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: optimizer_batched_ns=true: AdamW does not take it") and "\n" not in err, err
