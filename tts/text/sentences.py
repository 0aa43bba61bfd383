"""Long Uzbek text → paragraphs → sentences, each then normalised and spoken on its own.

VITS speaks one utterance at a time and degrades on inputs much longer than its training
sentences, so synthesis cuts text where a reader pauses. The cut is made on the raw text (before
normalisation), where case and quotes still tell a sentence end from an abbreviation:

- a sentence ends at ``. ! ? …`` (closing quotes/brackets included) followed by a space and an
  upper-case letter, a digit or an opening quote (Latin or Cyrillic); ``Salom! dedi u`` does
  not end at ``!`` (lower case follows);
- never after a title (``prof.``, ``dr.``, ``akad.``, ``dots.``) or a place abbreviation
  (``sh.``, ``vil.``, ``koʻch.``) or ``t.y.`` (tugʻilgan yili) - a name follows - nor after an
  initial (``A. Navoiy``, ``Sh.M.``) or an unknown dotted abbreviation; other known abbreviations of the
  normaliser (``va h.k.``, ``mln.``) end a sentence when a capitalised word follows, as
  ``tts.text.normalize`` reads them;
- digits and dates (``5.09.2024``, ``3.5``) never split (no space after the dot);
- a paragraph is text between blank lines; single line breaks are spaces;
- a sentence longer than ``max_chars`` is cut further at ``; : ,`` (then at spaces).

`speak_sentences` is the one loop both models' `stream` functions (tts/vits/synthesize.py, tts/clone/infer.py)
run over that plan: one sentence at a time, a pause between spoken sentences, a cancel check between them, so
the CLI scripts (which write or concatenate the chunks) and the server (which can stop a request between
sentences) read long text the same way.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from common.errors import UserError
from tts.text.cyrillic import cyrillic_to_latin
from tts.text.normalizer import _APOS_CLASS, ABBREVIATIONS, TITLES
from tts.text.symbols import OKINA

NO_BREAK_AFTER = {"prof", "dr", "akad", "dots", "sh", "vil", f"ko{OKINA}ch", "mil", "masl"}
_END = re.compile(r"([.!?\u2026]+)([\"'»”’)\]]*)(\s+)")
_STARTS_SENTENCE = re.compile(r"[\"'«“„‘(\[]*[A-ZÀ-ÞЀ-ЯЎҚҒҲ0-9]")
_WORD_BEFORE = re.compile(r"([\w.'ʻʼ`‘’]+)$")


def paragraphs(text: str) -> list[str]:
    """Blank-line separated paragraphs, inner line breaks as spaces, empty ones dropped."""
    parts = re.split(r"\n[ \t\r\f\v]*\n", text.replace("\r\n", "\n"))
    return [re.sub(r"\s+", " ", p).strip() for p in parts if p.strip()]


def _word(before: str) -> str:
    """The word before a full stop, lower-case Latin with ʻ for oʻ/gʻ ("Проф" → "prof")."""
    m = _WORD_BEFORE.search(before)
    word = cyrillic_to_latin(m.group(1)) if m else ""
    return re.sub(_APOS_CLASS, OKINA, word).lower().strip(".")


def _ends_sentence(before: str, mark: str) -> bool:
    if not mark.startswith("."):  # ! ? … always end a sentence (when a capital follows)
        return True
    word = _word(before)
    last = word.rsplit(".", 1)[-1]
    if last in NO_BREAK_AFTER or word in NO_BREAK_AFTER:
        return False
    known = ABBREVIATIONS.get(word + ".")
    if known is not None:
        return known not in TITLES
    if "." in word:  # an unknown dotted abbreviation ("b.z.", "Sh.M.")
        return False
    m = _WORD_BEFORE.search(before)
    return not (len(word) == 1 and m is not None and m.group(1)[-1:].isupper())  # an initial ("A. Navoiy")


def _cut_long(sentence: str, max_chars: int) -> list[str]:
    out = []
    while len(sentence) > max_chars:
        head = sentence[:max_chars]
        cut = max((head.rfind(c) for c in ";:,"), default=-1)
        if cut < max_chars // 3:  # no clause mark in a useful place: the last space
            cut = head.rfind(" ")
        if cut <= 0:
            cut = max_chars - 1
        out.append(sentence[: cut + 1].strip())
        sentence = sentence[cut + 1 :].strip()
    return [*out, sentence] if sentence else out


def split_sentences(paragraph: str, max_chars: int = 300) -> list[str]:
    """One paragraph (raw, any script) → its sentences, raw (normalise each afterwards)."""
    text = re.sub(r"\s+", " ", paragraph).strip()
    out, start = [], 0
    for m in _END.finditer(text):
        after = text[m.end():]
        if not _STARTS_SENTENCE.match(after) or not _ends_sentence(text[start:m.start()], m.group(1)):
            continue
        out.append(text[start:m.end()].strip())
        start = m.end()
    out.append(text[start:].strip())
    return [piece for s in out if s for piece in _cut_long(s, max_chars)]


def plan(text: str, max_chars: int = 300) -> list[tuple[str, str]]:
    """Raw text → [(raw sentence, what follows it: "sentence" | "paragraph" | "end")]: how both TTS models
    read long text (the pause after each comes from what follows it)."""
    items = []
    paras = paragraphs(text)
    for p, para in enumerate(paras):
        sentences = split_sentences(para, max_chars)
        for s, sentence in enumerate(sentences):
            last = s == len(sentences) - 1
            items.append((sentence, "end" if last and p == len(paras) - 1 else "paragraph" if last else "sentence"))
    return items


class NothingToSay(UserError, ValueError):
    """A text (or one sentence of it) with nothing speakable after normalisation: empty, only symbols or emoji.
    A ValueError too, as the VITS front-end raised it before."""


@dataclass
class SpokenSentence:
    """One chunk of a stream: `audio` (float32 mono) is the pause that follows the previous spoken sentence
    (none before the first) and then this sentence, so concatenating the chunks gives the whole speech with no
    silence after its end. `index` is the sentence's place in the plan (skipped ones leave gaps)."""

    audio: np.ndarray
    text: str
    index: int
    seconds: float  # this sentence's own audio, the pause before it not included
    compute_s: float  # the time its synthesis took (text processing, model, vocoder)


