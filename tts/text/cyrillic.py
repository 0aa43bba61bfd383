"""Script detection and Uzbek Cyrillic → Latin transliteration (the 1995 official rules).

Crowd-sourced Uzbek text mixes both scripts, sometimes inside one word (Latin ``o``/``a``/``e``
typed on a Cyrillic keyboard layout look identical to Cyrillic ``о``/``а``/``е``), so the
decision is made per word and homoglyphs are first moved into the word's majority script.
The context rules are the ones that make pronunciation right:
``е`` → ``ye`` at the start of a word and after a vowel or ъ/ь; ``ц`` → ``ts`` after a vowel,
else ``s``; ``ъ`` → tutuq ``ʼ`` unless a iotated vowel follows; ``ь`` is silent (``y`` before
``о``); ``сҳ`` → ``sʼh`` so it is not read as the digraph ``sh``.
"""

from __future__ import annotations

import re

from tts.text.symbols import OKINA, TUTUQ

_BASE = {
    "а": "a", "б": "b", "в": "v", "г": "g", "д": "d", "ж": "j", "з": "z", "и": "i", "й": "y",
    "к": "k", "л": "l", "м": "m", "н": "n", "о": "o", "п": "p", "р": "r", "с": "s", "т": "t",
    "у": "u", "ф": "f", "х": "x", "ч": "ch", "ш": "sh", "щ": "sh", "ы": "i", "э": "e",
    "ю": "yu", "я": "ya", "ё": "yo", "ў": "o" + OKINA, "қ": "q", "ғ": "g" + OKINA, "ҳ": "h",
    # neighbours' letters that turn up in Uzbek corpora (Kazakh, Tajik, Karakalpak)
    "ң": "ng", "ү": "u", "ө": "o" + OKINA, "ә": "a", "һ": "h", "і": "i", "ӣ": "i", "ӯ": "u",
    "ҷ": "j", "ұ": "u",
}
_VOWELS = set("аеёиоуўэюяыәөүі")
_IOTATED = set("еёюя")

_CYR = re.compile(r"[\u0400-\u04FF\u0500-\u052F]")
_LAT = re.compile(r"[A-Za-z\u00C0-\u024F]")
_WORD = re.compile(r"[\w\u02bb\u02bc'`\u2018\u2019]+")

# Latin letters that look like Cyrillic ones (and back).
_LAT2CYR = dict(zip("aeopcxyAEOPCXYBHMTK", "аеорсхуАЕОРСХУВНМТК", strict=True))
_CYR2LAT = {v: k for k, v in _LAT2CYR.items()}


def detect_script(text: str) -> str:
    """'latin', 'cyrillic', 'mixed' (both present) or 'none' (no letters)."""
    has_cyr, has_lat = bool(_CYR.search(text)), bool(_LAT.search(text))
    if has_cyr and has_lat:
        return "mixed"
    return "cyrillic" if has_cyr else "latin" if has_lat else "none"


def _fix_homoglyphs(word: str) -> str:
    """Move look-alike letters into the script most of the word's other letters are in."""
    cyr = sum(1 for c in word if _CYR.match(c) and c not in _CYR2LAT)
    lat = sum(1 for c in word if _LAT.match(c) and c not in _LAT2CYR)
    if cyr > lat:
        return "".join(_LAT2CYR.get(c, c) for c in word)
    if lat > cyr:
        return "".join(_CYR2LAT.get(c, c) for c in word)
    if any(_CYR.match(c) for c in word) and not lat:  # only homoglyphs + Cyrillic
        return "".join(_LAT2CYR.get(c, c) for c in word)
    return word


def _translit_word(word: str) -> str:
    low = word.lower()
    letters = [c for c in word if c.isalpha()]
    all_caps = len(letters) > 1 and all(c.isupper() for c in letters)
    out = []
    for i, ch in enumerate(low):
        prev = low[i - 1] if i > 0 else ""
        nxt = low[i + 1] if i + 1 < len(low) else ""
        if ch == "е":
            lat = "ye" if (not prev.isalpha() or prev in _VOWELS or prev in "ъь") else "e"
        elif ch == "ц":
            lat = "ts" if prev in _VOWELS else "s"
        elif ch == "ъ":
            lat = "" if nxt in _IOTATED else TUTUQ
        elif ch == "ь":
            lat = "y" if nxt == "о" else ""
        elif ch == "с" and nxt == "ҳ":
            lat = "s" + TUTUQ
        else:
            lat = _BASE.get(ch, ch)
        if word[i] != ch and lat:  # the source letter was upper case
            lat = lat.upper() if all_caps else lat[0].upper() + lat[1:]
        out.append(lat)
    return "".join(out)


def cyrillic_to_latin(text: str) -> str:
    """Transliterate every word that is (mostly) Cyrillic; Latin words pass unchanged."""

    def repl(m: re.Match) -> str:
        word = _fix_homoglyphs(m.group(0))
        return _translit_word(word) if _CYR.search(word) else word

    return _WORD.sub(repl, text)
