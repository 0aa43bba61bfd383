"""Any-script Uzbek text → canonical lower-case Latin Uzbek, ready for ``text_to_ids``.

Order matters and is the reason this is one pipeline:
1. Unicode NFC, odd spaces/dashes/quotes folded;
2. Cyrillic → Latin per word (case kept, so acronyms such as АҚШ stay recognisable);
3. apostrophes: every variant users type (ʻ ʼ ' ` ‘ ’ ´) after o/g becomes the oʻ/gʻ letter
   mark ʻ (U+02BB); after any other letter it is the tutuq belgisi ʼ (U+02BC), a sound of its
   own; a pair around words is a quotation and is dropped;
4. abbreviations and acronyms (case-sensitive), Roman numerals (→ ordinals);
5. numbers: dates, times, currency, percent, units, ranges, ordinals (``5-sinf``, ``2024-yil``,
   ``3-chi``), decimals (``3,5``), thousands (``1 000``), plain cardinals;
6. lower case, foreign Latin letters folded (ö→oʻ, ş→sh, w→v, c→s/k, accents dropped);
7. punctuation kept as prosody symbols (. , ! ? ; : -), brackets → commas, quotes dropped,
   whitespace collapsed.
Characters it cannot read are left in place so ``text_to_ids`` reports them (never silent).
"""

from __future__ import annotations

import re
import unicodedata

from tts.text.cyrillic import cyrillic_to_latin
from tts.text.numbers import (
    MONTHS,
    cardinal,
    decimal,
    number_string,
    ordinal,
    ordinal_suffix,
    roman_to_int,
)
from tts.text.symbols import OKINA, TUTUQ

APOSTROPHES = "\u02bb\u02bc'`\u2018\u2019\u00b4\u02b9\u2032\u02bd"
_APOS_CLASS = "[" + re.escape(APOSTROPHES) + "]"

_SPACES = re.compile(r"[\u00a0\u2000-\u200b\u202f\u205f\u3000\t\r\n\f\v]")
_DASHES = {"\u2010": "-", "\u2011": "-", "\u2012": "-", "\u2013": " - ", "\u2014": " - ",
           "\u2015": " - ", "\u2212": "-"}
_DROP_QUOTES = re.compile("[\"«»„“”‹›]")

# Dotted abbreviations (matched case-insensitively, on word boundaries).
ABBREVIATIONS = {
    "h.k.": "hokazo", "sh.k.": "shu kabi", "va b.": "va boshqalar", "m.a.": "miloddan avvalgi",
    "mil. av.": "miloddan avvalgi", "prof.": "professor", "dots.": "dotsent",
    "akad.": "akademik", "dr.": "doktor", "vil.": "viloyati", f"ko{OKINA}ch.": f"ko{OKINA}chasi",
    "t.f.n.": "texnika fanlari nomzodi", "f.f.d.": "falsafa doktori", "mln.": "million",
    "mlrd.": "milliard", "mln": "million", "mlrd": "milliard", "sh.": "shahri",
    "yy.": "yillar", "masl.": "masalan", "t.y.": f"tug{OKINA}ilgan yili",
}
TITLES = {"professor", "dotsent", "akademik", "doktor", f"tug{OKINA}ilgan yili"}  # never end a sentence
# Acronyms (matched case-sensitively).
ACRONYMS = {
    "AQSH": f"amerika qo{OKINA}shma shtatlari", "AQSh": f"amerika qo{OKINA}shma shtatlari",
    "BMT": "birlashgan millatlar tashkiloti", "MDH": f"mustaqil davlatlar hamdo{OKINA}stligi",
    f"O{OKINA}zR": f"o{OKINA}zbekiston respublikasi", "RF": "rossiya federatsiyasi",
    "YeI": "yevropa ittifoqi", "SSSR": "sovet sotsialistik respublikalar ittifoqi",
    "OAV": "ommaviy axborot vositalari", "OTM": f"oliy ta{TUTUQ}lim muassasasi",
    "YaIM": "yalpi ichki mahsulot", "IIV": "ichki ishlar vazirligi",
    "FVV": "favqulodda vaziyatlar vazirligi", "TV": "televizor",
}
# Names of Latin letters, for unknown acronyms with no vowel ("QR" → "qu er").
LETTER_NAMES = {
    "A": "a", "B": "be", "C": "se", "D": "de", "E": "e", "F": "ef", "G": "ge", "H": "ha",
    "I": "i", "J": "je", "K": "ka", "L": "el", "M": "em", "N": "en", "O": "o", "P": "pe",
    "Q": "qu", "R": "er", "S": "es", "T": "te", "U": "u", "V": "ve", "W": "dubl ve", "X": "xa",
    "Y": "ye", "Z": "ze",
}
# Units read after a number.
UNITS = {
    "km/soat": "kilometr soatiga", "km/s": "kilometr soatiga", "km": "kilometr",
    "m": "metr", "sm": "santimetr", "mm": "millimetr", "kg": "kilogramm", "g": "gramm",
    "mg": "milligramm", "t": "tonna", "l": "litr", "ml": "millilitr",
    "°C": "gradus", "°": "gradus", "kVt": "kilovatt", "mln": "million", "mlrd": "milliard",
    "ming": "ming", "y.": "yil", "mln.": "million", "mlrd.": "milliard",
}
CURRENCY_SIGNS = {"$": "dollar", "€": "yevro", "£": "funt sterling", "₽": "rubl", "¥": "iyena",
                  "₸": "tenge"}
