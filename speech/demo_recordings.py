"""Real human speech for the demos, from a Debian package, fetched at data time.

Debian's `tuxpaint-stamps-default` ships several thousand short descriptions of Tux Paint's
stamps read aloud by people, one reader per language (44.1 kHz Ogg Vorbis, ~1-2 s each;
licence GPL-2, © 2002-2022 Bill Kendrick and the Tux Paint contributors). `apt-get download`
fetches the .deb from the machine's own package sources (no root needed, nothing installed),
the Ogg files of the chosen readers are taken out of it and written as mono wavs at the demo's
sample rate; the .deb is deleted afterwards and nothing of it is committed.

The demo trains on `TRAIN_READERS` and holds out `HELD_OUT_READERS`: voices it never heard.
No package has Uzbek recordings, so the Uzbek text-to-speech demos keep espeak-ng (`speech.demo_speech`).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

import numpy as np
import soundfile as sf

from common.atomic_write import write_bytes, write_text
from common.errors import UserError
from speech.audio import resample, save_wav

PACKAGE = "tuxpaint-stamps-default"
LICENCE = "GPL-2 (Debian package tuxpaint-stamps-default: © 2002-2022 Bill Kendrick and the Tux Paint contributors)"
# One reader per language. Median f0 measured with Praat on 12 files each: fr 128, ru 125, ca 143
# (male voices), be 236, es 257, el 208 Hz (female); held out: da 125 (male), ro 221 Hz (female).
# Not used: bg (heavily noise-gated and band-processed: the waveform demo scored MCD ~9 dB on it).
# Held out, be came out 7-11 dB too quiet after the 2700 steps the demo had then (ro, el: within 3 dB): an
# unseen voice can sit outside what a few CPU minutes generalise to, so be is a training reader.
TRAIN_READERS = ("fr", "ru", "ca", "be", "es", "el")
HELD_OUT_READERS = ("ro", "da")
MALE_READERS = ("fr", "ru", "ca", "da")  # the others are female (the medians above)
MIN_SECONDS, MAX_SECONDS = 1.0, 6.0  # shorter clips are mostly one word; none is longer
PEAK = 0.9  # every clip is peak-normalised: the readers recorded at very different levels (peaks 0.16-1.2)
DONE = "corpus.json"


class RecordingsUnavailable(UserError, RuntimeError):
    """The package could not be fetched or read; the message says why."""


def _download(workdir: Path, timeout: float = 600.0) -> Path:
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        raise RecordingsUnavailable("apt-get/dpkg-deb not found (not a Debian-based system)")
    try:
        res = subprocess.run(["apt-get", "download", PACKAGE], cwd=workdir, capture_output=True, text=True,
                             timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise RecordingsUnavailable(f"`apt-get download {PACKAGE}` took over {timeout:.0f} s") from e
    debs = sorted(workdir.glob(f"{PACKAGE}_*.deb"))
    if res.returncode != 0 or not debs:
        last = (res.stderr.strip().splitlines() or ["no .deb written"])[-1]
        raise RecordingsUnavailable(f"`apt-get download {PACKAGE}` failed: {last} (try `apt-get update` first)")
    return debs[0]


def _extract(deb: Path, readers: tuple[str, ...], dest: Path) -> dict[str, list[Path]]:
    """The readers' description clips out of the .deb's data tarball, streamed (no full unpack)."""
    suffixes = {f"_desc_{r}.ogg": r for r in readers}
    found: dict[str, list[Path]] = {r: [] for r in readers}
    with subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE) as proc:
        with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
            for member in tar:
                reader = next((r for s, r in suffixes.items() if member.name.endswith(s)), None)
                if reader is None or not member.isfile():
                    continue
                # Folder + stem keep names unique (the same stamp name exists in several categories).
                parts = Path(member.name).parts
                out = dest / reader / f"{parts[-2]}_{Path(member.name).stem}.ogg"
                out.parent.mkdir(parents=True, exist_ok=True)
                src = tar.extractfile(member)
                if src is not None:
                    write_bytes(out, src.read())
                    found[reader].append(out)
    if proc.returncode != 0:
        raise RecordingsUnavailable(f"dpkg-deb could not read {deb.name} (exit {proc.returncode})")
    empty = [r for r, files in found.items() if not files]
    if empty:
        raise RecordingsUnavailable(f"{deb.name} has no description clips for reader(s) {', '.join(empty)}")
    return found


def _pick(files: list[Path], count: int) -> list[Path]:
    """`count` clips spread evenly over the sorted list (all stamp categories), of usable length."""
    usable = []
    for f in sorted(files):
        try:
            info = sf.info(str(f))
        except (RuntimeError, sf.LibsndfileError):
            continue
        if MIN_SECONDS <= info.duration <= MAX_SECONDS:
            usable.append(f)
    if len(usable) <= count:
        return usable
    return [usable[i] for i in np.linspace(0, len(usable) - 1, count).round().astype(int)]


def _write_wav(src: Path, dst: Path, sample_rate: int) -> None:
    wav, sr = sf.read(str(src), dtype="float32", always_2d=True)
    wav = wav.mean(axis=1)
    if sr != sample_rate:
        wav = resample(wav, sr, sample_rate)
    peak = float(np.abs(wav).max())
    save_wav(dst, wav * (PEAK / peak) if peak > 0 else wav, sample_rate)


def make_recordings_corpus(out_dir: str | Path, sample_rate: int, train_per_reader: int = 30,
                           held_out_per_reader: int = 3, deb: str | Path | None = None) -> dict:
    """Writes `<out_dir>/<reader>/<clip>.wav` for every reader and returns the corpus record
    `{"package", "licence", "train_readers", "held_out_readers", "files"}` (also `<out_dir>/corpus.json`).

    Reused as it is when a finished corpus with the same settings exists. `deb` reads an already
    downloaded package instead of calling `apt-get download` (tests pass a small one they build).
    Raises RecordingsUnavailable when the package cannot be had."""
    out = Path(out_dir)
    record = {"package": PACKAGE, "licence": LICENCE, "sample_rate": sample_rate,
              "train_readers": list(TRAIN_READERS), "held_out_readers": list(HELD_OUT_READERS),
              "train_per_reader": train_per_reader, "held_out_per_reader": held_out_per_reader}
    done = out / DONE
    if done.is_file():
        old = json.loads(done.read_text())
        if {k: old.get(k) for k in record} == record:
            return old
    shutil.rmtree(out, ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix="recordings-") as tmp:
        tmp = Path(tmp)
        package = Path(deb) if deb is not None else _download(tmp)
        clips = _extract(package, TRAIN_READERS + HELD_OUT_READERS, tmp / "ogg")
        files = []
        for reader, found in clips.items():
            count = held_out_per_reader if reader in HELD_OUT_READERS else train_per_reader
            for src in _pick(found, count):
                dst = out / reader / f"{src.stem}.wav"
                _write_wav(src, dst, sample_rate)
                files.append(f"{reader}/{dst.name}")
    record["files"] = files
    write_text(done, json.dumps(record, indent=1))
    return record
