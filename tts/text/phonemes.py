"""The model's front-end: normalised Uzbek text → token ids, as graphemes or espeak-ng phonemes.

``phoneme_type: text`` (the default) reads the normalised Latin letters (``tts.text.symbols``).
``phoneme_type: espeak`` reads espeak-ng's IPA for the ``uz`` voice, one codepoint per symbol
(NFD), clause by clause with the clause's punctuation kept and ", : ;" followed by a space - the
sequence Piper's runtime builds (its ``phonemize_espeak``), so a voice trained here runs in Piper
with Piper's own espeak-ng. espeak-ng is called as a subprocess (``/usr/bin/espeak-ng``); the
prepared data caches the phonemes (``phonemes_<voice>.json``) so training never calls it.

The symbol list and the phoneme type are saved in every checkpoint; synthesis and export rebuild
the front-end from there (:meth:`Frontend.from_checkpoint`).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import unicodedata
import warnings
from dataclasses import dataclass
from pathlib import Path

from common.atomic_write import write_text
from common.config import ConfigError
from speech.demo_speech import to_espeak_text
from tts.text.symbols import PAD, PUNCTUATION, SYMBOLS, describe_char, text_to_ids

PHONEME_TYPES = ("text", "espeak")
ESPEAK = "espeak-ng"
CLAUSE_END = ".,!?;:"  # what espeak-ng ends a clause on; Piper keeps it as a symbol
# espeak-ng's IPA output for uz (measured on the demo corpus) and the rest of its common IPA set, so
# a fine-tune on another corpus keeps the ids. One codepoint each; the list only grows at the end.
_IPA = ("aæbβcçdðeəɛɜfgɡɣhħiɪɨjkqɫlʎmnɲŋoɔœøɒpɸrɾɹʁsʃtθuʊʉʋvwxχyʏzʒʔʕʌɑɐɯɤɵɘɞɟɢɦɭɬɮɳɴɕʑʂʐʈɖɽ"
        "ʲʷʰˈˌːˑ\u0303\u0329\u032a\u032f\u030a\u0327ᵻ'"
        "ABCDEFGHIJKLMNOPQRSTUVWXYZ")  # espeak-ng 1.51 `uz` writes ch as "tS": its ASCII leaks are symbols too
ESPEAK_SYMBOLS: list[str] = [PAD, " ", *PUNCTUATION, *dict.fromkeys(_IPA)]
_LANG_FLAG = re.compile(r"\([^)]*\)")  # "(en)" around words espeak reads in another language


class PhonemizerError(ConfigError):
    """espeak-ng is missing or failed (phoneme_type: espeak); the message says what to install or check."""


def _espeak_exe() -> str:
    exe = shutil.which(ESPEAK)
    if exe is None:
        raise PhonemizerError("phoneme_type: espeak needs espeak-ng: `apt-get install espeak-ng` "
                              "(or set phoneme_type: text)")
    return exe


def _run_espeak(lines: list[str], voice: str) -> list[str]:
    """One espeak-ng process over ``lines`` (one clause each) → its IPA output lines."""
    proc = subprocess.run([_espeak_exe(), "-q", "--ipa", "-v", voice], input="\n".join(lines) + "\n",
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise PhonemizerError(f"espeak-ng -v {voice} failed ({proc.returncode}): {proc.stderr.strip()[:300]}; "
                              "check the config key espeak_voice (`espeak-ng --voices` lists them)")
    return [ln.strip() for ln in proc.stdout.splitlines()]


def _clean(ipa: str) -> str:
    ipa = _LANG_FLAG.sub("", ipa).replace("\u200d", "")
    return re.sub(r"\s+", " ", unicodedata.normalize("NFD", ipa)).strip()


def clauses(normalized: str) -> list[tuple[str, str]]:
    """'salom, dunyo!' → [('salom', ','), ('dunyo', '!')]; the last clause may have no terminator."""
    out = []
    for m in re.finditer(rf"([^{re.escape(CLAUSE_END)}]*)([{re.escape(CLAUSE_END)}]*)", normalized):
        text, end = m.group(1).strip(" -"), m.group(2)[:1]
        if text or end:
            out.append((text, end))
    return out


def phonemize(texts: list[str], voice: str = "uz") -> list[str]:
    """Normalised texts → espeak-ng IPA strings (Piper's sequence: clause phonemes + terminator, a
    space after , : ;). One espeak-ng call for all clauses; an item whose clause count espeak-ng
    does not keep is redone clause by clause."""
    per_item = [clauses(t) for t in texts]
    spoken = [to_espeak_text(c) for items in per_item for c, _ in items if c]
    lines = _run_espeak(spoken, voice) if spoken else []
    if len(lines) != len(spoken):  # espeak-ng merged or split a clause: one call per clause instead
        lines = [_clean(" ".join(_run_espeak([c], voice))) for c in spoken]
    it = iter(lines)
    out = []
    for items in per_item:
        parts = []
        for text, end in items:
            ph = _clean(next(it)) if text else ""
            parts.append(ph + end + (" " if end in (",", ":", ";") else ""))
        out.append("".join(parts).strip())
    return out


@dataclass(frozen=True)
class Frontend:
    """Which symbols the model reads, and how normalised text becomes their ids."""

    phoneme_type: str = "text"
    voice: str = "uz"

    def __post_init__(self):
        if self.phoneme_type not in PHONEME_TYPES:
            raise ValueError(f"phoneme_type must be one of {', '.join(PHONEME_TYPES)}, not {self.phoneme_type!r}")

    @property
    def symbols(self) -> list[str]:
        return SYMBOLS if self.phoneme_type == "text" else ESPEAK_SYMBOLS

    def phonemes(self, normalized: list[str]) -> list[str]:
        return phonemize(normalized, self.voice) if self.phoneme_type == "espeak" else list(normalized)

    def ids(self, normalized: str, on_unknown: str = "warn", phonemes: str | None = None) -> list[int]:
        """Normalised text (or its cached phonemes) → ids without blanks; unknown symbols as in
        ``text_to_ids`` (error / warn and drop / drop)."""
        if self.phoneme_type == "text":
            return text_to_ids(normalized, on_unknown)
        ph = phonemes if phonemes is not None else self.phonemes([normalized])[0]
        index = {s: i for i, s in enumerate(ESPEAK_SYMBOLS)}
        unknown = [c for c in ph if c not in index]
        if unknown and on_unknown == "error":
            raise ValueError(f"espeak-ng phoneme {describe_char(unknown[0])} of {normalized!r} is not in the "
                             "symbol set (tts.text.phonemes.ESPEAK_SYMBOLS)")
        if unknown and on_unknown == "warn":
            chars = ", ".join(describe_char(c) for c in dict.fromkeys(unknown))
            warnings.warn(f"dropped unknown phonemes {chars} from {ph!r}", stacklevel=2)
        return [index[c] for c in ph if c in index]

    @classmethod
    def of(cls, cfg) -> Frontend:
        """The front-end a training config asks for (its ``phoneme_type`` and ``espeak_voice``)."""
        return cls(cfg.phoneme_type, cfg.espeak_voice)

    def to_checkpoint(self) -> dict:
        return {"symbols": list(self.symbols), "phoneme_type": self.phoneme_type, "espeak_voice": self.voice}

    @classmethod
    def from_checkpoint(cls, extra: dict) -> Frontend:
        """The front-end a checkpoint was trained with (old checkpoints: graphemes)."""
        return cls(extra.get("phoneme_type", "text"), extra.get("espeak_voice", "uz"))


class PhonemeCache:
    """``<prepared>/phonemes_<voice>.json``: normalised text → espeak-ng phonemes, filled on demand."""

    def __init__(self, data_dir: str | Path, voice: str):
        self.path = Path(data_dir) / f"phonemes_{voice}.json"
        self.voice = voice
        self.table: dict[str, str] = {}
        if self.path.is_file():
            try:
                table = json.loads(self.path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as e:  # damaged (not UTF-8 / not JSON): a cache, so made again
                table = None
                print(f"note: {self.path} is damaged ({str(e).splitlines()[0][:100]}); phonemizing again")
            self.table = table if isinstance(table, dict) else {}

    def fill(self, texts: list[str]) -> int:
        """Phonemize the texts not cached yet and rewrite the file (atomically); how many were new."""
        missing = sorted(set(texts) - set(self.table))
        if missing:
            self.table.update(zip(missing, phonemize(missing, self.voice)))
            write_text(self.path, json.dumps(self.table, ensure_ascii=False, indent=0))
        return len(missing)
