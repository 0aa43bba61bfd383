"""The training loop's promises: it learns, clipping clips, the LR schedule steps, non-finite
steps are skipped without touching optimizer state and repeated ones stop the run, resume is
bit-exact, Muon_AdamW's AdamW half uses the config's betas, frozen params stay frozen,
fine-tuning loads what it should; the generator update: its critic call, the generator-only warm-up,
the energy loss term."""

import copy
import hashlib
import math

import numpy as np
import pytest
import torch

from common.checkpoint import CheckpointError, load_checkpoint, save_atomic
from common.config import ConfigError
from common.training import critic_outputs_for_generator
from vocoder.config import OptimizerArgs
from vocoder.data import VocoderDataset
from vocoder.discriminators import head_outputs, split_outputs
from vocoder.layouts import to_legacy_names
from vocoder.losses import feature_matching_loss, generator_adv_loss
from vocoder.train import VocoderTrainer, build_generator, build_optimizer_from_args
from vocoder.train import main as train_main

from .conftest import DEMO_YAML, TINY_YAML, tiny_config, write_tones

QUIET = dict(device="cpu", log=lambda *a, **k: None)


def _trainer(data, run_dir, *overrides, **kw) -> VocoderTrainer:
    return VocoderTrainer(tiny_config(*overrides), data, run_dir, **QUIET, **kw)


def _batch(tr: VocoderTrainer) -> dict:
    tr.sampler.set_epoch(0)
    return next(iter(tr.loader))


def _snapshot(module) -> dict:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def test_a_few_steps_lower_the_loss(tiny_data, tmp_path):
    tr = _trainer(tiny_data, tmp_path)
    batch = _batch(tr)
    first = float(tr.train_step(batch)["loss_mel"])
    for _ in range(20):  # the quiet freshly initialised output needs ~10 steps to leave the mel floor
        last = float(tr.train_step(batch)["loss_mel"])
    assert last < 0.8 * first


def test_clip_grad_norm_really_clips(tiny_data, tmp_path):
    seen = []

    def record(opt, args, kwargs):
        grads = [p.grad for g in opt.param_groups for p in g["params"] if p.grad is not None]
        seen.append(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])).item())

    tr = _trainer(tiny_data, tmp_path, "clip_grad_norm=0.001")
    tr.g_opt.register_step_pre_hook(record)
    logs = tr.train_step(_batch(tr))
    assert float(logs["grad_norm_g"]) > 0.01  # the unclipped norm is far above the limit ...
    assert seen and seen[-1] <= 0.001 * 1.001  # ... and the optimizer saw the clipped one

    tr2 = _trainer(tiny_data, tmp_path / "b", "clip_grad_norm=null")  # measured, not clipped
    seen.clear()
    tr2.g_opt.register_step_pre_hook(record)
    logs = tr2.train_step(_batch(tr2))
    assert seen[-1] == pytest.approx(float(logs["grad_norm_g"]), rel=1e-4) and seen[-1] > 0.01


def test_lr_warmup_really_steps(tiny_data, tmp_path):
    tr = _trainer(tiny_data, tmp_path, "lr_scheduler_args.warmup_steps=4")
    base = tr.cfg.generator_optimizer_args.lr
    batch = _batch(tr)
    lrs = [tr.g_opt.param_groups[0]["lr"]]
    for _ in range(5):
        tr.train_step(batch)
        lrs.append(tr.g_opt.param_groups[0]["lr"])
    assert lrs == pytest.approx([base * min(1, k / 4) for k in range(1, 7)])


