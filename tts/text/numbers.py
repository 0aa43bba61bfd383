"""Uzbek number words: cardinals, ordinals (-inchi / -nchi), decimals, Roman numerals.

Uzbek has no vowel harmony, so suffixes attach unchanged (``besh`` + ``ta`` → ``beshta``) and
the ordinal suffix only depends on the last letter: ``-nchi`` after a vowel, ``-inchi`` after
a consonant. 100 and 1000 are read without "bir" (``yuz``, ``ming``) as people say them;
million and above always take their count (``bir million``).
"""

from __future__ import annotations

from tts.text.symbols import OKINA

OO = "o" + OKINA  # oʻ

UNITS = ["nol", "bir", "ikki", "uch", f"t{OO}rt", "besh", "olti", "yetti", "sakkiz", f"t{OO}qqiz"]
TENS = ["", f"{OO}n", "yigirma", f"{OO}ttiz", "qirq", "ellik", "oltmish", "yetmish", "sakson", f"t{OO}qson"]
SCALES = [(10**12, "trillion"), (10**9, "milliard"), (10**6, "million"), (10**3, "ming")]
MONTHS = ["yanvar", "fevral", "mart", "aprel", "may", "iyun", "iyul", "avgust", "sentabr",
          "oktabr", "noyabr", "dekabr"]
_VOWELS = set("aeiou")
_ROMAN = [(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"), (50, "L"),
          (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]


def _below_1000(n: int) -> list[str]:
    words = []
    hundreds, rest = divmod(n, 100)
    if hundreds:
        words += ([UNITS[hundreds]] if hundreds > 1 else []) + ["yuz"]
    tens, units = divmod(rest, 10)
    if tens:
        words.append(TENS[tens])
    if units:
        words.append(UNITS[units])
    return words


def cardinal(n: int) -> str:
    """12345 → 'oʻn ikki ming uch yuz qirq besh'. Beyond 10^15: digit by digit."""
    if n < 0:
        return "minus " + cardinal(-n)
    if n == 0:
        return UNITS[0]
    if n >= 10**15:
        return digits(str(n))
    words: list[str] = []
    for value, name in SCALES:
        count, n = divmod(n, value)
        if count:
            words += ([] if (count == 1 and value == 1000) else _below_1000(count)) + [name]
    words += _below_1000(n)
    return " ".join(words)


def digits(s: str) -> str:
    """'007' → 'nol nol yetti' (codes, leading zeros, very long numbers)."""
    return " ".join(UNITS[int(c)] for c in s if c.isdigit())


def ordinal_suffix(word: str) -> str:
    return word + ("nchi" if word[-1] in _VOWELS else "inchi")


def ordinal(n: int) -> str:
    """21 → 'yigirma birinchi', 2024 → 'ikki ming yigirma toʻrtinchi'."""
    words = cardinal(n).split(" ")
    words[-1] = ordinal_suffix(words[-1])
    return " ".join(words)


def number_string(s: str) -> str:
    """A digit string as read aloud: leading zeros and >15 digits are read digit by digit."""
    if len(s) > 1 and s.startswith("0") or len(s) > 15:
        return digits(s)
    return cardinal(int(s))


def decimal(integer: str, fraction: str) -> str:
    """'3', '25' → 'uch butun yuzdan yigirma besh' (the Uzbek way: 3 wholes, 25 hundredths)."""
    whole = number_string(integer) if integer else UNITS[0]
    if len(fraction) > 6:
        return f"{whole} butun {digits(fraction)}"
    denominator = cardinal(10 ** len(fraction))
    if len(fraction) == 3:
        denominator = "ming"
    if len(fraction) == 6:
        denominator = "million"
    return f"{whole} butun {denominator}dan {cardinal(int(fraction))}"


def roman_to_int(s: str) -> int | None:
    """Value of a canonical Roman numeral ('XXI' → 21); None for anything non-canonical."""
    if not s or any(c not in "IVXLCDM" for c in s):
        return None
    value, i = 0, 0
    for v, sym in _ROMAN:
        while s.startswith(sym, i):
            value += v
            i += len(sym)
    if i != len(s) or not 0 < value < 4000 or int_to_roman(value) != s:
        return None
    return value


def int_to_roman(n: int) -> str:
    out = []
    for v, sym in _ROMAN:
        count, n = divmod(n, v)
        out.append(sym * count)
    return "".join(out)
