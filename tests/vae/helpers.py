"""Tiny images and configs for the VAE tests (everything is drawn here; nothing is downloaded)."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np
from PIL import Image

from common.config import load_config
from vae.config import VAEConfig

REPO = Path(__file__).resolve().parents[2]
TINY_CONFIG = REPO / "vae" / "configs" / "tiny.yaml"


def tiny_cfg(**kw) -> VAEConfig:
    """vae/configs/tiny.yaml as the trainer resolves it (over its base_config), with `kw` on top."""
    return load_config(TINY_CONFIG, VAEConfig, extra=kw)


def textured(size: int, seed: int) -> np.ndarray:
    """A smooth colourful image with edges (learnable, not noise)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size] / size
    img = np.zeros((size, size, 3))
    for c in range(3):
        fx, fy, ph = rng.uniform(1, 4, 3)
        img[..., c] = 0.5 + 0.35 * np.sin(2 * np.pi * (fx * xx + fy * yy) + ph * 3)
    cx, cy, r = rng.uniform(0.2, 0.8, 3)
    mask = (xx - cx) ** 2 + (yy - cy) ** 2 < (0.1 + 0.2 * r) ** 2
    img[mask] = rng.uniform(0, 1, 3)
    return (img.clip(0, 1) * 255).astype(np.uint8)


def write_images(folder: Path, n: int, size: int = 48, seed: int = 0, ext: str = "png") -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        p = folder / f"img_{i:03d}.{ext}"
        Image.fromarray(textured(size, seed + i)).save(p)
        paths.append(p)
    return paths


def huge_png_header(path: Path, width: int = 100_000, height: int = 100_000) -> None:
    """A valid-looking PNG that claims 10^10 pixels (a decompression bomb) in a few bytes."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b"")
    path.write_bytes(png)


def write_robustness_set(folder: Path) -> dict[str, str]:
    """Every kind of awkward file, plus a few good ones. Returns {file name: expected outcome}
    where outcome is "ok" or the expected skip kind."""
    folder.mkdir(parents=True, exist_ok=True)
    expected: dict[str, str] = {}
    base = textured(64, 1)

    Image.fromarray(base).save(folder / "good.jpg", quality=95)
    expected["good.jpg"] = "ok"
    Image.fromarray(textured(80, 2)).save(folder / "good_wide.png")
    expected["good_wide.png"] = "ok"

    good_bytes = (folder / "good.jpg").read_bytes()
    (folder / "truncated.jpg").write_bytes(good_bytes[: len(good_bytes) // 2])
    expected["truncated.jpg"] = "corrupt"
    (folder / "garbage.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4)
    expected["garbage.png"] = "corrupt"
    (folder / "notes.jpg").write_text("this is a text file, not a JPEG\n")
    expected["notes.jpg"] = "not_image"
    (folder / "empty.png").write_bytes(b"")
    expected["empty.png"] = "empty"

    Image.fromarray(base).convert("CMYK").save(folder / "cmyk.jpg", quality=95)
    expected["cmyk.jpg"] = "ok"
    gray16 = (np.linspace(0, 65535, 64 * 64).reshape(64, 64)).astype(np.uint16)
    Image.fromarray(gray16).save(folder / "gray16.png")  # mode I;16: 16-bit grayscale
    expected["gray16.png"] = "ok"
    Image.fromarray(base).convert("L").save(folder / "gray.png")
    expected["gray.png"] = "ok"
    rgba = np.dstack([base, np.full((64, 64), 128, np.uint8)])
    Image.fromarray(rgba, "RGBA").save(folder / "rgba.png")
    expected["rgba.png"] = "ok"
    pal = Image.fromarray(base).convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    pal.info["transparency"] = 0
    pal.save(folder / "palette.png", transparency=0)
    expected["palette.png"] = "ok"
    frames = [Image.fromarray(textured(64, s)) for s in (3, 4, 5)]
    frames[0].save(folder / "animated.gif", save_all=True, append_images=frames[1:], duration=100, loop=0)
    expected["animated.gif"] = "animated"
    Image.fromarray(np.full((1, 1, 3), 200, np.uint8)).save(folder / "one.png")
    expected["one.png"] = "too_small"
    Image.fromarray(textured(8, 6)).save(folder / "eight.png")
    expected["eight.png"] = "too_small"
    huge_png_header(folder / "huge.png")
    expected["huge.png"] = "too_large"
    Image.fromarray(np.zeros((64, 64, 3), np.uint8)).save(folder / "black.png")
    expected["black.png"] = "blank"
    (folder / "zz_copy_of_good.jpg").write_bytes(good_bytes)  # sorts after good.jpg: the copy is skipped
    expected["zz_copy_of_good.jpg"] = "duplicate"
    (folder / "readme.txt").write_text("not an image extension: ignored\n")
    return expected
