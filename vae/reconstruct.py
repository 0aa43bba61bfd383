"""Image in → reconstruction out, with feathered tiles for images too large to encode at once.

    python vae/reconstruct.py --checkpoint runs/vae/vae_final.pt --input photo.jpg --output rec.png
    python vae/reconstruct.py --checkpoint runs/vae/diffusers --input folder/ --output out/ --tile_size 512

`--checkpoint` takes a training checkpoint (EMA weights unless --no-ema), `vae_final.pt` or a diffusers
AutoencoderKL folder. Why tiles overlap and blend: each tile is reconstructed on its own (the middle
attention and GroupNorm see only that tile), so neighbouring tiles disagree slightly at their edges;
weights that ramp linearly across the overlap make that disagreement fade instead of showing a seam.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from PIL import Image

from common.precision import Precision
from common.run_dir import OutputPathError, check_output_dir, check_output_file
from vae.data import BadImage, image_to_tensor, list_images, open_image_rgb, tensor_to_uint8
from vae.metrics import psnr
from vae.model import AutoencoderKL


def _pad_to(x: torch.Tensor, multiple: int) -> tuple[torch.Tensor, int, int]:
    h, w = x.shape[-2:]
    ph, pw = (-h) % multiple, (-w) % multiple
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


@torch.no_grad()
def reconstruct_tiled(model: AutoencoderKL, x: torch.Tensor, tile: int = 512, overlap: int = 64) -> torch.Tensor:
    """Reconstruct [B,3,H,W] in overlapping `tile`-px squares blended with linear ramps."""
    f = model.downsample_factor
    tile = max(f, tile - tile % f)
    overlap = min(overlap, tile // 2)
    xp, h, w = _pad_to(x, f)
    H, W = xp.shape[-2:]
    if H <= tile and W <= tile:
        return reconstruct_full(model, x)
    stride = tile - overlap
    out = torch.zeros(xp.shape[0], 3, H, W, dtype=torch.float32, device=x.device)
    weight = torch.zeros(1, 1, H, W, dtype=torch.float32, device=x.device)
    ys, xs = _starts(H, tile, stride), _starts(W, tile, stride)
    for y0 in ys:
        th = min(tile, H)
        wy = _ramp(th, overlap, y0 > 0, y0 + th < H)
        for x0 in xs:
            tw = min(tile, W)
            wx = _ramp(tw, overlap, x0 > 0, x0 + tw < W)
            piece = xp[..., y0:y0 + th, x0:x0 + tw]
            rec = model.decode(model.encode(piece).mode()).float()
            wt = (wy[:, None] * wx[None, :]).to(x.device)[None, None]
            out[..., y0:y0 + th, x0:x0 + tw] += rec * wt
            weight[..., y0:y0 + th, x0:x0 + tw] += wt
    return (out / weight.clamp_min(1e-8))[..., :h, :w]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="checkpoint_*.pt, vae_final.pt or a diffusers folder")
    p.add_argument("--input", required=True, help="an image file or a folder of images")
    p.add_argument("--output", required=True, help="output file (single input) or folder")
    p.add_argument("--tile_size", type=int, default=512, help="tile side in px; 0 = never tile")
    p.add_argument("--tile_overlap", type=int, default=64)
    p.add_argument("--ema", action=argparse.BooleanOptionalAction, default=True, help="use EMA weights if present")
    p.add_argument("--precision", default="32-true", help="32-true | bf16-mixed | 16-mixed")
    p.add_argument("--device", default="", help="cuda / cpu (default: cuda if available)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from vae.train_vae import load_vae_weights  # imported here: keeps `import vae.reconstruct` light

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    src = Path(args.input)
    if not src.exists():
        print(f"error: --input {src}: no such file or folder", file=sys.stderr)
        return 2
    try:
        (check_output_dir if src.is_dir() else check_output_file)(args.output, "--output")
    except OutputPathError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        model, meta = load_vae_weights(args.checkpoint, use_ema=args.ema)
    except Exception as exc:  # noqa: BLE001 - shown to the user as one line
        print(f"error: --checkpoint {args.checkpoint}: {exc}", file=sys.stderr)
        return 2
    model = model.to(device).eval()
    prec = Precision(args.precision, device)
    print(f"loaded {args.checkpoint} ({meta.get('source')}), {device}, {prec.precision}")
    inputs = list_images(src) if src.is_dir() else [src]
    out = Path(args.output)
    failures = 0
    for path in inputs:
        try:
            im, _ = open_image_rgb(path, min_size=1, allow_blank=True)
        except BadImage as exc:
            print(f"  skipped {path}: {exc.reason}")
            failures += 1
            continue
        x = image_to_tensor(im)[None].to(device)
        with prec.autocast():
            if args.tile_size and max(x.shape[-2:]) > args.tile_size:
                rec = reconstruct_tiled(model, x, args.tile_size, args.tile_overlap)
            else:
                rec = reconstruct_full(model, x)
        dst = out if not src.is_dir() else out / path.relative_to(src).with_suffix(".png")
        dst.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(tensor_to_uint8(rec[0])).save(dst)
        print(f"  {path} -> {dst}  {im.width}x{im.height}  PSNR {float(psnr(x, rec)[0]):.2f} dB")
    return 1 if failures and failures == len(inputs) else 0


if __name__ == "__main__":
    sys.exit(main())
