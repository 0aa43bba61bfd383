"""Speaker similarity: does the generated voice sound like the speaker of the recording?

The figure is the cosine between two speaker embeddings, one of the generated waveform and one of the
recording it should match (1 = the same voice to the encoder; two different speakers of a corpus score
lower; see tests/speech/test_speaker_similarity.py for measured values). Embeddings come from a speaker
encoder whose weights are files on this machine, never a download:

- **default: Resemblyzer's** (`pip install --no-deps resemblyzer==0.1.4`, in requirements-nodeps.txt): a
  3-layer LSTM (GE2E, Wan et al. 2018) over 40-band mel frames of 16 kHz audio; its weights,
  `pretrained.pt` (17 MB), ship inside the wheel. The package itself is never imported (its `__init__`
  imports webrtcvad, a C build with no Windows wheel): this module builds the same network, reads the
  package's weights file, and reproduces its preprocessing (volume to -30 dBFS, increase only; 1.6 s
  partials at 1.3 per second, averaged and L2-normed), with one difference: long silences are cut by
  an energy threshold (`trim_silences`) instead of webrtcvad's voice activity detector.
- **a file you give** (`path`): a state dict of the Resemblyzer network (a fine-tuned copy; `{"model_state":
  ...}` as Resemblyzer saves it, or the bare dict; `.pt` or `.safetensors`), read as data
  (`common.model_files.load_weights`: never pickled code; fp16/fp64 converted, NaN refused); or a module whose
  `forward(wav[1, T])`, float32 at 16 kHz in [-1, 1], returns an embedding `[1, D]` (any encoder you can
  export), saved by `torch.export.save` (a `.pt2` file, with T dynamic) or `torch.jit.save` (TorchScript).
  Such a file runs code stored in it, so it loads only with the opt-in `TRUST_CODE_FILES=1` in the
  environment (`common.model_files`); without it, the one "off" line names the file and the opt-in.

`load_speaker_encoder` returns None after one line when neither is there (the package is missing, the file
is missing, unreadable, code without the opt-in): the metric is off and whatever called it goes on. What a
user's module returns is checked on every call (a floating tensor [1, D] or [D], D ≤ `MAX_EMBEDDING`; an
exception inside it): anything else is a `ModelFileError` naming the file, one line, exit 2. Everything runs
on the CPU unless a device is given; the network is built without drawing from torch's global RNG.
"""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn

from common.model_files import (
    ModelFileError,
    allow_code_file,
    check_output,
    code_kind,
    float32_weights,
    load_weights,
    regular_file,
)
from speech.audio import resample

SAMPLE_RATE = 16000  # the encoder's input rate
N_MELS, WINDOW, HOP = 40, 400, 160  # 25 ms windows, 10 ms hop (Resemblyzer's hparams)
PARTIAL_FRAMES = 160  # 1.6 s per partial utterance
PARTIAL_RATE, MIN_COVERAGE = 1.3, 0.75  # partials per second; a last partial shorter than this is dropped
TARGET_DBFS = -30.0
INSTALL_HINT = "pip install --no-deps resemblyzer==0.1.4"
PACKAGED = "resemblyzer"  # the `path` that names the package's own weights (as "" does)
MAX_EMBEDDING = 1 << 16  # values an embedding may have (Resemblyzer's: 256; the usual ECAPA / x-vector: 192-512)
WHAT = "speaker encoder"


class VoiceEncoderNet(nn.Module):
    """Resemblyzer's network: mel frames [B, frames, 40] (power, not log) → L2-normed embeddings [B, 256]."""

    def __init__(self, hidden: int = 256, embedding: int = 256, layers: int = 3) -> None:
        super().__init__()
        self.lstm = nn.LSTM(N_MELS, hidden, layers, batch_first=True)
        self.linear = nn.Linear(hidden, embedding)

    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        _, (hidden, _) = self.lstm(mels)
        e = torch.relu(self.linear(hidden[-1]))
        return e / e.norm(dim=1, keepdim=True).clamp_min(1e-12)


