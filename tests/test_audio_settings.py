"""One mel settings block (`speech.audio.AudioSettings`) in the vocoder, VITS and cloning schemas.

Every shipped config's block builds the mel front-end it describes and agrees with the model that
consumes it (the cloning recipes' mels are vocoded by the vocoder recipe they name; a HiFi-GAN
decoder upsamples one mel frame to `hop_length` samples), and every seed spelling of a mel key works
in YAML and `--set`: the vocoder's flat SingingVocoders keys, the Coqui/jaywalnut310 VITS names.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from common.config import ConfigError, load_config
from speech.audio import AudioSettings, MelSpectrogram
from speech.f0 import SPEECH_F0_MAX
from tts.clone.config import CloneConfig
from tts.vits.config import TrainConfig
from vocoder.config import VocoderConfig

REPO = Path(__file__).resolve().parents[1]
FIELDS = ("sample_rate", "n_fft", "win_length", "hop_length", "n_mels", "fmin", "fmax")
FOLDERS = ("vocoder/configs", "tts/vits/configs", "tts/clone/configs")
SHIPPED = sorted(str(p.relative_to(REPO)) for d in FOLDERS for p in (REPO / d).glob("*.yaml"))
# each cloning recipe and the vocoder recipe whose mels it predicts (named in the recipe's comments)
VOCODED_BY = {"tts/clone/configs/clone_base.yaml": "vocoder/configs/base_hifi_gpu.yaml",
              "tts/clone/configs/clone_demo.yaml": "vocoder/configs/demo.yaml",
              "tts/clone/configs/tiny.yaml": "vocoder/configs/tiny.yaml"}


def _schema(path: str) -> type:
    if path.startswith("vocoder/"):
        return VocoderConfig
    return CloneConfig if path.startswith("tts/clone/") else TrainConfig


def _values(cfg) -> tuple:
    return tuple(getattr(cfg.audio, f) for f in FIELDS)


@pytest.mark.parametrize("path", SHIPPED)
def test_shipped_configs_build_their_mel_front_end(path):
    cfg = load_config(REPO / path, _schema(path))
    assert isinstance(cfg.audio, AudioSettings)
    assert cfg.audio.mel_kwargs == dict(zip(FIELDS, _values(cfg)))
    mel = MelSpectrogram(**cfg.audio.mel_kwargs)  # the block is exactly MelSpectrogram's arguments
    hop = cfg.audio.hop_length
    assert mel(torch.zeros(1, 8 * hop + cfg.audio.n_fft)).shape[1] == cfg.audio.n_mels
    if isinstance(cfg, TrainConfig):  # the VITS decoder turns one frame into hop_length samples
        assert math.prod(cfg.args().upsample_rates) == hop
    if isinstance(cfg, VocoderConfig):
        assert math.prod(cfg.model_args.upsample_rates) == hop


@pytest.mark.parametrize("clone, vocoder", sorted(VOCODED_BY.items()))
def test_cloning_recipes_predict_the_mels_their_vocoder_reads(clone, vocoder):
    assert set(VOCODED_BY) == {p for p in SHIPPED if p.startswith("tts/clone/")}
    assert _values(load_config(REPO / clone, CloneConfig)) == _values(load_config(REPO / vocoder, VocoderConfig))


def test_vocoder_flat_seed_keys_in_yaml_and_set(tmp_path):
    flat = tmp_path / "flat.yaml"
    flat.write_text("audio_sample_rate: 22050\naudio_num_mel_bins: 80\nhop_size: 256\nfft_size: 1024\n"
                    "win_size: 1024\nfmin: 30\nfmax: 8000\nmodel_args: {upsample_rates: [8, 8, 2, 2]}\n")
    cfg = load_config(flat, VocoderConfig)
    assert _values(cfg) == (22050, 1024, 1024, 256, 80, 30.0, 8000.0)
    over = load_config(flat, VocoderConfig, ["fmax=7000", "audio.fmin=20", "audio_sample_rate=24000"])
    assert (over.audio.fmax, over.audio.fmin, over.audio.sample_rate) == (7000.0, 20.0, 24000)
    nested = tmp_path / "nested.yaml"  # a child in the block's own names overrides a flat base
    nested.write_text(f"base_config: {flat.name}\naudio: {{hop_length: 256, n_mels: 64}}\n")
    assert load_config(nested, VocoderConfig).audio.n_mels == 64
    assert load_config(nested, VocoderConfig).audio.sample_rate == 22050
    both = tmp_path / "both.yaml"
    both.write_text("hop_size: 512\naudio: {hop_length: 512}\n")
    with pytest.raises(ConfigError, match="twice"):
        load_config(both, VocoderConfig)


def test_vits_and_clone_read_every_seed_spelling(tmp_path):
    f = tmp_path / "coqui.yaml"
    f.write_text("audio: {sampling_rate: 16000, filter_length: 512, win_size: 512, hop_size: 128, num_mels: 64, "
                 "mel_fmin: 10, mel_fmax: 7000}\n")
    assert _values(load_config(f, TrainConfig)) == (16000, 512, 512, 128, 64, 10.0, 7000.0)
    clone = load_config(None, CloneConfig, ["audio.hop_size=256", "audio.audio_num_mel_bins=80"])
    assert (clone.audio.hop_length, clone.audio.n_mels, clone.audio.f0_max) == (256, 80, SPEECH_F0_MAX)
