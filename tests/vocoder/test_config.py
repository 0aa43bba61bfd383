import pytest
import yaml

from common.config import ConfigError, load_config
from vocoder.config import VocoderConfig, task_kind

from .conftest import DEMO_YAML, GPU_YAML, RTX_YAML, tiny_config


def test_base_hifi_gpu_table_values():
    c = load_config(GPU_YAML, VocoderConfig)
    assert c.task_cls == "nsf_HiFigan_task.nsf_HiFigan" and c.task == "standard"
    assert c.batch_size == 16
    assert c.crop_mel_frames == 48
    assert c.model_args.upsample_initial_channel == 512
    for opt in (c.generator_optimizer_args, c.discriminator_optimizer_args):
        assert opt.optimizer_cls == "torch.optim.AdamW" and opt.lr == 1e-4
        assert (opt.beta1, opt.beta2) == (0.8, 0.99)
    assert c.precision == "32-true"
    assert (c.num_workers, c.dataloader_prefetch_factor) == (6, 4)
    assert c.binarization_args.num_workers == 8
    assert c.model_args.discriminator_periods == [3, 5, 7, 11, 17, 23, 37]
    assert c.discriminator_names == ["mpd", "msd"]
    assert c.validate_every == 2000
    assert c.max_updates == 150000
    assert c.clip_grad_norm is None
    raw = yaml.safe_load(GPU_YAML.read_text())
    assert "noise_sigma" not in raw["model_args"]  # the table's "—"
    # 44.1 kHz defaults of the issue
    a = c.audio
    assert (a.sample_rate, a.hop_length, a.n_fft, a.win_length, a.n_mels) == (44100, 512, 2048, 2048, 128)
    assert (a.fmin, a.fmax) == (40, 16000)


def test_base_hifi_rtx5090_table_values():
    c = load_config(RTX_YAML, VocoderConfig)
    assert c.task_cls == "nsf_HiFigan_fast_task.nsf_HiFigan" and c.task == "fast"
    assert c.batch_size == 32
    assert c.crop_mel_frames == 80
    assert c.model_args.upsample_initial_channel == 1024
    for opt in (c.generator_optimizer_args, c.discriminator_optimizer_args):
        assert opt.optimizer_cls == "common.muon.MuonAdamW" and opt.is_muon and opt.lr == 3e-4
        assert (opt.beta1, opt.beta2) == (0.8, 0.99)
    raw = yaml.safe_load(RTX_YAML.read_text())
    assert raw["generator_optimizer_args"]["optimizer_cls"] == "Muon_AdamW"
    assert c.precision == "16-mixed"
    assert (c.num_workers, c.dataloader_prefetch_factor) == (12, 4)
    assert c.binarization_args.num_workers == 16
    assert c.model_args.discriminator_periods == [2, 3, 5, 7, 11, 17, 23]
    assert c.model_args.fast_mpd_strides == [4, 4, 4] and c.model_args.fast_mpd_kernel_size == 11
    assert c.discriminator_names == ["fast_mpd", "mrd"]
    assert c.validate_every == 1000
    assert c.max_updates == 300000
    assert c.clip_grad_norm == 1.0
    assert c.model_args.noise_sigma == 0.0 and raw["model_args"]["noise_sigma"] == 0.0
    assert c.num_valid_plots == 32  # the 5090 guide's value
    # the guide does not change the source: the base's full NSF source, mini-NSF stays an option
    assert "mini_nsf" not in raw["model_args"] and c.model_args.mini_nsf is False


def test_demo_config_is_small():
    c = load_config(DEMO_YAML, VocoderConfig)
    assert (c.audio.sample_rate, c.audio.hop_length, c.audio.n_fft, c.audio.n_mels) == (22050, 256, 1024, 80)
    assert 32 <= c.model_args.upsample_initial_channel <= 128


def test_unknown_key_is_an_error_naming_the_closest(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"base_config: {GPU_YAML}\ncrop_mel_frame: 10\n")
    with pytest.raises(ConfigError, match="crop_mel_frames"):
        load_config(bad, VocoderConfig)
    with pytest.raises(ConfigError, match="upsample_initial_channel"):
        load_config(GPU_YAML, VocoderConfig, ["model_args.upsample_initial_channels=3"])


def test_seed_aliases_and_task_names(tmp_path):
    f = tmp_path / "seed.yaml"
    f.write_text(
        "task_cls: training.nsf_HiFigan_fast_task.nsf_HiFigan\n"
        "generater_optimizer_args: {optimizer_cls: modules.optimizer.muon.Muon_AdamW, lr: 0.0002}\n"
        "discriminate_optimizer_args: {lr: 0.0003}\n"
        "save_n_checkpoints: 3\n"
    )
    c = load_config(f, VocoderConfig)
    assert c.task == "fast"
    assert c.generator_optimizer_args.is_muon and c.generator_optimizer_args.lr == 2e-4
    assert c.discriminator_optimizer_args.lr == 3e-4
    assert c.save_n_checkpoints == 3
    assert task_kind("nsf_HiFigan_task.nsf_HiFigan") == "standard"
    with pytest.raises(ConfigError, match="nsf_HiFigan"):
        load_config(None, VocoderConfig, ["task_cls=training.univnet.UnivNet"])