CURRENCY_CODES = {"USD": "dollar", "EUR": "yevro", "RUB": "rubl", "UZS": f"so{OKINA}m",
                  "so'm": f"so{OKINA}m", "so" + OKINA + "m": f"so{OKINA}m", "сўм": f"so{OKINA}m"}
SYMBOL_WORDS = {"&": " va ", "+": " plyus ", "=": " teng ", "№": " raqam ", "#": " raqam ",
                "@": " kuchukcha ", "§": " paragraf ", "/": " ", "*": " ", "\\": " ", "_": " ",
                "~": " ", "^": " ", "|": " "}
# Case suffixes that attach to a number written with a hyphen ("5-da" → "beshda").
CASE_SUFFIXES = ("gacha", "dagi", "ning", "tadan", "tasi", "dan", "da", "ga", "ni", "ta", "lar",
                 "ka", "qa", "ta")
ORDINAL_SUFFIXES = ("inchi", "nchi", "chi")
ROMAN_CONTEXT = ("asr", "bob", "qism", "jild", "sinf", "daraja", "tom", "kurs", "chorak",
                 "guruh", "bosqich", "bo" + OKINA + "lim", "modda", "qurultoy", "olimpiada")

_NUM = r"\d+(?:[.,]\d+)?"


def _fold_apostrophes(text: str) -> str:
    """oʻ/gʻ letter mark vs tutuq belgisi vs quotation marks, from the neighbouring letters."""
    out = []
    quote_open = False
    for i, ch in enumerate(text):
        if ch not in APOSTROPHES:
            out.append(ch)
            continue
        prev = text[i - 1] if i > 0 else ""
        nxt = text[i + 1] if i + 1 < len(text) else ""
        if not prev.isalpha():  # word-initial: an opening quote (or stray mark)
            quote_open = quote_open or nxt.isalpha()
            out.append(" ")
        elif quote_open and not nxt.isalpha():  # closes an earlier opening quote
            quote_open = False
            out.append(" ")
        elif prev in "oOgG":
            out.append(OKINA)
        else:
            out.append(TUTUQ)
    return "".join(out)


def _abbreviations(text: str) -> str:
    for abbr in sorted(ACRONYMS, key=len, reverse=True):
        text = re.sub(rf"(?<![\w{OKINA}]){re.escape(abbr)}(?![\w{OKINA}])", ACRONYMS[abbr], text)
    for abbr in sorted(ABBREVIATIONS, key=len, reverse=True):
        pat = re.escape(abbr).replace(r"\ ", r"\s*")
        # the abbreviation's dot also ends the sentence when a capitalised word follows
        text = re.sub(rf"(?<![\w{OKINA}]){pat}(?!\w)((?-i:\s+[A-ZЀ-Я]))?",
                      lambda m, w=ABBREVIATIONS[abbr]: f" {w}." + m.group(1)
                      if m.group(1) and w not in TITLES else f" {w} " + (m.group(1) or ""),
                      text, flags=re.IGNORECASE)

    def spell(m: re.Match) -> str:
        word = m.group(0)
        if any(c in "AEIOU" for c in word):  # pronounceable: read as a word
            return word
        return " ".join(LETTER_NAMES[c] for c in word)

    return re.sub(r"(?<![\w])[A-Z]{2,5}(?![\w])", spell, text)


