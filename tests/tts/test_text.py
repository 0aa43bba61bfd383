"""Uzbek normaliser and tokenizer."""

from __future__ import annotations

import pytest

from tts.text import (
    PAD_ID,
    SYMBOLS,
    UnknownCharacterError,
    detect_script,
    ids_to_text,
    intersperse,
    normalize,
    text_to_ids,
)
from tts.text.numbers import cardinal, decimal, ordinal, roman_to_int

OK = "\u02bb"  # ʻ of oʻ/gʻ
TQ = "\u02bc"  # ʼ tutuq belgisi


def test_symbols_contract():
    assert SYMBOLS[PAD_ID] == SYMBOLS[0] == "_"
    assert len(set(SYMBOLS)) == len(SYMBOLS)
    for tok in ("o" + OK, "g" + OK, "sh", "ch", TQ, " ", ".", ",", "?", "!"):
        assert tok in SYMBOLS


def test_script_detection():
    assert detect_script("salom dunyo") == "latin"
    assert detect_script("салом дунё") == "cyrillic"
    assert detect_script("salom дунё") == "mixed"
    assert detect_script("123 !") == "none"


@pytest.mark.parametrize("cyr, lat", [
    ("ёз", "yoz"), ("юлдуз", "yulduz"), ("яхши", "yaxshi"), ("цирк", "sirk"), ("доцент", "dotsent"),
    ("шаҳар", "shahar"), ("чой", "choy"), ("ғалаба", "g" + OK + "alaba"), ("қиш", "qish"),
    ("ўқиш", "o" + OK + "qish"), ("ҳаво", "havo"), ("таълим", "ta" + TQ + "lim"), ("шеър", "she" + TQ + "r"),
    ("объект", "obyekt"), ("апрель", "aprel"), ("батальон", "batalyon"), ("ер", "yer"), ("поезд", "poyezd"),
    ("Исҳоқ", "is" + TQ + "hoq"), ("Ўзбекистон", "o" + OK + "zbekiston"), ("ЁШЛАР", "yoshlar"),
    ("сaлом", "salom"),  # Latin 'a' typed inside a Cyrillic word
])
def test_cyrillic_to_latin(cyr, lat):
    assert normalize(cyr) == lat


@pytest.mark.parametrize("apos", ["\u02bb", "\u02bc", "'", "`", "\u2018", "\u2019"])
def test_apostrophe_variants_fold(apos):
    text = f"O{apos}zbekiston g{apos}alaba o{apos}g{apos}il"
    assert normalize(text) == f"o{OK}zbekiston g{OK}alaba o{OK}g{OK}il"
    # after any other letter it is the tutuq belgisi, kept distinct from the oʻ/gʻ mark
    assert normalize(f"ma{apos}no san{apos}at") == f"ma{TQ}no san{TQ}at"


def test_tutuq_is_its_own_token():
    ids = text_to_ids(normalize("ta'lim o'qish"))
    assert ids.count(SYMBOLS.index(TQ)) == 1 and ids.count(SYMBOLS.index("o" + OK)) == 1
    assert SYMBOLS.index(TQ) != SYMBOLS.index(OK)


def test_quotes_are_not_letters():
    assert normalize("U 'salom' dedi.") == "u salom dedi."
    assert normalize("«Salom», dedi u.") == "salom, dedi u."


