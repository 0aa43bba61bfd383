"""The token inventory of normalised Uzbek Latin text and the text → ids mapping.

Tokens are the letters of the 1995 Uzbek Latin alphabet with the digraph letters ``oʻ gʻ sh ch``
as single tokens (they are single phonemes; ``s`` + ``h`` across a morpheme boundary is written
``sʼh`` and stays three tokens), the tutuq belgisi ``ʼ`` (a glottal stop, a sound of its own),
the space, and punctuation kept as prosody symbols. Index 0 is the pad, which VITS also uses as
the interspersed "blank" token. The list only ever grows at the end so old checkpoints keep
their ids; a fine-tune with a different vocabulary goes through ``--init_from``.
"""

from __future__ import annotations

import unicodedata
import warnings

from common.errors import UserError

PAD = "_"
PAD_ID = 0
PUNCTUATION = [".", ",", "!", "?", ";", ":", "-"]
TUTUQ = "\u02bc"  # ʼ  MODIFIER LETTER APOSTROPHE: tutuq belgisi (glottal stop)
OKINA = "\u02bb"  # ʻ  MODIFIER LETTER TURNED COMMA: the mark of oʻ and gʻ
LETTERS = list("abdefghijklmnopqrstuvxyz")
DIGRAPHS = ["o" + OKINA, "g" + OKINA, "sh", "ch"]

SYMBOLS: list[str] = [PAD, " ", *PUNCTUATION, TUTUQ, OKINA, *LETTERS, *DIGRAPHS]
SYMBOL_TO_ID: dict[str, int] = {s: i for i, s in enumerate(SYMBOLS)}
_MAX_TOKEN_LEN = max(len(s) for s in SYMBOLS)


# Symbols that say nothing on their own (the first ids of both inventories, graphemes and espeak-ng
# phonemes): text that leaves only these after normalisation ("🎉 👍", "😀.") is as empty as "".
SILENT = frozenset([PAD, " ", *PUNCTUATION])


def says_something(ids: list[int], symbols: list[str] = SYMBOLS) -> bool:
    """Whether `ids` hold at least one symbol that is spoken, not only pauses and punctuation."""
    return any(symbols[i] not in SILENT for i in ids)


class UnknownCharacterError(UserError, ValueError):
    """A character that is not in ``SYMBOLS`` (after normalisation). Names it and where."""

    def __init__(self, char: str, position: int, text: str):
        self.char, self.position, self.text = char, position, text
        super().__init__(
            f"unknown character {describe_char(char)} at position {position} in {text!r}; "
            "the Uzbek normaliser (tts.text.normalize) does not know how to read it - remove "
            "or spell it out in the text"
        )


def describe_char(char: str) -> str:
    """'x' (U+0078 LATIN SMALL LETTER X): readable even for invisible characters."""
    name = unicodedata.name(char, "unnamed")
    return f"{char!r} (U+{ord(char):04X} {name})"


def tokenize(text: str) -> list[tuple[str, int]]:
    """Greedy longest-match split into (token, start position); unknown chars become (char, pos)."""
    out, i = [], 0
    while i < len(text):
        for n in range(min(_MAX_TOKEN_LEN, len(text) - i), 0, -1):
            piece = text[i : i + n]
            if piece in SYMBOL_TO_ID:
                out.append((piece, i))
                i += n
                break
        else:
            out.append((text[i], i))
            i += 1
    return out


def find_unknown(text: str) -> list[str]:
    """The distinct characters of ``text`` (lower-cased) that have no token, in order of appearance."""
    seen: list[str] = []
    for tok, _ in tokenize(text.lower()):
        if tok not in SYMBOL_TO_ID and tok not in seen:
            seen.append(tok)
    return seen


def text_to_ids(normalized: str, on_unknown: str = "warn") -> list[int]:
    """Normalised text → token ids (no blanks; the model adds them when ``add_blank``).

    ``on_unknown``: "error" raises :class:`UnknownCharacterError` naming the first unknown
    character; "warn" drops unknown characters with one warning listing them (synthesis);
    "drop" drops them silently (only for callers that already reported them).
    The input is lower-cased first, so a capital letter is never "unknown".
    """
    if on_unknown not in ("warn", "error", "drop"):
        raise ValueError(f"on_unknown must be 'warn', 'error' or 'drop', not {on_unknown!r}")
    text = normalized.lower()
    ids, unknown = [], []
    for tok, pos in tokenize(text):
        idx = SYMBOL_TO_ID.get(tok)
        if idx is None:
            if on_unknown == "error":
                raise UnknownCharacterError(tok, pos, normalized)
            unknown.append(tok)
            continue
        ids.append(idx)
    if unknown and on_unknown == "warn":
        chars = ", ".join(describe_char(c) for c in dict.fromkeys(unknown))
        warnings.warn(f"dropped unknown characters {chars} from {normalized!r}", stacklevel=2)
    return ids


def ids_to_text(ids: list[int]) -> str:
    """Inverse of :func:`text_to_ids` (pads/blanks removed); for logs and tests."""
    return "".join(SYMBOLS[i] for i in ids if i != PAD_ID)


def intersperse(ids: list[int], blank: int = PAD_ID) -> list[int]:
    """[a, b] → [blank, a, blank, b, blank]: VITS' "add_blank", which helps MAS align."""
    out = [blank] * (2 * len(ids) + 1)
    out[1::2] = ids
    return out
