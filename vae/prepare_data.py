"""Prepare or validate an image folder for VAE training.

    python vae/prepare_data.py --mode preprocess --input_dir raw/ --output_dir data/vae --target_size 1024
    python vae/prepare_data.py --mode validate --input_dir raw/ --output_file validation_report.json

preprocess: every image → 8-bit RGB (EXIF orientation applied, alpha composited on white), resized
by `--resize_mode` (cover: fill the square and centre-crop; contain: fit inside and pad; stretch:
ignore the aspect ratio), written losslessly (PNG; `--format webp` is lossless WebP) under
`output_dir/images/` with `manifest.json` and `preprocess_report.json`. Bad files are skipped and
reported with the reason; the input folder is never modified. Re-running skips finished files
(outputs are written atomically, so a finished file is a complete file) once each is read back: one
damaged since (cut short, garbage, another size or mode) is made again, with one line.

validate: reads every image and writes counts, sizes, modes, formats, exact duplicates, corrupt,
too-small and too-large files (each with its name) to a JSON report. Nothing is written elsewhere.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from collections import Counter
from pathlib import Path

from PIL import Image

from common import exit_codes
from common.atomic_write import atomic_output, write_text
from common.cli import FlagParser
from common.errors import ConfigError
from common.model_card import DATA_SOURCE, add_data_licence_flag, data_source
from common.run_dir import (
    check_apart,
    check_output_dir,
    check_output_file,
    check_prepared_settings,
    outside,
)
from common.workers import RUN_ERRORS, file_progress, process_pool
from vae.data import (
    DEFAULT_MAX_PIXELS,
    SETTINGS_FILE,
    SETTINGS_KEYS,
    BadImage,
    default_min_size,
    list_images,
    open_image_rgb,
    skipped_lines,
)


def file_sha1(path: Path) -> str:
    h = hashlib.sha1()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def resize_image(im: Image.Image, target: int, mode: str, background: tuple[int, int, int]) -> Image.Image:
    """Square `target`×`target` output (or the image unchanged when target is 0)."""
    if target <= 0:
        return im
    w, h = im.size
    lanczos = Image.Resampling.LANCZOS
    if mode == "stretch":
        return im.resize((target, target), lanczos, reducing_gap=3.0)
    if mode == "cover":
        scale = target / min(w, h)
        nw, nh = max(target, round(w * scale)), max(target, round(h * scale))
        im = im.resize((nw, nh), lanczos, reducing_gap=3.0)
        left, top = (nw - target) // 2, (nh - target) // 2
        return im.crop((left, top, left + target, top + target))
    if mode == "contain":
        scale = target / max(w, h)
        nw, nh = max(1, round(w * scale)), max(1, round(h * scale))
        im = im.resize((nw, nh), lanczos, reducing_gap=3.0)
        canvas = Image.new("RGB", (target, target), background)
        canvas.paste(im, ((target - nw) // 2, (target - nh) // 2))
        return canvas
    raise ValueError(f"--resize_mode must be cover, contain or stretch, got {mode!r}")


def _save_atomic(im: Image.Image, dst: Path, fmt: str) -> None:
    with atomic_output(dst) as tmp:
        if fmt == "png":
            im.save(tmp, format="PNG", compress_level=4)
        else:
            im.save(tmp, format="WEBP", lossless=True, quality=80, method=4)


def prepared_image(path: Path, target: int) -> tuple[tuple[int, int], str | None]:
    """((width, height), None) for an output of an earlier run that is whole: it opens as an 8-bit RGB image,
    its data pass the format's own check (PNG: every chunk's CRC, no decoding) and it is `target` px square
    (any size when `target` is 0); else (size, what is wrong), and the file is made again. Our own writes
    are atomic, so damage comes from outside: a disk error, a copy cut short, an edit."""
    try:
        with Image.open(path) as im:
            size, mode = im.size, im.mode
            im.verify()
    except RUN_ERRORS:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure to read it back means: make it again
        detail = " ".join(str(exc).split())[:120] or type(exc).__name__
        return (0, 0), f"is damaged ({detail})"
    if mode != "RGB":
        return size, f"is {mode}, not the RGB that prepare writes"
    if target and size != (target, target):
        return size, f"is {size[0]}x{size[1]}, not {target}x{target}"
    return size, None


def process_one(task: tuple[str, str, dict]) -> dict:
    """One input file → one output file, or a skip record. Runs in a worker process."""
    src, dst, s = task
    record = {"source": src, "path": dst}
    try:
        im, info = open_image_rgb(src, s["max_pixels"], s["min_size"], tuple(s["background"]),
                                  draft_size=s["target_size"])
        record.update(orig_width=info["width"], orig_height=info["height"], orig_mode=info["mode"])
        if s["target_size"] and min(im.size) < s["target_size"]:
            record["upscaled"] = True
        out = resize_image(im, s["target_size"], s["resize_mode"], tuple(s["background"]))
        _save_atomic(out, Path(s["output_dir"]) / dst, s["format"])
        record.update(status="ok", width=out.width, height=out.height)
    except BadImage as exc:
        record.update(status="skipped", kind=exc.kind, reason=exc.reason)
    except RUN_ERRORS:
        raise  # a full disk, a missing module: not this file's fault, the whole run stops with one line
    except Exception as exc:  # noqa: BLE001 - one bad file must never stop the whole run
        record.update(status="skipped", kind="error", reason=f"{type(exc).__name__}: {exc}")
    return record


def _run_parallel(fn, tasks: list, num_workers: int, desc: str, skipped_before: int = 0) -> list:
    """`fn` over `tasks` behind the prepare scripts' progress bar (`common.workers.file_progress`: rate, ETA, the
    skipped count; closed before an error leaves)."""
    if num_workers <= 1 or len(tasks) < 2:
        return list(file_progress(map(fn, tasks), len(tasks), desc, _skipped, skipped_before))
    with process_pool(num_workers, label=lambda task: task[0], flag="--num_workers") as pool:
        return list(file_progress(pool.map(fn, tasks, chunksize=4), len(tasks), desc, _skipped, skipped_before))


def _skipped(result: object) -> bool:
    """Whether one task's result is a skipped file (the bar's count): status "skipped" (preprocess) or "problem"
    (validate)."""
    return isinstance(result, dict) and result.get("status") in ("skipped", "problem")


def _output_names(files: list[Path], root: Path, fmt: str) -> list[str]:
    """`a/b.jpg` → `images/a/b.png`; if two inputs collide (b.jpg and b.png), the later one keeps
    its old extension in the name (`b.png.png`) so nothing is overwritten."""
    names, used = [], set()
    for f in files:
        rel = f.relative_to(root)
        name = (Path("images") / rel).with_suffix(f".{fmt}").as_posix()
        if name in used:
            name = (Path("images") / rel.parent / f"{rel.name}.{fmt}").as_posix()
        used.add(name)
        names.append(name)
    return names


def preprocess(args: argparse.Namespace) -> int:
    src_root, out_root = Path(args.input_dir).resolve(), Path(args.output_dir).resolve()
    # only apart from the input: inside it the outputs would be re-read, around it --overwrite would move it
    check_apart(args.output_dir, "--output_dir", {"--input_dir": args.input_dir})
    settings = {"target_size": args.target_size, "resize_mode": args.resize_mode, "format": args.format,
                "min_size": args.min_size, "background": list(args.background)}
    settings_file = out_root / SETTINGS_FILE
    if settings_file.is_file():  # never a dataset that mixes two settings
        old = json.loads(settings_file.read_text(encoding="utf-8"))
        check_prepared_settings(out_root, {k: old.get(k) for k in SETTINGS_KEYS},
                                {k: settings[k] for k in SETTINGS_KEYS}, args.overwrite, "--output_dir")
    out_root.mkdir(parents=True, exist_ok=True)
    write_text(settings_file, json.dumps(settings, indent=2) + "\n")

    files = list_images(src_root)
    away = outside(files, src_root)
    if away:  # only files inside the given folder are read
        print(f"skipped {len(away)} image(s) that lead outside --input_dir (links to elsewhere): "
              f"{', '.join(str(p) for p in away[:3])}")
        files = [f for f in files if f not in set(away)]
    print(f"found {len(files)} image files in {src_root}")
    names = _output_names(files, src_root, args.format)

    # Exact duplicates (same bytes) would be seen twice per epoch and leak into validation.
    first_by_hash: dict[str, str] = {}
    records: list[dict] = []
    tasks = []
    common = {**settings, "max_pixels": args.max_pixels, "output_dir": str(out_root)}
    for f, name in zip(files, names):
        rel = f.relative_to(src_root).as_posix()
        try:
            digest = file_sha1(f)
        except OSError as exc:
            records.append({"source": str(f), "status": "skipped", "kind": "corrupt", "reason": f"unreadable: {exc}"})
            continue
        if digest in first_by_hash:
            records.append({"source": str(f), "status": "skipped", "kind": "duplicate",
                            "reason": f"exact duplicate of {first_by_hash[digest]}"})
            continue
        first_by_hash[digest] = rel
        if (out_root / name).is_file():
            size, damage = prepared_image(out_root / name, args.target_size)
            if damage is None:
                records.append({"source": str(f), "path": name, "status": "done", "width": size[0],
                                "height": size[1]})
                continue
            print(f"making {name} again: the prepared file {damage}")
        tasks.append((str(f), name, common))
    records += _run_parallel(process_one, tasks, args.num_workers, "preprocess",
                             sum(r["status"] == "skipped" for r in records))

    ok = [r for r in records if r["status"] in ("ok", "done")]
    skipped = [r for r in records if r["status"] == "skipped"]
    ok.sort(key=lambda r: r["path"])
    manifest = {"settings": settings, "files": [{"path": r["path"], "source": r["source"], "width": r["width"],
                                                 "height": r["height"]} for r in ok],
                DATA_SOURCE: data_source([src_root], args.data_licence)}  # carried into checkpoints and exports
    write_text(out_root / "manifest.json", json.dumps(manifest, indent=1) + "\n")
    report = {
        "input_dir": str(src_root), "output_dir": str(out_root), "settings": settings,
        "counts": {"found": len(files), "written": sum(r["status"] == "ok" for r in records),
                   "already_done": sum(r["status"] == "done" for r in records), "skipped": len(skipped),
                   "upscaled": sum(bool(r.get("upscaled")) for r in records),
                   "skipped_by_kind": dict(Counter(r["kind"] for r in skipped))},
        "input_modes": dict(Counter(r["orig_mode"] for r in records if "orig_mode" in r)),
        "skipped": [{"file": r["source"], "kind": r["kind"], "reason": r["reason"]} for r in skipped],
        "upscaled": [r["source"] for r in records if r.get("upscaled")],
    }
    write_text(out_root / "preprocess_report.json", json.dumps(report, indent=1) + "\n")
    c = report["counts"]
    print(f"written {c['written']}, already done {c['already_done']}, skipped {c['skipped']}, "
          f"upscaled {c['upscaled']} -> {out_root}")
    for line in skipped_lines([(r["file"], r["reason"]) for r in report["skipped"]],
                              f": see {out_root / 'preprocess_report.json'}"):
        print(line)
    if c["upscaled"]:
        print(f"  note: {c['upscaled']} image(s) were smaller than --target_size and were upscaled")
    if not ok:
        print("error: no usable image was produced")
        return 1
    return 0


def inspect_one(task: tuple[str, int, int]) -> dict:
    path, min_size, max_pixels = task
    rec: dict = {"file": path}
    try:
        rec["sha1"] = file_sha1(Path(path))
        rec["bytes"] = Path(path).stat().st_size
        im, info = open_image_rgb(path, max_pixels, min_size=0, allow_blank=True)
        rec.update(status="ok", width=info["width"], height=info["height"], mode=info["mode"], format=info["format"])
        if min(info["width"], info["height"]) < min_size:
            rec.update(status="problem", kind="too_small",
                       reason=f"too small: {info['width']}x{info['height']} < --min_size {min_size}")
        elif all(lo == hi for lo, hi in im.getextrema()):
            rec.update(status="problem", kind="blank", reason="blank: every pixel has the same colour")
    except BadImage as exc:
        rec.update(status="problem", kind=exc.kind, reason=exc.reason)
    except RUN_ERRORS:
        raise
    except Exception as exc:  # noqa: BLE001
        rec.update(status="problem", kind="error", reason=f"{type(exc).__name__}: {exc}")
    return rec


def validate(args: argparse.Namespace) -> int:
    root = Path(args.input_dir)
    files = list_images(root)
    known = set(files)
    others = [p for p in root.rglob("*") if p.is_file() and p not in known]
    tasks = [(str(f), args.min_size, args.max_pixels) for f in files]
    recs = _run_parallel(inspect_one, tasks, args.num_workers, "validate")
    good = [r for r in recs if r["status"] == "ok"]
    by_hash: dict[str, list[str]] = {}
    for r in recs:
        if "sha1" in r:
            by_hash.setdefault(r["sha1"], []).append(r["file"])
    duplicates = [group for group in by_hash.values() if len(group) > 1]
    sized = [r for r in recs if "width" in r]
    widths = sorted(r["width"] for r in sized)
    heights = sorted(r["height"] for r in sized)
    buckets = Counter()
    for r in sized:
        short = min(r["width"], r["height"])
        buckets["<256" if short < 256 else "256-511" if short < 512 else "512-1023" if short < 1024
                else "1024-2047" if short < 2048 else ">=2048"] += 1
    problems = [r for r in recs if r["status"] == "problem"]
    kinds = Counter(r["kind"] for r in problems)

    def listing(kind: str) -> list[dict]:
        return [{"file": r["file"], "reason": r["reason"]} for r in problems if r["kind"] == kind]

    report = {
        "input_dir": str(root.resolve()),
        "settings": {"min_size": args.min_size, "max_pixels": args.max_pixels},
        "counts": {"files": len(files), "valid": len(good), "problems": len(problems),
                   "duplicate_groups": len(duplicates), "non_image_files_ignored": len(others), **dict(kinds)},
        "sizes": {
            "min_width": widths[0] if widths else None, "max_width": widths[-1] if widths else None,
            "min_height": heights[0] if heights else None, "max_height": heights[-1] if heights else None,
            "median_width": widths[len(widths) // 2] if widths else None,
            "median_height": heights[len(heights) // 2] if heights else None,
            "short_side_histogram": dict(buckets),
        },
        "modes": dict(Counter(r["mode"] for r in sized)),
        "formats": dict(Counter(r["format"] for r in sized)),
        "duplicates": duplicates,
        "corrupt": listing("corrupt") + listing("empty") + listing("error"),
        "not_images": listing("not_image"),
        "too_small": listing("too_small"),
        "too_large": listing("too_large"),
        "animated": listing("animated"),
        "unsupported": listing("unsupported"),
        "blank": listing("blank"),
        "problems": [{"file": r["file"], "kind": r["kind"], "reason": r["reason"]} for r in problems],
        "ignored_files": [str(p) for p in others[:1000]],
    }
    out = Path(args.output_file)
    write_text(out, json.dumps(report, indent=1) + "\n")
    print(f"{len(files)} image files: {len(good)} valid, {len(problems)} with problems, "
          f"{len(duplicates)} duplicate group(s) -> {out}")
    for r in problems[:50]:
        print(f"  {r['file']}: {r['reason']}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = FlagParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=("preprocess", "validate"), required=True)
    p.add_argument("--input_dir", required=True, help="folder of images (searched recursively; never modified)")
    p.add_argument("--output_dir", help="preprocess: where images/, manifest.json and the report go")
    p.add_argument("--output_file", default="validation_report.json", help="validate: the JSON report")
    p.add_argument("--target_size", type=int, default=1024, help="square output size in px; 0 keeps each size")
    p.add_argument("--resize_mode", choices=("cover", "contain", "stretch"), default="cover")
    p.add_argument("--format", choices=("png", "webp"), default="png", help="lossless output format")
    p.add_argument("--min_size", type=int, default=None,
                   help="skip images whose shorter side is below this (default: min(256, target_size))")
    p.add_argument("--max_pixels", type=int, default=DEFAULT_MAX_PIXELS,
                   help="decompression-bomb limit: larger images are reported, not decoded")
    p.add_argument("--background", type=int, nargs=3, default=(255, 255, 255), metavar=("R", "G", "B"),
                   help="colour that transparent pixels are composited onto")
    p.add_argument("--num_workers", type=int, default=min(8, os.cpu_count() or 1))
    p.add_argument("--overwrite", action="store_true",
                   help="preprocess again into a folder prepared with other settings (its old files are moved aside)")
    add_data_licence_flag(p)
    return p


# the flags one mode reads and the other would accept and ignore
MODE_FLAGS = {"preprocess": ("--output_dir", "--resize_mode", "--format", "--background", "--overwrite",
                             "--data_licence"),
              "validate": ("--output_file",)}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)

    def body() -> int:
        given = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
        other = [f for mode, flags in MODE_FLAGS.items() if mode != args.mode for f in flags if f in given]
        if other:
            raise ConfigError(f"{', '.join(other)} {'go' if len(other) > 1 else 'goes'} with the other --mode, not "
                              f"--mode {args.mode} (it would change nothing)")
        if not Path(args.input_dir).is_dir():
            raise ConfigError(f"--input_dir {args.input_dir}: no such folder")
        if args.min_size is None:
            args.min_size = default_min_size(args.target_size)
        if args.target_size < 0 or args.min_size < 1:
            raise ConfigError("--target_size must be >= 0 and --min_size >= 1")
        if args.target_size and args.target_size % 8:
            print(f"warning: --target_size {args.target_size} is not a multiple of 8; the VAE needs crops that are")
        if args.mode == "preprocess":
            if not args.output_dir:
                raise ConfigError("--mode preprocess needs --output_dir")
            check_apart(args.output_dir, "--output_dir", {"--input_dir": args.input_dir})  # before it is made
            check_output_dir(args.output_dir, "--output_dir")
        else:
            check_output_file(args.output_file, "--output_file")
        # a full disk while writing (common.atomic_write.DiskFullError) and a worker the OS killed are UserErrors:
        # one line; a module that is not installed is one line naming it; Ctrl-C / SIGTERM say "run again"
        return preprocess(args) if args.mode == "preprocess" else validate(args)

    return exit_codes.run_main(body)

if __name__ == "__main__":
    sys.exit(main())
