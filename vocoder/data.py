"""Dataset over a folder written by ``prepare_data.py``: random (mel, f0, audio) crops for
training, whole files for validation. One crop path for computed and GTA mels (``--mel_dir``): the
three arrays share one frame grid, so the same frame window cuts all three.

Randomness comes only from the sample key that ``common.data.ResumableSampler`` hands out
(``sample_rng(key)``), so crops and augmentations are identical with any number of workers and
after an exact resume. Items are memory-mapped: a crop reads ``crop_mel_frames`` frames, not
the whole file (a 10-minute file costs the same as a 2-second one).

A damaged item (a file missing, cut short, not an array, of another shape, or NaN/inf in what a sample
reads) or manifest stops the run with one line naming the file and the prepare command that makes it
again (``common.prepared``, exit 2), also from a loader worker; a NaN in a mel is never a divergence.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from common.data import sample_rng
from common.errors import UserError
from common.prepared import damaged, load_npy, read_json, require_finite
from vocoder.config import VocoderConfig
from vocoder.prepare_data import AUDIO_EXTENSIONS, FORMAT_VERSION, MANIFEST

LOG_FLOOR = math.log(1e-5)  # speech.audio.MelSpectrogram's log clamp


class DatasetError(UserError, RuntimeError):
    """The prepared folder is missing, stale or made with other audio or f0 settings."""


def missing_manifest(data_dir: Path) -> str:
    """What to do when `data_dir` has no manifest: a folder of raw audio is the input of prepare_data.py,
    never its output (its files would be mixed with the items), so the command names a new folder."""
    has_audio = data_dir.is_dir() and any(  # a look at the first 10 000 entries is enough to tell
        p.suffix.lower() in AUDIO_EXTENSIONS for p in itertools.islice(data_dir.rglob("*"), 10_000))
    if has_audio:
        prepared = data_dir.parent / f"{data_dir.name}_prepared"
        return (f"{data_dir} holds raw audio, not a dataset made by vocoder/prepare_data.py (no {MANIFEST}): "
                f"prepare it first with `python vocoder/prepare_data.py --config <this run's config> --input "
                f"{data_dir} --output {prepared}`, then train with --data_dir {prepared}")
    return (f"{data_dir / MANIFEST} not found: --data_dir must be a folder made by vocoder/prepare_data.py; make it "
            f"with `python vocoder/prepare_data.py --config <this run's config> --input <audio folders> "
            f"--output {data_dir}`")


def prepare_again(data_dir: str | Path) -> str:
    """What to do about a damaged prepared file of `data_dir`: the prepare command that makes it again."""
    return (f"run `python vocoder/prepare_data.py --config <this run's config> --input <audio folders> --output "
            f"{data_dir}` again (it makes damaged items again and keeps the others), then train again (--resume "
            "auto continues from the last checkpoint)")


def load_manifest(data_dir: str | Path, cfg: VocoderConfig) -> dict:
    """Read the manifest and check it was made with this config's audio/mel settings."""
    data_dir = Path(data_dir)
    path = data_dir / MANIFEST
    if not path.is_file():
        raise DatasetError(missing_manifest(data_dir))
    manifest = read_json(path, prepare_again(data_dir))
    if manifest.get("format_version") != FORMAT_VERSION:
        raise DatasetError(f"{data_dir} was prepared by another version of prepare_data.py; run it again")
    fields = {"settings": dict, "train": list, "valid": list}
    wrong = [k for k, kind in fields.items() if not isinstance(manifest.get(k), kind)]
    if wrong or not all(isinstance(i, str) for i in manifest["train"] + manifest["valid"]):
        raise damaged(path, f"is damaged ({', '.join(wrong) or 'train/valid ids'} not as prepare_data.py writes "
                      "them)", prepare_again(data_dir))
    s = manifest["settings"]
    a = cfg.audio
    # the f0 keys too: training reads the stored f0, and the export tells inference to extract it this way
    want = {"sample_rate": a.sample_rate, "hop_size": a.hop_length, "fft_size": a.n_fft,
            "win_size": a.win_length, "num_mels": a.n_mels, "fmin": a.fmin, "fmax": a.fmax,
            "pe": cfg.pe, "f0_min": cfg.f0_min, "f0_max": cfg.f0_max}
    if cfg.pe == "rmvpe" and cfg.pe_ckpt:  # its weights too, by content (a moved or renamed file is the same)
        from speech.rmvpe import F0WeightsError, weights_digest

        try:
            want["pe_ckpt_sha256"] = weights_digest(cfg.pe_ckpt)
        except F0WeightsError as e:
            raise DatasetError(f"pe_ckpt (f0_extractor_weights): {e}") from None
    wrong = [f"{k}: data {s.get(k)} vs config {v}" for k, v in want.items() if s.get(k) != v]
    if wrong:
        raise DatasetError(f"{data_dir} was prepared with other audio or f0 settings ({'; '.join(wrong)}); "
                           "prepare it again with this config (or use the config it was made with)")
    if s.get("mel_dir") and cfg.key_aug:
        raise DatasetError(f"{data_dir} holds an acoustic model's mels (prepared with --mel_dir {s['mel_dir']}); "
                           "key_aug recomputes the mel from the resampled audio and would train on computed mels "
                           "instead: --set key_aug=false")
    return manifest


