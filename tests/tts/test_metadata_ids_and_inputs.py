"""Metadata that used to be lost or crash tts/prepare_data.py ("Never lose a run", round 4): Unicode ids kept
apart and turned into valid, distinct file names; a Piper phoneme-id file prepared although its ids are few per
second; a bad phoneme-id field one reported line; a cp1251 file named as such and read with --encoding; parquet
text held as bytes decoded, a datasets folder's state.json kept inside the folder, and parquet read a few rows
and only the needed columns at a time. Unit level: tiny synthetic tones, no espeak-ng, no training."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import pytest
import soundfile as sf

from tests.vocoder.conftest import voiced_tone
from tts import metadata
from tts.metadata import HASH_MARK, NAME_BYTES, file_names, parse_metadata, read_table, table_files
from tts.prepare_data import PrepareError, check_item, main, prepare
from tts.text import SYMBOLS
from tts.vits.config import DataConfig, TrainConfig

SR = 22050
TEXT = "Bugun havo juda yaxshi."  # 19 letters: 19 letters/s over the 1 s tones


def _cfg() -> TrainConfig:
    cfg = TrainConfig()
    cfg.data.trim_silence = False  # tones: nothing for the speech detector to keep
    cfg.data.eval_split_size = 1
    return cfg


def _tone(path: Path, seed: int = 0, seconds: float = 1.0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(path, voiced_tone(seconds, SR, seed=seed), SR, subtype="PCM_16")
    return path


def _records(out: Path) -> list[dict]:
    return [json.loads(x) for name in ("train.jsonl", "eval.jsonl")
            for x in (out / name).read_text(encoding="utf-8").splitlines()]


# --------------------------------------------------------------------------------------- ids → file names
def test_ids_become_distinct_file_names_valid_everywhere(tmp_path):
    long_a, long_b = "x" * 299 + "a", "x" * 299 + "b"  # the same first 299 characters
    nfc, nfd = "\u0439", "\u0438\u0306"  # й written two ways: two ids, one name on macOS unless told apart
    ids = ["кулок", "дарах", "китоб", "LJ001-0001", "gʻisht", "a b", "a_b", "a/b", "a~b", long_a, long_b, "я" * 300,
           "CON", "nul", "com1.take2", "LPT\u00b2", "Ab", "ab", "AB", nfc, nfd, ".hidden", "..", "<>:\"|?*\\\x01\x7f",
           "Straße", "STRASSE"]
    names = file_names(ids)
    assert list(names) == ids  # every id has its own entry, compared as written
    for kept in ("кулок", "дарах", "китоб", "LJ001-0001", "gʻisht", "a_b", nfc):  # safe names stay as they are
        assert names[kept] == kept
    folded = {unicodedata.normalize("NFC", n.casefold()) for n in names.values()}
    assert len(folded) == len(ids)  # distinct even where case and normal form do not count (Windows, macOS)
    for id_, name in names.items():
        assert len(name.encode("utf-8")) <= NAME_BYTES + 1 + len(HASH_MARK) + 8, id_
        assert not any(c in name for c in '<>:"/\\|?*') and all(c.isprintable() for c in name), (id_, name)
        assert not name.startswith(".") and name.split(".")[0].upper() not in {"CON", "NUL", "COM1", "LPT\u00b2"}
        assert (name == id_) != (HASH_MARK in name)  # a changed name, and only a changed one, carries the hash
    assert names[long_a] != names[long_b]
    for name in names.values():  # the filesystem takes every one of them
        (tmp_path / f"{name}.wav").write_bytes(b"")
    assert len(list(tmp_path.iterdir())) == len(ids)


def test_unicode_ids_prepare_each_their_own_files(tmp_path):
    """The issue's case: distinct Cyrillic ids were all 'duplicate id (first on line 1)'; ids differing in case only
    and a Windows device name prepare too; a 300-character id is one dropped line, not an OSError traceback."""
    ids = ["кулок", "дарах", "китоб", "Ab", "ab", "CON"]
    for i, id_ in enumerate(ids):
        _tone(tmp_path / "wavs" / f"{id_}.wav", seed=i)
    meta = tmp_path / "metadata.csv"
    meta.write_text("".join(f"{id_}|{TEXT}\n" for id_ in ids) + f"{'й' * 300}|{TEXT}\nкулок|{TEXT}\n", encoding="utf-8")
    report = prepare(meta, tmp_path / "wavs", tmp_path / "out", _cfg(), quiet=True)
    assert report["kept"] == 6, report["dropped"]
    dropped = {d["line"]: d["reason"] for d in report["dropped"]}
    assert "longer than a file name can be" in dropped[7]
    assert dropped[8] == "duplicate id (first on line 1)"  # the same id written twice is still one
    records = {r["metadata_id"]: r for r in _records(tmp_path / "out")}
    assert set(records) == set(ids)
    assert records["кулок"]["id"] == "кулок" and records["CON"]["id"].startswith("_CON" + HASH_MARK)
    assert records["Ab"]["wav"] != records["ab"]["wav"] and records["Ab"]["wav"].lower() != records["ab"]["wav"].lower()
    for r in records.values():
        assert (tmp_path / "out" / r["wav"]).is_file() and (tmp_path / "out" / r["spec"]).is_file()


# --------------------------------------------------------------------------------------- Piper phoneme ids
def test_a_piper_phoneme_id_file_prepares(tmp_path):
    """12 lines of id|text|phoneme_ids with 1-4 spoken ids each over 1 s of audio: no letters-per-
    second floor for given ids (the report says so); the ceiling counts phonemes."""
    lines = []
    for i in range(12):
        _tone(tmp_path / "wavs" / f"u{i:02d}.wav", seed=i)
        lines.append(f"u{i:02d}|Salom.|{' '.join(str(12 + (i + k) % 20) for k in range(1 + i % 4))} 3")
    meta = tmp_path / "metadata.csv"
    meta.write_text("\n".join(lines) + "\n", encoding="utf-8")
    report = prepare(meta, tmp_path / "wavs", tmp_path / "out", _cfg(), quiet=True)
    assert report["format"] == "piper_ids" and report["kept"] == 12, report["dropped"]
    assert any("speaking-rate floor" in n["reason"] and n["line"] is None for n in report["notes"])
    assert {tuple(r["ids"]) for r in _records(tmp_path / "out")} == {
        tuple(int(t) for t in ln.split("|")[2].split()) for ln in lines}

    wav, cfg = voiced_tone(1.0, SR), DataConfig()
    assert check_item("", wav, SR, cfg, ids=[12, 3]).ok  # 1 phoneme a second: kept
    assert "too slow" in check_item("ha", wav, SR, cfg).reason  # letters still have their floor
    fast = check_item("", voiced_tone(1.0, SR), SR, cfg, ids=[12] * 40).reason
    assert "40.0 phonemes/s > 30" in fast


def test_a_bad_phoneme_id_field_is_one_line(tmp_path):
    """'²' passes str.isdigit but not int(); 5000 digits are more than int() reads: each is one reported line naming
    the file, the line and the field, and the other lines are read."""
    meta = tmp_path / "ids.csv"
    meta.write_text("a|Salom.|12 20 3\nb|Xayr.|12 \u00b2 3\nc|Ha.|" + "9" * 5000 + "\nd|Yoʻq.|12 \u0663 3\n"
                    "e|Bor.|13 21 3\n", encoding="utf-8")
    rows, problems, fmt = parse_metadata(meta, symbols=SYMBOLS, text_kind="auto")
    assert fmt == "piper_ids" and [r.id for r in rows] == ["a", "e"]
    assert [(p.file, p.line) for p in problems] == [(str(meta), 2), (str(meta), 3), (str(meta), 4)]
    assert all(p.reason.startswith("phoneme_ids field 3 not read: ") for p in problems)
    assert "'²' not a phoneme id" in problems[0].reason and "(5000 characters)" in problems[1].reason

    text_ids = tmp_path / "text_ids.csv"  # --text_kind phoneme_ids on an id|text file: the text field holds them
    text_ids.write_text("a|12 20 3\nb|12 \u00b2 3\n", encoding="utf-8")
    rows, problems, _ = parse_metadata(text_ids, symbols=SYMBOLS, text_kind="phoneme_ids")
    assert [r.ids for r in rows] == [[12, 20, 3]]
    assert problems[0].line == 2 and problems[0].reason.startswith("text field not read as phoneme ids: '²' not")


# --------------------------------------------------------------------------------------- encodings
def test_a_cp1251_file_is_named_and_prepares_with_encoding(tmp_path, capsys):
    ids = ["кулок", "дарах", "китоб"]
    for i, id_ in enumerate(ids):
        _tone(tmp_path / "wavs" / f"{id_}.wav", seed=i)
    meta = tmp_path / "metadata.csv"
    meta.write_bytes("".join(f"{id_}|Бугун яхши кун.\n" for id_ in ids).encode("cp1251", errors="replace"))
    before = meta.read_bytes()
    with pytest.raises(PrepareError, match=rf"^{meta}: not UTF-8: 3 of 3 lines do not decode \(the first at line 1, "
                                           r"byte offset 0: 0x.*--encoding cp1251"):
        parse_metadata(meta)
    args = ["--metadata", str(meta), "--audio_dir", str(tmp_path / "wavs"), "--num_workers", "1", "--no_trim"]
    assert main(args + ["--output_dir", str(tmp_path / "bad"), "--encoding", "no-such-codec"]) == 2
    assert "--encoding no-such-codec: not a text encoding" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()  # refused before anything is made
    assert main(args + ["--output_dir", str(tmp_path / "out"), "--encoding", "cp1251"]) == 0
    assert {r["metadata_id"] for r in _records(tmp_path / "out")} == set(ids)
    assert meta.read_bytes() == before  # read, never rewritten


# --------------------------------------------------------------------------------------- tables
def _audio_cells(paths: list[Path], names: list[str | None]) -> list[dict]:
    return [{"bytes": p.read_bytes(), "path": n} for p, n in zip(paths, names)]


def test_parquet_text_held_as_bytes_is_decoded_or_named(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    wavs = [_tone(tmp_path / "wavs" / f"t{i}.wav", seed=i, seconds=0.6) for i in range(3)]
    texts = [b"Salom dunyo.", "Бугун ҳаво.".encode(), "Бугун".encode("cp1251")]
    pq.write_table(pa.table({"audio": _audio_cells(wavs, ["t0.wav", "t1.wav", "t2.wav"]),
                             "text": pa.array(texts, pa.binary())}), tmp_path / "bin.parquet")
    rows, problems = read_table(tmp_path / "bin.parquet", "speaker", (None, None, None))
    assert [r.text for r in rows] == ["Salom dunyo.", "Бугун ҳаво."]  # never "b'...'"
    assert problems[0].line == 3 and "column 'text' holds bytes that are not utf-8 text" in problems[0].reason
    rows, problems = read_table(tmp_path / "bin.parquet", "speaker", (None, None, None), encoding="cp1251")
    assert {r.line: r.text for r in rows}[3] == "Бугун" and not problems
    pq.write_table(pa.table({"audio": _audio_cells(wavs, ["a", "b", "c"]), "text": [1, 2, 3]}), tmp_path / "int.parquet")
    with pytest.raises(PrepareError, match="its text column 'text' holds int64, not text; .*--text_column"):
        read_table(tmp_path / "int.parquet", "speaker", (None, None, None))


def test_a_datasets_folder_reads_only_files_inside_it(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.ipc  # noqa: F401  (pa.ipc below)
    folder, elsewhere = tmp_path / "ds", tmp_path / "elsewhere.arrow"
    folder.mkdir()
    table = pa.table({"audio": ["a.wav"], "text": ["salom"]})
    for target in (elsewhere, folder / "data-00000-of-00001.arrow"):
        with pa.ipc.new_stream(str(target), table.schema) as w:
            w.write_table(table)
    for name in ("../elsewhere.arrow", str(elsewhere)):
        (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": name}]}), encoding="utf-8")
        with pytest.raises(PrepareError, match=rf"^{folder / 'state.json'} names the data file '{name}', which leads "
                                               rf"outside {folder} "):
            table_files(folder)
    (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}))
    assert table_files(folder) == [folder / "data-00000-of-00001.arrow"]
    (folder / "state.json").unlink()
    (folder / "data-00000-of-00001.arrow").unlink()
    (folder / "link.arrow").symlink_to(elsewhere)  # no state.json: the folder's own .arrow files, links too
    with pytest.raises(PrepareError, match=r"link.arrow is a link, which leads outside"):
        table_files(folder)


def test_parquet_is_read_in_batches_of_the_needed_columns(tmp_path, monkeypatch):
    """The whole file, a whole row group or a column nobody reads is never loaded: text and paths come without the
    audio bytes, the bytes a few rows at a time (what kept a 6 MB parquet from taking 4 GiB). The paths are 300
    characters long: their ids become file names cut to size."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    n = 10
    wavs = [_tone(tmp_path / "wavs" / f"t{i}.wav", seed=i) for i in range(n)]
    names = [f"{'я' * 296}{i:02d}.wav" for i in range(n)]
    pq.write_table(pa.table({"audio": _audio_cells(wavs, names), "sentence": [TEXT] * n,
                             "unused": pa.array([b"\0" * 100_000] * n, pa.binary())}),
                   tmp_path / "train.parquet", row_group_size=n)
    calls = []
    real = pq.ParquetFile.iter_batches

    def spy(self, batch_size=65536, row_groups=None, columns=None, **kw):
        calls.append((batch_size, columns))
        return real(self, batch_size=batch_size, row_groups=row_groups, columns=columns, **kw)

    def refuse(*args, **kw):
        raise AssertionError("a whole table or row group was read")

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", spy)
    for whole in ("read", "read_row_group", "read_row_groups"):
        monkeypatch.setattr(pq.ParquetFile, whole, refuse)
    report = prepare(tmp_path / "train.parquet", None, tmp_path / "out", _cfg(), quiet=True)
    assert report["kept"] == n, report["dropped"]
    assert (metadata.TABLE_BATCH_ROWS, ["audio.path", "sentence"]) in calls  # the rows: no bytes, no `unused`
    assert (metadata.AUDIO_BATCH_ROWS, ["audio"]) in calls  # the bytes: a few rows at a time
    assert all(cols is not None and "unused" not in cols for _, cols in calls)
    assert all(size <= metadata.TABLE_BATCH_ROWS for size, _ in calls)
    for r in _records(tmp_path / "out"):
        assert len(r["metadata_id"]) == 298 and len(Path(r["wav"]).stem.encode()) <= NAME_BYTES + 9
        assert (tmp_path / "out" / r["wav"]).is_file()


@pytest.mark.parametrize("fmt_line", ["utt00.wav|Bugun havo.", "utt00.WAV|anna|Bugun havo."])
def test_an_id_that_keeps_its_audio_extension_is_the_name_without_it(tmp_path, fmt_line):
    """Piper / LJSpeech metadata often keeps `.wav` in the id: the id (and so every prepared file) is `utt00`,
    never `utt00.wav.wav`; the audio is still found by the name as written."""
    meta = tmp_path / "metadata.csv"
    meta.write_text(fmt_line + "\n", encoding="utf-8")
    rows, problems, _ = parse_metadata(meta, "auto")
    assert not problems and rows[0].id == "utt00" and rows[0].audio == fmt_line.split("|")[0]
    assert metadata.audio_id("utt00.tar") == "utt00.tar" and metadata.audio_id(".wav") == ".wav"