def resemblyzer_weights() -> Path | None:
    """The `pretrained.pt` inside the installed resemblyzer package (found without importing it), or None."""
    try:
        spec = importlib.util.find_spec("resemblyzer")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        path = Path(folder) / "pretrained.pt"
        if path.is_file():
            return path
    return None


def normalize_volume(wav: np.ndarray, target_dbfs: float = TARGET_DBFS) -> np.ndarray:
    """Raise a quiet waveform to `target_dbfs` RMS (never lowers one: Resemblyzer's `increase_only`)."""
    rms = float(np.sqrt(np.mean(wav.astype(np.float64) ** 2))) if wav.size else 0.0
    if rms <= 1e-9:
        return wav
    change_db = target_dbfs - 20.0 * np.log10(rms)
    return wav * np.float32(10.0 ** (change_db / 20.0)) if change_db > 0 else wav


def trim_silences(wav: np.ndarray, top_db: float = 40.0, keep_s: float = 0.09) -> np.ndarray:
    """Cut silences (frames more than `top_db` below the loudest) longer than 2 · `keep_s`, keeping `keep_s`
    of each around the speech: the energy stand-in for Resemblyzer's webrtcvad trimming."""
    import librosa

    if wav.size < WINDOW:
        return wav
    intervals = librosa.effects.split(wav, top_db=top_db, frame_length=WINDOW, hop_length=HOP)
    if len(intervals) == 0:
        return wav
    pad = int(keep_s * SAMPLE_RATE)
    keep = np.zeros(len(wav), dtype=bool)
    for start, end in intervals:
        keep[max(0, start - pad): min(len(wav), end + pad)] = True
    return wav[keep]


def mel_frames(wav: np.ndarray) -> np.ndarray:
    """16 kHz waveform → [frames, 40] power mel (librosa's defaults, as Resemblyzer computes it)."""
    import librosa

    m = librosa.feature.melspectrogram(y=wav, sr=SAMPLE_RATE, n_fft=WINDOW, hop_length=HOP, n_mels=N_MELS)
    return m.astype(np.float32).T


def partial_slices(n_samples: int) -> list[slice]:
    """Mel-frame slices of the 1.6 s partials covering a waveform of `n_samples` (Resemblyzer's rule)."""
    n_frames = int(np.ceil((n_samples + 1) / HOP))
    step = max(1, int(round(SAMPLE_RATE / PARTIAL_RATE / HOP)))
    starts = range(0, max(1, n_frames - PARTIAL_FRAMES + step + 1), step)
    slices = [slice(s, s + PARTIAL_FRAMES) for s in starts]
    coverage = (n_samples - slices[-1].start * HOP) / (PARTIAL_FRAMES * HOP)
    if coverage < MIN_COVERAGE and len(slices) > 1:
        slices = slices[:-1]
    return slices


