"""Image loading and the training/validation datasets.

One loader (`open_image_rgb`) serves preprocessing, training and `reconstruct.py`, so every entry
point treats odd files the same way: EXIF orientation applied, any mode → 8-bit RGB with alpha
composited on a background, 16-bit data scaled (not clipped to white), and anything it cannot read
raised as `BadImage` with a reason a user can act on. Why so strict: a silently black (or white)
training image teaches the VAE nothing and hides a broken dataset.

`build_train_data` turns the config into what the training loop iterates over.

Randomness: a training sample's crop and flip come from `common.data.sample_rng(key)`, where the
key comes from the `ResumableSampler`, so an exact resume (even with workers) sees identical crops.
"""

from __future__ import annotations

import json
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from PIL import Image, ImageFile, ImageOps, UnidentifiedImageError
from torch.utils.data import Dataset

from common.config import ConfigError
from common.data import ResumableSampler, make_loader, sample_rng
from common.errors import InputNotFoundError, UserError
from common.prepared import json_problem

if TYPE_CHECKING:
    from vae.config import VAEConfig

IMAGE_EXTENSIONS = {".jpg", ".jpeg", ".jfif", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff"}
DEFAULT_MAX_PIXELS = 2**28  # ~268 Mpx (16384²): beyond that a file is a decompression bomb or a scan


class BadImage(UserError):
    """An image that cannot be used; `reason` says why (shown in reports)."""

    def __init__(self, reason: str, kind: str = "corrupt") -> None:
        super().__init__(reason)
        self.reason = reason
        self.kind = kind  # corrupt | not_image | too_large | too_small | animated | unsupported | blank | empty


def list_images(root: str | Path) -> list[Path]:
    """Image files under `root` (recursive, sorted, hidden files skipped)."""
    root = Path(root)
    files = [p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS
             and not any(part.startswith(".") for part in p.relative_to(root).parts)]
    return sorted(files)


# Leading bytes of the formats we accept: a file that starts like one but does not parse is corrupt,
# anything else (text, PDF, a video renamed .jpg) is simply not an image.
_MAGIC = {b"\x89PNG": "PNG", b"\xff\xd8\xff": "JPEG", b"GIF8": "GIF", b"BM": "BMP", b"II*\x00": "TIFF",
          b"MM\x00*": "TIFF", b"RIFF": "WebP"}


def _sniff(path: Path) -> str | None:
    with open(path, "rb") as f:
        head = f.read(16)
    if head.startswith(b"RIFF") and head[8:12] != b"WEBP":
        return None
    return next((fmt for magic, fmt in _MAGIC.items() if head.startswith(magic)), None)


def _to_8bit_rgb(im: Image.Image, background: tuple[int, int, int]) -> Image.Image:
    mode = im.mode
    if mode in ("I;16", "I;16L", "I;16B", "I;16N", "I"):
        arr = np.asarray(im).astype(np.float64)
        peak = arr.max() if arr.size else 0
        if mode.startswith("I;16") or peak > 255:
            if peak > 65535 or arr.min() < 0:
                raise BadImage(f"32-bit integer image with values {arr.min():.0f}..{peak:.0f}: unknown range",
                               "unsupported")
            arr = arr / 257.0  # 16-bit → 8-bit, full range kept
        return Image.fromarray(np.clip(np.rint(arr), 0, 255).astype(np.uint8), "L").convert("RGB")
    if mode == "F":
        raise BadImage("floating-point image (mode F): its value range is unknown; export it as 8/16-bit",
                       "unsupported")
    has_alpha = mode in ("RGBA", "LA", "PA", "RGBa", "La") or (mode == "P" and "transparency" in im.info)
    if has_alpha:
        rgba = im.convert("RGBA")
        canvas = Image.new("RGBA", rgba.size, (*background, 255))
        return Image.alpha_composite(canvas, rgba).convert("RGB")
    if mode != "RGB":
        return im.convert("RGB")  # L, 1, P, CMYK, YCbCr, LAB, HSV
    return im


def open_image_rgb(path: str | Path, max_pixels: int = DEFAULT_MAX_PIXELS, min_size: int = 0,
                   background: tuple[int, int, int] = (255, 255, 255), draft_size: int = 0,
                   allow_blank: bool = False) -> tuple[Image.Image, dict]:
    """Decode `path` into an oriented 8-bit RGB image, or raise BadImage with the reason.

    Returns (image, info) where info has the original `width`, `height`, `mode` and `format`.
    `draft_size`: for JPEGs much larger than needed, let libjpeg decode at 1/2, 1/4 or 1/8 scale
    (never below `draft_size` on the short side) - a 50 Mpx photo then decodes ~10× faster.
    """
    path = Path(path)
    try:
        if path.stat().st_size == 0:
            raise BadImage("empty file (0 bytes)", "empty")
    except OSError as exc:
        raise BadImage(f"cannot read file: {exc.strerror or exc}", "corrupt") from None
    ImageFile.LOAD_TRUNCATED_IMAGES = False  # a truncated file is an error, never a grey half-image
    old_limit = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = max_pixels
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            try:
                im = Image.open(path)
            except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
                raise BadImage(f"too large: {exc}. Raise --max_pixels if this image is intended", "too_large") from None
            except UnidentifiedImageError:
                fmt = _sniff(path)
                if fmt:
                    raise BadImage(f"corrupt: starts like a {fmt} file but cannot be parsed", "corrupt") from None
                raise BadImage("not an image (Pillow cannot identify the format; wrong extension or a "
                               "different file type)", "not_image") from None
            except OSError as exc:
                raise BadImage(f"cannot open: {exc}", "corrupt") from None
            except ValueError as exc:  # a PNG text or ICC chunk that inflates beyond PIL's MAX_TEXT_CHUNK (a bomb)
                raise BadImage(f"corrupt: {exc}", "corrupt") from None
        with im:
            info = {"width": im.width, "height": im.height, "mode": im.mode, "format": im.format or "?"}
            if im.width * im.height > max_pixels:
                raise BadImage(f"too large: {im.width}x{im.height} = {im.width * im.height} pixels > "
                               f"--max_pixels {max_pixels}", "too_large")
            frames = getattr(im, "n_frames", 1)
            if frames > 1:
                raise BadImage(f"animated/multi-frame image ({frames} frames): export a single still frame",
                               "animated")
            if min(im.size) < min_size:
                raise BadImage(f"too small: {im.width}x{im.height}, shorter side < --min_size {min_size}",
                               "too_small")
            if draft_size and im.format == "JPEG" and min(im.size) > 2 * draft_size:
                scale = draft_size / min(im.size)
                im.draft(im.mode, (int(im.width * scale) + 1, int(im.height * scale) + 1))
            try:
                im.load()
                im = ImageOps.exif_transpose(im)
                rgb = _to_8bit_rgb(im, background)
            except BadImage:
                raise
            except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
                raise BadImage(f"corrupt or truncated: {exc}", "corrupt") from None
    finally:
        Image.MAX_IMAGE_PIXELS = old_limit
    if not allow_blank:
        extrema = rgb.getextrema()
        if all(lo == hi for lo, hi in extrema):
            raise BadImage(f"blank: every pixel has the same colour {tuple(lo for lo, _ in extrema)}", "blank")
    return rgb, info


def default_min_size(size: int) -> int:
    """The one size filter of prepare_data.py (`--min_size` default from `--target_size`) and of
    training (from `image_size`): a shorter side below min(256, size) is too small to learn from,
    so it is skipped, never upscaled from 1x1 or 8x8."""
    return min(256, size) if size > 0 else 256


SHOWN_SKIPPED = 50  # skipped files named one per line; the rest are counted (all of them in prepare's report)


def skipped_lines(skipped: list[tuple[str, str]], more: str = "") -> list[str]:
    """'  skipped FILE: REASON' per (file, reason), the one per-file report of prepare_data.py and of
    training on a raw folder; past `SHOWN_SKIPPED`, one line with the count (and `more`: where the rest is)."""
    lines = [f"  skipped {file}: {reason}" for file, reason in skipped[:SHOWN_SKIPPED]]
    if len(skipped) > SHOWN_SKIPPED:
        lines.append(f"  ... and {len(skipped) - SHOWN_SKIPPED} more{more}")
    return lines


def usable_images(files: list[Path], size: int, max_pixels: int = DEFAULT_MAX_PIXELS,
                  where: str | Path = "", log: Callable[[str], None] = print) -> list[Path]:
    """The files that pass prepare_data.py's filters at crop `size` (decoded once, JPEGs at draft
    scale). Each skipped file is named with its reason through `log`, as prepare_data.py names them;
    none usable → ConfigError (exit 2) with one line: how many were skipped and why."""
    good, skipped, kinds = [], [], Counter()
    for path in files:
        try:
            open_image_rgb(path, max_pixels, default_min_size(size), draft_size=size)
            good.append(path)
        except BadImage as exc:
            skipped.append((str(path), exc.reason))
            kinds[exc.kind] += 1
    if skipped:
        summary = ", ".join(f"{n} {kind.replace('_', ' ')}" for kind, n in sorted(kinds.items()))
        where = where or Path(files[0]).parent
        log(f"{where}: {len(good)} of {len(files)} images usable, {len(skipped)} skipped ({summary}); "
            "`python vae/prepare_data.py --mode preprocess` filters a folder once, with a report")
        for line in skipped_lines(skipped):
            log(line)
        if not good:
            first, reason = skipped[0]
            raise ConfigError(f"no usable image in {where} ({len(skipped)} files skipped: {summary}; e.g. "
                              f"{Path(first).name}: {reason}). Check the folder with `python vae/prepare_data.py "
                              "--mode validate`")
    return good


def image_to_tensor(im: Image.Image) -> torch.Tensor:
    """8-bit RGB PIL image → float CHW tensor in [-1, 1] (the VAE's input range)."""
    arr = np.asarray(im, dtype=np.uint8)
    return torch.from_numpy(arr.copy()).permute(2, 0, 1).float().div_(127.5).sub_(1.0)


def tensor_to_uint8(x: torch.Tensor) -> np.ndarray:
    """CHW tensor in [-1, 1] → HWC uint8 array."""
    x = ((x.detach().float().clamp(-1, 1) + 1.0) * 127.5).round().to(torch.uint8)
    return x.permute(1, 2, 0).cpu().numpy()


def read_json(path: Path, advice: str, error: type[Exception] = ConfigError) -> dict:
    """The JSON object in `path`; `error` (exit 2) in one line naming the file, what is wrong with it
    (`common.prepared.json_problem`) and `advice` (what to do)."""
    data, why = json_problem(path)
    if why:
        raise error(f"{path} {why}; {advice}")
    return data


def read_manifest(root: Path) -> list[Path] | None:
    """Files listed by `prepare_data.py` (manifest.json), or None for a plain folder of images. A damaged
    one (cut short, garbage, not the layout prepare_data.py writes) is ConfigError naming it (exit 2)."""
    manifest = root / "manifest.json"
    if not manifest.is_file():
        return None
    advice = (f"prepare the folder again (python vae/prepare_data.py --mode preprocess --input_dir <your images> "
              f"--output_dir {root}: the images already done are kept and the manifest is written anew)")
    files = read_json(manifest, advice).get("files", [])
    if not (isinstance(files, list) and all(isinstance(i, dict) and isinstance(i.get("path"), str) for i in files)):
        raise ConfigError(f"{manifest} is damaged (its 'files' is not a list of {{\"path\": ...}} entries); {advice}")
    return [root / item["path"] for item in files]


# What `prepare_data.py --mode preprocess` records of a prepared folder (`SETTINGS_FILE`, and the manifest's
# "settings"): a folder prepared again with other values holds other images under the same names.
SETTINGS_FILE = "prepare_settings.json"
SETTINGS_KEYS = ("target_size", "resize_mode", "format", "min_size", "background")


def prepared_settings(root: Path) -> dict | None:
    """The settings a prepared folder was made with (`SETTINGS_KEYS` of its `SETTINGS_FILE`, else of its
    manifest); None when neither is there or readable (gone, or being written)."""
    for name, pick in ((SETTINGS_FILE, lambda d: d), ("manifest.json", lambda d: d.get("settings"))):
        try:
            found = pick(json.loads((root / name).read_text(encoding="utf-8")))
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(found, dict):
            return {k: found.get(k) for k in SETTINGS_KEYS}
    return None


class PreparedWatch:
    """The prepared folders a run reads (`data_path`, `val_data_path`; a raw folder of images is not watched)
    and their settings when the run listed their files. `changed()`, between steps, says in one line which
    folder was prepared again with other settings (`prepare_data.py --overwrite`) or moved aside: its images
    are then other images under the same names, and training on would mix the two silently. It costs two
    `stat` calls per folder while nothing changes."""

    def __init__(self, folders: dict[str, str | Path | None]):
        self.start: dict[str, tuple[Path, dict]] = {}
        self._seen: dict[str, tuple] = {}
        for flag, folder in folders.items():
            root = Path(folder) if folder else None
            if root is not None and (root / "manifest.json").is_file():
                settings = prepared_settings(root)
                if settings is not None:
                    self.start[flag] = (root, settings)
                    self._seen[flag] = self._stamp(root)

    @classmethod
    def of(cls, cfg: VAEConfig) -> PreparedWatch:
        return cls({"--data_path": cfg.data_path, "--val_data_path": cfg.val_data_path or None})

    @staticmethod
    def _stamp(root: Path) -> tuple:
        out = []
        for name in (SETTINGS_FILE, "manifest.json"):
            try:
                st = (root / name).stat()
                out.append((st.st_ino, st.st_size, st.st_mtime_ns))
            except OSError:
                out.append(None)
        return tuple(out)

    def changed(self) -> str | None:
        """None while every watched folder holds what it held at the start; else what to say (one line)."""
        for flag, (root, old) in self.start.items():
            stamp = self._stamp(root)
            if stamp == self._seen[flag]:
                continue
            self._seen[flag] = stamp
            new = prepared_settings(root)
            if new == old:  # prepared again with the same settings: the same images (a resumed prepare)
                continue
            if new is None:
                what = f"its {SETTINGS_FILE} and manifest.json are gone (moved aside by `prepare_data.py --overwrite`?)"
            else:
                what = "prepared again with other settings (" + ", ".join(
                    f"{k} {old[k]!r} -> {new[k]!r}" for k in SETTINGS_KEYS if old[k] != new[k]) + ")"
            return (f"{flag} {root} changed while this run trained on it: {what}; the run stopped rather than mix "
                    f"images of two preparations (its checkpoints are kept). Prepare into another --output_dir "
                    f"while a run reads this one; to train on the folder as it is now, run again with "
                    f"--resume_from auto")
        return None


def find_training_images(data_path: str | Path) -> list[Path]:
    root = Path(data_path)
    if not root.is_dir():
        raise InputNotFoundError(f"--data_path {data_path}: no such folder. Point it at images, or at the "
                                 "output of `python vae/prepare_data.py --mode preprocess`")
    files = read_manifest(root)
    if files is None:
        files = list_images(root)
    if not files:
        raise InputNotFoundError(f"--data_path {data_path}: no images found ({', '.join(sorted(IMAGE_EXTENSIONS))})")
    return files


def checked_images(folder: str | Path, image_size: int, max_pixels: int = DEFAULT_MAX_PIXELS,
                   log: Callable[[str], None] = print) -> list[Path]:
    """The images of `folder` for training: a prepared folder's manifest as is (prepare_data.py filtered
    it), a raw folder through the same filters once, so an unusable file is never upscaled or counted
    (each skipped one is named with its reason through `log`)."""
    files = find_training_images(folder)
    if read_manifest(Path(folder)) is not None:
        return files
    return usable_images(files, image_size, max_pixels, folder, log)


def split_train_val(files: list[Path], num_val: int, seed: int = 1234) -> tuple[list[Path], list[Path]]:
    """A fixed held-out set (same files every run and every resume), disjoint from training."""
    if num_val <= 0:
        return list(files), []
    if len(files) < 2:
        raise ConfigError(f"only {len(files)} image(s): need at least 2 to hold one out for validation "
                          "(or set num_val_images: 0)")
    num_val = min(num_val, max(1, len(files) // 5))
    order = np.random.default_rng(seed).permutation(len(files))
    val_idx = set(order[:num_val].tolist())
    train = [f for i, f in enumerate(files) if i not in val_idx]
    val = [f for i, f in enumerate(files) if i in val_idx]
    return train, val


class ImageDataset(Dataset):
    """Square crops of `image_size` px: random crop + flip for training, centre crop for validation.

    An image smaller than the crop but not below prepare_data.py's size filter (`default_min_size`)
    is upscaled (short side → image_size) with a warning; an image that fails to load or fails the
    filters is reported by name and replaced by the next file (never by a black tensor).
    """

    def __init__(self, files: list[Path], image_size: int, train: bool = True, random_flip: bool = True,
                 max_pixels: int = DEFAULT_MAX_PIXELS, max_failures: int = 50) -> None:
        if not files:
            raise ValueError("ImageDataset got no files")
        self.files = [Path(f) for f in files]
        self.image_size = int(image_size)
        self.train = train
        self.random_flip = random_flip
        self.max_pixels = max_pixels
        self.max_failures = max_failures
        self._failures = 0

    def __len__(self) -> int:
        return len(self.files)

    def _load(self, index: int) -> tuple[Image.Image, Path]:
        for attempt in range(len(self.files)):
            path = self.files[(index + attempt) % len(self.files)]
            try:
                im, _ = open_image_rgb(path, self.max_pixels, default_min_size(self.image_size),
                                       draft_size=self.image_size)
                return im, path
            except BadImage as exc:
                self._failures += 1
                warnings.warn(f"skipping unreadable training image {path}: {exc.reason} "
                              "(run `vae/prepare_data.py --mode validate` on the data)", stacklevel=2)
                if self._failures > self.max_failures:
                    raise RuntimeError(f"more than {self.max_failures} training images failed to load "
                                       f"(last: {path}: {exc.reason}); fix the dataset") from None
        raise RuntimeError("no training image could be loaded")

    def __getitem__(self, key) -> torch.Tensor:
        index, rng = sample_rng(key)
        im, path = self._load(index)
        size = self.image_size
        w, h = im.size
        if min(w, h) < size:
            warnings.warn(f"{path} is {w}x{h}, smaller than the {size} px crop: upscaled (prepare the data at "
                          f"--target_size >= {size} to avoid blurry training crops)", stacklevel=2)
            scale = size / min(w, h)
            im = im.resize((max(size, round(w * scale)), max(size, round(h * scale))), Image.Resampling.BICUBIC)
            w, h = im.size
        if self.train:
            left = int(rng.integers(0, w - size + 1))
            top = int(rng.integers(0, h - size + 1))
        else:
            left, top = (w - size) // 2, (h - size) // 2
        im = im.crop((left, top, left + size, top + size))
        x = image_to_tensor(im)
        if self.train and self.random_flip and rng.random() < 0.5:
            x = x.flip(-1)
        return x


def eval_loader(files: list[Path], image_size: int, max_pixels: int = DEFAULT_MAX_PIXELS, seed: int = 0,
                batch_size: int = 4, limit: int | None = None):
    """Centre crops of `files` (the first `limit`) in a fixed order: validation and latent statistics."""
    ds = ImageDataset(files[:limit] if limit else files, image_size, train=False, max_pixels=max_pixels)
    return make_loader(ds, batch_size=batch_size, num_workers=0, seed=seed)


# ----------------------------------------------------------------------------- a training run's data


def training_images(cfg: VAEConfig, log: Callable[[str], None] = print) -> tuple[list[Path], list[Path]]:
    """(train, validation) files: `val_data_path`, or a fixed held-out part of `data_path`; skipped files
    of a raw folder are reported through `log` (rank 0's print)."""
    files = checked_images(cfg.data_path, cfg.image_size, cfg.max_pixels, log)
    if cfg.val_data_path:
        return files, checked_images(cfg.val_data_path, cfg.image_size, cfg.max_pixels, log)
    return split_train_val(files, cfg.num_val_images, seed=cfg.seed)


@dataclass
class TrainData:
    """The images of a run and its planned length: what the training loop iterates over."""
    train_files: list[Path]
    val_files: list[Path]
    sampler: ResumableSampler
    loader: torch.utils.data.DataLoader
    steps_per_epoch: int
    total_steps: int
    samples_per_step: int  # images per optimizer step over all GPUs
    watch: PreparedWatch | None = None  # the prepared folders, checked between steps


def build_train_data(cfg: VAEConfig, world_size: int, train_files: list[Path], val_files: list[Path],
                     watch: PreparedWatch | None = None) -> TrainData:
    """The resumable shuffled loader at the config's (already fitted) batch size, and the run's length:
    `max_steps`, else `num_epochs` x the optimizer steps one epoch fills. `watch`: the prepared folders'
    settings from when their files were listed (`PreparedWatch.of(cfg)` then; made here when not given)."""
    batch, accum = int(cfg.batch_size), cfg.accumulation_steps
    train_ds = ImageDataset(train_files, cfg.image_size, train=True, random_flip=cfg.random_flip,
                            max_pixels=cfg.max_pixels)
    sampler = ResumableSampler(train_ds, shuffle=True, seed=cfg.seed)
    loader = make_loader(train_ds, batch_size=batch, sampler=sampler, num_workers=cfg.num_workers,
                         prefetch_factor=cfg.prefetch_factor, pin_memory=cfg.pin_memory,
                         persistent_workers=cfg.persistent_workers, seed=cfg.seed, drop_last=True)
    steps_per_epoch = (len(sampler) // batch) // accum
    if steps_per_epoch < 1:
        raise ConfigError(f"{len(train_files)} training images cannot fill one step of batch_size {batch} x "
                          f"accumulation_steps {accum} x {world_size} GPU(s); lower them or add images")
    total_steps = cfg.max_steps if cfg.max_steps > 0 else cfg.num_epochs * steps_per_epoch
    return TrainData(train_files, val_files, sampler, loader, steps_per_epoch, total_steps, batch * accum * world_size,
                     watch if watch is not None else PreparedWatch.of(cfg))
