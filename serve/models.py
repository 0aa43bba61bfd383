"""The checkpoints a server was started with, loaded once, and the four things a request asks of them.

Every model is loaded by its trainer's own inference code (tts/vits/synthesize.py, tts/clone/infer.py,
vocoder/infer.py, vae/weights.py + vae/reconstruct.py); this file only picks which one from the file (the
trainer a checkpoint records, `common.checkpoint.checkpoint_kind`), holds one lock per model (one request
at a time on it: a model's buffers and the RNG are not shared between two syntheses) and stops a synthesis
between sentences when its request is cancelled. Requests never name a file: they name a model by the id
given here at start (`vits-1`, `vocoder-1`, ...).
"""

from __future__ import annotations

import contextlib
import io
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf
import torch

from common import pitch_metrics as pm
from common.audio import AudioError, MelSpectrogram, check_f0_extractor, load_audio, to_int16
from common.checkpoint import CheckpointError, checkpoint_kind, describe_kind, load_checkpoint
from common.errors import UserError
from common.log import plot_spectrograms
from common.plausibility import compare_speech
from common.precision import Precision

KINDS = ("vits", "clone", "vocoder", "vae")


class BadRequest(UserError, ValueError):
    """What is wrong with a request, said to the user as it is (the API answers 4xx with it)."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


class Cancelled(Exception):
    """The request was cancelled (POST /cancel/<id>) while it waited or ran."""


@dataclass
class Limits:
    """What an upload or a text may be; `serve --help` names the flags."""

    max_upload_bytes: int = 20 * 2**20
    max_audio_seconds: float = 60.0
    max_pixels: int = 4096 * 4096
    max_text_chars: int = 5000


@dataclass
class Served:
    """One loaded model. `kind`: vits | clone | vocoder | vae; `info`: what the page shows and offers."""

    id: str
    kind: str
    label: str
    model: Any
    info: dict = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    extra: dict = field(default_factory=dict)

    def public(self) -> dict:
        return {"id": self.id, "kind": self.kind, "label": self.label, **self.info}


def file_kind(path: Path) -> str:
    """The trainer of a checkpoint file or exported folder, from the file itself (never from its name)."""
    if path.is_dir():
        if (path / "model.ckpt").is_file() and (path / "config.json").is_file():
            return "vocoder"
        if (path / "config.json").is_file() and any(path.glob("diffusion_pytorch_model*")):
            return "vae"
        raise CheckpointError(f"{path}: a folder that is neither an exported vocoder (model.ckpt + config.json) "
                              "nor a diffusers VAE (config.json + diffusion_pytorch_model.safetensors)")
    kind = checkpoint_kind(load_checkpoint(path))
    if kind == "vocoder_export":
        return "vocoder"
    if kind not in KINDS:
        what = describe_kind(kind)[0] if kind else "a file no trainer here recognises"
        raise CheckpointError(f"{path}: {what}; give a checkpoint or export of the vocoder, VITS, cloning or VAE trainer")
    return kind


def load_model(path: str | Path, device: torch.device, precision: str, index: int) -> Served:
    """`path` → a Served model on `device`, loaded by its trainer's inference code."""
    path = Path(path)
    kind = file_kind(path)
    label = str(path)
    if kind == "vits":
        from tts.vits.synthesize import load_generator

        model, cfg, speakers = load_generator(path, device)
        info = {"sample_rate": cfg.audio.sample_rate, "speakers": list(speakers),
                "scales": {k: getattr(cfg, k) for k in ("noise_scale", "length_scale", "noise_scale_w")}}
        return Served(f"vits-{index}", kind, label, model, info, extra={"cfg": cfg, "speakers": speakers})
    if kind == "clone":
        from tts.clone.infer import load_clone_model, load_matching_vocoder

        model, cfg = load_clone_model(path, device)
        info = {"sample_rate": cfg.audio.sample_rate, "own_vocoder": None}
        extra: dict = {"cfg": cfg, "vocoder": None}
        if cfg.vocoder.path and Path(cfg.vocoder.path).exists():  # the one it was trained with, when still there
            try:
                extra["vocoder"] = load_matching_vocoder(cfg.vocoder.path, cfg.audio, device)
                info["own_vocoder"] = cfg.vocoder.path
            except (CheckpointError, ValueError) as e:
                info["own_vocoder_problem"] = str(e)
        return Served(f"clone-{index}", kind, label, model, info, extra=extra)
    if kind == "vocoder":
        from vocoder.infer import load_vocoder

        voc = load_vocoder(path, device)
        check_f0_extractor(voc.pe, voc.pe_ckpt)  # Vocode extracts f0 with it: a missing package or rmvpe file at start
        return Served(f"vocoder-{index}", kind, label, voc, {"sample_rate": voc.sample_rate},
                      extra={"mel": MelSpectrogram(**voc.mel_kwargs).to(device)})
    from vae.weights import load_vae_weights

    model, meta = load_vae_weights(path)
    return Served(f"vae-{index}", kind, label, model.to(device).eval(), {"source": meta.get("source")},
                  extra={"precision": Precision(precision, device)})


