"""Image in → reconstruction out, with feathered tiles for images too large to encode at once.

    python vae/reconstruct.py --checkpoint runs/vae/vae_final.pt --input photo.jpg --output rec.png
    python vae/reconstruct.py --checkpoint runs/vae/diffusers --input folder/ --output out/ --tile_size 512

`--checkpoint` takes a training checkpoint (EMA weights unless --no-ema), `vae_final.pt` or a diffusers
AutoencoderKL folder. Why tiles overlap and blend: each tile is reconstructed on its own (the middle
attention and GroupNorm see only that tile), so neighbouring tiles disagree slightly at their edges;
weights that ramp linearly across the overlap make that disagreement fade instead of showing a seam.

Why `--max_pixels` (default 2**25, 33.5 Mpx): tiles bound only the model's activations; the whole image,
its reconstruction and the blend weights stay in memory as float tensors, about 80 bytes per pixel
(1.2 GB at 16.7 Mpx). A 60 KB PNG can declare 16000x16000 pixels (20 GB), so the size is read from the
file's header and a larger image is refused (one line, exit 2) before it is decoded. Raise the flag for
an image that is meant to be that large.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from PIL import Image

from common import exit_codes
from common.atomic_write import atomic_output
from common.checkpoint import resolve_checkpoint_arg
from common.cli import FlagParser
from common.errors import ConfigError
from common.precision import Precision
from common.run_dir import (
    OutputPathError,
    check_apart,
    check_output_dir,
    check_output_file,
    refuse_to_replace,
)
from vae.data import BadImage, image_to_tensor, list_images, open_image_rgb, tensor_to_uint8
from vae.metrics import psnr
from vae.model import AutoencoderKL
from vae.weights import load_vae_weights

BYTES_PER_PIXEL = 80  # host memory per image pixel, tiled or not (measured: 1.2 GB for a 4096x4096 image)
MAX_PIXELS = 2**25  # 33.5 Mpx (8192x4096): about 2.7 GB at BYTES_PER_PIXEL


def _pad_to(x: torch.Tensor, multiple: int) -> tuple[torch.Tensor, int, int]:
    """x padded to whole multiples of `multiple` and at least two of them a side: at one latent pixel a GroupNorm
    of one channel per group has a single value to normalise (a 1x1 image failed in a small model)."""
    h, w = x.shape[-2:]
    ph, pw = max((-h) % multiple, 2 * multiple - h), max((-w) % multiple, 2 * multiple - w)
    if ph or pw:
        mode = "reflect" if ph < h and pw < w else "replicate"
        x = F.pad(x, (0, pw, 0, ph), mode=mode)
    return x, h, w


@torch.no_grad()
def reconstruct_full(model: AutoencoderKL, x: torch.Tensor) -> torch.Tensor:
    """Deterministic reconstruction (posterior mode) of [B,3,H,W] in [-1,1]; any H, W."""
    xp, h, w = _pad_to(x, model.downsample_factor)
    rec = model.decode(model.encode(xp).mode())
    return rec[..., :h, :w].float()


def _starts(length: int, tile: int, stride: int) -> list[int]:
    if length <= tile:
        return [0]
    starts = list(range(0, length - tile, stride))
    starts.append(length - tile)  # the last tile ends exactly at the border
    return sorted(set(starts))


def _ramp(size: int, overlap: int, fade_start: bool, fade_end: bool) -> torch.Tensor:
    """1-D blend weights: rising over `overlap` px where a neighbour tile exists, else flat."""
    w = torch.ones(size)
    ramp = (torch.arange(overlap, dtype=torch.float32) + 0.5) / overlap
    if fade_start and overlap:
        w[:overlap] = torch.minimum(w[:overlap], ramp)
    if fade_end and overlap:
        w[-overlap:] = torch.minimum(w[-overlap:], ramp.flip(0))
    return w


def blend_tiles(fn, x: torch.Tensor, tile: int, overlap: int, num: int = 1, den: int = 1) -> torch.Tensor:
    """`fn` applied to overlapping `tile`-sided squares of x [B,C,H,W] and blended with linear ramps.

    `fn` maps a tile of side t to one of side t*num/den (1/1: image -> reconstruction, 1/f: image ->
    latent, f/1: latent -> image); the ramps run over the overlap in the output's units, and the weights
    are normalised where tiles meet, so the result is a weighted mean of the tiles that cover a pixel.
    The caller makes tile, overlap and the tile starts whole multiples in both units."""
    H, W = x.shape[-2:]
    th, tw = min(tile, H), min(tile, W)
    stride = tile - overlap
    o_ov = overlap * num // den
    out = weight = None
    for y0 in _starts(H, tile, stride):
        wy = _ramp(th * num // den, o_ov, y0 > 0, y0 + th < H)
        for x0 in _starts(W, tile, stride):
            wx = _ramp(tw * num // den, o_ov, x0 > 0, x0 + tw < W)
            piece = fn(x[..., y0:y0 + th, x0:x0 + tw]).float()
            if out is None:
                out = torch.zeros(*piece.shape[:2], H * num // den, W * num // den, device=x.device)
                weight = torch.zeros(1, 1, *out.shape[-2:], device=x.device)
            oy, ox = y0 * num // den, x0 * num // den
            wt = (wy[:, None] * wx[None, :]).to(x.device)[None, None]
            out[..., oy:oy + piece.shape[-2], ox:ox + piece.shape[-1]] += piece * wt
            weight[..., oy:oy + piece.shape[-2], ox:ox + piece.shape[-1]] += wt
    return out / weight.clamp_min(1e-8)


@torch.no_grad()
def reconstruct_tiled(model: AutoencoderKL, x: torch.Tensor, tile: int = 512, overlap: int = 64) -> torch.Tensor:
    """Image-space tiles: each `tile`-px square is encoded and decoded on its own, blended in pixels."""
    f = model.downsample_factor
    tile = max(f, tile - tile % f)
    overlap = min(overlap, tile // 2)
    xp, h, w = _pad_to(x, f)
    if max(xp.shape[-2:]) <= tile:
        return reconstruct_full(model, x)
    rec = blend_tiles(lambda p: model.decode(model.encode(p).mode()), xp, tile, overlap)
    return rec[..., :h, :w]


def _latent_tiling(model: AutoencoderKL, tile_px: int, overlap_px: int) -> tuple[int, int]:
    """Tile and overlap in latent elements (>= 1 and < the tile) from pixel values."""
    f = model.downsample_factor
    tile = max(2, tile_px // f)
    return tile, max(0, min(overlap_px // f, tile // 2))


@torch.no_grad()
def encode_tiled(model: AutoencoderKL, x: torch.Tensor, tile: int = 512, overlap: int = 64) -> torch.Tensor:
    """The posterior mode of [B,3,H,W] (H, W multiples of the model's factor) from overlapping image
    tiles, blended in latent space: a latent for images too large to encode at once."""
    f = model.downsample_factor
    t, o = _latent_tiling(model, tile, overlap)
    if max(x.shape[-2:]) <= t * f:
        return model.encode(x).mode().float()
    return blend_tiles(lambda p: model.encode(p).mode(), x, t * f, o * f, 1, f)


@torch.no_grad()
def decode_tiled(model: AutoencoderKL, z: torch.Tensor, tile: int = 64, overlap: int = 8) -> torch.Tensor:
    """Decode latents [B,z,h,w] in overlapping `tile`-element latent squares, blended in pixels with
    ramps over `overlap` x factor px (diffusers' `enable_tiling` decode does the same): the decoder,
    the memory-heavy half at full resolution, only ever sees one tile."""
    if max(z.shape[-2:]) <= tile:
        return model.decode(z).float()
    overlap = max(0, min(overlap, tile // 2))
    return blend_tiles(model.decode, z, tile, overlap, model.downsample_factor, 1)


@torch.no_grad()
def reconstruct_latent_tiled(model: AutoencoderKL, x: torch.Tensor, tile: int = 512, overlap: int = 64) -> torch.Tensor:
    """Latent tiling end to end: `encode_tiled` to one latent for the whole image, then `decode_tiled`
    (tile and overlap in pixels, converted to latent elements)."""
    xp, h, w = _pad_to(x, model.downsample_factor)
    z = encode_tiled(model, xp, tile, overlap)
    t, o = _latent_tiling(model, tile, overlap)
    return decode_tiled(model, z, t, o)[..., :h, :w]


def reconstruct_image(model: AutoencoderKL, x: torch.Tensor, prec: Precision, tile_size: int = 512,
                      tile_overlap: int = 64, tiling: str = "image") -> torch.Tensor:
    """[B,3,H,W] in [-1,1] → its reconstruction under `prec`'s autocast: whole when no side exceeds
    `tile_size` (0 = never tile), else in feathered tiles (`tiling`: "image" or "latent", as --tiling).
    The one path reconstruct.py and the local server (serve/) share."""
    with prec.autocast():
        if tile_size and max(x.shape[-2:]) > tile_size:
            tiled = reconstruct_latent_tiled if tiling == "latent" else reconstruct_tiled
            return tiled(model, x, tile_size, tile_overlap)
        return reconstruct_full(model, x)


def header_size(path: Path) -> tuple[int, int] | None:
    """(width, height) of the image at `path` from its header alone (`Image.open` reads no pixel data), or None
    for a file PIL cannot open: `open_image_rgb` says what is wrong with it."""
    old = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = None  # the size is judged by the caller, against --max_pixels, not by PIL's own limit
    try:
        with Image.open(path) as im:
            return im.size
    except Exception:  # noqa: BLE001 - not an image, damaged: open_image_rgb's message
        return None
    finally:
        Image.MAX_IMAGE_PIXELS = old


def too_large(path: Path, max_pixels: int, flag: str = "--max_pixels") -> str | None:
    """Why `path` is too large to reconstruct, from its header alone, or None; `flag`: the setting the message
    names (the server's is "the server's --max_pixels")."""
    size = header_size(path)
    if size is None:
        return None
    w, h = size
    if w * h <= max_pixels:
        return None
    return (f"too large: {w}x{h} = {w * h} pixels (from its header) > {flag} {max_pixels}; tiles bound only "
            f"the model's memory, the whole image would take about {w * h * BYTES_PER_PIXEL / 2**30:.1f} GiB: raise "
            f"{flag} if it is meant to be this large")


ACTIVATION_COPIES = 6  # live feature maps of the widest layer in one no-grad ResBlock (input, norm, conv, skip), and margin
TILE_STEPS = (4096, 2048, 1024, 512, 256, 128, 64)  # the tiles fit_tile tries, largest first


def reconstruct_memory(model: AutoencoderKL, height: int, width: int, tile_size: int) -> int:
    """Bytes a reconstruction of a `height` x `width` image needs at most with tiles of `tile_size` px (0 = whole):
    the whole image's tensors (BYTES_PER_PIXEL a pixel), plus one tile's float32 activations: the widest feature
    map (channels x pixels, at every level) ACTIVATION_COPIES times, and the mid-block attention's scores, N² for N
    latent positions (the math kernel's; the fused kernels need less, so this errs on the safe side). Why it
    matters: without tiles a 4096² image has 262144 latent positions, 256 GiB of attention scores."""
    f = model.downsample_factor
    th, tw = (min(tile_size, n) if tile_size else n for n in (height, width))
    pixels = max(2 * f, -(-th // f) * f) * max(2 * f, -(-tw // f) * f)  # the tile as _pad_to pads it
    widest = max(c * pixels // 4**i for i, c in enumerate(model.channels))
    positions = pixels // f**2
    attention = positions**2 if model.mid_attention else 0
    return height * width * BYTES_PER_PIXEL + 4 * (ACTIVATION_COPIES * widest + attention)


def fit_tile(model: AutoencoderKL, height: int, width: int, tile_size: int, budget: int) -> int | None:
    """The tile to reconstruct with inside `budget` bytes (`reconstruct_memory`): `tile_size` itself (0 = whole) when
    it fits, else the largest of TILE_STEPS below it that does; None when even the smallest does not."""
    largest = tile_size or max(height, width)
    for tile in (tile_size, *(t for t in TILE_STEPS if t < largest)):
        if reconstruct_memory(model, height, width, tile) <= budget:
            return tile
    return None


def image_format(path: str | Path) -> str | None:
    """The PIL format that writes `path` by its extension (`.png` → PNG), or None when PIL cannot write one."""
    fmt = Image.registered_extensions().get(Path(path).suffix.lower())
    return fmt if fmt in Image.SAVE else None


def build_parser() -> argparse.ArgumentParser:
    p = FlagParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", "--ckpt", dest="checkpoint", required=True, help="checkpoint_*.pt, vae_final.pt, a run folder (best.pt, else the newest) or a diffusers folder")
    p.add_argument("--input", required=True, help="an image file or a folder of images")
    p.add_argument("--output", required=True, help="output file (single input) or folder")
    p.add_argument("--overwrite", action="store_true", help="replace output images that exist (else refused)")
    p.add_argument("--tile_size", type=int, default=512, help="tile side in px; 0 = never tile")
    p.add_argument("--tile_overlap", type=int, default=64, help="overlap of neighbouring tiles in px")
    p.add_argument("--tiling", choices=("image", "latent"), default="image",
                   help="image: each image tile encoded+decoded alone, blended in pixels; latent: one latent "
                        "from blended image tiles, decoded in overlapping latent tiles (diffusers' tiling)")
    p.add_argument("--ema", action=argparse.BooleanOptionalAction, default=True, help="use EMA weights if present")
    p.add_argument("--precision", default="32-true", help="32-true | bf16-mixed | 16-mixed")
    p.add_argument("--device", default="", help="cuda / cpu (default: cuda if available)")
    p.add_argument("--max_pixels", type=int, default=MAX_PIXELS,
                   help=f"refuse larger images, read from the file's header before decoding (default {MAX_PIXELS}: "
                        f"tiles bound the model's memory, but the whole image takes about {BYTES_PER_PIXEL} bytes "
                        "per pixel)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.checkpoint = str(resolve_checkpoint_arg(args.checkpoint))  # a run folder: its best.pt, else the newest
    return exit_codes.run_main(lambda: run(args))


def run(args: argparse.Namespace) -> int:
    """Reconstruct `--input` (an image or a folder of them). What the user gave that cannot be used is a
    UserError (one line, exit 2 through `run_main`); any other exception, while loading the weights too, is a bug."""
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    src = Path(args.input)
    if not src.exists():
        raise ConfigError(f"--input {src}: no such file or folder")
    check_apart(args.output, "--output", {"--input": src, "--checkpoint": args.checkpoint}, "_reconstructed")
    (check_output_dir if src.is_dir() else check_output_file)(args.output, "--output")
    if not src.is_dir() and image_format(args.output) is None:  # before minutes of reconstruction
        raise OutputPathError(f"--output {args.output}: not an image file name; end it in .png (lossless), "
                              ".webp, .jpg or .tif")
    for dst in [Path(args.output)] if not src.is_dir() else [
            Path(args.output) / f.relative_to(src).with_suffix(".png") for f in list_images(src)]:
        refuse_to_replace(dst, args.overwrite, "--output")  # a second run must not silently replace the first's
    model, meta = load_vae_weights(args.checkpoint, use_ema=args.ema)  # a CheckpointError names the file
    model = model.to(device).eval()
    prec = Precision(args.precision, device)
    print(f"loaded {args.checkpoint} ({meta.get('source')}), {device}, {prec.precision}")
    inputs = list_images(src) if src.is_dir() else [src]
    out = Path(args.output)
    failures = 0
    for path in inputs:
        try:
            problem = too_large(path, args.max_pixels)
            if problem:
                raise BadImage(problem, "too_large")
            im, _ = open_image_rgb(path, max_pixels=args.max_pixels, min_size=1, allow_blank=True)
        except BadImage as exc:  # too large (from the header), not an image, damaged: one line naming it
            if not src.is_dir():
                raise ConfigError(f"--input {path}: {exc.reason}") from None
            print(f"  skipped {path}: {exc.reason}")
            failures += 1
            continue
        x = image_to_tensor(im)[None].to(device)
        rec = reconstruct_image(model, x, prec, args.tile_size, args.tile_overlap, args.tiling)
        dst = out if not src.is_dir() else out / path.relative_to(src).with_suffix(".png")
        with atomic_output(dst) as tmp:  # a full disk: DiskFullError, one line
            Image.fromarray(tensor_to_uint8(rec[0])).save(tmp, format=image_format(dst))
        print(f"  {path} -> {dst}  {im.width}x{im.height}  PSNR {float(psnr(x, rec)[0]):.2f} dB")
    if failures:
        print(f"error: {failures} of the {len(inputs)} images in {src} skipped (listed above); the others are "
              f"in {out}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    return exit_codes.OK

if __name__ == "__main__":
    sys.exit(main())
