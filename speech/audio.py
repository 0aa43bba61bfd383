"""Audio I/O, checks and mel/linear spectrograms: the one implementation every audio trainer
shares, so a mel made in preprocessing is bit-for-bit the mel made in training. f0 lives beside it,
in `speech/f0.py`, on the same frame grid.

I/O is soundfile (libsndfile: wav/flac/ogg/mp3, every PCM width, float) and resampling is soxr
'HQ'; the STFT is `torch.stft` with librosa's slaney mel filterbank (the HiFi-GAN convention,
so configs and checkpoints from that family line up).

Time alignment (shared by `MelSpectrogram` and `speech.f0.extract_f0`): with the default `center=False`
the waveform is reflect-padded by (n_fft - hop) // 2 on both sides, so frame i is centred on
sample i * hop + hop / 2 and a waveform of T samples gives T // hop frames (exactly, for any T,
when n_fft - hop is even). `extract_f0` samples the pitch at those same instants.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import librosa
import numpy as np
import soundfile as sf
import soxr
import torch
from torch import nn

from common.atomic_write import atomic_output
from common.errors import UserError
from common.ranges import NonNegativeFloat, PositiveFloat, PositiveInt

# |x| at or above this counts as "at full scale" (int16 full scale is 32767/32768 = 0.99997).
_FULL_SCALE = 0.999


class AudioError(UserError, ValueError):
    """A file that cannot be used as audio. `.reason` is the short text a preprocessing report
    lists; `str(err)` names the file too; `.kind` is "not_audio" for a file no decoder reads (the
    server answers an upload of it as "not audio"), else "unusable"."""

    def __init__(self, reason: str, path: str | os.PathLike | None = None, kind: str = "unusable"):
        self.reason = reason
        self.path = None if path is None else str(path)
        self.kind = kind
        super().__init__(reason if path is None else f"{path}: {reason}")


# ---------------------------------------------------------------------------------------------
# I/O and conversions
# ---------------------------------------------------------------------------------------------


def _to_numpy(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().float().cpu().numpy()
    return np.asarray(x)


def load_audio(path: str | os.PathLike, sr: int | None = None, mono: bool = True,
               max_seconds: float | None = None) -> tuple[np.ndarray, int]:
    """Read any file libsndfile reads (wav/flac/ogg/mp3, 8/16/24/32-bit PCM, float) as float32.

    Returns `(wav, sr)`: wav is [T] when `mono` (channels averaged) else [channels, T]; it is
    resampled with soxr 'HQ' to `sr` when given (otherwise the file's rate is returned).
    Raises `AudioError` (a ValueError naming the file) for a missing, unreadable or non-audio
    file, a file with no samples, or one with NaN/Inf samples (float files can hold them).
    `max_seconds`: a longer file is refused from its header, before a sample is decoded
    (`too long (612.00 s > 600 s)`, the reason `check_audio` gives).

    Memory: mono audio is read `BLOCK_FRAMES` at a time, mixed down and resampled block by block
    (`soxr.ResampleStream`, bit-identical to one `soxr.resample` call) into the result, so a file costs
    its mono result at the output rate (4 bytes a sample) and one block, not its whole decoded
    multichannel original besides: 600 s at 44.1 kHz is 106 MB.
    """
    path = Path(path)
    if not path.is_file():
        raise AudioError("file not found", path)
    try:
        info = sf.info(str(path))
        _check_declared_size(info, path)
        if max_seconds is not None and info.frames > max_seconds * info.samplerate:
            raise AudioError(f"too long ({info.frames / info.samplerate:.2f} s > {max_seconds:g} s)", path)
        if mono:
            data, file_sr = _read_mono(path, None if sr is None else int(sr))
        else:
            data, file_sr = sf.read(str(path), dtype="float32", always_2d=True)  # [T, C]
    except AudioError:
        raise
    except (sf.SoundFileError, RuntimeError, OSError, ValueError, TypeError) as e:
        detail = str(e).splitlines()[-1] if str(e) else type(e).__name__
        raise AudioError(f"not readable as audio ({detail})", path, kind="not_audio") from e
    if mono:
        return data, int(sr if sr is not None else file_sr)
    cut = _wav_truncation(path)
    if cut:
        raise AudioError(f"truncated/unreadable: {cut} ({data.shape[0] / file_sr:.2f} s readable); "
                         "re-export or copy the file again", path)
    if data.shape[0] == 0 or data.shape[1] == 0:
        raise AudioError("empty (0 samples)", path)
    if not np.isfinite(data).all():
        raise AudioError("non-finite samples (NaN/Inf)", path)
    if sr is not None and int(sr) != int(file_sr):
        data = soxr.resample(data, file_sr, int(sr), quality="HQ")
        file_sr = int(sr)
    return np.ascontiguousarray(data.T, dtype=np.float32), int(file_sr)


BLOCK_FRAMES = 1 << 16  # frames `load_audio` reads at a time: 1.5 s at 44.1 kHz, 256 KiB a channel


class _Filled:
    """A float32 array filled block by block: one buffer of the expected length (grown if a header
    undercounted), so the result is never concatenated (which would hold it twice)."""

    def __init__(self, expected: int):
        self.buf = np.empty(max(int(expected), 1), dtype=np.float32)
        self.n = 0

    def add(self, x: np.ndarray) -> None:
        if self.n + len(x) > len(self.buf):
            self.buf = np.resize(self.buf, max(self.n + len(x), 2 * len(self.buf)))
        self.buf[self.n:self.n + len(x)] = x
        self.n += len(x)

    def result(self) -> np.ndarray:
        return self.buf[:self.n]  # a view: a copy would hold the result twice for a moment


def _read_mono(path: Path, sr: int | None) -> tuple[np.ndarray, int]:
    """The file averaged to mono (and resampled to `sr`), read `BLOCK_FRAMES` at a time; the checks of
    `load_audio` (truncated WAV, no samples, NaN/Inf) as AudioError."""
    with sf.SoundFile(str(path)) as f:
        file_sr, frames = int(f.samplerate), int(f.frames)
        resampler = None if sr is None or sr == file_sr else soxr.ResampleStream(
            file_sr, sr, 1, dtype="float32", quality="HQ")
        out = _Filled(frames if resampler is None else math.ceil(frames * sr / file_sr) + 16)
        read, finite = 0, True
        while True:
            block = f.read(BLOCK_FRAMES, dtype="float32", always_2d=True)  # [n, C]
            if not len(block):
                break
            read += len(block)
            finite = finite and bool(np.isfinite(block).all())
            x = block.mean(axis=1) if block.shape[1] > 1 else block[:, 0]
            out.add(x if resampler is None else resampler.resample_chunk(x, last=False))
        if resampler is not None and read:
            out.add(resampler.resample_chunk(np.zeros(0, dtype=np.float32), last=True))
    cut = _wav_truncation(path)
    if cut:
        raise AudioError(f"truncated/unreadable: {cut} ({read / file_sr:.2f} s readable); "
                         "re-export or copy the file again", path)
    if read == 0:
        raise AudioError("empty (0 samples)", path)
    if not finite:
        raise AudioError("non-finite samples (NaN/Inf)", path)
    return out.result(), file_sr


# What a header may declare before anything is decoded: a 40 KB WAV that claims a 1 Hz rate becomes GBs once
# resampled, and a FLAC that claims 2^36 samples asks for that much memory. Real recordings sit far inside.
MIN_SAMPLE_RATE, MAX_SAMPLE_RATE = 2_000, 768_000
MAX_SECONDS = 3 * 3600  # one file; a longer one is split first (an audiobook chapter is shorter)


def _check_declared_size(info, path: Path) -> None:
    """AudioError for a header that declares an absurd sample rate or length, before any sample is read."""
    if not MIN_SAMPLE_RATE <= info.samplerate <= MAX_SAMPLE_RATE:
        raise AudioError(f"declares a sample rate of {info.samplerate} Hz (outside {MIN_SAMPLE_RATE}-"
                         f"{MAX_SAMPLE_RATE}): a damaged or crafted header", path)
    if info.frames > MAX_SECONDS * info.samplerate or info.channels > 64:
        raise AudioError(f"declares {info.frames} samples x {info.channels} channel(s) ({info.frames / info.samplerate / 3600:.1f} h): "
                         f"longer than {MAX_SECONDS // 3600} h; split it into utterances first", path)


def _wav_truncation(path: Path) -> str | None:
    """Why a WAV file is cut short, or None. libsndfile quietly reads whatever part of the data chunk
    is there, so a half-copied file would pass as a shorter (or a 0.00 s) clip: compare the size
    the header declares with the bytes present."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(12)
            if len(head) < 12 or head[:4] not in (b"RIFF", b"RIFX") or head[8:12] != b"WAVE":
                return None
            order = "little" if head[:4] == b"RIFF" else "big"
            pos = 12
            while pos + 8 <= size:
                f.seek(pos)
                chunk = f.read(8)
                n = int.from_bytes(chunk[4:], order)
                if chunk[:4] == b"data":
                    have = size - pos - 8
                    if n != 0xFFFFFFFF and have < n:  # 0xFFFFFFFF: a streamed WAV of unknown length
                        return f"the WAV header declares {n} bytes of samples, the file holds {have}"
                    return None
                pos += 8 + n + (n & 1)
    except OSError:
        return None
    return None


def to_int16(wav) -> np.ndarray:
    """float audio → int16: clip to [-1, 1], scale by 32767, round. NaN becomes 0 (clipping
    alone would turn it into garbage), so a model's bad output can still be written and heard."""
    x = np.nan_to_num(_to_numpy(wav).astype(np.float64), nan=0.0, posinf=1.0, neginf=-1.0)
    return np.round(np.clip(x, -1.0, 1.0) * 32767.0).astype(np.int16)


def to_float32(int_array) -> np.ndarray:
    """Integer PCM → float32 in about [-1, 1], by dtype: signed ints are divided by their
    maximum (int16 / 32767, int32 / 2147483647, …, the inverse of `to_int16`); uint8 (8-bit WAV)
    is centred on 128 first. Float input is returned as float32."""
    x = _to_numpy(int_array)
    if np.issubdtype(x.dtype, np.floating):
        return x.astype(np.float32)
    if x.dtype == np.uint8:
        return ((x.astype(np.float32) - 128.0) / 127.0).astype(np.float32)
    if np.issubdtype(x.dtype, np.signedinteger):
        return (x.astype(np.float64) / np.iinfo(x.dtype).max).astype(np.float32)
    raise TypeError(f"to_float32: unsupported dtype {x.dtype} (expected int8/16/32/64, uint8 or float)")


def save_wav(path: str | os.PathLike, wav, sr: int) -> Path:
    """Write 16-bit PCM WAV (values clipped, see `to_int16`). `wav` is [T] or [channels, T]
    (numpy or torch). The file appears atomically (`common.atomic_write`), so an interrupted
    run never leaves a truncated wav that a resumable step would mistake for a finished one, and a
    full disk is DiskFullError (exit 2)."""
    path = Path(path)
    data = to_int16(wav)
    if data.ndim == 2:
        data = data.T  # soundfile wants [T, C]
    elif data.ndim != 1:
        raise ValueError(f"save_wav({path}): expected [T] or [channels, T], got shape {tuple(data.shape)}")
    with atomic_output(path) as tmp:
        sf.write(tmp, data, int(sr), subtype="PCM_16", format="WAV")
    return path


def resample(wav, sr_in: int, sr_out: int) -> np.ndarray:
    """soxr 'HQ' resampling of [T] or [channels, T] float audio (returned as float32)."""
    x = _to_numpy(wav).astype(np.float32)
    if int(sr_in) == int(sr_out):
        return x
    if x.ndim == 2:
        return np.ascontiguousarray(soxr.resample(x.T, sr_in, sr_out, quality="HQ").T, dtype=np.float32)
    return soxr.resample(x, sr_in, sr_out, quality="HQ").astype(np.float32)


def check_audio(
    wav,
    sr: int,
    min_seconds: float = 0.0,
    max_seconds: float | None = None,
    silence_db: float = -60.0,
    max_clip_fraction: float = 0.01,
) -> str | None:
    """The one shared data check. Returns a short reason to skip the clip, or None when usable:
    "non-finite samples", "too short (0.12 s < 0.5 s)", "too long (31.20 s > 30 s)",
    "silent (peak -inf dBFS)" (peak below `silence_db`), "clipped (3.2 % of samples at full
    scale)" (more than `max_clip_fraction` of samples with |x| >= 0.999)."""
    x = _to_numpy(wav)
    if x.size == 0:
        return "too short (0.00 s, no samples)"
    if not np.isfinite(x).all():
        return "non-finite samples"
    seconds = x.shape[-1] / float(sr)
    if seconds < min_seconds:
        return f"too short ({seconds:.2f} s < {min_seconds:g} s)"
    if max_seconds is not None and seconds > max_seconds:
        return f"too long ({seconds:.2f} s > {max_seconds:g} s)"
    peak = float(np.abs(x).max())
    peak_db = 20.0 * math.log10(peak) if peak > 0 else -math.inf
    if peak_db < silence_db:
        return f"silent (peak {peak_db:.1f} dBFS)" if peak > 0 else "silent (peak -inf dBFS)"
    clip_fraction = float((np.abs(x) >= _FULL_SCALE).mean())
    if clip_fraction > max_clip_fraction:
        return f"clipped ({100 * clip_fraction:.1f} % of samples at full scale)"
    return None


# ---------------------------------------------------------------------------------------------
# Spectrograms
# ---------------------------------------------------------------------------------------------


@dataclass
class AudioSettings:
    """The mel contract a model is trained on, as one config block (`audio:`) of every audio schema:
    a mel made with other values is another model's input.

    Defaults are the 44.1 kHz NSF-HiFiGAN contract (a model whose mels feed such a waveform model
    must match it); a schema with other defaults subclasses this with its own values. The seed
    configs' key names are aliases: openvpi / DiffSinger (`audio_sample_rate`, `fft_size`,
    `win_size`, `hop_size`, `audio_num_mel_bins`) and Coqui / jaywalnut310 (`sampling_rate`,
    `filter_length`, `num_mels`, `n_mel_channels`, `mel_fmin`, `mel_fmax`)."""

    ALIASES: ClassVar[dict[str, str]] = {
        "audio_sample_rate": "sample_rate", "fft_size": "n_fft", "win_size": "win_length",
        "hop_size": "hop_length", "audio_num_mel_bins": "n_mels",
        "sampling_rate": "sample_rate", "filter_length": "n_fft", "num_mels": "n_mels",
        "n_mel_channels": "n_mels", "mel_fmin": "fmin", "mel_fmax": "fmax",
    }
    sample_rate: PositiveInt = 44100
    n_fft: PositiveInt = 2048
    win_length: PositiveInt = 2048
    hop_length: PositiveInt = 512
    n_mels: PositiveInt = 128
    fmin: NonNegativeFloat = 40.0
    fmax: PositiveFloat | None = 16000.0  # None = sample_rate / 2

    @property
    def mel_kwargs(self) -> dict:
        """The keyword arguments of `MelSpectrogram` for these settings (the seven fields only)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(AudioSettings)}


def magnitude(spec: torch.Tensor) -> torch.Tensor:
    """|STFT| with the eps inside the sqrt: a clamp has zero gradient, and a freshly initialised
    generator is quiet enough (~1e-5) to sit entirely below one and never start learning.
    real² + imag² rather than ``view_as_real(spec).pow(2).sum(-1)``: the same bits and layout (hence
    the same reductions downstream), ~3x faster on the CPU, where a sum over a size-2 last axis is slow."""
    return torch.sqrt((spec.real.square() + spec.imag.square()).contiguous() + 1e-9)


class MelSpectrogram(nn.Module):
    """Log-mel (and linear magnitude) spectrogram in the HiFi-GAN / NSF-HiFiGAN convention.

    center=False: reflect-pad (n_fft - hop) // 2 per side, so T samples → T // hop frames, frame
    i centred on sample i * hop + hop / 2 (this is what makes mel frames and a waveform model's output
    line up exactly). center=True is torch.stft's own centring: T // hop + 1 frames centred on i * hop.
    Magnitude is sqrt(re² + im² + 1e-9) (the epsilon keeps the gradient finite at 0), the mel is
    librosa's slaney filterbank, and the log is natural log of clamp(min=1e-5).

    Always computed in fp32, also under autocast: an fp16 STFT loses the quiet bins that the mel
    loss and the model's input depend on. The window and filterbank are non-persistent buffers:
    they follow `.to(device)` and stay out of checkpoints (they are rebuilt from the config).
    """

    def __init__(
        self,
        sample_rate: int,
        n_fft: int,
        win_length: int,
        hop_length: int,
        n_mels: int,
        fmin: float = 0.0,
        fmax: float | None = None,
        center: bool = False,
    ):
        super().__init__()
        if win_length > n_fft:
            raise ValueError(f"MelSpectrogram: win_length ({win_length}) must be <= n_fft ({n_fft})")
        if hop_length <= 0 or n_mels <= 0:
            raise ValueError("MelSpectrogram: hop_length and n_mels must be positive")
        self.sample_rate = int(sample_rate)
        self.n_fft = int(n_fft)
        self.win_length = int(win_length)
        self.hop_length = int(hop_length)
        self.n_mels = int(n_mels)
        self.fmin = float(fmin)
        self.fmax = None if fmax is None else float(fmax)
        self.center = bool(center)
        self.pad = (self.n_fft - self.hop_length) // 2
        mel = librosa.filters.mel(
            sr=self.sample_rate, n_fft=self.n_fft, n_mels=self.n_mels, fmin=self.fmin, fmax=self.fmax
        )
        self.register_buffer("mel_basis", torch.from_numpy(mel).float(), persistent=False)
        self.register_buffer("window", torch.hann_window(self.win_length), persistent=False)

    def extra_repr(self) -> str:
        return (
            f"sample_rate={self.sample_rate}, n_fft={self.n_fft}, win_length={self.win_length}, "
            f"hop_length={self.hop_length}, n_mels={self.n_mels}, fmin={self.fmin}, fmax={self.fmax}, "
            f"center={self.center}"
        )

    def linear(self, wav: torch.Tensor) -> torch.Tensor:
        """wav [B, T], [B, 1, T] or [T] → linear magnitude [B, n_fft // 2 + 1, frames] (fp32)."""
        if wav.dim() == 1:
            wav = wav.unsqueeze(0)
        elif wav.dim() == 3 and wav.size(1) == 1:
            wav = wav.squeeze(1)
        if wav.dim() != 2:
            raise ValueError(f"MelSpectrogram: expected wav [B, T] or [T], got shape {tuple(wav.shape)}")
        with torch.autocast(device_type=wav.device.type, enabled=False):
            wav = wav.float()
            min_len = self.n_fft // 2 + 1 if self.center else max(self.pad + 1, self.n_fft - 2 * self.pad)
            if wav.size(-1) < min_len:
                raise ValueError(
                    f"MelSpectrogram: waveform of {wav.size(-1)} samples is too short for n_fft={self.n_fft} "
                    f"(need at least {min_len})"
                )
            if not self.center and self.pad > 0:
                wav = nn.functional.pad(wav.unsqueeze(1), (self.pad, self.pad), mode="reflect").squeeze(1)
            spec = torch.stft(
                wav,
                self.n_fft,
                hop_length=self.hop_length,
                win_length=self.win_length,
                window=self.window.float(),
                center=self.center,
                pad_mode="reflect",
                normalized=False,
                onesided=True,
                return_complex=True,
            )
            return magnitude(spec)

    def mel_from_linear(self, spec: torch.Tensor) -> torch.Tensor:
        """Linear magnitude [B, n_fft // 2 + 1, frames] → log-mel [B, n_mels, frames] (fp32)."""
        with torch.autocast(device_type=spec.device.type, enabled=False):
            mel = torch.matmul(self.mel_basis.float(), spec.float())
            return torch.log(torch.clamp(mel, min=1e-5))

    def forward(self, wav: torch.Tensor) -> torch.Tensor:
        """wav [B, T], [B, 1, T] or [T] → log-mel [B, n_mels, frames] (fp32)."""
        return self.mel_from_linear(self.linear(wav))

    def mel_in_chunks(self, wav: torch.Tensor, chunk_frames: int = 1024) -> torch.Tensor:
        """One waveform [T] → log-mel [n_mels, frames], `chunk_frames` frames at a time: the same frames as
        `forward` (each frame sees only its own window; bit-identical on the CPU), without the whole file's
        complex STFT and its magnitudes (24 bytes a frame-bin: 1.3 GB for 10 min at 44.1 kHz) at once. For
        a preparation's long files (`center=False`; `center=True` runs `forward`)."""
        if self.center or wav.dim() != 1:
            return self.forward(wav)[0] if wav.dim() == 1 else self.forward(wav)
        min_len = max(self.pad + 1, self.n_fft - 2 * self.pad)
        if wav.numel() < min_len:
            return self.forward(wav)[0]  # its error
        with torch.no_grad(), torch.autocast(device_type=wav.device.type, enabled=False):
            padded = wav.float()
            if self.pad > 0:
                padded = nn.functional.pad(padded[None, None], (self.pad, self.pad), mode="reflect")[0, 0]
            frames = (padded.numel() - self.n_fft) // self.hop_length + 1
            out = torch.empty(self.n_mels, frames)
            for a in range(0, frames, chunk_frames):
                b = min(frames, a + chunk_frames)
                seg = padded[a * self.hop_length:(b - 1) * self.hop_length + self.n_fft]
                spec = torch.stft(seg[None], self.n_fft, hop_length=self.hop_length, win_length=self.win_length,
                                  window=self.window.float(), center=False, normalized=False, onesided=True,
                                  return_complex=True)
                out[:, a:b] = self.mel_from_linear(magnitude(spec))[0]
            return out


def frame_log_power(log_mel: torch.Tensor) -> torch.Tensor:
    """Natural-log magnitude mel [..., n_mels, T] → log of each frame's mel power, log Σ_k mel_k² [..., T]
    (fp32). It does not depend on which bins of a frame hold the energy: a level, not a shape."""
    with torch.autocast(device_type=log_mel.device.type, enabled=False):
        return torch.logsumexp(2.0 * log_mel.float(), dim=-2)