def load_models(paths: list[str], device: torch.device, precision: str = "32-true") -> dict[str, Served]:
    """Every path, in order, as {id: Served}; ids count per kind from 1."""
    models: dict[str, Served] = {}
    counts = dict.fromkeys(KINDS, 0)
    for path in paths:
        kind = file_kind(Path(path))
        counts[kind] += 1
        served = load_model(path, device, precision, counts[kind])
        models[served.id] = served
    return models


# --------------------------------------------------------------------------------------------- requests


class Job:
    """One request's cancel flag; `check()` raises Cancelled once it is set."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()

    def check(self) -> None:
        if self.cancelled.is_set():
            raise Cancelled("cancelled")


@contextlib.contextmanager
def locked(served: Served, job: Job) -> Iterator[None]:
    """Hold the model's lock; a request cancelled while it waits for it ends at once."""
    while not served.lock.acquire(timeout=0.1):
        job.check()
    try:
        yield
    finally:
        served.lock.release()


def wav_bytes(wav: np.ndarray, sr: int) -> bytes:
    """float waveform → 16-bit PCM wav file bytes."""
    buf = io.BytesIO()
    sf.write(buf, to_int16(wav), sr, subtype="PCM_16", format="WAV")
    return buf.getvalue()


def check_text(text: str, limits: Limits) -> str:
    text = (text or "").strip()
    if not text:
        raise BadRequest("the text is empty: type a sentence to speak")
    if len(text) > limits.max_text_chars:
        raise BadRequest(f"the text is {len(text)} characters, more than the limit of {limits.max_text_chars} "
                         "(--max_text_chars)")
    return text


def read_upload_audio(data: bytes, sr: int, limits: Limits, what: str = "the upload") -> np.ndarray:
    """Uploaded bytes → mono float32 at `sr` through common.audio's loader (its checks and messages)."""
    if not data:
        raise BadRequest(f"{what} is empty (0 bytes): choose an audio file (wav, flac, ogg, mp3)")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "upload"
        path.write_bytes(data)
        try:
            wav, _ = load_audio(path, sr=sr, max_seconds=limits.max_audio_seconds)
        except AudioError as e:
            raise BadRequest(f"{what} is {_audio_reason(e.reason)}; give a wav, flac, ogg or mp3 file of at most "
                             f"{limits.max_audio_seconds:g} s") from None
    return wav


def _audio_reason(reason: str) -> str:
    return "not audio" if reason.startswith("not readable as audio") else reason


def speak(served: Served, text: str, job: Job, limits: Limits, speaker: str | None = None,
          scales: dict[str, float] | None = None, seed: int = 0, reference: bytes | None = None,
          vocoder: Served | None = None) -> dict:
    """Text → {"wav": bytes, "sample_rate", "seconds", "elapsed", "rtf", "sentences"} with a VITS or cloning model."""
    text = check_text(text, limits)
    if served.kind == "vits":
        return _speak_vits(served, text, job, speaker, scales or {}, seed)
    if served.kind == "clone":
        if reference is None:
            raise BadRequest("the cloning model speaks in the voice of a reference clip: upload one (a few seconds)")
        return _speak_clone(served, text, job, limits, reference, vocoder, (scales or {}).get("length_scale"), seed)
    raise BadRequest(f"{served.id} is a {served.kind} model; Speak takes a VITS or cloning model")


