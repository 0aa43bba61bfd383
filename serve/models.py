"""The checkpoints a server was started with, each read from disk once, and what a request asks of them.

One class per model kind (`VitsModel`, `CloneModel`, `VocoderModel`, `VaeModel`, all `Served`): each is built
by its trainer's own inference code (tts/vits/synthesize.py, tts/clone/infer.py, vocoder/infer.py, vae/weights.py
+ vae/reconstruct.py) from the checkpoint `load_models` read once to learn which trainer wrote it
(`common.checkpoint.checkpoint_kind`); a vocoder export that is served and is also a cloning model's own vocoder
is loaded once and shared, with its lock. Each model has one lock (one request at a time on it: a model's buffers
and the RNG are not shared between two syntheses); Speak runs the models' `stream` functions, which stop between
sentences when the request is cancelled. Requests never name a file: they name a model by the id given here at
start (`vits-1`, `vocoder-1`, ...). A message the user sees is the one the code raised (a `common.errors.
UserError`: serve/app.py answers it as a 4xx), never rewritten here.
"""

from __future__ import annotations

import contextlib
import io
import math
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import soundfile as sf
import torch

from common.checkpoint import CheckpointError, checkpoint_kind, describe_kind, load_checkpoint
from common.errors import UserError
from common.precision import Precision
from speech import pitch_metrics as pm
from speech.audio import AudioError, MelSpectrogram, load_audio, to_int16
from speech.buzz import hop_comb_db
from speech.f0 import check_f0_extractor
from speech.mcd import compare_speech
from speech.plots import plot_spectrograms

KINDS = ("vits", "clone", "vocoder", "vae")
# The /speak fields that change what a speech model says. Each model tells which of them it reads ("controls" in
# GET /models) and why it ignores the others ("unused"), so the page can grey out a control that would change
# nothing and a program can see it in X-Ignored-Fields, instead of hearing the same wav and wondering why.
SPEECH_CONTROLS = ("speaker", "noise_scale", "length_scale", "noise_scale_w", "reference", "vocoder")


