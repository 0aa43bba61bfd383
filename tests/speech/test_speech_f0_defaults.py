"""The speech recipes track f0 with the speech default (the extractor that measured best on speech, in the speech
range); the singing recipes keep SingingVocoders' Praat at 65-1100 Hz (bench/README.md, "f0 extractors")."""

from pathlib import Path

from speech.f0 import SPEECH_F0_MAX, SPEECH_F0_METHOD, SPEECH_F0_MIN

REPO = Path(__file__).resolve().parents[2]


def test_speech_configs_pick_the_speech_extractor_and_range_and_singing_keeps_its_own():
    from common.config import load_config
    from tts.clone.config import AudioConfig, CloneConfig
    from vocoder.config import VocoderConfig

    speech = (SPEECH_F0_METHOD, SPEECH_F0_MIN, SPEECH_F0_MAX)
    assert SPEECH_F0_METHOD == "pyin" and (SPEECH_F0_MIN, SPEECH_F0_MAX) == (50.0, 600.0)
    demo = load_config(REPO / "vocoder" / "configs" / "demo.yaml", VocoderConfig)
    assert (demo.pe, demo.f0_min, demo.f0_max) == speech
    for singing in ("base_hifi_gpu.yaml", "base_hifi_rtx5090_optimized.yaml", "finetune_openvpi.yaml"):
        cfg = load_config(REPO / "vocoder" / "configs" / singing, VocoderConfig)
        assert (cfg.pe, cfg.f0_min, cfg.f0_max) == ("parselmouth", 65, 1100), singing
    a = AudioConfig(22050, 1024, 1024, 256, 80, 40.0, 8000.0)
    assert (a.f0_method, a.f0_min, a.f0_max) == speech
    for name in ("clone_base.yaml", "clone_demo.yaml"):
        a = load_config(REPO / "tts" / "clone" / "configs" / name, CloneConfig).audio
        assert (a.f0_method, a.f0_min, a.f0_max) == speech, name