def _speak_vits(served: Served, text: str, job: Job, speaker: str | None, scales: dict, seed: int) -> dict:
    from common.config import ConfigError
    from tts.vits.synthesize import resolve_speaker, synthesize_long

    cfg, device = served.extra["cfg"], next(served.model.parameters()).device
    try:
        sid = resolve_speaker(speaker or None, served.extra["speakers"])
    except ConfigError as e:
        raise BadRequest(str(e).replace("--speaker", "speaker")) from None
    s = {k: float(getattr(cfg, k) if scales.get(k) is None else scales[k])
         for k in ("noise_scale", "length_scale", "noise_scale_w")}
    if s["noise_scale"] < 0 or s["noise_scale_w"] < 0 or not 0 < s["length_scale"] <= 10:
        raise BadRequest(f"noise_scale and noise_scale_w must be >= 0 and length_scale in (0, 10], got {s}")

    def between(*_) -> None:
        job.check()

    with locked(served, job), tempfile.TemporaryDirectory() as tmp:
        job.check()
        torch.manual_seed(seed)
        out = Path(tmp) / "speech.wav"
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # unknown characters are dropped; the page shows the result
                stats = synthesize_long(served.model, cfg, text, out, sid, s["noise_scale"], s["length_scale"],
                                        s["noise_scale_w"], device=device, on_sentence=between)
        except ValueError as e:  # nothing speakable after normalisation
            raise BadRequest(str(e)) from None
        data = out.read_bytes()
    return {"wav": data, "sample_rate": cfg.audio.sample_rate, "seconds": stats["seconds"],
            "elapsed": stats["elapsed"], "rtf": stats["elapsed"] / max(stats["seconds"], 1e-9),
            "sentences": stats["sentences"]}


def _speak_clone(served: Served, text: str, job: Job, limits: Limits, reference: bytes, vocoder: Served | None,
                 length_scale: float | None, seed: int) -> dict:
    from tts.clone.data import DataError, load_reference
    from tts.clone.infer import VocoderMismatchError, check_vocoder_settings, synthesize_long

    cfg = served.extra["cfg"]
    voc = vocoder.model if vocoder is not None else served.extra["vocoder"]
    if voc is None:
        raise BadRequest("this cloning model's own vocoder is not here: start the server with a vocoder "
                         "export too and choose it")
    if vocoder is not None:
        try:
            check_vocoder_settings(voc, cfg.audio, f" {vocoder.id}")
        except VocoderMismatchError as e:
            raise BadRequest(str(e)) from None
    length_scale = 1.0 if length_scale is None else float(length_scale)
    if not 0 < length_scale <= 10:
        raise BadRequest(f"length_scale must be in (0, 10], got {length_scale}")
    read_upload_audio(reference, cfg.audio.sample_rate, limits, "the reference clip")  # not audio / too long: 4xx
    with tempfile.TemporaryDirectory() as tmp:
        ref_path = Path(tmp) / "reference"
        ref_path.write_bytes(reference)
        try:
            ref = load_reference(ref_path, cfg.audio, cfg.data)
        except DataError as e:
            raise BadRequest(str(e).replace(f"reference clip {ref_path}", "the reference clip")) from None
    locks = [served] + ([vocoder] if vocoder is not None else [])  # always model before vocoder: no deadlock
    with locked(locks[0], job), (locked(locks[1], job) if len(locks) > 1 else contextlib.nullcontext()):
        torch.manual_seed(seed)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                res = synthesize_long(served.model, text, ref, voc, length_scale, between=job.check)
        except DataError as e:  # nothing speakable after normalisation
            raise BadRequest(str(e)) from None
    seconds = len(res["wav"]) / voc.sample_rate
    return {"wav": wav_bytes(res["wav"], voc.sample_rate), "sample_rate": voc.sample_rate, "seconds": seconds,
            "elapsed": res["compute_s"], "rtf": res["compute_s"] / max(seconds, 1e-9), "sentences": res["sentences"]}