class BadRequest(UserError, ValueError):
    """What is wrong with a request, said to the user as it is (the API answers 4xx with it, or 503 with the
    `headers` that say when to come back)."""

    def __init__(self, message: str, status: int = 400, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.headers = status, headers


class Cancelled(Exception):
    """The request was cancelled (POST /cancel/<id>) while it waited or ran."""


@dataclass
class Limits:
    """What an upload or a text may be, and what one request may take of the server; `serve --help` names the
    flags. `memory_bytes`: what one reconstruction may use (`vae.reconstruct.reconstruct_memory`; larger ones are
    tiled, or refused); `queue_per_model`: requests waiting for or running on one model (more: 503);
    `body_timeout_s`: the longest pause while a request body arrives (longer: 408, the connection dropped)."""

    max_upload_bytes: int = 20 * 2**20
    max_audio_seconds: float = 60.0
    max_pixels: int = 4096 * 4096
    max_text_chars: int = 5000
    memory_bytes: int = 4 * 2**30
    queue_per_model: int = 4
    body_timeout_s: float = 30.0


class Served:
    """One loaded model. `kind`: vits | clone | vocoder | vae; `info`: what the page shows and offers. The three
    requests a model does not take answer with what it is and which kind takes them."""

    kind: ClassVar[str] = ""

    def __init__(self, id: str, label: str, model: Any, info: dict | None = None,
                 lock: threading.Lock | None = None) -> None:
        self.id, self.label, self.model = id, label, model
        self.info = info or {}
        self.lock = lock or threading.Lock()

    def public(self) -> dict:
        return {"id": self.id, "kind": self.kind, "label": self.label, **self.info}

    def speak(self, text: str, job: Job, limits: Limits, speaker: str | None = None,
              scales: dict[str, float | None] | None = None, seed: int = 0, reference: bytes | None = None,
              vocoder: Served | None = None) -> dict:
        """Text → {"wav": bytes, "sample_rate", "seconds", "elapsed", "rtf", "sentences", "metrics"} (VITS and
        cloning; metrics: the speech's hop comb, `speech_answer`)."""
        raise BadRequest(f"{self.id} is a {self.kind} model; Speak takes a VITS or cloning model")

    def vocode(self, data: bytes, job: Job, limits: Limits) -> dict:
        raise BadRequest(f"{self.id} is a {self.kind} model; Vocode takes a vocoder")

    def reconstruct(self, data: bytes, job: Job, limits: Limits, tile_size: int = 512, tile_overlap: int = 64) -> dict:
        raise BadRequest(f"{self.id} is a {self.kind} model; Reconstruct takes a VAE")


# A vocoder read once per file, whoever needs it (a served vocoder, a cloning model's own): {resolved path: (the
# loaded vocoder, its lock)}.
Vocoders = dict[Path, tuple[Any, threading.Lock]]


def shared_vocoder(path: Path, ckpt: dict | None, device: torch.device, vocoders: Vocoders) -> tuple[Any, threading.Lock]:
    """The vocoder at `path`, loaded (by `vocoder.infer.load_vocoder`) only the first time it is asked for."""
    from vocoder.infer import load_vocoder

    key = path.resolve()
    if key not in vocoders:
        vocoders[key] = (load_vocoder(path, device, ckpt=ckpt), threading.Lock())
    return vocoders[key]


class VitsModel(Served):
    """A VITS checkpoint (tts/train.py): text → speech, in one of its speakers' voices."""

    kind = "vits"

    @classmethod
    def load(cls, path: Path, ckpt: dict | None, device: torch.device, precision: str, id: str,
             vocoders: Vocoders) -> VitsModel:
        from tts.vits.synthesize import load_generator

        model, cfg, speakers = load_generator(path, device, ckpt=ckpt)
        unused = {"reference": "a VITS model speaks in its own speakers' voices",
                  "vocoder": "a VITS model makes the waveform itself"}
        if len(speakers) < 2:
            unused["speaker"] = "this model has one speaker"
        if not model.args.use_sdp:  # the deterministic duration predictor takes no noise
            unused["noise_scale_w"] = ("this model's duration predictor is deterministic (use_sdp: false); "
                                       "noise_scale_w is the stochastic one's noise")
        info = {"sample_rate": cfg.audio.sample_rate, "speakers": list(speakers),
                "scales": {k: getattr(cfg, k) for k in ("noise_scale", "length_scale", "noise_scale_w")},
                **speech_controls(unused)}
        return cls(id, display_name(path), model, info, cfg=cfg, speakers=speakers, device=device)

    def __init__(self, id: str, label: str, model: Any, info: dict, *, cfg: Any, speakers: dict[str, int],
                 device: torch.device) -> None:
        super().__init__(id, label, model, info)
        self.cfg, self.speakers, self.device = cfg, speakers, device

    def speak(self, text: str, job: Job, limits: Limits, speaker: str | None = None,
              scales: dict[str, float | None] | None = None, seed: int = 0, reference: bytes | None = None,
              vocoder: Served | None = None) -> dict:
        from tts.text.sentences import plan
        from tts.vits.synthesize import resolve_speaker, stream

        text = check_text(text, limits)
        sid = resolve_speaker(speaker or None, self.speakers, "speaker")
        scales = scales or {}
        s = {k: float(getattr(self.cfg, k) if scales.get(k) is None else scales[k])
             for k in ("noise_scale", "length_scale", "noise_scale_w")}
        if s["noise_scale"] < 0 or s["noise_scale_w"] < 0 or not 0 < s["length_scale"] <= 10:
            raise BadRequest(f"noise_scale and noise_scale_w must be >= 0 and length_scale in (0, 10], got {s}")
        with locked(self.lock, job):
            torch.manual_seed(seed)
            t0 = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # unknown characters are dropped; the page shows the result
                chunks = list(stream(self.model, self.cfg, plan(text), sid, s["noise_scale"], s["length_scale"],
                                     s["noise_scale_w"], device=self.device, cancelled=job.is_cancelled))
            job.check()  # a cancel between sentences ended the stream early
            elapsed = time.perf_counter() - t0
        return speech_answer(chunks, self.cfg.audio.sample_rate, self.cfg.audio.hop_length, elapsed)


class CloneModel(Served):
    """A voice-cloning checkpoint (tts/train_main.py): text + a reference clip → speech, through a vocoder (its
    own, the one it was trained with, when that is still there, or a served one the request names)."""

    kind = "clone"

    @classmethod
    def load(cls, path: Path, ckpt: dict | None, device: torch.device, precision: str, id: str,
             vocoders: Vocoders) -> CloneModel:
        from tts.clone.infer import check_vocoder_settings, load_clone_model

        model, cfg = load_clone_model(path, device, ckpt=ckpt)
        unused = {"speaker": "a cloning model speaks in the voice of its reference clip",
                  "noise_scale": "a VITS scale; a cloning model reads length_scale only",
                  "noise_scale_w": "a VITS scale; a cloning model reads length_scale only"}
        info: dict = {"sample_rate": cfg.audio.sample_rate, "own_vocoder": None, **speech_controls(unused)}
        own = None
        if cfg.vocoder.path and Path(cfg.vocoder.path).exists():  # the one it was trained with, when still there
            try:
                own = shared_vocoder(Path(cfg.vocoder.path), None, device, vocoders)
                check_vocoder_settings(own[0], cfg.audio, f" at {cfg.vocoder.path}")
                info["own_vocoder"] = display_name(Path(cfg.vocoder.path))
            except (CheckpointError, UserError) as e:
                own = None
                print(f"  {id}: its own vocoder cannot be used: {e}")  # the page lists only the served vocoders
        return cls(id, display_name(path), model, info, cfg=cfg, own_vocoder=own)

    def __init__(self, id: str, label: str, model: Any, info: dict, *, cfg: Any,
                 own_vocoder: tuple[Any, threading.Lock] | None) -> None:
        super().__init__(id, label, model, info)
        self.cfg, self.own_vocoder = cfg, own_vocoder  # (vocoder, its lock): shared when it is served too

    def speak(self, text: str, job: Job, limits: Limits, speaker: str | None = None,
              scales: dict[str, float | None] | None = None, seed: int = 0, reference: bytes | None = None,
              vocoder: Served | None = None) -> dict:
        from tts.clone.data import load_reference
        from tts.clone.infer import check_vocoder_settings, stream
        from tts.text.sentences import plan

        text = check_text(text, limits)
        if reference is None:
            raise BadRequest("the cloning model speaks in the voice of a reference clip: upload one (a few seconds)")
        if vocoder is not None:
            voc, voc_lock = vocoder.model, vocoder.lock
            check_vocoder_settings(voc, self.cfg.audio, f" {vocoder.id}")
        elif self.own_vocoder is not None:
            voc, voc_lock = self.own_vocoder
        else:
            raise BadRequest("this cloning model's own vocoder is not here: start the server with a vocoder "
                             "export too and choose it")
        length_scale = (scales or {}).get("length_scale")
        length_scale = 1.0 if length_scale is None else float(length_scale)
        if not 0 < length_scale <= 10:
            raise BadRequest(f"length_scale must be in (0, 10], got {length_scale}")
        read_upload_audio(reference, self.cfg.audio.sample_rate, limits, "the reference clip")  # not audio / too long
        with tempfile.TemporaryDirectory() as tmp:
            ref_path = Path(tmp) / "reference"
            ref_path.write_bytes(reference)
            ref = load_reference(ref_path, self.cfg.audio, self.cfg.data, name="the reference clip")
        with locked(self.lock, job), locked(voc_lock, job):  # always model before vocoder: no deadlock
            torch.manual_seed(seed)
            t0 = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                chunks = list(stream(self.model, plan(text), ref, voc, length_scale, cancelled=job.is_cancelled))
            job.check()
            elapsed = time.perf_counter() - t0
        return speech_answer(chunks, voc.sample_rate, voc.hop_length, elapsed)


class VocoderModel(Served):
    """A vocoder checkpoint or export (vocoder/train.py, vocoder/export.py): a recording → its copy-synthesis."""

    kind = "vocoder"

    @classmethod
    def load(cls, path: Path, ckpt: dict | None, device: torch.device, precision: str, id: str,
             vocoders: Vocoders) -> VocoderModel:
        voc, lock = shared_vocoder(path, ckpt, device, vocoders)
        check_f0_extractor(voc.pe, voc.pe_ckpt)  # Vocode extracts f0 with it: a missing package or rmvpe file at start
        return cls(id, display_name(path), voc, {"sample_rate": voc.sample_rate}, lock)

    def __init__(self, id: str, label: str, model: Any, info: dict, lock: threading.Lock | None = None) -> None:
        super().__init__(id, label, model, info, lock)
        self.mel = MelSpectrogram(**model.mel_kwargs).to(model.device)  # the metrics' mel, on the vocoder's device

    def vocode(self, data: bytes, job: Job, limits: Limits) -> dict:
        """An uploaded recording → its copy-synthesis, side-by-side spectrograms (PNG) and the vocoder's held-out
        figures against the recording: level and MCD-DTW (`speech.mcd`), F0 RMSE, median and gross F0 error, V/UV
        error and periodicity (`speech.pitch_metrics`, tracked with the vocoder's own extractor and range), and the
        copy-synthesis's hop comb (a buzz at the frame rate, `speech.buzz`)."""
        voc = self.model
        wav = read_upload_audio(data, voc.sample_rate, limits)
        if len(wav) < 4 * voc.hop_length:
            raise BadRequest(f"the recording is too short ({len(wav) / voc.sample_rate:.3f} s): give at least a second")
        with locked(self.lock, job):
            t0 = time.perf_counter()
            out = voc.copy_synthesize(wav)
            if voc.device.type == "cuda":
                torch.cuda.synchronize()
            elapsed = time.perf_counter() - t0
        ref = wav[: len(out)]
        pair = compare_speech("upload", out, ref, self.mel)
        pitch = pm.pitch_errors(out, ref, voc.sample_rate, voc.hop_length, voc.f0_min, voc.f0_max, voc.pe,
                                voc.pe_ckpt or None)
        seconds = len(out) / voc.sample_rate
        fig = plot_spectrograms([("recording", pair.ref_mel), (f"copy-synthesis ({self.id})", pair.gen_mel)],
                                hop_seconds=voc.hop_length / voc.sample_rate)
        png = io.BytesIO()
        fig.savefig(png, format="png")
        metrics = {"mcd_dtw_db": pair.mcd, "level_db": pair.level_db, **pitch,
                   "hop_comb_db": hop_comb_db(out, voc.sample_rate, voc.hop_length)}
        # silence, DC or a whisper has no pitch or level to compare: such a figure is null (JSON has no NaN)
        metrics = {k: float(v) if v is not None and math.isfinite(v) else None for k, v in metrics.items()}
        return {"wav": wav_bytes(out, voc.sample_rate), "original": wav_bytes(ref, voc.sample_rate),
                "png": png.getvalue(), "metrics": metrics, "seconds": seconds, "elapsed": elapsed,
                "rtf": elapsed / max(seconds, 1e-9), "sample_rate": voc.sample_rate}


class VaeModel(Served):
    """A VAE checkpoint, final weights or diffusers folder (vae/train_vae.py): an image → its reconstruction."""

    kind = "vae"

    @classmethod
    def load(cls, path: Path, ckpt: dict | None, device: torch.device, precision: str, id: str,
             vocoders: Vocoders) -> VaeModel:
        from vae.weights import load_vae_weights

        model, meta = load_vae_weights(path, ckpt=ckpt)
        return cls(id, display_name(path), model.to(device).eval(), {"source": meta.get("source")},
                   precision=Precision(precision, device), device=device)

    def __init__(self, id: str, label: str, model: Any, info: dict, *, precision: Precision,
                 device: torch.device) -> None:
        super().__init__(id, label, model, info)
        self.precision, self.device = precision, device

    def reconstruct(self, data: bytes, job: Job, limits: Limits, tile_size: int = 512, tile_overlap: int = 64) -> dict:
        """An uploaded image → {"png": its reconstruction, "psnr", "width", "height", "tiled", "tile_size",
        "elapsed"}. Before decoding, from the header (as vae/reconstruct.py): a size over --max_pixels is refused,
        and the memory the reconstruction would take (`vae.reconstruct.fit_tile`) picks a smaller tile than asked
        when the asked one would not fit `limits.memory_bytes` (413 when even the smallest would not). The request's
        cancel is asked before each tile."""
        from PIL import Image

        from vae.data import BadImage, image_to_tensor, open_image_rgb, tensor_to_uint8
        from vae.metrics import psnr
        from vae.reconstruct import header_size, reconstruct_image, too_large

        if not data:
            raise BadRequest("the upload is empty (0 bytes): choose an image (png, jpg, webp)")
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "upload"
            path.write_bytes(data)
            try:
                problem = too_large(path, limits.max_pixels, "the server's --max_pixels")
                if problem:
                    raise BadImage(problem, "too_large")
                size = header_size(path)
                if size is not None:
                    tile_size = self.fit(*size, tile_size, limits)
                im, _ = open_image_rgb(path, max_pixels=limits.max_pixels, min_size=1, allow_blank=True)
            except BadImage as e:
                reason = "not an image" if e.kind == "not_image" else e.reason
                raise BadRequest(f"the upload is {reason}; give a png, jpg or webp image") from None
        if size != im.size:  # oriented by its EXIF tag, or no header PIL reads without decoding: judge it now
            tile_size = self.fit(im.width, im.height, tile_size, limits)
        x = image_to_tensor(im)[None].to(self.device)
        tiled = bool(tile_size) and max(x.shape[-2:]) > tile_size
        with locked(self.lock, job):
            hooks = [part.register_forward_pre_hook(lambda *_: job.check())
                     for part in (self.model.encoder, self.model.decoder)]  # each tile encodes and decodes once
            try:
                t0 = time.perf_counter()
                rec = reconstruct_image(self.model, x, self.precision, tile_size, tile_overlap)
                elapsed = time.perf_counter() - t0
            finally:
                for hook in hooks:
                    hook.remove()
        png = io.BytesIO()
        Image.fromarray(tensor_to_uint8(rec[0])).save(png, format="PNG")
        return {"png": png.getvalue(), "psnr": float(psnr(x, rec.float())[0]), "width": im.width,
                "height": im.height, "tiled": tiled, "tile_size": tile_size, "elapsed": elapsed}

    def fit(self, width: int, height: int, tile_size: int, limits: Limits) -> int:
        """The tile a `width` x `height` reconstruction runs with inside the memory budget, or 413."""
        from vae.reconstruct import TILE_STEPS, fit_tile, reconstruct_memory

        tile = fit_tile(self.model, height, width, tile_size, limits.memory_bytes)
        if tile is None:
            need = reconstruct_memory(self.model, height, width, TILE_STEPS[-1])
            raise BadRequest(f"a {width}x{height} image needs about {need / 2**30:.2f} GiB even in {TILE_STEPS[-1]} px "
                             f"tiles, more than the server's memory budget of {limits.memory_bytes / 2**30:.2f} GiB "
                             "(--max_memory_gb): give a smaller image", 413)
        return tile


CLASSES: dict[str, type] = {cls.kind: cls for cls in (VitsModel, CloneModel, VocoderModel, VaeModel)}
KINDS = tuple(CLASSES)


def file_kind(path: Path, ckpt: dict | None = None) -> str:
    """The trainer of a checkpoint file or exported folder, from the file itself (never from its name); `ckpt`:
    the file already loaded."""
    if path.is_dir():
        if (path / "model.ckpt").is_file() and (path / "config.json").is_file():
            return "vocoder"
        if (path / "config.json").is_file() and any(path.glob("diffusion_pytorch_model*")):
            return "vae"
        raise CheckpointError(f"{path}: a folder that is neither an exported vocoder (model.ckpt + config.json) "
                              "nor a diffusers VAE (config.json + diffusion_pytorch_model.safetensors)")
    kind = checkpoint_kind(load_checkpoint(path) if ckpt is None else ckpt)
    if kind == "vocoder_export":
        return "vocoder"
    if kind not in KINDS:
        what = describe_kind(kind)[0] if kind else "a file no trainer here recognises"
        raise CheckpointError(f"{path}: {what}; give a checkpoint or export of the vocoder, VITS, cloning or VAE trainer")
    return kind


def load_models(paths: list[str], device: torch.device, precision: str = "32-true") -> dict[str, Served]:
    """Every path, in order, as {id: Served}; ids count per kind from 1. Each file is read from disk once: the
    checkpoint that says which trainer wrote it is the one its model is built from."""
    models: dict[str, Served] = {}
    counts = dict.fromkeys(KINDS, 0)
    vocoders: Vocoders = {}
    for name in paths:
        path = Path(name)
        if path.resolve() in vocoders:  # already read as a cloning model's own vocoder
            kind, ckpt = "vocoder", None
        else:
            ckpt = None if path.is_dir() else load_checkpoint(path)
            kind = file_kind(path, ckpt)
        counts[kind] += 1
        served = CLASSES[kind].load(path, ckpt, device, precision, f"{kind}-{counts[kind]}", vocoders)
        models[served.id] = served
    return models


# --------------------------------------------------------------------------------------------- requests


class Job:
    """One request's cancel flag; `check()` raises Cancelled once it is set."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()

    def is_cancelled(self) -> bool:
        """Whether the request was cancelled: what a model's `stream` asks between sentences."""
        return self.cancelled.is_set()

    def check(self) -> None:
        if self.is_cancelled():
            raise Cancelled("cancelled")


@contextlib.contextmanager
def locked(lock: threading.Lock, job: Job) -> Iterator[None]:
    """Hold a model's lock; a request cancelled while it waits for it ends at once, and so does one cancelled
    just as it gets it."""
    while not lock.acquire(timeout=0.1):
        job.check()
    try:
        job.check()
        yield
    finally:
        lock.release()


def speech_controls(unused: dict[str, str]) -> dict:
    """A speech model's "controls" (the SPEECH_CONTROLS it reads) and "unused" ({control: why it ignores it})."""
    return {"controls": [c for c in SPEECH_CONTROLS if c not in unused], "unused": unused}


def speech_answer(chunks: list, sample_rate: int, hop_length: int, elapsed: float) -> dict:
    """A stream's chunks joined into Speak's answer: the wav, its timings, the text as the model read it (each
    spoken sentence normalised as the front-end does: Latin script, numbers in words), which is what a listener
    should compare the audio with, and its hop comb (`speech.buzz`: a young model's buzz at the frame rate sounds
    like one pitch whatever the voice; None when too short to tell)."""
    from tts.text import normalize

    wav = np.concatenate([c.audio for c in chunks])
    seconds = len(wav) / sample_rate
    comb = hop_comb_db(wav, sample_rate, hop_length)
    return {"wav": wav_bytes(wav, sample_rate), "sample_rate": sample_rate, "seconds": seconds, "elapsed": elapsed,
            "rtf": elapsed / max(seconds, 1e-9), "sentences": len(chunks),
            "spoken": " ".join(normalize(c.text) for c in chunks),
            "metrics": {"hop_comb_db": comb if math.isfinite(comb) else None}}


def wav_bytes(wav: np.ndarray, sr: int) -> bytes:
    """float waveform → 16-bit PCM wav file bytes."""
    buf = io.BytesIO()
    sf.write(buf, to_int16(wav), sr, subtype="PCM_16", format="WAV")
    return buf.getvalue()


def display_name(path: Path) -> str:
    """How the page names a model's file: its last two parts (`checkpoints/best.pt`, `vocoder_demo/export`), never the
    absolute path, which would tell any page that can read /models the user's folders."""
    return "/".join(Path(path).resolve().parts[-2:])


def check_text(text: str, limits: Limits) -> str:
    text = (text or "").strip()
    if not text:
        raise BadRequest("the text is empty: type a sentence to speak")
    if len(text) > limits.max_text_chars:
        raise BadRequest(f"the text is {len(text)} characters, more than the limit of {limits.max_text_chars} "
                         "(--max_text_chars)")
    return text


def read_upload_audio(data: bytes, sr: int, limits: Limits, what: str = "the upload") -> np.ndarray:
    """Uploaded bytes → mono float32 at `sr` through speech.audio's loader (its checks and messages)."""
    if not data:
        raise BadRequest(f"{what} is empty (0 bytes): choose an audio file (wav, flac, ogg, mp3)")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "upload"
        path.write_bytes(data)
        try:
            wav, _ = load_audio(path, sr=sr, max_seconds=limits.max_audio_seconds)
        except AudioError as e:
            reason = "not audio" if e.kind == "not_audio" else e.reason
            raise BadRequest(f"{what} is {reason}; give a wav, flac, ogg or mp3 file of at most "
                             f"{limits.max_audio_seconds:g} s") from None
    return wav