class VocoderDataset(Dataset):
    """``train=True``: a random crop of ``crop_mel_frames`` frames per sample (with volume and
    key/speed augmentation); ``train=False``: the whole file (cut to ``valid_max_seconds``).

    Items: ``{"mel": [n_mels, F], "f0": [F], "audio": [F * hop], "name": str}``. The length of
    a training epoch is at least one batch per rank even for a tiny corpus (indices wrap).
    """

    def __init__(self, data_dir: str | Path, ids: list[str], cfg: VocoderConfig, train: bool = True,
                 min_len: int = 1):
        if not ids:
            raise DatasetError(f"{data_dir}: no {'training' if train else 'validation'} items")
        self.dir = Path(data_dir) / "items"
        self.again = prepare_again(data_dir)  # the advice of a damaged item's one line
        self.ids = list(ids)
        self.cfg = cfg
        self.train = train
        self.hop = cfg.audio.hop_length
        self.length = max(len(self.ids), min_len) if train else len(self.ids)
        self._mel_fn = None  # built lazily in the worker (key_aug only)

    def __len__(self) -> int:
        return self.length

    def _load(self, name: str, mmap: bool = True) -> dict[str, np.ndarray]:
        """The item's three arrays (memory-mapped: only their headers are read here), each checked to be
        readable and of the shape prepare_data.py writes (mel [F, n_mels], f0 [F], audio [F * hop]);
        `PreparedFileError` names the first that is not."""
        d = self.dir / name
        mel = load_npy(d / "mel.npy", self.again, mmap, shape=(None, self.cfg.audio.n_mels))
        frames = mel.shape[0]
        return {"mel": mel, "f0": load_npy(d / "f0.npy", self.again, mmap, shape=(frames,)),
                "audio": load_npy(d / "audio.npy", self.again, mmap, shape=(frames * self.hop,))}

    def _read(self, item: dict, key: str, start: int | None = None, stop: int | None = None) -> np.ndarray:
        """`item[key][start:stop]` read into memory, refused (the file named) when it holds NaN or inf."""
        return require_finite(np.array(item[key][start:stop]), self.dir / item["name"] / f"{key}.npy", self.again)

    def __getitem__(self, key) -> dict:
        index, rng = sample_rng(key)
        name = self.ids[index % len(self.ids)]
        item = {**self._load(name), "name": name}
        if not self.train:
            return self._whole(item, name)
        sample = None
        if self.cfg.key_aug and rng.random() < self.cfg.key_aug_prob:
            sample = self._speed_crop(item, rng)
        if sample is None:
            sample = self._crop(item, rng)
        if self.cfg.volume_aug and rng.random() < self.cfg.volume_aug_prob:
            self._volume(sample, rng)
        sample["name"] = name
        return {k: torch.from_numpy(np.ascontiguousarray(v)) if isinstance(v, np.ndarray) else v
                for k, v in sample.items()}

    def _whole(self, item: dict, name: str) -> dict:
        frames = item["mel"].shape[0]
        limit = max(1, int(self.cfg.valid_max_seconds * self.cfg.audio.sample_rate / self.hop))
        n = min(frames, limit)
        return {"mel": torch.from_numpy(np.ascontiguousarray(self._read(item, "mel", 0, n).T)),
                "f0": torch.from_numpy(self._read(item, "f0", 0, n)),
                "audio": torch.from_numpy(self._read(item, "audio", 0, n * self.hop)), "name": name}

    def _crop(self, item: dict, rng: np.random.Generator) -> dict:
        crop = self.cfg.crop_mel_frames
        frames = item["mel"].shape[0]
        if frames >= crop:
            start = int(rng.integers(0, frames - crop + 1))
            return {"mel": self._read(item, "mel", start, start + crop).T,
                    "f0": self._read(item, "f0", start, start + crop),
                    "audio": self._read(item, "audio", start * self.hop, (start + crop) * self.hop)}
        # Shorter than a crop: pad with silence (floor mel, held f0, zero audio).
        pad = crop - frames
        mel = np.pad(self._read(item, "mel").T, ((0, 0), (0, pad)), constant_values=LOG_FLOOR)
        f0 = np.pad(self._read(item, "f0"), (0, pad), mode="edge")
        audio = np.pad(self._read(item, "audio"), (0, pad * self.hop))
        return {"mel": mel, "f0": f0, "audio": audio}

    def _speed_crop(self, item: dict, rng: np.random.Generator) -> dict | None:
        """Key/speed augmentation (``key_aug``): play a segment ``speed`` times faster by
        resampling it, so duration shrinks and pitch rises by ``speed``; the mel is recomputed
        from the new audio and f0 is the old contour, time-warped and multiplied by ``speed``."""
        import soxr

        from speech.audio import MelSpectrogram

        speed = float(rng.uniform(self.cfg.aug_min, self.cfg.aug_max))
        crop, margin = self.cfg.crop_mel_frames, 2
        need = math.ceil((crop + 2 * margin) * speed) + 1
        frames = item["mel"].shape[0]
        if frames < need:
            return None
        start = int(rng.integers(0, frames - need + 1))
        seg = self._read(item, "audio", start * self.hop, (start + need) * self.hop).astype(np.float32)
        fast = soxr.resample(seg, round(self.hop * speed), self.hop, quality="HQ").astype(np.float32)
        total = crop + 2 * margin
        if len(fast) < total * self.hop:
            return None
        fast = fast[: total * self.hop]
        if self._mel_fn is None:
            self._mel_fn = MelSpectrogram(**self.cfg.audio.mel_kwargs)
        with torch.no_grad():
            mel = self._mel_fn(torch.from_numpy(fast)[None])[0].numpy()  # [n_mels, total]
        # New frame j is centred at old time (j + 0.5) * speed frames after the segment start.
        pos = (np.arange(total) + 0.5) * speed - 0.5
        f0_old = self._read(item, "f0", start, start + need).astype(np.float64)
        f0 = np.interp(pos, np.arange(need), f0_old) * speed
        return {"mel": mel[:, margin:margin + crop], "f0": f0[margin:margin + crop].astype(np.float32),
                "audio": fast[margin * self.hop:(margin + crop) * self.hop]}

    @staticmethod
    def _volume(sample: dict, rng: np.random.Generator) -> None:
        """Random gain g (log-uniform, never pushing the peak past 1): audio * g, log-mel + log g."""
        peak = float(np.abs(sample["audio"]).max()) + 1e-5
        shift = float(rng.uniform(-3.0, min(3.0, math.log(1.0 / peak))))
        sample["audio"] = (sample["audio"] * math.exp(shift)).astype(np.float32)
        sample["mel"] = np.maximum(sample["mel"] + shift, LOG_FLOOR).astype(np.float32)


def collate(batch: list[dict]) -> dict:
    """Stack same-length crops; ``name`` stays a list."""
    return {"mel": torch.stack([b["mel"] for b in batch]), "f0": torch.stack([b["f0"] for b in batch]),
            "audio": torch.stack([b["audio"] for b in batch])[:, None, :], "name": [b["name"] for b in batch]}
