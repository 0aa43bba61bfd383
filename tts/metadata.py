"""The metadata a user already has → rows for tts/prepare_data.py (id, audio, text, speaker[, phoneme ids]).

Here so that every input layout is read in one place and then goes through the same per-item checks:

- LJSpeech ``id|text`` / ``id|text|normalized_text`` (column 3 ignored).
- Piper's metadata.csv (piper.train.vits's dataset reader): ``id|text``, ``id|speaker|text``, and its
  phoneme-id layouts ``id|text|phoneme_ids`` / ``id|speaker|text|phoneme_ids`` (ids separated by spaces).
  Three fields are told apart over the WHOLE file (:func:`_three_fields`): a last column of numbers is
  phoneme ids; a short one-word column 2 with few values next to a sentence is a speaker; two sentence
  columns are LJSpeech. What cannot be told is refused, never guessed.
- Common Voice's TSV, and a CSV with a header (audio, text[, speaker] columns).
- A Hugging Face ``datasets`` folder (``Dataset.save_to_disk``) or a ``.parquet`` file with an audio column
  (the ``Audio`` feature: bytes and/or a path; or a plain path string) and a text column. Read with pyarrow
  alone, offline: ``datasets`` itself is not needed and never decodes audio here. Embedded audio bytes are
  written once into a hidden folder of the output (:class:`TableAudio`) and read from there like any file.

Text files are UTF-8 unless ``encoding`` (``--encoding``) says otherwise; a file that is mostly undecodable is
refused naming its first bad byte. Ids are compared as written, and :func:`file_names` gives each its own file
name, valid on every filesystem (Unicode kept, length cut, a hash where the id had to change).

The text column may also hold what the model reads directly (``text_kind``): espeak-ng IPA
(``phonemes``, needs ``phoneme_type: espeak``) or phoneme ids (``phoneme_ids``), checked against the
config's symbol list and carried to training as ids (a line with an unknown symbol or id is dropped with it).
"""

from __future__ import annotations

import codecs
import csv
import hashlib
import json
import re
import unicodedata
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from common.atomic_write import write_bytes
from common.errors import UserError
from common.run_dir import outside
from tts.text.symbols import PAD_ID, describe_char

AUDIO_EXTENSIONS = (".wav", ".flac", ".ogg", ".mp3", ".opus")
DEFAULT_SPEAKER = "speaker"
FORMATS = ("auto", "ljspeech", "piper", "commonvoice", "csv", "hf")
TEXT_KINDS = ("auto", "text", "phonemes", "phoneme_ids")
# the layouts a file was read as (report.json "format"); --format piper picks one of the piper_* by the fields
LAYOUTS = {"ljspeech": "LJSpeech id|text[|normalized_text]", "piper": "Piper id|text",
           "piper_speaker": "Piper id|speaker|text", "piper_ids": "Piper id|text|phoneme_ids",
           "piper_speaker_ids": "Piper id|speaker|text|phoneme_ids", "commonvoice": "Common Voice TSV",
           "csv": "CSV with a header", "hf": "Hugging Face datasets table"}
PYARROW = "pyarrow==26.0.1"  # what the message of a missing pyarrow asks for (requirements-test.txt's)
TABLE_AUDIO = ".table_audio"  # the output's hidden folder of audio taken out of a table (removed after)
_IDS = re.compile(r"\s*\d+(\s+\d+)*\s*", re.ASCII)  # phoneme ids as written: ASCII digits only (int() takes no '²')
_ID_TOKEN = re.compile(r"[0-9]{1,9}")  # one phoneme id: no symbol list has a billion entries, and int() stays cheap


class PrepareError(UserError, RuntimeError):
    """Nothing usable, or the inputs cannot be read at all; the message says what to do."""


@dataclass
class Row:
    line: int  # the metadata line (a table: its row number, from 1)
    id: str
    audio: str  # path as written in the metadata (resolved later)
    text: str
    speaker: str
    ids: list[int] | None = None  # phoneme ids (text_kind phonemes / phoneme_ids), checked against the symbols
    table: str | None = None  # the .arrow / .parquet file that holds this row's audio bytes
    index: int = -1  # the row in that file


@dataclass
class Problem:
    file: str
    line: int | None
    id: str | None
    reason: str


# ---------------------------------------------------------------------------------------------
# Ids → file names
# ---------------------------------------------------------------------------------------------
NAME_BYTES = 100  # UTF-8 bytes kept of an id in its file name: with the mark, '.wav' and common.atomic_write's temp
# name (".<name>.<random>.tmp") far below the 255 bytes (ext4, APFS) / 255 UTF-16 units (NTFS) of one name
HASH_MARK = "~"  # never kept from an id, so only a changed name holds it, followed by its id's hash
_RESERVED = {"CON", "PRN", "AUX", "NUL", *(f"{d}{n}" for d in ("COM", "LPT") for n in "0123456789\u00b9\u00b2\u00b3")}