def test_non_finite_step_is_skipped_without_touching_muon_or_adam_state(tiny_data, tmp_path):
    tr = _trainer(tiny_data, tmp_path, "generator_optimizer_args.optimizer_cls=Muon_AdamW")
    batch = _batch(tr)
    tr.train_step(batch)  # creates the moment / momentum buffers
    g_params, d_params = _snapshot(tr.generator), _snapshot(tr.discriminator)
    g_opt, d_opt = copy.deepcopy(tr.g_opt.state_dict()), copy.deepcopy(tr.d_opt.state_dict())
    bad = dict(batch, mel=batch["mel"].clone())
    bad["mel"][0, 0, 0] = float("nan")
    tr.train_step(bad)
    assert tr.guards["generator"].skipped_total == 1 and tr.guards["discriminator"].skipped_total == 1
    for before, module in ((g_params, tr.generator), (d_params, tr.discriminator)):
        for k, v in module.state_dict().items():
            assert torch.equal(v, before[k]), k
    for before, opt in ((g_opt, tr.g_opt), (d_opt, tr.d_opt)):
        after = opt.state_dict()["state"]
        for idx, st in before["state"].items():
            for name, val in st.items():
                if torch.is_tensor(val):
                    assert torch.equal(after[idx][name], val), (idx, name)
    assert all(p.grad is None for p in tr.generator.parameters())
    tr.train_step(batch)  # a good step afterwards trains again
    assert tr.guards["generator"].consecutive == 0