def _roman(text: str) -> str:
    ctx = "|".join(ROMAN_CONTEXT)

    def repl(m: re.Match) -> str:
        word, after = m.group(1), m.group(2)
        value = roman_to_int(word)
        if value is None:
            return m.group(0)
        contextual = bool(after) and (after.startswith("-") or re.match(rf"\s+({ctx})", after))
        if not contextual and (len(word) < 2 or not set(word) <= set("IVX")):
            return m.group(0)
        if after.startswith("-"):  # "XXI-asr": the hyphen marks the ordinal; drop it
            return ordinal(value) + " " + after[1:]
        return ordinal(value) + after

    return re.sub(rf"(?<![\w{OKINA}])([IVXLCDM]+)(?![\w{OKINA}])(-(?=\w)|\s+\w+|)", repl, text)


def _number_word(s: str) -> str:
    """'12,5' / '12.5' → decimal words; '1990' → cardinal."""
    m = re.fullmatch(r"(\d+)[.,](\d+)", s)
    return decimal(m.group(1), m.group(2)) if m else number_string(s)


def _date(day: str, month: str, year: str | None) -> str | None:
    d, mo = int(day), int(month)
    if not (1 <= d <= 31 and 1 <= mo <= 12):
        return None
    words = f"{ordinal(d)} {MONTHS[mo - 1]}"
    return f"{words} {ordinal(int(year))} yil" if year else words


def _numbers(text: str) -> str:
    # thousands written with spaces or several dot/comma groups: "1 000 000", "1.000.000"
    text = re.sub(r"(?<![\d.,])\d{1,3}(?:[ \u00a0\u202f]\d{3})+(?![\d]|[.,]\d)",
                  lambda m: re.sub(r"\s", "", m.group(0)), text)
    text = re.sub(r"(?<![\d.,])\d{1,3}(?:([.,])\d{3})(?:\1\d{3})+(?![\d]|[.,]\d)",
                  lambda m: re.sub(r"[.,]", "", m.group(0)), text)

    def date_dmy(m: re.Match) -> str:
        return _date(m.group(1), m.group(2), m.group(3)) or m.group(0)

    text = re.sub(r"(?<![\d.])(\d{1,2})[./](\d{1,2})[./](\d{4})(?![\d])", date_dmy, text)
    text = re.sub(r"(?<![\d.])(\d{4})-(\d{2})-(\d{2})(?![\d])",
                  lambda m: (f"{ordinal(int(m.group(1)))} yil " + (_date(m.group(3), m.group(2), None) or ""))
                  if _date(m.group(3), m.group(2), None) else m.group(0), text)

    def time(m: re.Match) -> str:
        h, mi = int(m.group(1)), m.group(2)
        if h > 24:
            return m.group(0)
        return f"{cardinal(h)} {number_string(mi) if mi != '00' else 'nol nol'}"

    text = re.sub(r"(?<![\d:])(\d{1,2}):(\d{2})(?::\d{2})?(?![\d:])", time, text)

    signs = "".join(re.escape(s) for s in CURRENCY_SIGNS)
    text = re.sub(rf"([{signs}])\s?({_NUM})",
                  lambda m: f" {_number_word(m.group(2))} {CURRENCY_SIGNS[m.group(1)]} ", text)
    text = re.sub(rf"({_NUM})\s?([{signs}])",
                  lambda m: f" {_number_word(m.group(1))} {CURRENCY_SIGNS[m.group(2)]} ", text)
    codes = "|".join(re.escape(c) for c in CURRENCY_CODES)
    text = re.sub(rf"({_NUM})\s?({codes})(?!\w)",
                  lambda m: f" {_number_word(m.group(1))} {CURRENCY_CODES[m.group(2)]} ", text)

    text = re.sub(rf"({_NUM})\s?%", lambda m: f" {_number_word(m.group(1))} foiz ", text)
    text = re.sub(rf"%\s?({_NUM})", lambda m: f" {_number_word(m.group(1))} foiz ", text)

    units = "|".join(re.escape(u) for u in sorted(UNITS, key=len, reverse=True))
    text = re.sub(rf"({_NUM})\s?({units})(?![\w{OKINA}])",
                  lambda m: f" {_number_word(m.group(1))} {UNITS[m.group(2)]} ", text)

    # ranges "5-10" → "beshdan oʻngacha"
    text = re.sub(r"(?<![\w.,])(\d+)\s?[-–—]\s?(\d+)(?![\d.,])",
                  lambda m: f"{number_string(m.group(1))}dan {number_string(m.group(2))}gacha", text)

    # explicit ordinals "3-chi", "2-nchi", "1-inchi"
    ords = "|".join(ORDINAL_SUFFIXES)
    text = re.sub(rf"(\d+)\s?-?\s?({ords})(?!\w)", lambda m: ordinal(int(m.group(1))), text)

    # a hyphen after a number: case suffix → cardinal+suffix, any other word → ordinal
    def hyphen(m: re.Match) -> str:
        n, word = m.group(1), m.group(2)
        if word.lower() in CASE_SUFFIXES:
            return number_string(n) + word
        return f"{ordinal(int(n))} {word}"

    text = re.sub(rf"(\d+)-([^\W\d_][\w{OKINA}{TUTUQ}]*)", hyphen, text)
    # years: "2024 yil", "1990 yillar"
    text = re.sub(r"(\d+)\s+(?=yil)", lambda m: ordinal(int(m.group(1))) + " ", text)
    # negative numbers
    text = re.sub(rf"(?<![\w.,])-({_NUM})", lambda m: "minus " + _number_word(m.group(1)), text)
    # decimals and the rest; digits glued to letters keep the suffix glued ("5ta" → "beshta")
    text = re.sub(r"\d+[.,]\d+(?=\D|$)", lambda m: " " + _number_word(m.group(0)) + " ", text)
    text = re.sub(r"\d+", lambda m: number_string(m.group(0)), text)
    return text