def _kept(char: str) -> bool:
    """A character a file name keeps as it is on every system: a letter, digit or mark of any script, _ - ."""
    return unicodedata.category(char)[0] in "LNM" or char in "_-."


def audio_id(field: str) -> str:
    """The id of a metadata row whose first field names its audio (LJSpeech, Piper): the name without a trailing
    audio extension, so that `utt00.wav|…` is id `utt00` and its prepared files `utt00.wav`, never `utt00.wav.wav`
    (the audio itself is still found by the name as written, `resolve_audio`)."""
    name = field.strip()
    suffix = Path(name).suffix
    return name[: -len(suffix)] if suffix and suffix.lower() in AUDIO_EXTENSIONS and len(name) > len(suffix) else name


def file_stem(id_: str, mark: bool = False) -> str:
    """The file name (without extension) of the prepared files of metadata id ``id_``: the id itself when it is a
    safe name everywhere, else its safe form (NFC; other characters → '_'; cut to NAME_BYTES; no leading '.';
    never a Windows device name such as CON or NUL) followed by ``~`` and 8 hex digits of its SHA-256. Only changed
    names hold ``~``, so two ids never share a name (up to the hash). ``mark``: add the hash to a safe name too
    (file_names does, for names that differ only in case)."""
    name = "".join(c if _kept(c) else "_" for c in unicodedata.normalize("NFC", id_))
    cut = name.encode("utf-8")[:NAME_BYTES].decode("utf-8", "ignore")
    name = cut if cut == name else unicodedata.normalize("NFC", cut)
    if name.startswith("."):  # never a hidden file
        name = "_" + name[1:]
    if not name or name.split(".")[0].upper() in _RESERVED:
        name = "_" + name
    if mark or name != id_:
        digest = hashlib.sha256(id_.encode("utf-8", "surrogatepass")).hexdigest()[:8]
        return f"{name}{HASH_MARK}{digest}"
    return name


def file_names(ids: Iterable[str]) -> dict[str, str]:
    """Each distinct id → its file stem (:func:`file_stem`), so that no two share a file on any filesystem:
    ids are compared as written (Unicode kept, 'кулок' and 'дарах' are two ids), and names that a case-insensitive
    filesystem (Windows, macOS) would take for one ('Ab', 'ab') all get their id's hash."""
    names = {i: file_stem(i) for i in dict.fromkeys(ids)}
    same: dict[str, list[str]] = defaultdict(list)
    for id_, name in names.items():
        same[unicodedata.normalize("NFC", name.casefold())].append(id_)
    for group in same.values():
        if len(group) > 1:
            names.update({id_: file_stem(id_, mark=True) for id_ in group})
    return names


# ---------------------------------------------------------------------------------------------
# Text files
# ---------------------------------------------------------------------------------------------
def check_encoding(encoding: str) -> str:
    """``encoding`` (``--encoding``) if Python can decode text with it; else one line saying what to give."""
    try:
        b"a".decode(encoding)  # LookupError for an unknown name and for bytes-to-bytes codecs (base64, zlib)
    except UnicodeDecodeError:  # a two-byte encoding cannot decode one byte: a text encoding all the same
        pass
    except LookupError:
        raise PrepareError(f"--encoding {encoding}: not a text encoding Python knows; give the metadata file's "
                           "encoding, e.g. utf-8, cp1251, latin-1, utf-16") from None
    return encoding


