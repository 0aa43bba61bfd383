"""Binarize folders of audio for vocoder training: mel + f0 (+ voiced mask) per file, a
manifest with a train/valid split, and a report of every skipped file with its reason.

    python vocoder/prepare_data.py --config vocoder/configs/demo.yaml \
        --input data/raw_wavs [more folders] --output data/vocoder_bin [--num_workers 4] [--mel_dir DIR]

``--mel_dir DIR``: an acoustic model's own mels (GTA / teacher-forced) instead of computed ones, one
``<name>.npy`` ``[n_mels, frames]`` per audio file plus ``mel_settings.json``; checked and loaded by
``vocoder/gta_mels.py`` (a folder that does not fit: one line and exit 2 before anything is written;
a single misfit file: skipped with its reason). Audio, f0 and voicing are made as without it.

Input: wav/flac/ogg/mp3 (whatever libsndfile reads), any sample rate (resampled with soxr to
``audio_sample_rate``) and channel count (averaged to mono). f0 is extracted from the
*resampled* audio, on the mel frame grid (``speech.f0.extract_f0``), with ``pe`` (alias
``f0_extractor``: parselmouth, pyin, harvest, crepe, fcpe, or rmvpe with the weights file ``pe_ckpt``; a missing
package or an unusable weights file is one line and exit 2 before any file). ``report.txt`` / ``report.json`` say what it found (voiced fraction, f0 percentiles, a warning
with suggested values when f0_min / f0_max cut a voice off), ``f0_histogram.png`` shows it.

Output layout (``--output``)::

    items/<id>/audio.npy   float32 [frames * hop_size]   (the target waveform, trimmed to whole frames)
    items/<id>/mel.npy     float32 [frames, n_mels]      (frame-major, so a crop is one contiguous read)
    items/<id>/f0.npy      float32 [frames]  Hz, unvoiced frames interpolated
    items/<id>/voiced.npy  bool    [frames]
    items/<id>/meta.json   source path/size/mtime + the settings fingerprint (written last)
    manifest.json          settings, items, train / valid ids
    report.json, report.txt  skipped files and reasons, the f0 report (speech/f0_report.py)
    f0_histogram.png       voiced f0 of every item, with f0_min / f0_max and the 1st / 99th percentiles

Resumable: an item whose meta.json matches the source file and the settings, and whose arrays read
back whole (the shapes meta.json records, no NaN/inf), is not redone; a damaged one is made again (one
line). Items are written to a temporary folder and renamed, so an interrupted run leaves no half item.
Input files are only read, never modified or deleted. Exit status 0 when at least one file was
usable (bad files are reported, not fatal), 2 when nothing usable was found.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from common import exit_codes
from common.atomic_write import atomic_output, remove_stale_temp_folders, write_text
from common.cli import FlagParser
from common.config import add_config_args, load_config, print_config_if_asked
from common.errors import UserError
from common.model_card import DATA_SOURCE, add_data_licence_flag, data_source
from common.prepared import npy_problem
from common.run_dir import check_apart, check_output_dir, check_prepared_settings, outside
from common.workers import RUN_ERRORS, file_progress, process_pool
from speech.f0_report import F0_PNG, f0_report_lines, f0_summary, save_f0_histogram, summary_json
from speech.trim import report_lines
from vocoder.config import VocoderConfig
from vocoder.gta_mels import check_mel_dir, load_gta_mel

AUDIO_EXTENSIONS = (".wav", ".flac", ".ogg", ".mp3", ".aif", ".aiff", ".opus")
MANIFEST = "manifest.json"
FORMAT_VERSION = 1


class PrepareError(UserError, RuntimeError):
    """Nothing usable (or the arguments are wrong): the message says what to do."""


@dataclass(frozen=True)
class Settings:
    """Everything that changes an item's content; an item made with other settings is redone."""

    sample_rate: int
    hop_size: int
    fft_size: int
    win_size: int
    num_mels: int
    fmin: float
    fmax: float | None
    pe: str
    f0_min: float
    f0_max: float
    min_seconds: float
    max_seconds: float | None
    silence_db: float
    max_clip_fraction: float
    mel_dir: str | None = None  # --mel_dir, resolved: GTA mels instead of computed ones
    trim_silence: bool = False  # Silero VAD trim before mel and f0 (speech/trim.py)
    trim_margin: float = 0.25
    loudness_lufs: float | None = None
    pe_ckpt: str | None = None  # pe=rmvpe: the weights file it runs (not part of the fingerprint: a moved file)
    pe_ckpt_sha256: str | None = None  # ... and what identifies them (speech.f0.f0_extractor_id)

    @classmethod
    def from_config(cls, cfg: VocoderConfig, mel_dir: str | Path | None = None) -> Settings:
        b = cfg.binarization_args
        a = cfg.audio
        return cls(a.sample_rate, a.hop_length, a.n_fft, a.win_length, a.n_mels, a.fmin, a.fmax, cfg.pe, cfg.f0_min, cfg.f0_max, b.min_seconds, b.max_seconds,
                   b.silence_db, b.max_clip_fraction, str(Path(mel_dir).resolve()) if mel_dir else None,
                   b.trim_silence, b.trim_margin, b.loudness_lufs)

    def as_dict(self) -> dict:
        """The fingerprint; `mel_dir` only when given and the trim/loudness keys only when on, so folders
        prepared without them keep their settings."""
        d = dict(self.__dict__)
        for key, off in (("mel_dir", None), ("trim_silence", False), ("loudness_lufs", None)):
            if d[key] == off:
                del d[key]
        if not self.trim_silence:
            del d["trim_margin"]
        del d["pe_ckpt"]
        if d["pe_ckpt_sha256"] is None:
            del d["pe_ckpt_sha256"]
        return d