def test_repeated_non_finite_steps_stop_with_last_good_checkpoint(tiny_data, tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    args = ["--config", str(TINY_YAML), "--data_dir", str(tiny_data), "--run_dir", str(run), "--device", "cpu"]
    assert train_main(args + ["--set", "max_updates=2"]) == 0
    ckpt = run / "checkpoints" / "model_00000002.pt"
    digest = hashlib.sha256(ckpt.read_bytes()).hexdigest()

    original = VocoderDataset.__getitem__

    def poisoned(self, key):
        item = original(self, key)
        if self.train:
            item["mel"] = torch.full_like(item["mel"], float("nan"))
        return item

    monkeypatch.setattr(VocoderDataset, "__getitem__", poisoned)
    rc = train_main(args + ["--resume", "auto", "--set", "max_updates=50", "--set", "max_nonfinite_steps=3"])
    assert rc == 3
    assert "consecutive steps had non-finite" in capsys.readouterr().err
    names = sorted(p.name for p in (run / "checkpoints").glob("model_*.pt"))
    assert names[-1] == "model_00000002.pt"
    assert hashlib.sha256(ckpt.read_bytes()).hexdigest() == digest


def test_existing_run_needs_resume_flag(tiny_data, tmp_path, capsys):
    run = tmp_path / "run"
    base = ["--config", str(TINY_YAML), "--data_dir", str(tiny_data), "--run_dir", str(run), "--device", "cpu"]
    base += ["--set", "max_updates=1"]
    assert train_main(base) == 0
    assert train_main(base) == 2 and "--resume auto" in capsys.readouterr().err
    assert train_main(base + ["--set", "crop_mel_frame=3"]) == 2
    assert "crop_mel_frames" in capsys.readouterr().err


def test_exact_resume_is_bitwise(tiny_data, tmp_path):
    """4 steps straight == 2 steps + resume + 2 steps, bitwise: weights, optimizer moments,
    scheduler, RNG-driven noise (full NSF source, noise_sigma) and the volume augmentation."""
    over = ["batch_size=1", "model_args.mini_nsf=false", "model_args.noise_sigma=0.01", "volume_aug=true",
            "volume_aug_prob=0.5", "num_sanity_val_steps=1", "val_check_interval=1",
            "lr_scheduler_args.warmup_steps=3"]
    straight = _trainer(tiny_data, tmp_path / "a", *over, "max_updates=4")
    straight.fit()
    assert (tmp_path / "a" / "lr_schedule.png").is_file()
    first = _trainer(tiny_data, tmp_path / "b", *over, "max_updates=2")
    first.fit()
    assert first.batch_in_epoch == 2 and first.epoch == 0  # stops mid-epoch (4 items, batch 1)
    resumed = _trainer(tiny_data, tmp_path / "b", *over, "max_updates=4", resume="auto")
    assert resumed.step == 2
    resumed.fit()
    a = load_checkpoint(tmp_path / "a" / "checkpoints" / "model_00000004.pt")
    b = load_checkpoint(tmp_path / "b" / "checkpoints" / "model_00000004.pt")
    for net in ("generator", "discriminator"):
        for k, v in a["models"][net].items():
            assert torch.equal(v, b["models"][net][k]), (net, k)
        for idx, st in a["optimizers"][net]["state"].items():
            for name, val in st.items():
                assert torch.equal(val, b["optimizers"][net]["state"][idx][name]), (net, idx, name)
        assert a["schedulers"][net] == b["schedulers"][net]
    assert torch.equal(a["rng"]["0"]["torch"], b["rng"]["0"]["torch"])
    assert a["counters"] == b["counters"]


def test_muon_adamw_adamw_half_uses_config_betas():
    g = build_generator(tiny_config())
    opt = build_optimizer_from_args(OptimizerArgs(optimizer_cls="Muon_AdamW", lr=3e-4, beta1=0.8, beta2=0.99), g)
    muon, adamw = opt.param_groups
    assert muon["use_muon"] and not adamw["use_muon"]
    assert adamw["betas"] == (0.8, 0.99) and adamw["lr"] == 3e-4
    assert len(muon["params"]) > 0 and len(adamw["params"]) > 0
    # weight-norm magnitudes must go to AdamW, never Muon
    assert all("original0" not in n for n in muon["param_names"])


def test_frozen_params_stay_frozen(tiny_data, tmp_path):
    tr = _trainer(tiny_data, tmp_path, "freezing_enabled=true",
                  "frozen_params=[generator.conv_pre, discriminator.fast_mpd.discriminators.0]")
    frozen = [p for n, p in tr.generator.named_parameters() if n.startswith("conv_pre")]
    frozen += list(tr.discriminator["fast_mpd"].discriminators[0].parameters())
    before = [p.detach().clone() for p in frozen]
    live_before = tr.generator.conv_post.parametrizations.weight.original1.detach().clone()
    in_opt = {id(p) for o in (tr.g_opt, tr.d_opt) for g in o.param_groups for p in g["params"]}
    assert not any(id(p) in in_opt for p in frozen)
    batch = _batch(tr)
    for _ in range(2):
        tr.train_step(batch)
    assert all(torch.equal(p, b) for p, b in zip(frozen, before))
    assert all(not p.requires_grad for p in frozen)
    assert not torch.equal(tr.generator.conv_post.parametrizations.weight.original1, live_before)
    with pytest.raises(ConfigError, match="matches no parameter"):
        _trainer(tiny_data, tmp_path / "x", "freezing_enabled=true", "frozen_params=[generator.nothing]")


def test_finetune_loads_all_but_ignored_params(tiny_data, tmp_path):
    src = _trainer(tiny_data, tmp_path / "src", "max_updates=1")
    src.fit()
    ckpt = tmp_path / "src" / "checkpoints" / "model_00000001.pt"
    trained = load_checkpoint(ckpt)["models"]["generator"]
    torch.manual_seed(7)  # the trainer builds its models right after manual_seed(cfg.seed)
    fresh = build_generator(tiny_config("seed=7")).state_dict()
    ft = _trainer(tiny_data, tmp_path / "ft", "seed=7", "finetune_enabled=true", f"finetune_ckpt_path={ckpt}",
                  "finetune_ignored_params=[conv_post]")
    for k, v in ft.generator.state_dict().items():
        if k.startswith("conv_post"):
            assert torch.equal(v, fresh[k]) and not torch.equal(v, trained[k]), k
        else:
            assert torch.equal(v, trained[k]), k
    # a released-style checkpoint: Lightning state_dict with classic weight_g / weight_v names
    legacy = {"state_dict": {f"generator.{k}": v for k, v in to_legacy_names(trained).items()}}
    save_atomic(legacy, tmp_path / "released.ckpt")
    ft2 = _trainer(tiny_data, tmp_path / "ft2", "seed=7", "finetune_enabled=true",
                   f"finetune_ckpt_path={tmp_path / 'released.ckpt'}")
    assert all(torch.equal(v, trained[k]) for k, v in ft2.generator.state_dict().items())
    with pytest.raises(CheckpointError, match="shape"):
        _trainer(tiny_data, tmp_path / "ft3", "model_args.upsample_initial_channel=64", "finetune_enabled=true",
                 f"finetune_ckpt_path={ckpt}", "finetune_strict_shapes=true")


def test_pc_aug_step(tiny_data, tmp_path):
    tr = _trainer(tiny_data, tmp_path, "pc_aug=true", "pc_aug_rate=0.5", "pc_aug_key=5")
    logs = tr.train_step(_batch(tr))
    assert math.isfinite(float(logs["loss_pc_wave"])) and math.isfinite(float(logs["loss_g"]))


def test_volume_and_key_augmentation(tiny_data):
    from vocoder.data import load_manifest

    cfg = tiny_config()
    ids = load_manifest(tiny_data, cfg)["train"]
    key = (0, 3, 0)
    plain = VocoderDataset(tiny_data, ids, cfg)[key]
    loud = VocoderDataset(tiny_data, ids, tiny_config("volume_aug=true", "volume_aug_prob=1.0"))[key]
    ratio = (loud["audio"] / plain["audio"].where(plain["audio"].abs() > 1e-3, torch.tensor(float("nan"))))
    gain = np.nanmedian(ratio.numpy())
    assert gain != pytest.approx(1.0) and np.nanstd(ratio.numpy()) < 1e-3 * abs(gain)
    above = plain["mel"] > math.log(1e-5) + 1
    shift = (loud["mel"] - plain["mel"])[above]
    assert torch.allclose(shift, torch.full_like(shift, math.log(gain)), atol=1e-3)

    fast = VocoderDataset(tiny_data, ids, tiny_config("key_aug=true", "key_aug_prob=1.0", "aug_min=1.3",
                                                      "aug_max=1.3"))[key]
    assert fast["mel"].shape == plain["mel"].shape and fast["audio"].shape == plain["audio"].shape
    assert fast["f0"].median() / plain["f0"].median() == pytest.approx(1.3, rel=0.08)


def test_signal_saves_and_exits_then_resumes(tiny_data, tmp_path, monkeypatch):
    """SIGINT/SIGTERM (simulated: GracefulExit.requested turns True after step 2) saves a
    checkpoint at that step and stops; --resume auto continues from it."""
    import common.stopping as stopping

    class SignalAfterTwoSteps(stopping.GracefulExit):
        checks = 0

        @property
        def requested(self):
            SignalAfterTwoSteps.checks += 1
            return SignalAfterTwoSteps.checks >= 2

        @requested.setter
        def requested(self, value):
            pass

    monkeypatch.setattr(stopping, "GracefulExit", SignalAfterTwoSteps)
    result = _trainer(tiny_data, tmp_path, "max_updates=10").fit()
    assert result.stopped == "signal" and result.step == 2
    assert (tmp_path / "checkpoints" / "model_00000002.pt").is_file()
    monkeypatch.undo()
    resumed = _trainer(tiny_data, tmp_path, "max_updates=3", resume="auto")
    assert resumed.step == 2
    assert resumed.fit().step == 3


def test_worker_counts_reach_the_pools(tiny_data, tmp_path, monkeypatch):
    tr = _trainer(tiny_data, tmp_path, "num_workers=2", "dataloader_prefetch_factor=3")
    assert tr.loader.num_workers == 2 and tr.loader.prefetch_factor == 3 and tr.loader.persistent_workers
    import vocoder.prepare_data as prep

    seen = {}

    class Recorder:  # records the pool size, runs inline (test_prepare covers real processes)
        def __init__(self, max_workers=None, **kw):
            seen["max_workers"] = max_workers

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def map(self, fn, jobs, chunksize=1):
            return map(fn, jobs)

    monkeypatch.setattr(prep, "process_pool", Recorder)
    from .conftest import write_tones

    write_tones(tmp_path / "w", 2, 22050, seconds=0.6)
    prep.prepare(tiny_config("binarization_args.num_workers=2"), [tmp_path / "w"], tmp_path / "bin",
                 log=lambda *a: None)
    assert seen["max_workers"] == 2


@pytest.mark.parametrize("plots, expected", [(2, 2), (32, 3)])
def test_num_valid_plots_sets_how_many_files_are_logged(tiny_data, tmp_path, plots, expected):
    """num_valid_plots files (at most the validation set) are logged as audio + mel figure."""
    tr = _trainer(tiny_data, tmp_path, f"num_valid_plots={plots}")
    tr.valid_set = [dict(tr.valid_set[0], name=f"v{i}") for i in range(3)]  # three held-out files
    audio, figures = [], []
    tr.writer.audio = lambda tag, *a, **k: audio.append(tag)
    tr.writer.figure = lambda tag, *a, **k: figures.append(tag)
    tr.validate()
    assert len([t for t in audio if t.endswith("/generated")]) == expected
    assert len(figures) == expected

# ----------------------------------------------------------------------------- the generator update
# The G update's critic call (real half without grad, fake half with grad) gives the generator the
# same gradients as a single call on cat([real, fake]), for every critic kind including the
# spectral-norm MSD sub-critic.


def _g_grads(tr: VocoderTrainer, d_real: dict, d_fake: dict, b: int) -> list[torch.Tensor]:
    adv, _ = generator_adv_loss(d_fake)
    fm, _ = feature_matching_loss(d_real, head_outputs(d_fake, b))
    params = [p for p in tr.generator.parameters() if p.requires_grad]
    return torch.autograd.grad(adv + fm, params, allow_unused=True, retain_graph=True)


def test_split_critic_call_gives_the_concatenated_calls_grads(tiny_data, tmp_path):
    tr = VocoderTrainer(tiny_config("model_args.discriminators=[mpd,msd,mrd,fast_mpd]"), tiny_data, tmp_path,
                        **QUIET)
    tr.sampler.set_epoch(0)
    batch = next(iter(tr.loader))
    real, b = batch["audio"], batch["audio"].shape[0]
    fake = tr.generator(batch["mel"], batch["f0"])
    tr.discriminator.requires_grad_(False)  # the G update freezes the critics (common.training.frozen)
    spectral_state = {k: v.clone() for k, v in tr.discriminator.state_dict().items()}  # power-iteration u, v

    d_real, d_fake = split_outputs(tr._critics(torch.cat([real, fake])), b)  # the former call
    old = _g_grads(tr, d_real, d_fake, b)
    u_after_old = {k: v.clone() for k, v in tr.discriminator.state_dict().items()}

    tr.discriminator.load_state_dict(spectral_state)
    d_real, d_fake = critic_outputs_for_generator(tr._critics, real, fake)
    new = _g_grads(tr, d_real, d_fake, b)

    assert sum(g is not None for g in new) > 10
    for go, gn in zip(old, new):
        assert (go is None) == (gn is None)
        if go is not None:
            torch.testing.assert_close(gn, go, rtol=1e-4, atol=1e-5 * go.abs().max().item() + 1e-9)
    # one spectral-norm power iteration per G update, as the single call did
    for k, v in tr.discriminator.state_dict().items():
        torch.testing.assert_close(v, u_after_old[k], rtol=1e-5, atol=1e-6)


def test_generator_only_warmup_leaves_the_critics_untouched_until_their_start(tiny_data, tmp_path):
    """discriminator_train_start_steps=2: steps 0-1 update the generator from the reconstruction
    losses alone (no critic update, no adversarial term logged); step 2 updates the critics."""
    tr = VocoderTrainer(tiny_config("discriminator_train_start_steps=2"), tiny_data, tmp_path, **QUIET)
    tr.sampler.set_epoch(0)
    batch = next(iter(tr.loader))
    d0 = [p.detach().clone() for p in tr.discriminator.parameters()]
    g0 = [p.detach().clone() for p in tr.generator.parameters()]
    for step in range(2):
        tr.step = step
        logs = tr.train_step(batch)
        assert "loss_d" not in logs and "loss_mel" in logs
    assert all(torch.equal(a, b) for a, b in zip(d0, tr.discriminator.parameters()))
    assert not all(torch.equal(a, b) for a, b in zip(g0, tr.generator.parameters()))
    tr.step = 2
    logs = tr.train_step(batch)
    assert "loss_d" in logs
    assert not all(torch.equal(a, b) for a, b in zip(d0, tr.discriminator.parameters()))


def test_energy_loss_weight_adds_its_term_to_the_generator_loss(tiny_data, tmp_path):
    """lab_aux_energyloss 0 (the default, as the references) adds nothing; > 0 logs and adds the
    weighted frame-energy L1."""
    def first_logs(*sets: str) -> dict:
        torch.manual_seed(0)
        tr = VocoderTrainer(tiny_config("discriminator_train_start_steps=5", *sets), tiny_data,
                            tmp_path / str(len(sets)), **QUIET)
        tr.sampler.set_epoch(0)
        return tr.train_step(next(iter(tr.loader)))

    plain, weighted = first_logs("lab_aux_energyloss=0"), first_logs("lab_aux_energyloss=4.0", "use_stftloss=true")
    assert "loss_energy" not in plain
    assert float(weighted["loss_energy"]) > 0
    torch.testing.assert_close(weighted["loss_g"], weighted["loss_mel"] + weighted["loss_energy"]
                               + weighted.get("loss_stft", torch.zeros(())))


def test_a_data_dir_without_a_manifest_gets_the_prepare_command_that_fits(tmp_path, capsys):
    raw = tmp_path / "my_wavs"
    write_tones(raw, 1, 22050, seconds=0.2)  # the folder of recordings itself, given as --data_dir
    for data_dir, expected in (
            (raw, f"error: {raw} holds raw audio, not a dataset made by vocoder/prepare_data.py (no manifest.json): "
                  f"prepare it first with `python vocoder/prepare_data.py --config <this run's config> --input {raw} "
                  f"--output {tmp_path / 'my_wavs_prepared'}`, then train with --data_dir {tmp_path / 'my_wavs_prepared'}"),
            (tmp_path / "bin", f"error: {tmp_path / 'bin' / 'manifest.json'} not found: --data_dir must be a folder "
                               "made by vocoder/prepare_data.py; make it with `python vocoder/prepare_data.py --config "
                               f"<this run's config> --input <audio folders> --output {tmp_path / 'bin'}`")):
        assert train_main(["--config", str(TINY_YAML), "--data_dir", str(data_dir), "--run_dir", str(tmp_path / "run"),
                           "--device", "cpu"]) == 2
        err = capsys.readouterr().err
        assert err.strip() == expected and "Traceback" not in err


@pytest.mark.parametrize("key, value", [("pe", "pyin"), ("f0_extractor", "fcpe")])
def test_a_prepare_only_key_on_the_training_command_line_is_noted_and_a_changed_f0_refused(tiny_data, tmp_path, capsys,
                                                                                           key, value):
    """val_num and pe (alias f0_extractor) are read when the data is prepared: training says so in one line (one
    --set list for both commands is common), and refuses data whose f0 was extracted another way than the config's."""
    rc = train_main(["--config", str(DEMO_YAML), "--data_dir", str(tiny_data), "--run_dir", str(tmp_path / "r"),
                     "--set", "val_num=3", "--set", f"{key}={value}"])
    printed = capsys.readouterr()
    assert f"note: val_num (--set val_num=3), pe (--set {key}={value}): read when the data is prepared" in printed.out
    assert rc == 2 and f"pe: data parselmouth vs config {value}" in printed.err


def test_fused_and_batched_ns_reach_each_optimizer_and_name_their_block_when_refused():
    from common.config import ConfigError

    g = build_generator(tiny_config())
    assert build_optimizer_from_args(OptimizerArgs(fused=True), g).defaults["fused"] is True
    assert build_optimizer_from_args(OptimizerArgs(optimizer_cls="Muon_AdamW", fused=True), g).fused is True
    assert build_optimizer_from_args(OptimizerArgs(optimizer_cls="Muon_AdamW", batched_ns=True), g).batched_ns
    with pytest.raises(ConfigError, match="^discriminator_optimizer_args.fused=true: torch.optim.SGD does not take"):
        build_optimizer_from_args(OptimizerArgs(optimizer_cls="torch.optim.SGD", fused=True), g,
                                  "discriminator_optimizer_args")