def vocode(served: Served, data: bytes, job: Job, limits: Limits) -> dict:
    """An uploaded recording → its copy-synthesis, side-by-side spectrograms (PNG) and the vocoder's held-out
    figures against the recording: level and MCD-DTW (`common.plausibility`), F0 RMSE, V/UV error and
    periodicity (`common.pitch_metrics`)."""
    if served.kind != "vocoder":
        raise BadRequest(f"{served.id} is a {served.kind} model; Vocode takes a vocoder")
    voc = served.model
    wav = read_upload_audio(data, voc.sample_rate, limits)
    if len(wav) < 4 * voc.hop_length:
        raise BadRequest(f"the recording is too short ({len(wav) / voc.sample_rate:.3f} s): give at least a second")
    with locked(served, job):
        job.check()
        t0 = time.perf_counter()
        out = voc.copy_synthesize(wav)
        if voc.device.type == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
    ref = wav[: len(out)]
    pair = compare_speech("upload", out, ref, served.extra["mel"])
    pitch = pm.pitch_errors(out, ref, voc.sample_rate, voc.hop_length, voc.f0_min, voc.f0_max)
    seconds = len(out) / voc.sample_rate
    fig = plot_spectrograms([("recording", pair.ref_mel), (f"copy-synthesis ({served.id})", pair.gen_mel)],
                            hop_seconds=voc.hop_length / voc.sample_rate)
    png = io.BytesIO()
    fig.savefig(png, format="png")
    metrics = {"mcd_dtw_db": pair.mcd, "level_db": pair.level_db, **{f"{k}": v for k, v in pitch.items()}}
    return {"wav": wav_bytes(out, voc.sample_rate), "original": wav_bytes(ref, voc.sample_rate), "png": png.getvalue(),
            "metrics": metrics, "seconds": seconds, "elapsed": elapsed, "rtf": elapsed / max(seconds, 1e-9),
            "sample_rate": voc.sample_rate}


def reconstruct(served: Served, data: bytes, job: Job, limits: Limits, tile_size: int = 512,
                tile_overlap: int = 64) -> dict:
    """An uploaded image → {"png": its reconstruction, "psnr", "width", "height", "tiled", "elapsed"}; the size
    is judged from the header before decoding (`vae.reconstruct.too_large`), as vae/reconstruct.py does."""
    from vae.data import BadImage, image_to_tensor, open_image_rgb, tensor_to_uint8
    from vae.metrics import psnr
    from vae.reconstruct import reconstruct_image, too_large

    if served.kind != "vae":
        raise BadRequest(f"{served.id} is a {served.kind} model; Reconstruct takes a VAE")
    if not data:
        raise BadRequest("the upload is empty (0 bytes): choose an image (png, jpg, webp)")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "upload"
        path.write_bytes(data)
        try:
            problem = too_large(path, limits.max_pixels)
            if problem:
                raise BadImage(problem.replace("--max_pixels", "the server's --max_pixels"), "too_large")
            im, _ = open_image_rgb(path, max_pixels=limits.max_pixels, min_size=1, allow_blank=True)
        except BadImage as e:
            reason = "not an image" if e.kind == "not_image" else e.reason
            raise BadRequest(f"the upload is {reason}; give a png, jpg or webp image") from None
    device = next(served.model.parameters()).device
    x = image_to_tensor(im)[None].to(device)
    tiled = bool(tile_size) and max(x.shape[-2:]) > tile_size
    with locked(served, job):
        job.check()
        t0 = time.perf_counter()
        rec = reconstruct_image(served.model, x, served.extra["precision"], tile_size, tile_overlap)
        elapsed = time.perf_counter() - t0
    png = io.BytesIO()
    from PIL import Image

    Image.fromarray(tensor_to_uint8(rec[0])).save(png, format="PNG")
    return {"png": png.getvalue(), "psnr": float(psnr(x, rec.float())[0]), "width": im.width, "height": im.height,
            "tiled": tiled, "elapsed": elapsed}
