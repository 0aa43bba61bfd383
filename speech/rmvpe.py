"""RMVPE f0 from a weights file the user gives: RVC's `rmvpe.onnx`, run by onnxruntime.

Why ONNX: the network (a U-Net + BiGRU, ~180 MB) is not shipped by any package, and running RVC's
exported graph needs no copy of its code here — only the input it was trained on and the decoding of its
output, which no library provides, so they are written here:

- input: log mel of the 16 kHz waveform, `[1, 128, T]`: |STFT| (n_fft = win 1024, periodic Hann, hop 160,
  centred with reflect padding), librosa's HTK-scale slaney-normalised filterbank (128 bands, 30-8000 Hz),
  `log(max(mel, 1e-5))`; T padded (reflect) to a multiple of 32 for the U-Net's pooling;
- output: `[1, T, 360]` salience in [0, 1], bin k = 1997.38 + 20 k cents above 10 Hz (~31.7-2006 Hz);
- decoding: per frame, the salience-weighted mean of the cents of the 9 bins around the argmax; unvoiced
  where the peak salience is at or under 0.03. Frame i is centred at i * 10 ms.

RVC's `rmvpe.pt` is a PyTorch state dict of that network, which this project does not carry: give the
.onnx. The file is data (an ONNX graph runs no Python): only a regular file is opened (a FIFO would block the
digest), a `.pt` is refused before it is read, and what the graph returns is checked (floating, [1, frames,
360] for the frames given, finite) before it is decoded, each a one-line `F0WeightsError` naming the file. The real network was not run while writing this (no weights offline); the tests check the mel, the
decoding and the error messages with a small stand-in ONNX model of the same input and output shapes.
"""

from __future__ import annotations

import hashlib
import os
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from common.errors import UserError
from common.model_files import ModelFileError, regular_file

SAMPLE_RATE, N_FFT, HOP, N_MELS, FMIN, FMAX = 16000, 1024, 160, 128, 30.0, 8000.0
N_BINS, CENTS_0, CENTS_STEP = 360, 1997.3794084376191, 20.0
THRESHOLD = 0.03
CENTS = CENTS_0 + CENTS_STEP * np.arange(N_BINS)


class F0WeightsError(UserError, ValueError):
    """The rmvpe weights file is missing, unreadable or not RVC's graph: the caller names its config key."""


