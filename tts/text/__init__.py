"""Uzbek text front-end: normaliser (any script → canonical Latin) and the token inventory.

Public API (kept stable; the voice-cloning model uses it too):
``normalize``, ``SYMBOLS``, ``PAD_ID``, ``text_to_ids``, ``UnknownCharacterError``.
"""

from tts.text.cyrillic import cyrillic_to_latin, detect_script
from tts.text.normalizer import normalize
from tts.text.symbols import (
    PAD_ID,
    SYMBOLS,
    UnknownCharacterError,
    find_unknown,
    ids_to_text,
    intersperse,
    says_something,
    text_to_ids,
)

__all__ = [
    "PAD_ID",
    "SYMBOLS",
    "UnknownCharacterError",
    "cyrillic_to_latin",
    "detect_script",
    "find_unknown",
    "ids_to_text",
    "intersperse",
    "normalize",
    "says_something",
    "text_to_ids",
]