def speak_sentences(sentences: Sequence[tuple[str, str]], speak: Callable[[str], np.ndarray | None],
                    sample_rate: int, sentence_pause: float, paragraph_pause: float,
                    cancelled: Callable[[], bool] | None = None) -> Iterator[SpokenSentence]:
    """`plan(text)` items → one SpokenSentence per sentence `speak` says (it returns None for a sentence with
    nothing to say: skipped). Before each sentence `cancelled()` is asked: once it is true the stream ends, after
    the sentence already spoken (the caller knows it cancelled). The pause before a sentence is the one the plan
    puts after the previous spoken sentence (`sentence_pause` within a paragraph, `paragraph_pause` after one).
    Raises NothingToSay for an empty plan, or when no sentence had anything to say."""
    if not sentences:
        raise NothingToSay("nothing to say: the text is empty")
    pauses = {"sentence": sentence_pause, "paragraph": paragraph_pause, "end": 0.0}
    pending = None  # the pause after the last spoken sentence, written before the next one
    for index, (sentence, after) in enumerate(sentences):
        if cancelled is not None and cancelled():
            return
        t0 = time.perf_counter()
        wav = speak(sentence)
        compute_s = time.perf_counter() - t0
        if wav is None:
            continue
        wav = np.asarray(wav, dtype=np.float32)
        audio = wav if pending is None else np.concatenate([np.zeros(round(pending * sample_rate), np.float32), wav])
        pending = pauses[after]
        yield SpokenSentence(audio, sentence, index, len(wav) / sample_rate, compute_s)
    if pending is None:
        text = " ".join(sentence for sentence, _ in sentences)
        raise NothingToSay(f"nothing to say in {text[:80]!r} after normalisation")