def rmvpe_mel(wav16k: np.ndarray) -> np.ndarray:
    """The network's input, `[128, T]` with T = len // 160 + 1 (frame i centred at sample i * 160)."""
    import librosa

    x = torch.from_numpy(np.ascontiguousarray(wav16k, dtype=np.float32))
    if x.numel() <= N_FFT // 2:  # reflect padding needs more samples than the pad
        x = torch.nn.functional.pad(x, (0, N_FFT // 2 + 1 - x.numel()))
    spec = torch.stft(x, N_FFT, HOP, N_FFT, window=torch.hann_window(N_FFT), center=True, pad_mode="reflect",
                      return_complex=True).abs()
    basis = librosa.filters.mel(sr=SAMPLE_RATE, n_fft=N_FFT, n_mels=N_MELS, fmin=FMIN, fmax=FMAX, htk=True)
    return torch.log(torch.clamp(torch.from_numpy(basis) @ spec, min=1e-5)).numpy()


def decode(salience: np.ndarray, threshold: float = THRESHOLD) -> np.ndarray:
    """`[T, 360]` salience → f0 [T] in Hz, 0 where unvoiced: the weighted mean of the cents of the 9 bins
    around each frame's argmax (bins past either end weigh nothing)."""
    s = np.asarray(salience, dtype=np.float64)
    if s.ndim != 2 or s.shape[1] != N_BINS:
        raise F0WeightsError(f"the model gave salience of shape {s.shape}, not [frames, {N_BINS}]")
    centre = s.argmax(axis=1)
    idx = centre[:, None] + np.arange(-4, 5)[None, :]
    inside = (idx >= 0) & (idx < N_BINS)
    idx = np.clip(idx, 0, N_BINS - 1)
    w = np.take_along_axis(s, idx, axis=1) * inside
    cents = (w * CENTS[idx]).sum(axis=1) / np.maximum(w.sum(axis=1), 1e-12)
    f0 = 10.0 * 2.0 ** (cents / 1200.0)
    return np.where(s.max(axis=1) > threshold, f0, 0.0)


def weights_digest(path: str | os.PathLike) -> str:
    """What identifies the weights in a prepared folder / feature cache: the first 16 hex digits of the
    file's SHA-256 (another file under the same name is another extractor)."""
    p = _readable(path)
    st = p.stat()
    return _digest(str(p.resolve()), st.st_size, st.st_mtime_ns)


@lru_cache(maxsize=8)
def _digest(path: str, size: int, mtime_ns: int) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()[:16]


def _readable(path: str | os.PathLike | None) -> Path:
    if not path:
        raise F0WeightsError("the f0 extractor rmvpe needs its weights file: RVC's rmvpe.onnx")
    p = Path(path).expanduser()
    if not p.exists():
        raise F0WeightsError(f"rmvpe weights file {p} does not exist (give RVC's rmvpe.onnx)")
    try:
        regular_file(p, "rmvpe weights file")
    except ModelFileError as exc:
        raise F0WeightsError(str(exc)) from None
    if p.suffix.lower() in (".pt", ".pth", ".ckpt"):
        raise F0WeightsError(f"rmvpe weights file {p} is a PyTorch checkpoint; this project runs RVC's network "
                             "from its ONNX export only: give rmvpe.onnx")
    return p


def _fits(dim, want: int) -> bool:
    """A graph dimension is `want` or symbolic (a name / None); a list: its one element is."""
    if isinstance(dim, list):
        return len(dim) == 1 and _fits(dim[0], want)
    return dim == want or not isinstance(dim, int)


_SESSIONS: dict = {}  # (path, digest, threads) -> onnxruntime session, loaded once per process


def load_session(path: str | os.PathLike):
    """The onnxruntime session of `path`, checked: one input of rank 3 with 128 bands, an output of 360 bins.
    Threads: torch's count (a prepare worker runs single-threaded)."""
    import onnxruntime as ort

    p = _readable(path)
    key = (str(p.resolve()), weights_digest(p), torch.get_num_threads())
    if key not in _SESSIONS:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = opts.inter_op_num_threads = torch.get_num_threads()
        opts.log_severity_level = 3
        try:
            sess = ort.InferenceSession(str(p), sess_options=opts, providers=["CPUExecutionProvider"])
        except Exception as e:  # onnxruntime's own exception types (InvalidProtobuf, Fail, ...)
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise F0WeightsError(f"rmvpe weights file {p} is not an ONNX model onnxruntime can load ({first})") from None
        ins, outs = sess.get_inputs(), sess.get_outputs()
        shape_in, shape_out = list(ins[0].shape), list(outs[0].shape)
        if len(ins) != 1 or len(shape_in) != 3 or not _fits(shape_in[1], N_MELS) or not _fits(shape_out[-1:], N_BINS):
            raise F0WeightsError(f"rmvpe weights file {p} is not RVC's rmvpe graph: input {shape_in}, output "
                                 f"{shape_out} (expected mel [1, {N_MELS}, frames] -> [1, frames, {N_BINS}])")
        _SESSIONS[key] = sess
    return _SESSIONS[key]


def _checked_salience(out, weights: str | os.PathLike, frames: int) -> np.ndarray:
    """The graph's output as `[frames, 360]` when it is a floating array of that many values, all finite;
    else F0WeightsError naming the file (a foreign graph must not make the decoding allocate or crash)."""
    arr = np.asarray(out)
    if not np.issubdtype(arr.dtype, np.floating) or arr.size != frames * N_BINS or arr.shape[-1:] != (N_BINS,):
        raise F0WeightsError(f"rmvpe weights file {weights}: the model returned {arr.dtype} of shape {list(arr.shape)} "
                             f"for {frames} frames, not [1, {frames}, {N_BINS}] salience: give RVC's rmvpe.onnx")
    if not np.isfinite(arr).all():
        raise F0WeightsError(f"rmvpe weights file {weights}: the model returned NaN or infinite salience; the file "
                             "is damaged: give an intact rmvpe.onnx")
    return arr.reshape(frames, N_BINS)


def rmvpe_f0(wav16k: np.ndarray, weights: str | os.PathLike, f0_min: float, f0_max: float):
    """(times [s], f0 [Hz], 0 unvoiced) of a 16 kHz waveform on RMVPE's own 10 ms grid; f0 outside
    [f0_min, f0_max] is unvoiced, as the other extractors never report it."""
    sess = load_session(weights)
    mel = rmvpe_mel(wav16k)
    n = mel.shape[1]
    mel = np.pad(mel, ((0, 0), (0, 32 * ((n - 1) // 32 + 1) - n)), mode="reflect")
    try:
        out = sess.run(None, {sess.get_inputs()[0].name: mel[None].astype(np.float32)})[0]
    except Exception as e:  # a graph that takes other shapes
        raise F0WeightsError(f"rmvpe weights file {weights}: the model did not run on a mel of shape "
                             f"{(1, *mel.shape)} ({str(e).strip().splitlines()[0] if str(e).strip() else e!r})") from None
    f0 = decode(_checked_salience(out, weights, mel.shape[1])[:n])
    f0 = np.where((f0 >= f0_min) & (f0 <= f0_max), f0, 0.0)
    return np.arange(n) * HOP / SAMPLE_RATE, f0
