"""`prepare_data.py --mel_dir DIR`: train on an acoustic model's own (teacher-forced, "GTA") mels
instead of mels computed from the audio, so the vocoder learns the mels it will be given.

The folder holds one `<name>.npy` per audio file (float `[n_mels, frames]`; `<name>` is the audio
file's path relative to its --input folder, without the extension) and `mel_settings.json`
(`speech.mel_files`). Checked before anything is written (`check_mel_dir`, one `MelDirError` line
naming the folder, what is wrong and the fix): the settings equal the config's, every audio file has
a mel and every mel an audio file, and most mels have the audio's frame count. One file that does not
fit is skipped with its reason by `load_gta_mel`, like any other bad file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import soundfile as sf

from common.errors import UserError
from common.workers import RUN_ERRORS
from speech.audio import AudioSettings
from speech.mel_files import FRAME_TOLERANCE, MEL_SETTINGS_FILE, read_mel_settings, settings_mismatch

WRITER_HINT = "write them with the acoustic model (e.g. tts/infer_clone.py --teacher_forced --output DIR)"


class MelDirError(UserError, ValueError):
    """The --mel_dir folder as a whole does not fit the audio or the config (exit 2, nothing written)."""


def mel_path(mel_dir: Path, root: Path, audio: Path) -> Path:
    """The mel file that belongs to `audio` (found under the --input folder `root`)."""
    return mel_dir / audio.relative_to(root).with_suffix(".npy")


def header_frames(audio: Path, sample_rate: int, hop: int) -> int | None:
    """The frame count the audio will have after resampling, from the file header only (None: unreadable;
    prepare then skips the file with the reader's own reason)."""
    try:
        info = sf.info(str(audio))
    except RUN_ERRORS:
        raise
    except Exception:  # noqa: BLE001 - any unreadable header is that file's problem, reported later
        return None
    samples = info.frames if info.samplerate == sample_rate else round(info.frames * sample_rate / info.samplerate)
    return samples // hop


def mel_frames(path: Path) -> int | None:
    """The frame count of a `[n_mels, frames]` .npy without reading its data (None: not such an array)."""
    try:
        arr = np.load(path, mmap_mode="r")
    except (OSError, ValueError):
        return None
    return int(arr.shape[1]) if arr.ndim == 2 else None


def check_mel_dir(mel_dir: Path, files: list[tuple[Path, Path]], audio: AudioSettings) -> dict[Path, Path]:
    """{audio file: its mel file} when the folder fits; else `MelDirError` with the one line to print."""
    where = f"--mel_dir {mel_dir}"
    if not mel_dir.is_dir():
        raise MelDirError(f"{where}: no such folder; {WRITER_HINT}")
    recorded = read_mel_settings(mel_dir)
    if recorded is None:
        raise MelDirError(f"{where}: no readable {MEL_SETTINGS_FILE} (the mel settings the mels were made with); "
                          f"{WRITER_HINT}, which writes it beside the mels")
    wrong = settings_mismatch(recorded, audio)
    if wrong:
        raise MelDirError(f"{where}: the mels were made with other mel settings than this config "
                          f"({'; '.join(wrong)}); make the mels with the vocoder config's audio settings, "
                          "or prepare with the config the mels match")
    pairs = {path: mel_path(mel_dir, root, path) for root, path in files}
    claimed: dict[Path, list[Path]] = {}
    for path, mel in pairs.items():
        claimed.setdefault(mel, []).append(path)
    shared = [(mel, paths) for mel, paths in claimed.items() if len(paths) > 1]
    if shared:
        mel, paths = shared[0]
        raise MelDirError(f"{where}: {len(shared)} mel(s) would serve two audio files of different --input folders "
                          f"({mel.relative_to(mel_dir)} for {' and '.join(map(str, paths[:2]))}); mels are named "
                          "relative to their --input folder, so prepare each folder with its own --mel_dir")
    missing = sorted(str(m.relative_to(mel_dir)) for m in pairs.values() if not m.is_file())
    extra = sorted(str(p.relative_to(mel_dir)) for p in set(mel_dir.rglob("*.npy")) - set(pairs.values()))
    problems = []
    if missing:
        problems.append(f"{len(missing)} audio file(s) have no mel ({', '.join(missing[:3])}"
                        f"{', ...' if len(missing) > 3 else ''})")
    if extra:
        problems.append(f"{len(extra)} mel(s) have no audio file ({', '.join(extra[:3])}{', ...' if len(extra) > 3 else ''})")
    if problems:
        raise MelDirError(f"{where}: {'; '.join(problems)}; a mel per audio file is needed, named like the audio "
                          f"file relative to its --input folder: {WRITER_HINT} for exactly the --input audio")
    off = []
    for path, mel in pairs.items():
        want, got = header_frames(path, audio.sample_rate, audio.hop_length), mel_frames(mel)
        if want is not None and got is not None and abs(got - want) > FRAME_TOLERANCE:
            off.append(f"{mel.relative_to(mel_dir)}: {got} frames vs {want} from the audio")
    if off and len(off) * 2 > len(pairs):
        raise MelDirError(f"{where}: {len(off)} of {len(pairs)} mels are misaligned with their audio ({off[0]}); "
                          f"a mel must have one frame per {audio.hop_length} samples at {audio.sample_rate} Hz "
                          f"(T samples -> T // hop frames, ±{FRAME_TOLERANCE}): make the mels from these same audio "
                          "files at the config's hop")
    return pairs


def load_gta_mel(path: Path, n_mels: int, frames: int) -> np.ndarray | str:
    """The mel as prepare stores it (`[frames', n_mels]` float32, frame-major), trimmed to the shorter of
    mel and audio when they differ by at most FRAME_TOLERANCE frames; or the reason to skip the file."""
    try:
        mel = np.load(path)
    except (OSError, ValueError) as e:
        return f"mel {path.name} not readable ({type(e).__name__}: {e})"
    if mel.ndim != 2 or mel.shape[0] != n_mels:
        return f"mel {path.name} has shape {list(mel.shape)}, expected [{n_mels}, frames] (n_mels {n_mels})"
    if abs(mel.shape[1] - frames) > FRAME_TOLERANCE:
        return (f"mel {path.name} has {mel.shape[1]} frames, the audio {frames} "
                f"(more than ±{FRAME_TOLERANCE} apart: not the same audio, or another hop)")
    if not np.isfinite(mel).all():
        return f"mel {path.name} has non-finite values"
    return np.ascontiguousarray(mel[:, :min(frames, mel.shape[1])].T, dtype=np.float32)