@pytest.mark.parametrize("text, expected", [
    ("0", "nol"), ("7", "yetti"), ("15", f"o{OK}n besh"), ("40", "qirq"), ("99", f"to{OK}qson to{OK}qqiz"),
    ("100", "yuz"), ("305", "uch yuz besh"), ("1000", "ming"), ("2024", f"ikki ming yigirma to{OK}rt"),
    ("1 000 000", "bir million"), ("3000000000", "uch milliard"), ("5ta olma", "beshta olma"),
])
def test_cardinals(text, expected):
    assert normalize(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("1-sinf", "birinchi sinf"), ("2-chi", "ikkinchi"), ("3-nchi", "uchinchi"), ("4-inchi", f"to{OK}rtinchi"),
    ("20-asr", "yigirmanchi asr"), ("6-qavatda", "oltinchi qavatda"),
    ("1991-yil", f"ming to{OK}qqiz yuz to{OK}qson birinchi yil"),
    ("2024 yilda", f"ikki ming yigirma to{OK}rtinchi yilda"),
    ("XXI asr", "yigirma birinchi asr"), ("IV bob", f"to{OK}rtinchi bob"), ("XIX-asr", f"o{OK}n to{OK}qqizinchi asr"),
    ("5-da", "beshda"),
])
def test_ordinals_years_roman(text, expected):
    assert normalize(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("12.05.2024", f"o{OK}n ikkinchi may ikki ming yigirma to{OK}rtinchi yil"),
    ("2024-05-12", f"ikki ming yigirma to{OK}rtinchi yil o{OK}n ikkinchi may"),
    ("31-avgust", f"o{OK}ttiz birinchi avgust"),
    ("14:30", f"o{OK}n to{OK}rt o{OK}ttiz"), ("09:05", f"to{OK}qqiz nol besh"),
    ("3,5", f"uch butun o{OK}ndan besh"), ("0.25", "nol butun yuzdan yigirma besh"),
    ("12,5%", f"o{OK}n ikki butun o{OK}ndan besh foiz"), ("50 %", "ellik foiz"),
    ("$100", "yuz dollar"), ("25 €", "yigirma besh yevro"), ("5000 so'm", f"besh ming so{OK}m"),
    ("10 USD", f"o{OK}n dollar"), ("-5 daraja", "minus besh daraja"),
    ("5-10 kishi", f"beshdan o{OK}ngacha kishi"), ("5 km", "besh kilometr"), ("3 kg", "uch kilogramm"),
    ("007", "nol nol yetti"),
])
def test_dates_times_decimals_percent_currency_units(text, expected):
    assert normalize(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("AQSH", f"amerika qo{OK}shma shtatlari"), ("BMT", "birlashgan millatlar tashkiloti"),
    ("olma, nok va h.k.", "olma, nok va hokazo"), ("Prof. Karimov", "professor karimov"),
    ("Toshkent sh.", "toshkent shahri"), ("АҚШ", f"amerika qo{OK}shma shtatlari"), ("QR kod", "qu er kod"),
])
def test_abbreviations(text, expected):
    assert normalize(text) == expected


def test_punctuation_kept_as_prosody():
    assert normalize("Salom!!! Qalaysiz?  Yaxshi… (rahmat) — xayr;") == \
        "salom! qalaysiz? yaxshi. rahmat, - xayr"
    assert normalize("Nima?!") == "nima?!"
    ids = text_to_ids(normalize("Ha, yo'q. Nega?"))
    for p in (",", ".", "?"):
        assert SYMBOLS.index(p) in ids


def test_foreign_letters_folded():
    assert normalize("Öğretmen çay Washington café") == f"o{OK}g{OK}retmen chay vashington kafe"


def test_full_sentence_mixed_script():
    text = "Ўзбекистон 1991-йил 31-августда мустақил бўлди!"
    assert normalize(text) == (f"o{OK}zbekiston ming to{OK}qqiz yuz to{OK}qson birinchi yil o{OK}ttiz birinchi "
                               f"avgustda mustaqil bo{OK}ldi!")
    ids = text_to_ids(normalize(text), on_unknown="error")
    assert ids_to_text(ids) == normalize(text)


def test_unknown_characters():
    with pytest.raises(UnknownCharacterError) as err:
        text_to_ids("salom ☃ dunyo", on_unknown="error")
    assert "'☃'" in str(err.value) and "U+2603" in str(err.value) and err.value.position == 6
    with pytest.warns(UserWarning, match=r"U\+2603"):
        ids = text_to_ids("salom ☃", on_unknown="warn")
    assert ids_to_text(ids) == "salom "
    assert text_to_ids("salom ☃", on_unknown="drop") == ids
    assert "你" in normalize("你好")  # never silently removed by the normaliser
    with pytest.raises(ValueError):
        text_to_ids("a", on_unknown="ignore")


def test_digraph_tokens_and_blanks():
    ids = text_to_ids(f"sho{OK}rva")
    assert [SYMBOLS[i] for i in ids] == ["sh", "o" + OK, "r", "v", "a"]
    assert [SYMBOLS[i] for i in text_to_ids(f"is{TQ}hoq")] == ["i", "s", TQ, "h", "o", "q"]
    assert intersperse([5, 6]) == [PAD_ID, 5, PAD_ID, 6, PAD_ID]


def test_number_helpers():
    assert cardinal(123456) == "yuz yigirma uch ming to\u02bbrt yuz ellik olti"
    assert ordinal(90) == "to\u02bbqsoninchi" and ordinal(2) == "ikkinchi"
    assert decimal("1", "005") == "bir butun mingdan besh"
    assert roman_to_int("MCMXCI") == 1991 and roman_to_int("IIII") is None and roman_to_int("ABC") is None
