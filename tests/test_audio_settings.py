"""One mel settings block (`common.audio.AudioSettings`) in the vocoder, VITS and cloning schemas.

Every shipped config must load to the very values it loaded to before the block existed (the table
below was computed from main before the change), and every seed spelling of a mel key keeps working
in YAML and `--set`: the vocoder's flat SingingVocoders keys, the Coqui/jaywalnut310 VITS names.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from common.audio import AudioSettings, MelSpectrogram
from common.config import ConfigError, load_config
from tts.clone.config import CloneConfig
from tts.vits.config import TrainConfig
from vocoder.config import VocoderConfig

REPO = Path(__file__).resolve().parents[1]
FIELDS = ("sample_rate", "n_fft", "win_length", "hop_length", "n_mels", "fmin", "fmax")

# (sample_rate, n_fft, win_length, hop_length, n_mels, fmin, fmax) of each shipped config, from main
# before the shared block (vocoder: audio_sample_rate, fft_size, win_size, hop_size, audio_num_mel_bins).
EXPECTED = {
    "vocoder/configs/base_hifi_gpu.yaml": (44100, 2048, 2048, 512, 128, 40.0, 16000.0),
    "vocoder/configs/base_hifi_rtx5090_optimized.yaml": (44100, 2048, 2048, 512, 128, 40.0, 16000.0),
    "vocoder/configs/demo.yaml": (22050, 1024, 1024, 256, 80, 40.0, 8000.0),
    "tts/clone/configs/clone_base.yaml": (44100, 2048, 2048, 512, 128, 40.0, 16000.0),
    "tts/clone/configs/clone_demo.yaml": (22050, 1024, 1024, 256, 80, 40.0, 8000.0),
    "tts/vits/configs/demo.yaml": (22050, 1024, 1024, 256, 80, 0.0, 8000.0),
    "tts/vits/configs/uzbek_vits.yaml": (22050, 1024, 1024, 256, 80, 0.0, None),
    "tts/vits/configs/uzbek_vits_rtx5090.yaml": (22050, 1024, 1024, 256, 80, 0.0, None),
    # the old paths users type, kept as files that only inherit the recipes above
    "tts/configs/clone_base.yaml": (44100, 2048, 2048, 512, 128, 40.0, 16000.0),
    "tts/configs/uzbek_vits.yaml": (22050, 1024, 1024, 256, 80, 0.0, None),
    "tts/configs/uzbek_vits_rtx5090.yaml": (22050, 1024, 1024, 256, 80, 0.0, None),
}
DEFAULTS = {VocoderConfig: (44100, 2048, 2048, 512, 128, 40.0, 16000.0),
            TrainConfig: (22050, 1024, 1024, 256, 80, 0.0, None),
            CloneConfig: (44100, 2048, 2048, 512, 128, 40.0, 16000.0)}


def _schema(path: str) -> type:
    if path.startswith("vocoder/"):
        return VocoderConfig
    return CloneConfig if Path(path).name.startswith("clone") else TrainConfig


def _values(cfg) -> tuple:
    return tuple(getattr(cfg.audio, f) for f in FIELDS)


def test_every_shipped_audio_config_is_listed():
    folders = ("vocoder/configs", "tts/configs", "tts/vits/configs", "tts/clone/configs")
    shipped = {str(p.relative_to(REPO)) for d in folders for p in (REPO / d).glob("*.yaml")}
    assert shipped == set(EXPECTED)


@pytest.mark.parametrize("path", sorted(EXPECTED))
def test_shipped_configs_load_to_the_same_audio_values(path):
    cfg = load_config(REPO / path, _schema(path))
    assert isinstance(cfg.audio, AudioSettings)
    assert _values(cfg) == EXPECTED[path]
    assert cfg.audio.mel_kwargs == dict(zip(FIELDS, EXPECTED[path]))
    MelSpectrogram(**cfg.audio.mel_kwargs)  # the block is exactly MelSpectrogram's arguments


@pytest.mark.parametrize("schema", list(DEFAULTS))
def test_schema_defaults_unchanged(schema):
    assert _values(load_config(None, schema)) == DEFAULTS[schema]


def test_vocoder_flat_seed_keys_in_yaml_and_set(tmp_path):
    flat = tmp_path / "flat.yaml"
    flat.write_text("audio_sample_rate: 22050\naudio_num_mel_bins: 80\nhop_size: 256\nfft_size: 1024\n"
                    "win_size: 1024\nfmin: 30\nfmax: 8000\nmodel_args: {upsample_rates: [8, 8, 2, 2]}\n")
    cfg = load_config(flat, VocoderConfig)
    assert _values(cfg) == (22050, 1024, 1024, 256, 80, 30.0, 8000.0)
    # the seed's attribute names still read
    a = cfg.audio
    assert (a.sample_rate, a.n_fft, a.win_length, a.hop_length, a.n_mels, a.fmin, a.fmax) == \
        (22050, 1024, 1024, 256, 80, 30.0, 8000.0)
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
    assert (clone.audio.hop_length, clone.audio.n_mels, clone.audio.f0_max) == (256, 80, 800.0)