def _decode_lines(path: Path, problems: list[Problem], encoding: str = "utf-8") -> list[tuple[int, str]]:
    """(line number, text) for every line that decodes in ``encoding``; an undecodable line is reported and skipped.
    A file where most lines do not decode is in another encoding: refused in one line naming the first bad byte
    (line and byte offset) and ``--encoding``, rather than read as a few lines (or none) of a format nobody wrote."""
    data = path.read_bytes()
    name = codecs.lookup(encoding).name
    if data.startswith((b"\xff\xfe", b"\xfe\xff")) or name.startswith(("utf-16", "utf-32")):
        try:  # a BOM says UTF-16 whatever --encoding says; two-byte text is decoded whole, not split on b"\n"
            text = data.decode("utf-16" if data.startswith((b"\xff\xfe", b"\xfe\xff")) else encoding)
        except UnicodeDecodeError as e:
            raise PrepareError(f"{path}: not {encoding} (byte offset {e.start}: {e.reason}); pass --encoding with "
                               "the file's encoding, or re-save it as UTF-8") from None
        return [(i + 1, ln.rstrip("\r")) for i, ln in enumerate(text.split("\n"))]
    if data.startswith(b"\xef\xbb\xbf") and name == "utf-8":
        data = data[3:]
    out: list[tuple[int, str]] = []
    bad: list[tuple[int, int, int]] = []  # (line, byte offset in the file, byte) of each line that does not decode
    offset = 0
    raw_lines = data.split(b"\n")
    what = "UTF-8" if name == "utf-8" else encoding
    for i, raw in enumerate(raw_lines):
        try:
            out.append((i + 1, raw.decode(encoding).rstrip("\r")))
        except UnicodeDecodeError as e:
            bad.append((i + 1, offset + e.start, raw[e.start]))
            problems.append(Problem(str(path), i + 1, None,
                                    f"line is not valid {what} (byte 0x{raw[e.start]:02x} at column {e.start + 1}); "
                                    f"re-save the metadata file as UTF-8, or pass --encoding with its encoding"))
        offset += len(raw) + 1
    nonempty = sum(1 for raw in raw_lines if raw.strip())
    if bad and len(bad) >= max(1, nonempty // 2):
        line, at, byte = bad[0]
        hint = "e.g. --encoding cp1251 or --encoding latin-1" if name == "utf-8" else "--encoding with the right one"
        raise PrepareError(f"{path}: not {what}: {len(bad)} of {nonempty} lines do not decode (the first at line "
                           f"{line}, byte offset {at}: 0x{byte:02x}); pass the file's encoding ({hint}), or "
                           f"convert it (`iconv -f CP1251 -t UTF-8`)")
    return out


def is_table(path: Path) -> bool:
    """A Hugging Face ``datasets`` folder or a parquet file (read as ``--format hf``)."""
    return path.is_dir() or path.suffix.lower() == ".parquet"


def detect_format(lines: list[tuple[int, str]], path: Path) -> str:
    first = next((t for _, t in lines if t.strip()), "")
    header = [h.strip().lower() for h in first.split("\t")]
    if "path" in header and "sentence" in header:
        return "commonvoice"
    if "|" in first:
        return _pipe_layout(lines, path, "auto")
    if "," in first and _csv_columns(first)[0] is not None:
        return "csv"
    raise PrepareError(f"{path}: cannot tell the metadata format from its first line {first[:80]!r}; expected "
                       "LJSpeech/Piper 'id|text', a Common Voice TSV (header with path, sentence) or a CSV "
                       "with a header (file,text[,speaker]); or pass --format")


def _pipe_layout(lines: list[tuple[int, str]], path: Path, fmt: str) -> str:
    """Which '|' layout the whole file is (``fmt``: auto, ljspeech or piper), from its usual field count."""
    rows = [t.split("|") for _, t in lines if t.strip()]
    width = Counter(len(r) for r in rows).most_common(1)[0][0] if rows else 2
    same = [r for r in rows if len(r) == width]
    ids_last = width >= 3 and all(_looks_like_ids(r[-1]) for r in same)
    if fmt == "ljspeech":
        return "ljspeech"
    if width == 4 and ids_last:
        return "piper_speaker_ids"
    if width == 3 and ids_last:
        return "piper_ids"
    if width == 3:
        return _three_fields(same, path, fmt)
    return "piper" if fmt == "piper" else "ljspeech"  # id|text reads the same in both; other counts: per line


def _looks_like_ids(field: str) -> bool:
    """A field of numbers separated by spaces, as a reader sees it: any digit-like character counts ('²', '٣'),
    so a file with one bad id is still read as ids and that line is refused by :func:`parse_ids`, naming it."""
    tokens = field.split()
    return bool(tokens) and all(t.isnumeric() for t in tokens)


def parse_ids(field: str, count: int | None = None) -> tuple[list[int] | None, str | None]:
    """(the ids, None) of a phoneme-id field, or (None, why not): every id ASCII digits (what int() reads the same
    everywhere: '²' and '٣' are refused, not read as 2 and 3), at most 9 of them (a longer one is a mistake, and
    int() of thousands of digits raises), and below ``count`` (the symbol list's length) when given."""
    tokens = field.split()
    if not tokens:
        return None, "no phoneme ids"
    bad = [t for t in tokens if not _ID_TOKEN.fullmatch(t)]
    if bad:
        shown = ", ".join(repr(t) if len(t) <= 12 else f"{t[:12]!r}… ({len(t)} characters)" for t in bad[:3])
        return None, f"{shown} not a phoneme id (ids are whole numbers in ASCII digits, separated by spaces)"
    ids = [int(t) for t in tokens]
    outside = [str(i) for i in ids if count is not None and i >= count]
    if outside:
        return None, f"phoneme id(s) {', '.join(outside[:5])} not in the config's symbol set (0..{count - 1})"
    return ids, None


def _three_fields(rows: list[list[str]], path: Path, fmt: str) -> str:
    """``id|text|normalized_text`` (LJSpeech) or ``id|speaker|text`` (Piper), told over the whole file:
    column 2 is a speaker when every value is one short word, the values repeat (a speaker reads many lines) and
    column 3 is not the same text; column 2 holding a sentence anywhere, or equal to column 3, is LJSpeech."""
    col2 = [r[1].strip() for r in rows]
    speakerish = all(v and len(v) <= 64 and not any(c.isspace() for c in v) for v in col2)
    same = sum(r[1].strip().casefold() == r[2].strip().casefold() for r in rows)
    distinct = len(set(col2))
    if fmt == "piper":
        if not speakerish:
            raise PrepareError(f"{path}: --format piper with 3 fields is id|speaker|text, but column 2 holds text "
                               f"with spaces (e.g. {next(v for v in col2 if not v or ' ' in v)[:40]!r}); for "
                               "LJSpeech's id|text|normalized_text pass --format ljspeech")
        return "piper_speaker"
    if not speakerish or same * 2 >= len(rows):
        return "ljspeech"
    if distinct <= max(1, len(rows) // 2):
        return "piper_speaker"
    raise PrepareError(f"{path}: its lines have 3 '|' fields, which may be LJSpeech's id|text|normalized_text or "
                       f"Piper's id|speaker|text (column 2 is one word on every line, {distinct} different in "
                       f"{len(rows)} lines); say which: --format ljspeech or --format piper")


def _csv_columns(header_line: str) -> tuple[int | None, int | None, int | None]:
    cols = [c.strip().lower() for c in next(csv.reader([header_line]))]
    audio, text, speaker = _find_columns(cols)
    if audio is None or text is None:
        return None, None, None
    return audio, text, speaker


AUDIO_COLUMNS = ("id", "file", "filename", "file_name", "path", "audio", "wav", "audio_file", "audio_path")
TEXT_COLUMNS = ("text", "sentence", "transcript", "transcription", "normalized_text", "raw_text")
SPEAKER_COLUMNS = ("speaker", "speaker_name", "speaker_id", "client_id")


def _find_columns(cols: list[str]) -> tuple[int | None, int | None, int | None]:
    def find(names: tuple[str, ...]) -> int | None:
        return next((i for i, c in enumerate(cols) if c in names), None)  # the first such column of the header

    return find(AUDIO_COLUMNS), find(TEXT_COLUMNS), find(SPEAKER_COLUMNS)


def parse_metadata(path: Path, fmt: str = "auto", speaker: str = DEFAULT_SPEAKER, speaker_from_path: bool = False,
                   text_kind: str = "text", symbols: list[str] | None = None,
                   columns: tuple[str | None, str | None, str | None] = (None, None, None), encoding: str = "utf-8"
                   ) -> tuple[list[Row], list[Problem], str]:
    """Rows that parsed and the problems of those that did not (file + line + reason), and the layout read
    (a key of LAYOUTS). ``speaker_from_path``: an id/file like ``alice/0001`` belongs to speaker ``alice``.
    ``text_kind``/``symbols``: what the text column holds (or ``auto``: text, unless the layout has a
    phoneme-id column) and the config's symbol list the ids are checked against. ``columns``: the audio,
    text and speaker column names of a table or CSV (None: detected). ``encoding``: of a text file, and of a
    table's text held as bytes (``--encoding``; a table's strings are UTF-8 by definition)."""
    path = Path(path)
    check_encoding(encoding)
    if fmt == "hf" or (fmt == "auto" and is_table(path)):
        rows, problems = read_table(path, speaker, columns, encoding)
        fmt = "hf"
    else:
        if not path.is_file():
            raise PrepareError(f"metadata file not found: {path} (--metadata)")
        problems = []
        lines = _decode_lines(path, problems, encoding)
        if fmt == "auto":
            fmt = detect_format(lines, path)
        elif fmt in ("ljspeech", "piper"):
            fmt = _pipe_layout(lines, path, fmt)
        rows = _read_lines(path, lines, fmt, speaker, columns, problems)
    if speaker_from_path:
        for row in rows:
            parts = row.audio.replace("\\", "/").split("/")
            if len(parts) > 1 and parts[0]:
                row.speaker = parts[0]
    text_kind = resolve_kind(text_kind, fmt)
    if text_kind == "text":  # Piper's ids column set aside: the text is read
        for row in rows:
            row.ids = None
    else:
        rows = _to_ids(rows, text_kind, symbols, problems, str(path), from_text=not fmt.endswith("_ids"))
    return rows, problems, fmt


def resolve_kind(text_kind: str, fmt: str) -> str:
    """``auto``: phoneme ids where the layout has their column (Piper's ``..|phoneme_ids``), else text."""
    return ("phoneme_ids" if fmt.endswith("_ids") else "text") if text_kind == "auto" else text_kind


def _read_lines(path: Path, lines: list[tuple[int, str]], fmt: str, speaker: str,
                columns: tuple[str | None, str | None, str | None], problems: list[Problem]) -> list[Row]:
    rows: list[Row] = []
    src = str(path)
    body = [(n, t) for n, t in lines if t.strip()]
    if fmt in LAYOUTS and fmt.startswith(("ljspeech", "piper")):
        names = LAYOUTS[fmt].split(" ", 1)[1]
        fields = names.split("|")
        for n, t in body:
            parts = t.split("|")
            if fmt == "ljspeech" and len(parts) in (2, 3):
                rows.append(Row(n, audio_id(parts[0]), parts[0].strip(), parts[1], speaker))
            elif fmt != "ljspeech" and len(parts) == len(fields):
                spk = parts[1].strip() if "speaker" in fields else speaker
                ids, why = parse_ids(parts[-1]) if fmt.endswith("_ids") else (None, None)
                if why:  # checked against the symbols later (_to_ids), with the text column's ids
                    problems.append(Problem(src, n, parts[0].strip() or None,
                                            f"phoneme_ids field {len(fields)} not read: {why}"))
                    continue
                text = parts[-2] if ids is not None else parts[-1]
                rows.append(Row(n, audio_id(parts[0]), parts[0].strip(), text, spk or speaker, ids=ids))
            else:
                want = "2 or 3" if fmt == "ljspeech" else str(len(fields))
                problems.append(Problem(src, n, parts[0] or None, f"expected {want} '|'-separated fields "
                                        f"({'id|text[|normalized_text]' if fmt == 'ljspeech' else names}, the "
                                        f"layout of the file), got {len(parts)}"))
    elif fmt == "commonvoice":
        header = body[0][1].split("\t")
        cols = {h.strip().lower(): i for i, h in enumerate(header)}
        if "path" not in cols or "sentence" not in cols:
            raise PrepareError(f"{path}: Common Voice header needs 'path' and 'sentence' columns, got {header}")
        for n, t in body[1:]:
            parts = t.split("\t")
            if len(parts) != len(header):
                problems.append(Problem(src, n, None, f"expected {len(header)} tab-separated fields like the "
                                        f"header, got {len(parts)}"))
                continue
            audio = parts[cols["path"]].strip()
            spk = parts[cols["client_id"]].strip() if "client_id" in cols else speaker
            rows.append(Row(n, Path(audio).stem, audio, parts[cols["sentence"]], spk or speaker))
    elif fmt == "csv":
        header = [c.strip().lower() for c in next(csv.reader([body[0][1]]))]
        a, x, s = _given_columns(header, columns, path)
        if a is None or x is None:
            raise PrepareError(f"{path}: the CSV header needs an audio column (id/file/path/audio) and a text "
                               f"column (text/sentence/transcript), got {body[0][1]!r}; or name them with "
                               "--audio_column / --text_column")
        for n, t in body[1:]:
            parts = next(csv.reader([t]))
            if len(parts) != len(header):
                problems.append(Problem(src, n, None, f"expected {len(header)} comma-separated fields like the "
                                        f"header, got {len(parts)} (quote fields that contain commas)"))
                continue
            audio = parts[a].strip()
            rows.append(Row(n, Path(audio).stem if Path(audio).suffix.lower() in AUDIO_EXTENSIONS else audio,
                            audio, parts[x], (parts[s].strip() if s is not None else "") or speaker))
    else:
        raise PrepareError(f"--format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    return rows


def _given_columns(cols: list[str], given: tuple[str | None, str | None, str | None], where: Path
                   ) -> tuple[int | None, int | None, int | None]:
    """The audio, text and speaker column positions: the names given (checked) or the usual names."""
    found = list(_find_columns(cols))
    for i, (name, flag) in enumerate(zip(given, ("--audio_column", "--text_column", "--speaker_column"))):
        if name is not None:
            if name.lower() not in cols:
                raise PrepareError(f"{where}: {flag} {name} is not one of its columns ({', '.join(cols)})")
            found[i] = cols.index(name.lower())
    return found[0], found[1], found[2]


# ---------------------------------------------------------------------------------------------
# Phonemes and phoneme ids
# ---------------------------------------------------------------------------------------------
def _to_ids(rows: list[Row], text_kind: str, symbols: list[str] | None, problems: list[Problem], src: str,
            from_text: bool) -> list[Row]:
    """Each row's phonemes / phoneme ids → ids of ``symbols`` (the config's list); a line with an unknown symbol
    or id, or with the pad id (the blank the model inserts itself, data.add_blank), is dropped with it."""
    if not symbols:
        raise PrepareError("phoneme ids need the config's symbol list")
    index = {s: i for i, s in enumerate(symbols)}
    kept = []
    for row in rows:
        if text_kind == "phonemes":
            ph = re.sub(r"\s+", " ", unicodedata.normalize("NFD", row.text)).strip()
            unknown = list(dict.fromkeys(c for c in ph if c not in index))
            if unknown:
                problems.append(Problem(src, row.line, row.id, "phonemes not in the config's symbol set: "
                                        + ", ".join(describe_char(c) for c in unknown)))
                continue
            row.ids, row.text = [index[c] for c in ph], ph
        else:
            ids, why = parse_ids(row.text if from_text else " ".join(map(str, row.ids or [])), len(symbols))
            if ids is None:
                problems.append(Problem(src, row.line, row.id, f"text field not read as phoneme ids: {why}"
                                        if from_text else str(why)))
                continue
            if PAD_ID in ids:
                problems.append(Problem(src, row.line, row.id, f"phoneme id {PAD_ID} is the pad/blank that the model "
                                        "inserts itself (data.add_blank): give the ids without it (Piper's ids, "
                                        "with ^ _ $ of its own map, do not fit this model's symbols)"))
                continue
            row.ids = ids
        kept.append(row)
    return kept


# ---------------------------------------------------------------------------------------------
# Hugging Face datasets tables (save_to_disk folders, parquet files)
# ---------------------------------------------------------------------------------------------
def _pyarrow():
    try:
        import pyarrow
        import pyarrow.ipc  # noqa: F401
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise PrepareError(f"reading a Hugging Face datasets folder or a parquet file needs pyarrow: "
                           f"`pip install {PYARROW}`") from None
    return pyarrow


def table_files(path: Path) -> list[Path]:
    """The data files of a ``save_to_disk`` folder (its state.json order) or the parquet file itself. Only files
    inside the folder: a state.json naming an absolute or '..' path, or a link to elsewhere, is refused."""
    if path.suffix.lower() == ".parquet":
        if not path.is_file():
            raise PrepareError(f"metadata file not found: {path} (--metadata)")
        return [path]
    if not path.is_dir():
        raise PrepareError(f"--metadata {path}: not a Hugging Face datasets folder (save_to_disk) or a .parquet file")
    if (path / "dataset_dict.json").is_file():
        splits = sorted(p.name for p in path.iterdir() if (p / "state.json").is_file())
        raise PrepareError(f"{path} holds several splits ({', '.join(splits)}): pass one, e.g. --metadata "
                           f"{path / (splits[0] if splits else 'train')}")
    state = path / "state.json"
    try:
        names = [str(f["filename"]) for f in json.loads(state.read_text(encoding="utf-8"))["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError):
        names = []
    files = [path / n for n in names] if names else sorted(path.glob("*.arrow")) or sorted(path.glob("*.parquet"))
    escaping = outside(files, path)
    if escaping:
        where = f"{state} names the data file {names[files.index(escaping[0])]!r}" if names else f"{escaping[0]} is a link"
        raise PrepareError(f"{where}, which leads outside {path} (an absolute or '..' path, or a link to elsewhere): "
                           "only files inside the datasets folder are read; save the dataset again with "
                           "Dataset.save_to_disk, or pass its .parquet file")
    missing = [f for f in files if not f.is_file()]
    if not files or missing:
        raise PrepareError(f"{path}: not a readable datasets folder ({'missing ' + str(missing[0]) if missing else 'no .arrow or .parquet data files'}); "
                           "save it with Dataset.save_to_disk, or pass its .parquet file")
    return files


def _open(file: Path):
    """One data file: a parquet file opened, nothing read yet (:func:`_batches` reads it), or an .arrow table
    memory-mapped (nothing is read until used)."""
    pa = _pyarrow()
    try:
        if file.suffix.lower() == ".parquet":
            return pa.parquet.ParquetFile(file)
        source = pa.memory_map(str(file))
        try:
            return pa.ipc.open_stream(source).read_all()
        except pa.ArrowInvalid:
            return pa.ipc.open_file(source).read_all()
    except (OSError, pa.ArrowException) as e:
        raise PrepareError(f"{file}: not readable as an arrow/parquet table ({e})") from None


def _schema(table):
    return table.schema_arrow if hasattr(table, "schema_arrow") else table.schema


def _columns(file: Path, schema, given: tuple[str | None, str | None, str | None]) -> tuple[str, str, str | None]:
    names = [n.lower() for n in schema.names]
    a, x, s = _given_columns(names, given, file)
    feature = next((i for i, f in enumerate(schema) if _is_audio(f.type)), None)
    if given[0] is None and feature is not None:  # datasets' Audio feature first (Common Voice has a `path` too)
        a = feature
    if a is None or x is None:
        raise PrepareError(f"{file}: needs an audio column and a text column (columns: {', '.join(schema.names)}); "
                           "name them with --audio_column and --text_column")
    pa = _pyarrow()
    kind = schema.field(x).type
    if not any(test(kind) for test in (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary,
                                       pa.types.is_large_binary, pa.types.is_string_view, pa.types.is_binary_view)):
        raise PrepareError(f"{file}: its text column {schema.names[x]!r} holds {kind}, not text; name the column of "
                           "transcripts with --text_column")
    return schema.names[a], schema.names[x], None if s is None else schema.names[s]


def _is_audio(t) -> bool:
    return getattr(t, "num_fields", 0) and {t.field(i).name for i in range(t.num_fields)} >= {"bytes", "path"}


def _batches(table, columns: list[str], size: int, path_of: str | None = None):
    """(first row, a record batch of ``columns``) ``size`` rows at a time. A parquet file is read only in those
    columns, one batch at a time (``ParquetFile.iter_batches``), so memory stays bounded by the batch whatever the
    file's size; ``path_of``: an Audio column of which only the nested ``path`` is read, never its bytes. An
    .arrow table is memory-mapped: its batches are slices, nothing is copied."""
    columns = list(dict.fromkeys(columns))
    if hasattr(table, "iter_batches"):
        nested = [f"{c}.path" if c == path_of and "." not in c else c for c in columns]
        batches = table.iter_batches(batch_size=size, columns=nested)
    else:
        batches = table.select(columns).to_batches(max_chunksize=size)
    start = 0
    for batch in batches:
        yield start, batch
        start += batch.num_rows


def _as_text(value, column: str, encoding: str) -> tuple[str | None, str | None]:
    """(the value as text, None), or (None, why) for bytes that do not decode: a binary column (``binary`` in
    parquet) holds the text's bytes, which ``str()`` would turn into a "b'...'" transcript."""
    if isinstance(value, bytes):
        try:
            return value.decode(encoding), None
        except UnicodeDecodeError as e:
            return None, (f"column {column!r} holds bytes that are not {encoding} text (byte 0x{value[e.start]:02x} "
                          f"at offset {e.start}); pass --encoding with their encoding")
    return (None if value is None else str(value)), None


TABLE_BATCH_ROWS = 256  # rows of text, speaker and audio path read at a time (no audio bytes)
AUDIO_BATCH_ROWS = 8  # rows of audio bytes held at a time by TableAudio


def read_table(path: Path, speaker: str, given: tuple[str | None, str | None, str | None], encoding: str = "utf-8"
               ) -> tuple[list[Row], list[Problem]]:
    """Rows of a datasets folder / parquet file: the text (and speaker) of each row, and where its audio is: an
    Audio column's row (Row.table/index: its bytes, taken out later by TableAudio, or else the path it names)
    or the path a plain column names. Only these columns are read, a batch at a time, and never the audio bytes.
    Text held as bytes is decoded with ``encoding``; a row whose bytes do not decode is reported and skipped."""
    rows: list[Row] = []
    problems: list[Problem] = []
    number = 0
    for file in table_files(path):
        table = _open(file)
        a, x, s = _columns(file, _schema(table), given)
        is_struct = _is_audio(_schema(table).field(a).type)
        wanted = [a, x] + ([s] if s is not None else [])
        for start, batch in _batches(table, wanted, TABLE_BATCH_ROWS, path_of=a if is_struct else None):
            audio = batch.column(a)
            paths = (audio.field("path") if is_struct else audio).to_pylist()
            texts = batch.column(x).to_pylist()
            spks = batch.column(s).to_pylist() if s is not None else [None] * len(paths)
            for i, values in enumerate(zip(paths, texts, spks)):
                number += 1
                decoded = [_as_text(v, c, encoding) for v, c in zip(values, (a, x, s or ""))]
                why = next((w for _, w in decoded if w), None)
                if why:
                    problems.append(Problem(str(file), number, None, why))
                    continue
                p, t, k = (v for v, _ in decoded)
                if not is_struct and not p:
                    problems.append(Problem(str(file), number, None, f"no audio (column {a} holds no path)"))
                    continue
                rows.append(Row(number, "", p or "", t or "", speaker if k is None or k.strip() == "" else k.strip(),
                                table=str(file) if is_struct else None, index=start + i))
    stems = [Path(r.audio.replace("\\", "/")).stem for r in rows]
    unique = all(stems) and len(set(stems)) == len(stems)
    for r, stem in zip(rows, stems):  # ids: the audio names when they tell the rows apart, else the row numbers
        r.id = stem if unique else f"{r.line:06d}"
        if not unique and r.table is not None:  # audio in the table: a name of its own (the report lists files by it)
            r.audio = f"{Path(r.table).name}#{r.index}"
    return rows, problems


class TableAudio:
    """Audio bytes of table rows → files in ``<output>/.table_audio`` (removed by :meth:`close`), read from
    there by the workers like any audio file: a job carries a path, never megabytes, and each table is read
    once, in order, :data:`AUDIO_BATCH_ROWS` rows of its audio column at a time."""

    def __init__(self, out: Path, columns: tuple[str | None, str | None, str | None] = (None, None, None)):
        self.dir = Path(out) / TABLE_AUDIO
        self.columns = columns  # as given to read_table: the same audio column is found again
        self.column = ""
        self._file: str | None = None
        self._table = None
        self._batches = None  # the audio column's batches (_batches), read forward as the rows come
        self._start = 0  # the first row of self._batch
        self._batch = None

    def extract(self, row: Row) -> tuple[Path | None, str]:
        """(the file its bytes were written to, or None when the row holds no bytes; the path the row names)."""
        if row.table != self._file:
            self._file, self._table = row.table, _open(Path(str(row.table)))
            self.column = _columns(Path(str(row.table)), _schema(self._table), self.columns)[0]
            self._batches = None
        cell = self._cell(row.index) or {}
        path = str(cell.get("path") or "")
        if cell.get("bytes") is None:
            return None, path
        name = Path(path.replace("\\", "/")).name
        suffix = Path(name).suffix.lower() if Path(name).suffix.lower() in AUDIO_EXTENSIONS else ".wav"
        dest = self.dir / f"{row.line:06d}{suffix}"
        write_bytes(dest, cell["bytes"])
        return dest, path

    def _cell(self, index: int) -> dict | None:
        if self._batches is None or index < self._start:  # rows come in order: a table is read once, forward
            self._batches, self._start, self._batch = _batches(self._table, [self.column], AUDIO_BATCH_ROWS), 0, None
        while self._batch is None or index >= self._start + self._batch.num_rows:
            self._start, self._batch = next(self._batches)
        return self._batch.column(self.column)[index - self._start].as_py()

    def close(self) -> None:
        if self.dir.is_dir():
            for f in self.dir.iterdir():
                f.unlink(missing_ok=True)
            self.dir.rmdir()


def find_audio(row: Row, audio_dir: Path | None, tables: TableAudio) -> tuple[Path | None, str | None]:
    """(the row's audio file, None) or (None, why it is dropped): taken out of its table, or inside --audio_dir only
    (a path column's, or the path an Audio column names for a row without bytes)."""
    name = row.audio
    if row.table is not None:
        written, name = tables.extract(row)
        if written is not None:
            return written, None
        if not name:
            return None, f"no audio (column {tables.column} holds neither bytes nor a path)"
    if audio_dir is None:
        return None, f"audio path {name}: pass --audio_dir, the folder it lies in"
    path = resolve_audio(audio_dir, name)
    if path is not None and outside([path], audio_dir):
        return None, (f"audio path {name} leads outside --audio_dir (an absolute or '..' path, or a link to "
                      "elsewhere): only files inside it are read")
    if path is None and len(Path(name).name.encode("utf-8", "surrogatepass")) > 250:
        return None, (f"audio file not found: its name {name[:40]!r}… is {len(name)} characters, longer than a file "
                      "name can be; give the audio's own file name")
    if path is None:
        return None, f"audio file not found ({audio_dir / name}{'' if Path(name).suffix else '.wav'})"
    return path, None


def resolve_audio(audio_dir: Path, name: str) -> Path | None:
    cands = [audio_dir / name, audio_dir / "clips" / name]
    if Path(name).suffix.lower() not in AUDIO_EXTENSIONS:
        cands = [audio_dir / f"{name}{ext}" for ext in AUDIO_EXTENSIONS] + cands
    return next((c for c in cands if _is_file(c)), None)


def _is_file(path: Path) -> bool:
    """Path.is_file, and False for a name no file can have (too long for the filesystem: ENAMETOOLONG)."""
    try:
        return path.is_file()
    except OSError:
        return False


def describe(fmt: str, rows: list[Row], text_kind: str = "auto") -> str:
    """The one line that says how the metadata was read: 'metadata: Piper id|speaker|text, 40 line(s), 3 speakers,
    the model reads text'."""
    speakers = len({r.speaker for r in rows})
    if text_kind == "auto" and any(r.ids is not None for r in rows):  # what parse_metadata made of the rows
        given = fmt.endswith("_ids") or all(_IDS.fullmatch(r.text) for r in rows if r.ids is not None)
        text_kind = "phoneme_ids" if given else "phonemes"
    kind = {"text": "text", "phonemes": "IPA phonemes", "phoneme_ids": "phoneme ids"}[resolve_kind(text_kind, fmt)]
    return (f"metadata: {LAYOUTS.get(fmt, fmt)}, {len(rows)} line(s) read, {speakers} speaker"
            f"{'' if speakers == 1 else 's'}, the model reads {kind}")
