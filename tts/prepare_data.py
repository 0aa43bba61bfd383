"""Metadata + audio folder → a prepared TTS dataset folder (normalised text, resampled audio,
cached linear spectrograms, speaker ids, train/eval split, and a report of what was dropped).

    python tts/prepare_data.py --metadata metadata.csv --audio_dir wavs --output_dir data/prep
        [--config tts/vits/configs/uzbek_vits.yaml] [--num_workers 4] [--format auto] [--speaker NAME]
        [--text_kind auto|text|phonemes|phoneme_ids] [--audio_column A --text_column T --speaker_column S]
        [--encoding utf-8|cp1251|latin-1|utf-16|...]

Metadata forms (``--format auto`` detects them; one line says which was read; tts/metadata.py reads them):
- LJSpeech: ``id|text`` or ``id|text|normalized_text`` (no header; audio ``<audio_dir>/<id>.wav``,
  other extensions tried too). Our normaliser reads column 2; column 3 is ignored.
- Piper: ``id|text``, ``id|speaker|text``, ``id|text|phoneme_ids``, ``id|speaker|text|phoneme_ids``; three
  fields are told from LJSpeech over the whole file, or refused with a request for ``--format``.
- Common Voice: the TSV with a header holding ``path`` and ``sentence`` (and ``client_id`` →
  speaker); audio at ``<audio_dir>/<path>`` or ``<audio_dir>/clips/<path>``.
- CSV with a header naming an audio column (id/file/path/audio/wav), a text column
  (text/sentence/transcript) and optionally ``speaker``.
- Hugging Face ``datasets``: a ``save_to_disk`` folder or a ``.parquet`` file with an audio column and a text
  column (no --audio_dir when the audio is in the table); read offline with pyarrow.

A text file is read as UTF-8 (a UTF-16 BOM is honoured); one in another encoding is refused naming its first bad
byte, and ``--encoding cp1251`` (or latin-1, ...) reads it. Ids are compared as written (any script).

Output (``OUT``): ``wavs/<name>.wav`` (mono 16-bit at the config's rate), ``spec/<name>.npy``
(float16 linear magnitude [n_fft/2+1, frames], speech.audio.MelSpectrogram.linear of that wav),
``train.jsonl`` / ``eval.jsonl`` (id: the file name, metadata_id: the id as written, wav, spec, text, raw_text,
speaker, speaker_id, duration, num_samples, num_tokens, line), ``speakers.json`` (name → id), ``report.json``;
with ``phoneme_type: espeak`` also ``phonemes_<espeak_voice>.json`` (normalised text → espeak-ng phonemes,
tts/text/phonemes.py).
``<name>`` is the id itself when it is a safe file name everywhere, else its safe form and a hash of the id
(tts.metadata.file_stem): one distinct, valid name per id on every filesystem.

Nothing in the input is modified. A bad line or file is dropped and reported with its file and
line; the rest is prepared (exit 0). Nothing usable → a clear error (exit 1). A second run
reuses the outputs of items already done with the same audio settings, when they read back whole (a wav
at the rate, a spec of its frames and no NaN/inf); a damaged one is made again from its source (one line).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

from common import exit_codes
from common.atomic_write import atomic_output, write_text
from common.cli import FlagParser
from common.config import load_config
from common.model_card import DATA_SOURCE, add_data_licence_flag, data_source
from common.prepared import array_problem, open_npy
from common.run_dir import check_apart, check_output_dir, check_prepared_settings
from common.workers import RUN_ERRORS, file_progress, process_pool
from speech.audio import AudioError, MelSpectrogram, check_audio, load_audio, save_wav, to_float32, to_int16
from speech.trim import loudness, quiet_files, report_lines, trim_and_level
from tts.metadata import (  # noqa: F401  (Row, resolve_audio: importable from here too, as before)
    AUDIO_EXTENSIONS,
    DEFAULT_SPEAKER,
    FORMATS,
    TEXT_KINDS,
    PrepareError,
    Problem,
    Row,
    TableAudio,
    check_encoding,
    describe,
    file_names,
    find_audio,
    is_table,
    parse_metadata,
    resolve_audio,
)
from tts.text import SYMBOLS, find_unknown, normalize, text_to_ids
from tts.text.phonemes import ESPEAK_SYMBOLS, Frontend, PhonemeCache
from tts.text.symbols import PUNCTUATION, SILENT, describe_char
from tts.vits.config import AudioConfig, DataConfig, TrainConfig

_LETTER_IDS = {i for i, s in enumerate(SYMBOLS) if s not in PUNCTUATION and s not in (" ", "_")}
# phoneme ids given in the metadata: both symbol lists start with the symbols that say nothing (pad, space, punctuation)
_SPOKEN_FROM = len(SILENT)
assert set(SYMBOLS[:_SPOKEN_FROM]) == SILENT == set(ESPEAK_SYMBOLS[:_SPOKEN_FROM])


# ---------------------------------------------------------------------------------------------
# The one data check (also used by the voice-cloning data pipeline)
# ---------------------------------------------------------------------------------------------
@dataclass
class ItemCheck:
    text: str  # normalised text ("" if it could not be normalised)
    ids: list[int]  # token ids without blanks
    seconds: float  # audio duration (0 when no audio was given)
    reason: str | None  # why the item is unusable, or None

    @property
    def ok(self) -> bool:
        return self.reason is None


def check_item(raw_text: str, wav: np.ndarray | None = None, sr: int | None = None,
               cfg: DataConfig | None = None, hop_length: int = 256, ids: list[int] | None = None) -> ItemCheck:
    """Every per-item data check in one place: text (empty, unknown characters, token count),
    audio (speech.audio.check_audio: validity, silence, clipping, duration), speaking rate
    (normalised letters per second) and whether MAS can align it (frames ≥ tokens, with blanks).
    ``wav=None`` runs only the text checks. ``ids``: the phonemes / phoneme ids the metadata gave (tts/metadata.py
    checked them against the symbols): no normalising; the rate counts their spoken symbols as phonemes, against
    the ceiling only (see `_check_rest`)."""
    cfg = cfg or DataConfig()
    if ids is not None:
        return _check_rest(raw_text, ids, sum(1 for i in ids if i >= _SPOKEN_FROM), wav, sr, cfg, hop_length,
                           unit="phonemes")
    if raw_text is None or not raw_text.strip():
        return ItemCheck("", [], 0.0, "empty text")
    try:
        text = normalize(raw_text)
    except RUN_ERRORS:
        raise
    except Exception as e:  # a normaliser bug must not kill a corpus run; report it
        return ItemCheck("", [], 0.0, f"text could not be normalised ({type(e).__name__}: {e})")
    unknown = find_unknown(text)
    ids = text_to_ids(text, on_unknown="drop")
    letters = sum(1 for i in ids if i in _LETTER_IDS)
    if unknown:
        chars = ", ".join(describe_char(c) for c in unknown)
        what = "only unknown characters" if letters == 0 else "unknown characters"
        return ItemCheck(text, ids, 0.0 if wav is None or sr is None else len(wav) / float(sr), f"{what}: {chars}")
    return _check_rest(text, ids, letters, wav, sr, cfg, hop_length)


def _check_rest(text: str, ids: list[int], letters: int, wav: np.ndarray | None, sr: int | None, cfg: DataConfig,
                hop_length: int, unit: str = "letters") -> ItemCheck:
    """The checks of `check_item` after the text became ids: token count, audio, speaking rate, alignment.
    ``unit``: what ``letters`` counts. Normalised letters are held to both rate bounds. Given phonemes / phoneme ids
    (``unit="phonemes"``) only to the ceiling (data.max_chars_per_second, as phonemes per second: more than 30 a
    second is cut audio in any inventory): how many units a second of speech holds depends on the phonemizer that
    made them (Piper's espeak map has stress and length marks as ids, another map whole syllables), so a floor set
    for our letters would refuse valid files; a wrong transcript's ids are not caught by it (prepare() says so in
    the report), the alignment check below still applies."""
    seconds = 0.0 if wav is None or sr is None else len(wav) / float(sr)
    if letters == 0:
        return ItemCheck(text, ids, seconds, "no speakable text after normalisation")
    if len(ids) < cfg.min_text_len:
        return ItemCheck(text, ids, seconds, f"text too short ({len(ids)} tokens < {cfg.min_text_len})")
    if len(ids) > cfg.max_text_len:
        return ItemCheck(text, ids, seconds, f"text too long ({len(ids)} tokens > {cfg.max_text_len})")
    if wav is None or sr is None:
        return ItemCheck(text, ids, seconds, None)
    reason = check_audio(wav, sr, min_seconds=cfg.min_audio_len, max_seconds=cfg.max_audio_len,
                         silence_db=cfg.silence_db, max_clip_fraction=cfg.max_clip_fraction)
    if reason:
        return ItemCheck(text, ids, seconds, f"audio {reason}")
    cps = letters / seconds
    if unit == "letters" and cps < cfg.min_chars_per_second:
        return ItemCheck(text, ids, seconds, f"speaking rate too slow for the text ({cps:.1f} letters/s < "
                         f"{cfg.min_chars_per_second:g}): wrong transcript or long silences?")
    if cps > cfg.max_chars_per_second:
        return ItemCheck(text, ids, seconds, f"speaking rate too fast for the text ({cps:.1f} {unit}/s > "
                         f"{cfg.max_chars_per_second:g}): wrong transcript or truncated audio?")
    frames = len(wav) // hop_length
    need = 2 * len(ids) + 1 if cfg.add_blank else len(ids)
    if frames < need:
        return ItemCheck(text, ids, seconds, f"audio too short to align ({frames} frames < {need} tokens)")
    return ItemCheck(text, ids, seconds, None)


# ---------------------------------------------------------------------------------------------
# Per-item work (runs in worker processes)
# ---------------------------------------------------------------------------------------------
@dataclass
class Job:
    row: Row
    audio_path: str
    out_id: str
    out_dir: str
    audio: AudioConfig
    data: DataConfig
    reuse: bool


@dataclass
class Result:
    row: Row
    out_id: str
    record: dict | None = None
    reason: str | None = None
    notes: list[str] = field(default_factory=list)
    remade: str | None = None  # a damaged earlier output of this item, made again: which and why
    level: dict | None = None  # trimmed seconds and loudness (speech.trim.trim_and_level; None: audio not read)


_MEL: MelSpectrogram | None = None


def _init_worker() -> None:
    torch.set_num_threads(1)


def _spec_module(a: AudioConfig) -> MelSpectrogram:
    global _MEL
    if _MEL is None or (_MEL.sample_rate, _MEL.n_fft, _MEL.hop_length, _MEL.win_length) != (
            a.sample_rate, a.n_fft, a.hop_length, a.win_length):
        _MEL = MelSpectrogram(a.sample_rate, a.n_fft, a.win_length, a.hop_length, a.n_mels, a.fmin, a.fmax)
    return _MEL


def reusable(wav_out: Path, spec_out: Path, a: AudioConfig) -> tuple[np.ndarray | None, str | None]:
    """(the wav, None) when an earlier run's outputs of an item read back whole: the wav at the config's rate,
    the spec [n_fft // 2 + 1, that wav's frames] with only finite values; else (None, why not) to make them
    again, why None when they simply are not there."""
    there = [f for f in (wav_out, spec_out) if f.is_file()]
    if len(there) < 2:  # neither: a new item (or one dropped before); one: the other was lost
        return None, None if not there else f"{spec_out if there == [wav_out] else wav_out} is missing"
    try:
        wav, sr = load_audio(wav_out)
    except (AudioError, RuntimeError, OSError, ValueError) as e:
        return None, f"{wav_out} is damaged ({getattr(e, 'reason', e)})"
    if sr != a.sample_rate:
        return None, None  # another rate: not damaged, simply made again
    spec = open_npy(spec_out, mmap=True)
    why = array_problem(spec, (a.n_fft // 2 + 1, None))
    if why is None and abs(spec.shape[1] - len(wav) // a.hop_length) > 1:  # T samples make T // hop frames
        why = f"has {spec.shape[1]} frames, expected {len(wav) // a.hop_length} for its wav (one of them cut short?)"
    return (None, f"{spec_out} {why}") if why else (wav, None)


def _earlier_level(job: Job, wav: np.ndarray, sr: int) -> dict:
    """The report entry of an item made by an earlier run: the seconds trimmed (its source's length, from the
    header, less the kept wav) and, with no loudness target, the level of the kept wav (what trim_and_level
    measured); with a target the scale is not known again: prepare() takes the earlier report's entry."""
    level = {"trimmed_seconds": round(max(0.0, sf.info(job.audio_path).duration - len(wav) / sr), 3)
             if job.data.trim_silence else 0.0, "earlier": True}
    lufs = loudness(wav, sr) if job.data.loudness_lufs is None else float("-inf")
    return {**level, "lufs": round(lufs, 2)} if np.isfinite(lufs) else level


def _dropped(result: Result) -> bool:
    """Whether one line's result is dropped (the bar's skip count; `file_progress`)."""
    return result.record is None


def process_item(job: Job) -> Result:
    row, a, out = job.row, job.audio, Path(job.out_dir)
    res = Result(row, job.out_id)
    wav_out = out / "wavs" / f"{job.out_id}.wav"
    spec_out = out / "spec" / f"{job.out_id}.npy"
    try:
        wav, res.remade = reusable(wav_out, spec_out, a) if job.reuse else (None, None)
        done = wav is not None
        if done:
            sr = a.sample_rate
            res.level = _earlier_level(job, wav, sr)
        else:
            # longer than data.max_audio_len: refused from its header, nothing decoded; else read and resampled in
            # blocks (speech.audio.load_audio), so a worker holds the clip at the output rate and little more
            wav, sr = load_audio(job.audio_path, sr=a.sample_rate, mono=True, max_seconds=job.data.max_audio_len)
            info = sf.info(job.audio_path)
            if info is not None and info.channels > 1:
                res.notes.append(f"downmixed {info.channels} channels to mono")
            if info is not None and info.samplerate != a.sample_rate:
                res.notes.append(f"resampled {info.samplerate} Hz -> {a.sample_rate} Hz")
            # silence trimmed and level set before the spec (speech/trim.py), so spec, wav and durations agree
            wav, res.level = trim_and_level(wav, sr, job.data.trim_silence, job.data.trim_margin,
                                            job.data.loudness_lufs)
            if wav is None:
                res.reason = f"audio {res.level['reason']}"
                return res
            wav = to_float32(to_int16(wav))  # exactly what the saved 16-bit file will hold
    except AudioError as e:
        res.reason = f"audio {e.reason}"
        return res
    except (RuntimeError, OSError, ValueError) as e:  # soundfile can fail in odd ways
        res.reason = f"audio not readable ({type(e).__name__}: {e})"
        return res
    chk = check_item(row.text, wav, sr, job.data, a.hop_length, ids=row.ids)
    if not chk.ok:
        res.reason = chk.reason
        return res
    if not done:
        spec = _spec_module(a).linear(torch.from_numpy(wav))[0].numpy().astype(np.float16)
        save_wav(wav_out, wav, sr)
        with atomic_output(spec_out) as tmp, open(tmp, "wb") as f:
            np.save(f, spec)
    res.record = {
        "id": job.out_id, "metadata_id": row.id, "wav": f"wavs/{job.out_id}.wav", "spec": f"spec/{job.out_id}.npy",
        "text": chk.text, "raw_text": row.text, "speaker": row.speaker, "duration": round(chk.seconds, 4),
        "num_samples": len(wav), "num_tokens": len(chk.ids), "line": row.line,
        **({"ids": chk.ids} if row.ids is not None else {}),  # given phoneme ids: the model reads these
    }
    return res


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------
def split_items(records: list[dict], cfg: DataConfig) -> tuple[list[dict], list[dict]]:
    """Deterministic eval split; eval utterances only from speakers that keep some in train."""
    n = len(records)
    want = int(round(cfg.eval_split_size * n)) if cfg.eval_split_size < 1 else int(cfg.eval_split_size)
    want = max(1, min(want, cfg.eval_split_max_size, n - 1)) if n >= 2 else 0
    rng = np.random.default_rng(cfg.split_seed)
    order = rng.permutation(n)
    per_spk = Counter(r["speaker"] for r in records)
    eval_idx: set[int] = set()
    for i in order:
        if len(eval_idx) >= want:
            break
        spk = records[i]["speaker"]
        if per_spk[spk] >= 2:
            per_spk[spk] -= 1
            eval_idx.add(int(i))
    train = [r for i, r in enumerate(records) if i not in eval_idx]
    evals = [r for i, r in enumerate(records) if i in eval_idx]
    return train, evals


def _state_key(a: AudioConfig, d: DataConfig) -> dict:
    """What the folder's wavs and specs depend on: the audio settings, and the trim and loudness target when on."""
    trim = _trim_key(d)
    return {"audio": asdict(a), **({"trim": trim} if trim else {}), "version": 1}


def _trim_key(d: DataConfig) -> dict:
    """The trim / loudness settings that change the wavs, only those in use: a folder prepared before they
    existed (or with both off) keeps matching a run with both off."""
    key = {"trim_silence": True, "trim_margin": d.trim_margin} if d.trim_silence else {}
    return {**key, "loudness_lufs": d.loudness_lufs} if d.loudness_lufs is not None else key


def _read_state(path: Path) -> dict | None:
    """The settings (or report) an earlier run recorded, or None (no file, or a damaged one: nothing of it is
    reused)."""
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # missing, not UTF-8, not JSON
        return None
    return state if isinstance(state, dict) else None


def prepare(metadata: str | Path, audio_dir: str | Path | None, output_dir: str | Path, cfg: TrainConfig | None = None,
            num_workers: int = 1, fmt: str = "auto", speaker: str = DEFAULT_SPEAKER, quiet: bool = False,
            speaker_from_path: bool = False, overwrite: bool = False, text_kind: str = "auto",
            columns: tuple[str | None, str | None, str | None] = (None, None, None), encoding: str = "utf-8",
            data_licence: str | None = None) -> dict:
    """Runs the whole preparation and returns the report (also written to OUT/report.json). A folder
    prepared with other audio settings is refused (OutputPathError) unless `overwrite`, which moves its
    files aside first (`common.run_dir.check_prepared_settings`). `audio_dir` may be None for a datasets
    table whose audio is in it; `text_kind`, `columns` and `encoding`: tts.metadata.parse_metadata's; `data_licence`
    and the inputs go into the report's `data_source` (`common.model_card`), which the checkpoints and exports carry. The prepared
    files of an item are named after its id by tts.metadata.file_names (one name per id, valid everywhere)."""
    cfg = cfg or TrainConfig()
    metadata, out = Path(metadata), Path(output_dir)
    audio_dir = None if audio_dir is None else Path(audio_dir)
    if audio_dir is None and not (fmt == "hf" or (fmt == "auto" and is_table(metadata))):
        raise PrepareError(f"--audio_dir is needed for {metadata}: the folder with its audio files")
    if audio_dir is not None and not audio_dir.is_dir():
        raise PrepareError(f"audio folder not found: {audio_dir} (--audio_dir)")
    check_apart(out, "--output_dir", {"--audio_dir": audio_dir, "--metadata": metadata})  # before any write
    symbols = Frontend.of(cfg).symbols
    if text_kind == "phonemes" and cfg.phoneme_type != "espeak":
        raise PrepareError("--text_kind phonemes reads espeak-ng IPA: it needs phoneme_type: espeak in the config "
                           "(--set phoneme_type=espeak); for the letters of phoneme_type: text give the text itself")
    rows, problems, fmt = parse_metadata(metadata, fmt, speaker, speaker_from_path, text_kind, symbols, columns,
                                         encoding)
    if not quiet:
        print(describe(fmt, rows, text_kind))
    state_path = out / "prepare_state.json"
    old = _read_state(state_path)  # None: none yet, or damaged (then everything is made again)
    key = _state_key(cfg.audio, cfg.data)
    check_prepared_settings(out, None if old is None else {**old.get("audio", {}), **(old.get("trim") or {}),
                                                            "version": old.get("version")},
                            {**key["audio"], **key.get("trim", {}), "version": key["version"]}, overwrite,
                            "--output_dir", log=print)
    (out / "wavs").mkdir(parents=True, exist_ok=True)
    (out / "spec").mkdir(parents=True, exist_ok=True)
    reuse = _read_state(state_path) == key
    if not reuse:  # a re-run over a finished folder writes nothing another reader could catch half-written
        write_text(state_path, json.dumps(key, indent=1))

    jobs, seen, notes = [], {}, []
    src = str(metadata)
    if any(row.ids is not None for row in rows):
        notes.append(Problem(src, None, None, "speaking-rate floor (data.min_chars_per_second) not applied: the "
                             "metadata gives phonemes / phoneme ids, whose count per second depends on the phonemizer "
                             "that made them; the ceiling (data.max_chars_per_second, as phonemes/s) and the "
                             "alignment check apply"))
    names = file_names(row.id for row in rows if row.id)  # ids compared as written; one valid file name each
    tables = TableAudio(out, columns)  # audio bytes of a datasets table, as files for the workers (removed below)
    for row in rows:
        if not row.id:
            problems.append(Problem(src, row.line, None, "empty id / audio name"))
            continue
        out_id = names[row.id]
        if row.id in seen:
            problems.append(Problem(src, row.line, row.id, f"duplicate id (first on line {seen[row.id]})"))
            continue
        seen[row.id] = row.line
        if not row.text.strip():  # cheap checks first: no need to touch the audio
            problems.append(Problem(src, row.line, row.id, "empty text"))
            continue
        audio_path, why = find_audio(row, audio_dir, tables)
        if audio_path is None:
            problems.append(Problem(src, row.line, row.id, str(why)))
            continue
        jobs.append(Job(row, str(audio_path), out_id, str(out), cfg.audio, cfg.data, reuse))

    dropped = len(problems)  # lines refused before their audio was read (empty text, no audio file)
    if num_workers > 1 and len(jobs) > 1:
        with process_pool(num_workers, initializer=_init_worker, label=lambda job: job.audio_path,
                          flag="--num_workers") as pool:
            results = list(file_progress(pool.map(process_item, jobs, chunksize=max(1, len(jobs) // (8 * num_workers))),
                                         len(jobs), "prepare", _dropped, dropped))
    else:
        results = list(file_progress(map(process_item, jobs), len(jobs), "prepare", _dropped, dropped))
    tables.close()

    records, levels = [], {}
    earlier = (_read_state(out / "report.json") or {}).get("levels")  # the entries of items an earlier run made
    for r in results:
        if r.level is not None and r.level.pop("earlier", False) and isinstance(earlier, dict):
            r.level = earlier.get(r.row.audio) if isinstance(earlier.get(r.row.audio), dict) else r.level
        if r.level is not None:
            levels[r.row.audio] = r.level
        if r.remade:
            if not quiet:
                print(f"damaged prepared file made again from its source: {r.remade}")
            notes.append(Problem(src, r.row.line, r.row.id, f"damaged prepared file made again: {r.remade}"))
        for note in r.notes:
            notes.append(Problem(src, r.row.line, r.row.id, note))
        if r.record is None:
            problems.append(Problem(src, r.row.line, r.row.id, r.reason or "unknown problem"))
        else:
            records.append(r.record)
    if not records:
        _write_report(out, metadata, fmt, rows, problems, notes, [], [], {}, levels)
        _print_summary(problems, notes, 0, 0, 0.0, quiet=False)
        raise PrepareError(f"nothing usable in {metadata}: every line was dropped ({len(problems)} problems"
                           f" listed above and {out / 'report.json'}); check --audio_dir, the metadata "
                           "format and the text")
    records.sort(key=lambda r: r["id"])
    speakers = {name: i for i, name in enumerate(sorted({r["speaker"] for r in records}))}
    for r in records:
        r["speaker_id"] = speakers[r["speaker"]]
    train, evals = split_items(records, cfg.data)
    for name, items in (("train.jsonl", train), ("eval.jsonl", evals)):
        write_text(out / name, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in items))
    write_text(out / "speakers.json", json.dumps(speakers, ensure_ascii=False, indent=1))
    if any("ids" in r for r in records):  # the list the given ids index: training refuses a config of another
        write_text(out / "symbols.json", json.dumps({"phoneme_type": cfg.phoneme_type, "symbols": symbols},
                                                    ensure_ascii=False))
    if cfg.phoneme_type == "espeak":  # cached once here, so training never runs espeak-ng
        cache = PhonemeCache(out, cfg.espeak_voice)
        new = cache.fill([r["text"] for r in records if "ids" not in r])  # given phonemes / ids: nothing to run
        if not quiet:
            print(f"phonemes: {new} new utterance(s) phonemized with espeak-ng -v {cfg.espeak_voice} → {cache.path}")
    report = _write_report(out, metadata, fmt, rows, problems, notes, train, evals, speakers, levels,
                           data_source([metadata, audio_dir], data_licence))
    _print_summary(problems, notes, len(train), len(evals), report["hours"], quiet=quiet)
    return report


def _write_report(out: Path, metadata: Path, fmt: str, rows: list[Row], problems: list[Problem],
                  notes: list[Problem], train: list[dict], evals: list[dict], speakers: dict,
                  levels: dict[str, dict] | None = None, source: dict | None = None) -> dict:
    """report.json, and report.txt: the dropped lines, and the trimmed seconds and level of every file read
    (`levels`: speech.trim.trim_and_level's, or the earlier report's for the files an earlier run made; `source`:
    `common.model_card.data_source`'s record of the inputs)."""
    kinds = Counter(re.sub(r"\s*[(:].*$", "", p.reason) for p in problems)
    report = {
        "metadata": str(metadata), "format": fmt, "layout": describe(fmt, rows), "rows_parsed": len(rows),
        "kept": len(train) + len(evals), "train": len(train), "eval": len(evals),
        "hours": round(sum(r["duration"] for r in train + evals) / 3600, 4),
        "speakers": len(speakers), "dropped": [asdict(p) for p in problems],
        "dropped_by_reason": dict(kinds.most_common()), "notes": [asdict(n) for n in notes],
    }
    levels = levels or {}
    report["trimmed_seconds"] = round(sum(v.get("trimmed_seconds", 0.0) for v in levels.values()), 3)
    report["levels"] = levels
    if source is not None:
        report[DATA_SOURCE] = source
    report["quiet"] = [{"file": n, "lufs": lufs, "below_median_db": below} for n, lufs, below in quiet_files(levels)]
    write_text(out / "report.json", json.dumps(report, ensure_ascii=False, indent=1))
    lines = [f"{report['kept']} of {len(rows)} lines kept, {len(problems)} dropped"]
    lines += [f"DROPPED {p.file}:{p.line} [{p.id}]: {p.reason}" for p in problems]
    write_text(out / "report.txt", "\n".join(lines + report_lines(levels)) + "\n")
    return report


def _print_summary(problems: list[Problem], notes: list[Problem], n_train: int, n_eval: int, hours: float,
                   quiet: bool) -> None:
    if quiet:
        return
    for p in problems:
        where = f"{p.file}:{p.line}" if p.line else p.file
        print(f"dropped {where}{f' [{p.id}]' if p.id else ''}: {p.reason}")
    for n in notes:
        if n.line is None:  # about the whole metadata file
            print(f"note: {n.file}: {n.reason}")
    for what, count in Counter(n.reason for n in notes if n.line is not None).items():
        print(f"note: {what}: {count} file(s) (kept)")
    print(f"prepared {n_train} train + {n_eval} eval utterances ({hours * 60:.1f} min); "
          f"dropped {len(problems)} line(s)")


def main(argv: list[str] | None = None) -> int:
    p = FlagParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--metadata", required=True, help="metadata.csv (LJSpeech/Piper id|text, Piper id|speaker|text), "
                   "Common Voice TSV, CSV, or a Hugging Face datasets folder (save_to_disk) / .parquet file")
    p.add_argument("--audio_dir", default=None, help="folder with the audio files (not needed when a datasets "
                   "table holds the audio)")
    p.add_argument("--output_dir", required=True, help="prepared dataset folder (created)")
    p.add_argument("--config", default=None, help="training YAML (its audio: and data: sections are used)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--num_workers", type=int, default=max(1, min(8, (os.cpu_count() or 2) - 1)))
    p.add_argument("--format", default="auto", choices=FORMATS,
                   help="auto tells them apart; three '|' fields that cannot be told need ljspeech or piper")
    p.add_argument("--text_kind", default="auto", choices=TEXT_KINDS,
                   help="what the text column holds: text (normalised here), phonemes (espeak-ng IPA, with "
                   "phoneme_type: espeak) or phoneme_ids (ids of the config's symbols, space-separated); auto: "
                   "text, or the ids of Piper's id|[speaker|]text|phoneme_ids")
    p.add_argument("--audio_column", default=None, help="audio column of a CSV or datasets table (default: detected)")
    p.add_argument("--text_column", default=None, help="text column of a CSV or datasets table (default: detected)")
    p.add_argument("--speaker_column", default=None, help="speaker column of a CSV or datasets table (optional)")
    p.add_argument("--encoding", default="utf-8",
                   help="encoding of a metadata text file (and of a table's text held as bytes), e.g. cp1251, "
                   "latin-1, utf-16 (default utf-8; a file that starts with a UTF-16 BOM is read as UTF-16)")
    p.add_argument("--speaker", default=DEFAULT_SPEAKER, help="speaker name for formats without one")
    p.add_argument("--speaker_from_path", action="store_true",
                   help="take the speaker from the first folder of each id/path (alice/0001 → alice)")
    p.add_argument("--overwrite", action="store_true",
                   help="prepare again into a folder prepared with other audio settings (its old files are moved aside)")
    p.add_argument("--no_trim", action="store_true",
                   help="keep leading/trailing silence (default: trimmed with Silero VAD, data.trim_silence)")
    add_data_licence_flag(p)
    args = p.parse_args(argv)

    def body() -> int:
        cfg = load_config(args.config, TrainConfig, args.overrides)
        if args.no_trim:
            cfg.data.trim_silence = False
        check_encoding(args.encoding)  # before the output folder is made
        check_apart(args.output_dir, "--output_dir", {"--audio_dir": args.audio_dir, "--metadata": args.metadata})
        check_output_dir(args.output_dir, "--output_dir")
        prepare(args.metadata, args.audio_dir, args.output_dir, cfg, args.num_workers, args.format, args.speaker,
                speaker_from_path=args.speaker_from_path, overwrite=args.overwrite, text_kind=args.text_kind,
                columns=(args.audio_column, args.text_column, args.speaker_column), encoding=args.encoding,
                data_licence=args.data_licence)
        return exit_codes.OK
    return exit_codes.run_main(body)


if __name__ == "__main__":
    sys.exit(main())
