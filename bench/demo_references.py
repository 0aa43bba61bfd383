"""What a clearly wrong output scores on the vocoder demo's held-out readers: the numbers its
MCD-DTW threshold must stay below (`vocoder/demo.py` MAX_MCD cites them).

    python -m bench.demo_references          # after `make vocoder-demo` has built its corpus

For each held-out clip (readers the demo never trains on), in the demo's own mel (22.05 kHz, 80 bins):
- **another reader**: one clip of each training reader (another voice, other words);
- **same reader, other words**: the other held-out clip of the same reader;
- **flat harmonic stack**: 30 equal harmonics on the clip's own f0 (voiced frames), at its level;
- **white noise** at the clip's level.
A copy-synthesis re-uses the clip's own mel and f0, so a plausible one must score clearly below all four.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from common.config import load_config
from speech.audio import MelSpectrogram, load_audio
from speech.f0 import extract_f0
from speech.mcd import compare_speech, rms_db
from vocoder.config import VocoderConfig
from vocoder.demo import CONFIG, REPO


def harmonic_stack(f0: np.ndarray, voiced: np.ndarray, hop: int, sr: int, n: int = 30) -> np.ndarray:
    """Equal-amplitude harmonics below Nyquist on a per-sample f0, silent where unvoiced."""
    f0_s = np.repeat(f0, hop)
    on = np.repeat(voiced, hop).astype(np.float64)
    phase = 2 * np.pi * np.cumsum(f0_s) / sr
    out = np.zeros_like(phase)
    for k in range(1, n + 1):
        out += np.sin(k * phase) * (k * f0_s < sr / 2)
    return out * on


def at_level(wav: np.ndarray, level_db: float) -> np.ndarray:
    return wav * 10 ** ((level_db - rms_db(wav)) / 20)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recordings", default=str(REPO / "data" / "demo" / "vocoder_readers"))
    args = p.parse_args(argv)
    root = Path(args.recordings)
    corpus = json.loads((root / "corpus.json").read_text())
    cfg = load_config(CONFIG, VocoderConfig)
    sr, hop = cfg.audio.sample_rate, cfg.audio.hop_length
    mel = MelSpectrogram(**cfg.audio.mel_kwargs)
    by_reader: dict[str, list[Path]] = {}
    for f in corpus["files"]:
        by_reader.setdefault(f.split("/")[0], []).append(root / f)
    rng = np.random.default_rng(0)
    rows = {"another reader": [], "same reader, other words": [], "flat harmonic stack": [], "white noise": []}
    for reader in corpus["held_out_readers"]:
        clips = by_reader[reader]
        for clip in clips:
            wav, _ = load_audio(clip, sr=sr)
            level = rms_db(wav)
            for other in corpus["train_readers"]:
                o, _ = load_audio(by_reader[other][0], sr=sr)
                rows["another reader"].append(compare_speech("", o, wav, mel).mcd)
            for same in clips:
                if same != clip:
                    o, _ = load_audio(same, sr=sr)
                    rows["same reader, other words"].append(compare_speech("", o, wav, mel).mcd)
            n = len(wav) // hop
            f0, voiced = extract_f0(wav, sr, hop, n, cfg.f0_min, cfg.f0_max)
            stack = at_level(harmonic_stack(f0, voiced, hop, sr), level)
            rows["flat harmonic stack"].append(compare_speech("", stack, wav[: len(stack)], mel).mcd)
            noise = at_level(rng.standard_normal(len(wav)), level)
            rows["white noise"].append(compare_speech("", noise, wav, mel).mcd)
    print(f"MCD-DTW (dB) against the {sum(len(by_reader[r]) for r in corpus['held_out_readers'])} held-out clips "
          f"of readers {', '.join(corpus['held_out_readers'])}:")
    for name, values in rows.items():
        print(f"  {name:28s} min {min(values):.2f}  mean {np.mean(values):.2f}  max {max(values):.2f}  ({len(values)} pairs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