# Recorded, but no part of an item's content: it only picks which files become items, so a folder (and its
# items) prepared with another `max_seconds` continues, and an item longer than this run's is left out.
FILTER_KEYS = ("max_seconds",)


def same_content(settings: dict | None) -> dict | None:
    """A settings fingerprint without `FILTER_KEYS`: what must match for an item (or a folder) to be kept."""
    return None if settings is None else {k: v for k, v in settings.items() if k not in FILTER_KEYS}


def find_audio(roots: list[Path]) -> list[tuple[Path, Path]]:
    """(root, file) for every audio file under the roots, sorted, hidden files skipped."""
    found = []
    for root in roots:
        if root.is_file():
            found.append((root.parent, root))
            continue
        for path in sorted(root.rglob("*")):
            if path.suffix.lower() in AUDIO_EXTENSIONS and path.is_file() and not path.name.startswith("."):
                found.append((root, path))
    return found


def item_id(root: Path, path: Path) -> str:
    """A readable, collision-free folder name: relative path + a short hash of the full path."""
    rel = path.relative_to(root).with_suffix("")
    readable = "_".join(rel.parts)[-60:]
    readable = "".join(c if c.isalnum() or c in "-_" else "_" for c in readable)
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:10]
    return f"{readable}-{digest}"


def _source_stamp(path: Path) -> dict:
    st = path.stat()
    return {"source": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def is_done(item_dir: Path, path: Path, settings: Settings, mel: Path | None = None) -> dict | None:
    """The item's meta when it exists and matches the source file, the GTA `mel` file (if any) and the
    settings, else None."""
    meta_file = item_dir / "meta.json"
    if not meta_file.is_file():
        return None
    try:
        meta = json.loads(meta_file.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    stamp = _source_stamp(path)
    if same_content(meta.get("settings")) != same_content(settings.as_dict()) or any(
            meta.get(k) != v for k, v in stamp.items()):
        return None
    if mel is not None and meta.get("mel_source") != _source_stamp(mel):
        return None
    return meta


def item_problem(item_dir: Path, meta: dict, settings: Settings) -> str | None:
    """Why a finished item (its meta.json matched) cannot be kept: an array that does not read back whole,
    has another shape than its meta.json's frames, or holds NaN/inf (damaged after it was written). None when
    it is intact. Every array is read through once (memory-mapped)."""
    frames = meta.get("frames")
    if not isinstance(frames, int):
        return "meta.json has no frame count"
    shapes = {"mel": (frames, settings.num_mels), "f0": (frames,), "voiced": (frames,),
              "audio": (frames * settings.hop_size,)}
    for key, shape in shapes.items():
        why = npy_problem(item_dir / f"{key}.npy", shape)
        if why:
            return f"{key}.npy {why}"
    return None


def process_file(path: Path, item_dir: Path, settings: Settings, gta_mel: Path | None = None) -> dict:
    """Load, check, resample, make (or, with `gta_mel`, load) the mel + f0, write one item. Returns
    ``{"ok": True, "frames", "seconds"}`` or ``{"ok": False, "reason"}``; never raises for bad audio."""
    import torch

    from speech.audio import AudioError, MelSpectrogram, check_audio
    from speech.f0 import extract_f0
    from speech.trim import trim_and_level

    torch.set_num_threads(1)  # parallelism comes from processes
    try:
        wav, sr = load_checked(path, settings)
    except AudioError as e:
        return {"ok": False, "reason": e.reason}
    reason = check_audio(wav, sr, settings.min_seconds, settings.max_seconds, settings.silence_db,
                         settings.max_clip_fraction)
    if reason:
        return {"ok": False, "reason": reason}
    level = None
    if settings.trim_silence or settings.loudness_lufs is not None:
        # before mel and f0 (speech/trim.py), so a GTA mel of the trimmed audio and the f0 stay on its frames
        wav, level = trim_and_level(wav, sr, settings.trim_silence, settings.trim_margin, settings.loudness_lufs)
        if wav is None:
            return {"ok": False, "reason": level["reason"], "level": level}
        if len(wav) < settings.min_seconds * sr:
            return {"ok": False, "reason": f"too short after trimming silence ({len(wav) / sr:.2f} s < "
                    f"{settings.min_seconds:g} s)", "level": level}
    frames = len(wav) // settings.hop_size
    if frames * settings.hop_size < settings.fft_size:
        return {"ok": False, "reason": f"too short for fft_size {settings.fft_size}"}
    if gta_mel is None:
        wav = wav[: frames * settings.hop_size]
        mel_fn = MelSpectrogram(settings.sample_rate, settings.fft_size, settings.win_size, settings.hop_size,
                                settings.num_mels, settings.fmin, settings.fmax)
        with torch.no_grad():  # in chunks of frames: a long file never holds its whole STFT (the same values)
            mel = mel_fn.mel_in_chunks(torch.from_numpy(wav)).T.contiguous().numpy()  # [frames, n_mels]
        if mel.shape[0] != frames:
            return {"ok": False, "reason": f"internal: mel has {mel.shape[0]} frames, expected {frames}"}
    else:
        mel = load_gta_mel(gta_mel, settings.num_mels, frames)  # [frames', n_mels], or why not
        if isinstance(mel, str):
            return {"ok": False, "reason": mel}
        frames = mel.shape[0]  # the shorter of mel and audio
        wav = wav[: frames * settings.hop_size]
    try:
        f0, voiced = extract_f0(wav, sr, settings.hop_size, frames, settings.f0_min, settings.f0_max,
                                settings.pe, settings.pe_ckpt)
    except RUN_ERRORS:
        raise  # e.g. parselmouth not installed: no file's fault, the run stops with one line
    except Exception as e:  # noqa: BLE001 - an extractor failure is a per-file problem
        return {"ok": False, "reason": f"f0 extraction failed ({type(e).__name__}: {e})"}

    meta = {**_source_stamp(path), "settings": settings.as_dict(), "frames": frames,
            **({"mel_source": _source_stamp(gta_mel)} if gta_mel is not None else {}),
            "seconds": frames * settings.hop_size / settings.sample_rate,
            "voiced_fraction": float(voiced.mean()) if frames else 0.0,
            **({"level": level} if level is not None else {})}
    with atomic_output(item_dir, folder=True) as tmp:  # <item>.tmp<pid>, renamed when complete
        np.save(tmp / "audio.npy", wav.astype(np.float32, copy=False))  # no second copy of a long file
        np.save(tmp / "mel.npy", mel.astype(np.float32, copy=False))
        np.save(tmp / "f0.npy", f0.astype(np.float32))
        np.save(tmp / "voiced.npy", voiced.astype(bool))
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
    return {"ok": True, "frames": frames, "seconds": meta["seconds"], **({"level": level} if level else {})}


def check_extractor(cfg: VocoderConfig) -> dict:
    """Before any file: an unknown `pe` or an unusable `pe_ckpt` is a PrepareError naming the key; a missing
    package raises its ModuleNotFoundError, which `exit_codes.run_main` reports in one line with its pip install
    (exit 2). Returns the Settings fields of rmvpe's weights (the file, and its digest: the folder's identity)."""
    from speech.f0 import check_f0_keys, f0_extractor_id

    try:
        check_f0_keys(cfg.pe, cfg.pe_ckpt, "pe (f0_extractor)", "pe_ckpt (f0_extractor_weights)")
    except ValueError as e:
        raise PrepareError(str(e)) from None
    ident = f0_extractor_id(cfg.pe, cfg.pe_ckpt)
    if "f0_weights_sha256" not in ident:
        return {}
    return {"pe_ckpt": str(Path(cfg.pe_ckpt).expanduser().resolve()), "pe_ckpt_sha256": ident["f0_weights_sha256"]}


def prepared_settings(out: Path) -> dict | None:
    """The settings `out` was prepared with: its manifest's, or (an interrupted run) those of its first item."""
    sources = [out / MANIFEST, *sorted((out / "items").glob("*/meta.json"))[:1]]
    for f in sources:
        try:
            return json.loads(f.read_text())["settings"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None


def load_checked(path: Path, settings: Settings):
    """The file as mono float32 at the training rate: refused from its header when longer than
    `max_seconds` (nothing decoded), else read and resampled (soxr) block by block (`speech.audio.load_audio`),
    so a worker holds about the result alone: 4 bytes a sample at `sample_rate`."""
    from speech.audio import AudioError, load_audio

    if path.stat().st_size == 0:
        raise AudioError("empty file (0 bytes)", path)
    wav, sr = load_audio(path, sr=settings.sample_rate, mono=True, max_seconds=settings.max_seconds)
    if not np.isfinite(wav).all():  # the file's own samples are finite (load_audio): only soxr could do this
        raise AudioError("non-finite samples after resampling", path)
    return wav, sr


def _skipped(result: dict) -> bool:
    """Whether one file's result is a skip (the bar's count; `file_progress`)."""
    return not result["ok"]


def _job(args: tuple[str, str, Settings, str | None]) -> dict:
    path, item_dir, settings, gta_mel = args
    try:
        return process_file(Path(path), Path(item_dir), settings, Path(gta_mel) if gta_mel else None)
    except RUN_ERRORS:
        raise  # a full disk, a missing module: not this file's fault, the whole run stops with one line
    except Exception as e:  # noqa: BLE001 - report, never kill the whole run for one file
        return {"ok": False, "reason": f"unexpected error ({type(e).__name__}: {e})"}


def split_items(ids: list[str], val_num: int, shuffle: bool, seed: int,
                held_out: list[str] | None = None) -> tuple[list[str], list[str], str | None]:
    """(train, valid, note). `held_out` (the ids matching test_prefixes), when given, is the
    validation set; otherwise val_num seeded-random files. At least one file always stays in training."""
    ids = sorted(ids)
    if held_out is not None:
        valid = sorted(set(held_out) & set(ids))
        train = [i for i in ids if i not in set(valid)]
        if not valid or not train:
            raise PrepareError(f"test_prefixes select {len(valid)} of {len(ids)} usable files: they must select "
                               f"at least one file and leave at least one for training")
        return train, valid, None
    order = list(np.random.default_rng(seed).permutation(len(ids))) if shuffle else list(range(len(ids)))
    n_val = min(max(val_num, 0), len(ids) - 1)
    note = None
    if n_val < val_num:
        note = f"val_num={val_num} but only {len(ids)} usable file(s): using {n_val} for validation"
    valid = sorted(ids[i] for i in order[:n_val])
    train = sorted(ids[i] for i in order[n_val:])
    return train, valid, note


def prepare(cfg: VocoderConfig, inputs: list[str | Path], output: str | Path, num_workers: int | None = None,
            log=print, overwrite: bool = False, mel_dir: str | Path | None = None,
            mels: dict[Path, Path] | None = None, data_licence: str | None = None) -> dict:
    """Run the whole binarization; returns the manifest. Raises PrepareError when nothing is usable,
    MelDirError (before anything is written) when the `mel_dir` folder does not fit (`vocoder.gta_mels`);
    `mels`: `check_mel_dir`'s {audio: mel} when the caller already judged the folder (not judged twice).
    A folder prepared with other settings is refused (OutputPathError) unless `overwrite`, which moves
    its files aside first (`common.run_dir.check_prepared_settings`). `data_licence` and the inputs go into
    the manifest's `data_source` (`common.model_card`), which the checkpoints and exports carry."""
    roots = [Path(p) for p in inputs]
    missing = [str(r) for r in roots if not r.exists()]
    if not roots:
        raise PrepareError("no input folder: pass --input DIR (or set data_input_path in the config)")
    if missing:
        raise PrepareError(f"input path(s) not found: {', '.join(missing)}")
    out = Path(output)
    check_apart(out, "--output", {"--input": roots, "--mel_dir": mel_dir})  # before anything is written
    settings = dataclasses.replace(Settings.from_config(cfg, mel_dir), **check_extractor(cfg))
    if mel_dir and settings.trim_silence:
        raise PrepareError("binarization_args.trim_silence with --mel_dir: GTA mels are frame-aligned with the "
                           "whole file, so it cannot be trimmed here; trim when preparing the acoustic model's data")
    workers = cfg.binarization_args.num_workers if num_workers is None else num_workers
    files = find_audio(roots)
    away = {p for root, p in files if outside([p], root)}
    if away:
        log(f"skipped {len(away)} file(s) that lead outside --input (links to elsewhere; only files inside the "
            f"given folders are read): {', '.join(str(p) for p in sorted(away)[:3])}")
        files = [(root, p) for root, p in files if p not in away]
    if not files:
        raise PrepareError(f"no audio files ({'/'.join(e[1:] for e in AUDIO_EXTENSIONS)}) found under: "
                           f"{', '.join(str(r) for r in roots)}")
    if mel_dir and mels is None:
        mels = check_mel_dir(Path(mel_dir), files, cfg.audio)
    mels = mels or {}  # {audio: its GTA mel}
    check_prepared_settings(out, same_content(prepared_settings(out)), same_content(settings.as_dict()), overwrite,
                            "--output", log=log)
    items_dir = out / "items"
    items_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_temp_folders(items_dir, log=log)  # `<item>.tmp<pid>` of killed earlier runs

    results: dict[str, dict] = {}
    jobs = []
    sources, relative = {}, {}
    for root, path in files:
        iid = item_id(root, path)
        sources[iid] = path
        relative[iid] = path.relative_to(root).as_posix()
        meta = None
        try:
            meta = is_done(items_dir / iid, path, settings, mels.get(path))
        except OSError:
            pass
        why = item_problem(items_dir / iid, meta, settings) if meta is not None else None
        if why:
            log(f"damaged prepared item {items_dir / iid}: {why}; making it again from {path}")
            meta = None
        if meta is not None and settings.max_seconds is not None and meta["seconds"] > settings.max_seconds:
            results[iid] = {"ok": False, "reason": f"too long ({meta['seconds']:.2f} s > {settings.max_seconds:g} s)"}
        elif meta is not None:
            results[iid] = {"ok": True, "frames": meta["frames"], "seconds": meta["seconds"], "cached": True,
                            **({"level": meta["level"]} if "level" in meta else {})}
        else:
            jobs.append((str(path), str(items_dir / iid), settings, str(mels[path]) if path in mels else None))
    log(f"prepare: {len(files)} audio files, {len(files) - len(jobs)} already done, {len(jobs)} to process "
        f"with {max(1, workers)} worker(s)")
    t0 = time.time()
    before = sum(not r["ok"] for r in results.values())  # refused from an earlier run's output (too long)
    if workers <= 1 or len(jobs) <= 1:
        outs = file_progress(map(_job, jobs), len(jobs), "prepare", _skipped, before)
        for job, res in zip(jobs, outs):
            results[Path(job[1]).name] = res
    else:
        import multiprocessing as mp

        with process_pool(workers, mp_context=mp.get_context("spawn"), label=lambda job: job[0],
                          flag="--num_workers") as pool:
            outs = file_progress(pool.map(_job, jobs, chunksize=1), len(jobs), "prepare", _skipped, before)
            for job, res in zip(jobs, outs):
                results[Path(job[1]).name] = res
    good = sorted(i for i, r in results.items() if r["ok"])
    skipped = sorted(
        ({"file": str(sources[i]), "reason": r["reason"]} for i, r in results.items() if not r["ok"]),
        key=lambda d: d["file"],
    )
    f0 = f0_summary(((np.load(items_dir / i / "f0.npy"), np.load(items_dir / i / "voiced.npy"),
                     f"{sources[i]} (speaker {sources[i].parent.name})") for i in good),
                    settings.f0_min, settings.f0_max, settings.pe)
    if good:
        save_f0_histogram(f0, out / F0_PNG)
    report = {"num_files": len(files), "num_ok": len(good), "num_skipped": len(skipped), "skipped": skipped,
              "seconds": round(time.time() - t0, 2), "f0": summary_json(f0)}
    write_text(out / "report.json", json.dumps(report, indent=1))
    lines = [f"{len(good)} of {len(files)} files usable, {len(skipped)} skipped"]
    lines += [f"SKIPPED {s['file']}: {s['reason']}" for s in skipped]
    lines += f0_report_lines(f0) if good else []
    levels = {str(sources[i]): r["level"] for i, r in results.items() if r.get("level")}
    if levels:  # trim_silence / loudness_lufs on: trimmed seconds and level of every file, and the total
        report["levels"] = levels
        report["trimmed_seconds"] = round(sum(v.get("trimmed_seconds", 0.0) for v in levels.values()), 3)
        write_text(out / "report.json", json.dumps(report, indent=1))
        lines += report_lines(levels)
    write_text(out / "report.txt", "\n".join(lines) + "\n")
    for line in lines[1:]:
        log(line)
    if not good:
        raise PrepareError(
            f"no usable audio among {len(files)} file(s) under {', '.join(str(r) for r in roots)}; "
            f"every file was skipped (reasons in {out / 'report.txt'}). Provide speech/singing audio "
            f"of at least {settings.min_seconds:g} s that is not silent, clipped or corrupt."
        )
    held_out = None
    if cfg.test_prefixes:
        held_out = [i for i in good if any(relative[i].startswith(p) for p in cfg.test_prefixes)]
    train, valid, note = split_items(good, cfg.val_num, cfg.binarization_args.shuffle, cfg.seed, held_out)
    if note:
        log(f"note: {note}")
    manifest = {
        "format_version": FORMAT_VERSION,
        "settings": settings.as_dict(),
        "items": {i: {"source": str(sources[i]), "frames": results[i]["frames"],
                      "seconds": round(results[i]["seconds"], 3)} for i in good},
        "train": train,
        "valid": valid,
        "total_seconds": round(sum(results[i]["seconds"] for i in good), 2),
        DATA_SOURCE: data_source([*roots, mel_dir], data_licence),
    }
    write_text(out / MANIFEST, json.dumps(manifest, indent=1))
    log(f"prepare: {len(good)} items ({manifest['total_seconds']:.1f} s of audio): {len(train)} train, "
        f"{len(valid)} valid -> {out} ({report['seconds']:.1f} s)")
    return manifest


def build_parser() -> argparse.ArgumentParser:
    p = FlagParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_args(p, default_config=str(Path(__file__).parent / "configs" / "base_hifi_gpu.yaml"))
    p.add_argument("--input", nargs="+", default=None, help="audio folder(s) (default: data_input_path)")
    p.add_argument("--output", default=None, help="dataset folder (default: binary_data_dir)")
    p.add_argument("--num_workers", type=int, default=None, help="processes (default: binarization_args.num_workers)")
    p.add_argument("--mel_dir", default=None, help="an acoustic model's mels (GTA) to train on instead of computed "
                   "ones: <name>.npy [n_mels, frames] per audio file + mel_settings.json (vocoder/gta_mels.py)")
    p.add_argument("--overwrite", action="store_true",
                   help="prepare again into a folder prepared with other settings (its old files are moved aside)")
    add_data_licence_flag(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def body() -> int:
        cfg = load_config(args.config, VocoderConfig, args.overrides)
        print_config_if_asked(args, cfg)
        check_extractor(cfg)
        inputs = args.input or cfg.data_input_path
        output = args.output or cfg.binary_data_dir
        if not output:
            raise PrepareError("no output folder: pass --output DIR (or set binary_data_dir in the config)")
        if args.num_workers is not None and args.num_workers < 0:
            raise PrepareError("--num_workers must be >= 0")
        roots = [Path(p) for p in inputs]
        mels = None
        if args.mel_dir and roots and all(r.exists() for r in roots):
            # judged before check_output_dir makes the output folder: a --mel_dir that does not fit leaves nothing
            mels = check_mel_dir(Path(args.mel_dir), find_audio(roots), cfg.audio)
        check_apart(output, "--output", {"--input": list(inputs or []), "--mel_dir": args.mel_dir})
        check_output_dir(output, "--output")
        prepare(cfg, inputs, output, args.num_workers, overwrite=args.overwrite, mel_dir=args.mel_dir, mels=mels,
                data_licence=args.data_licence)
        return exit_codes.OK
    return exit_codes.run_main(body)


if __name__ == "__main__":
    sys.exit(main())