_FOLD = {"ö": "o" + OKINA, "ğ": "g" + OKINA, "ş": "sh", "ç": "ch", "ñ": "ng", "ı": "i",
         "w": "v", "ß": "ss", "æ": "ae", "œ": "oe", "ø": "o"}


def _fold_foreign(text: str) -> str:
    text = "".join(_FOLD.get(c, c) for c in text)
    # c outside "ch": like s before e/i/y, else k ("sirk", "kompyuter")
    text = re.sub(r"c(?!h)(?=[eiy])", "s", text)
    text = re.sub(r"c(?!h)", "k", text)
    # strip accents from Latin letters only (é → e); keep ʻ ʼ and non-Latin letters untouched
    out = []
    for ch in text:
        if "\u00c0" <= ch <= "\u024f":
            base = unicodedata.normalize("NFKD", ch)
            out.append("".join(b for b in base if not unicodedata.combining(b)))
        elif unicodedata.combining(ch):
            continue
        else:
            out.append(ch)
    return "".join(out)


def _punctuation(text: str) -> str:
    text = text.replace("…", ".").replace("(", ", ").replace(")", ", ").replace("[", ", ")
    text = text.replace("]", ", ").replace("{", ", ").replace("}", ", ")
    text = re.sub(r"\.{2,}", ".", text)
    text = re.sub(r"([!?.,;:])\1+", r"\1", text)
    text = re.sub(r"\s+", " ", text)
    text = re.sub(r"\s+([.,!?;:])", r"\1", text)  # no space before punctuation
    text = re.sub(r"([.,!?;:])(?=[^\s.,!?;:])", r"\1 ", text)  # one after it
    text = re.sub(r",\s*([.!?;:])", r"\1", text)  # ", ." from brackets → "."
    text = re.sub(r"([.!?;:])\s*,", r"\1", text)
    text = re.sub(r"^[\s,.;:!?-]+", "", text)  # nothing to say before the first word
    text = re.sub(r"\s*-\s*-+\s*", " - ", text)
    text = re.sub(r"\s+", " ", text)
    return text.strip(" ,;:-")


def normalize(text: str) -> str:
    """Any-script, any-spelling Uzbek → canonical lower-case Latin with words for numbers.

    >>> normalize("Ўзбекистон 1991-йил 31-августда мустақил бўлди!")
    'oʻzbekiston ming toʻqqiz yuz toʻqson birinchi yil oʻttiz birinchi avgustda mustaqil boʻldi!'
    """
    text = unicodedata.normalize("NFC", text)
    text = _SPACES.sub(" ", text)
    text = "".join(_DASHES.get(c, c) for c in text)
    text = _DROP_QUOTES.sub(" ", text)
    text = cyrillic_to_latin(text)
    text = _fold_apostrophes(text)
    text = _abbreviations(text)
    text = _roman(text)
    text = _numbers(text)
    for sym, word in SYMBOL_WORDS.items():
        text = text.replace(sym, word)
    text = text.lower()
    text = _fold_foreign(text)
    return _punctuation(text)


__all__ = ["normalize", "ordinal_suffix"]