class SpeakerEncoder:
    """A waveform → unit-length embedding. `mel_net`: the Resemblyzer network (mels in); `wav_net`: a
    user's TorchScript module (16 kHz waveform in). `source` names where the weights came from."""

    def __init__(self, source: str, mel_net: nn.Module | None = None, wav_net: nn.Module | None = None,
                 device: str | torch.device = "cpu") -> None:
        self.source, self.mel_net, self.wav_net = source, mel_net, wav_net
        self.device = torch.device(device)

    @torch.no_grad()
    def embed(self, wav, sr: int) -> np.ndarray:
        """A mono waveform (numpy or torch, [T] or [1, T]) at `sr` → float64 unit vector."""
        x = wav.detach().float().cpu().numpy() if isinstance(wav, torch.Tensor) else np.asarray(wav, np.float32)
        x = np.nan_to_num(x.reshape(-1).astype(np.float32))
        if sr != SAMPLE_RATE:
            x = resample(x, sr, SAMPLE_RATE)
        if self.wav_net is not None:
            e = self._user_embedding(torch.from_numpy(x)[None].to(self.device))
        else:
            x = trim_silences(normalize_volume(x))
            slices = partial_slices(len(x))
            x = np.pad(x, (0, max(0, slices[-1].stop * HOP - len(x))))
            mel = mel_frames(x)
            parts = torch.from_numpy(np.stack([mel[s] for s in slices])).to(self.device)
            threads = torch.get_num_threads()
            if self.device.type == "cpu":  # a small LSTM: one thread, no OpenMP barrier stalls on a shared CPU
                torch.set_num_threads(1)
            try:
                e = self.mel_net(parts).mean(0)
            finally:
                torch.set_num_threads(threads)
        e = e.double().cpu().numpy()
        return e / max(float(np.linalg.norm(e)), 1e-12)

    def _user_embedding(self, wav: torch.Tensor) -> torch.Tensor:
        """A user's module on `wav` [1, T]: its embedding, checked (ModelFileError naming the file otherwise)."""
        try:
            out = self.wav_net(wav)
        except Exception as exc:  # noqa: BLE001 - whatever a foreign module raises is the file's problem
            first = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ""
            raise ModelFileError(f"{WHAT} {self.source} failed on a waveform of {wav.shape[-1]} samples "
                                 f"({type(exc).__name__}: {first}); give an encoder whose forward takes wav [1, T] "
                                 "float32 at 16 kHz") from None
        out = check_output(out, self.source, WHAT, (1, 2), MAX_EMBEDDING)
        if out.dim() == 2 and out.shape[0] != 1:
            raise ModelFileError(f"{WHAT} {self.source} returned shape {list(out.shape)} for one waveform; expected "
                                 "[1, D] or [D]")
        return out.reshape(-1)

    def similarity(self, wav_a, wav_b, sr: int) -> float:
        """Cosine of the two waveforms' embeddings (both at `sr`)."""
        return float(np.dot(self.embed(wav_a, sr), self.embed(wav_b, sr)))


def _state_dict_net(path: Path, device: torch.device) -> nn.Module:
    """The Resemblyzer network with the state dict of `path`, read as data (`common.model_files`)."""
    state = load_weights(path, WHAT)
    if "model_state" in state and isinstance(state["model_state"], dict):
        state = state["model_state"]
    state = {k: v for k, v in float32_weights(state, path, WHAT).items()
             if not k.startswith("similarity_")}  # GE2E's training-only scale
    with torch.device("meta"):  # no init, no draw from the global RNG
        net = VoiceEncoderNet()
    net.load_state_dict(state, strict=True, assign=True)
    return net.to(device).eval()


def _code_net(file: Path, kind: str, device: torch.device, say: Callable[[str], None]) -> nn.Module:
    """A TorchScript module or `.pt2` program: runs the file's code, so only with the opt-in (said in one line)."""
    say(allow_code_file(file, kind, WHAT))
    if kind.startswith("a torch.export"):
        return torch.export.load(str(file)).module().to(device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit is deprecated, still read
        return torch.jit.load(str(file), map_location=device).eval()


def load_speaker_encoder(path: str | None = None, device: str | torch.device = "cpu",
                         say: Callable[[str], None] = print, what: str = "speaker similarity") -> SpeakerEncoder | None:
    """The encoder of `path` (a Resemblyzer state dict; `.pt2` or TorchScript with `TRUST_CODE_FILES=1`), or
    Resemblyzer's own weights when `path` is "" or "resemblyzer"; None after one line saying why `what` is off."""
    device = torch.device(device)
    if path and path != PACKAGED:
        try:
            file = regular_file(path, WHAT)
            kind = code_kind(file)
            if kind is not None:
                return SpeakerEncoder(str(file), wav_net=_code_net(file, kind, device, say), device=device)
            return SpeakerEncoder(str(file), mel_net=_state_dict_net(file, device), device=device)
        except ModelFileError as exc:
            say(f"{what} off: {exc}")
            return None
        except Exception as exc:  # noqa: BLE001 (any unreadable file is the same answer: the metric is off)
            say(f"{what} off: {path} is neither a Resemblyzer state dict nor an exported speaker encoder "
                f"({type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''})")
            return None
    weights = resemblyzer_weights()
    if weights is None:
        say(f"{what} off: no speaker encoder (`{INSTALL_HINT}` ships one, or name a file)")
        return None
    return SpeakerEncoder(f"resemblyzer ({weights})", mel_net=_state_dict_net(weights, device), device=device)