def test_inconsistent_values_are_rejected():
    with pytest.raises(ConfigError, match="hop_size"):
        load_config(GPU_YAML, VocoderConfig, ["hop_size=256"])
    with pytest.raises(ConfigError, match="mini_nsf"):
        load_config(GPU_YAML, VocoderConfig, ["pc_aug=true"])
    with pytest.raises(ConfigError, match="scheduler_cls"):
        load_config(GPU_YAML, VocoderConfig, ["lr_scheduler_args.scheduler_cls=OneCycle"])


def test_singingvocoders_spellings_layer_over_our_base_configs(tmp_path):
    """A file in other spellings over base_hifi_gpu.yaml: the later layer wins whichever spelling it
    uses, keys it does not give are inherited."""
    sv = tmp_path / "sv.yaml"
    sv.write_text(f"base_config: {GPU_YAML}\n"
                  "generater_optimizer_args: {optimizer_cls: modules.optimizer.muon.Muon_AdamW, lr: 0.0002}\n"
                  "discriminate_optimizer_args: {lr: 0.00005}\n"
                  "save_n_checkpoints: 3\n")
    c = load_config(sv, VocoderConfig)
    g, d = c.generator_optimizer_args, c.discriminator_optimizer_args
    assert g.is_muon and g.lr == 2e-4 and (g.beta1, g.beta2) == (0.8, 0.99)  # betas from the base
    assert d.optimizer_cls == "torch.optim.AdamW" and d.lr == 5e-5
    assert c.save_n_checkpoints == 3
    # the child's spelling (num_ckpt_keep, SingingVocoders') wins over its base's (save_n_checkpoints)
    ours = tmp_path / "ours.yaml"
    ours.write_text(f"base_config: {sv}\ngenerator_optimizer_args: {{lr: 0.0004}}\nnum_ckpt_keep: 2\n")
    c = load_config(ours, VocoderConfig, ["discriminate_optimizer_args.lr=0.0007"])
    assert c.generator_optimizer_args.lr == 4e-4 and c.generator_optimizer_args.is_muon
    assert c.save_n_checkpoints == 2 and c.discriminator_optimizer_args.lr == 7e-4
    both = tmp_path / "both.yaml"
    both.write_text("num_ckpt_keep: 2\nsave_n_checkpoints: 3\n")
    with pytest.raises(ConfigError, match="twice"):
        load_config(both, VocoderConfig)


def test_singingvocoders_muon_adamw_per_half_args(tmp_path):
    """nsf_hifigan_fast.yaml's `muon_args` / `adamw_args` mappings land on our keys, in YAML and --set."""
    sv = tmp_path / "fast.yaml"
    sv.write_text(f"base_config: {RTX_YAML}\n"
                  "generater_optimizer_args:\n  optimizer_cls: modules.optimizer.muon.Muon_AdamW\n  lr: 0.0002\n"
                  "  muon_args: {weight_decay: 0.03}\n  adamw_args: {weight_decay: 0.0}\n")
    c = load_config(sv, VocoderConfig, ["discriminate_optimizer_args.muon_args.weight_decay=0.02"])
    g = c.generator_optimizer_args
    assert g.is_muon and g.lr == 2e-4 and g.muon_weight_decay == 0.03 and g.weight_decay == 0.0
    assert c.discriminator_optimizer_args.muon_weight_decay == 0.02
    # with AdamW it would change nothing: refused, naming the key
    with pytest.raises(ConfigError, match=r"generator_optimizer_args\.muon_weight_decay .* is Muon_AdamW's, and this "
                                          r"optimizer is torch\.optim\.AdamW"):
        load_config(RTX_YAML, VocoderConfig, ["generator_optimizer_args.optimizer_cls=torch.optim.AdamW",
                                              "generator_optimizer_args.muon_weight_decay=0.1"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("generater_optimizer_args:\n  muon_args: {momentum: 0.9}\n")
    with pytest.raises(ConfigError, match=r"muon_args\.momentum.*has no equivalent.*muon_args\.weight_decay"):
        load_config(bad, VocoderConfig)


@pytest.mark.parametrize("key", ["pl_trainer_devices=auto", "accumulate_grad_batches=1", "DataIndexPath=data",
                                 "permanent_ckpt_start=200000", "aug_num=1"])
def test_singingvocoders_keys_without_equivalent_say_what_replaces_them(key):
    name = key.split("=")[0]
    assert name in VocoderConfig.NOT_READ_HERE and name not in VocoderConfig.__dataclass_fields__
    with pytest.raises(ConfigError) as e:
        load_config(GPU_YAML, VocoderConfig, [key])
    msg = str(e.value)
    assert f"config key '{name}'" in msg and msg.endswith("remove it") and "unknown" not in msg


def test_negative_discriminator_start_is_refused():
    with pytest.raises(ValueError, match="discriminator_train_start_steps"):
        tiny_config("discriminator_train_start_steps=-1")
