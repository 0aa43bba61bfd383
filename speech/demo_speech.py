"""Demo speech made on this machine with espeak-ng (voice `uz`), never downloaded.

Used by the speech demos and the tests: a few clearly different synthetic
speakers reading natural Uzbek sentences. espeak-ng is a formant synthesiser, so this is data
to exercise the pipelines end to end, not data to judge voice quality by.

espeak-ng `uz` reads digits one by one and misreads Cyrillic and U+02BC, so callers pass
normalised Latin text (canonical oʻ/gʻ with U+02BB, numbers as words). `speak` then maps every
apostrophe to ASCII "'": measured with espeak-ng 1.51, U+02BB, U+2018, U+2019 and "'" give
byte-identical audio ("o'"→/o/, "g'"→/ʁ/, "a'"→/ʔ/), while U+02BC spells the letters out
(2.5× longer) and "`" reads g` as /ɡe/.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from common.atomic_write import write_text
from common.errors import UserError
from speech.audio import load_audio, save_wav

ESPEAK = "espeak-ng"
INSTALL_HINT = "run `make setup` or `apt-get install espeak-ng`"

# oʻ/gʻ (U+02BB), tutuq belgisi (U+02BC) and the quote look-alikes users type → what espeak reads.
_APOSTROPHES = str.maketrans({"\u02bb": "'", "\u02bc": "'", "\u2018": "'", "\u2019": "'", "`": "'"})

# Six clearly different voices (median f0 measured with extract_f0 on a three-sentence text):
# three male (≈ 82, 95, 122 Hz) and three female (≈ 159, 216, 246 Hz) at different speaking rates.
DEMO_SPEAKERS: list[dict] = [
    {"name": "uz_m_low", "voice": "uz+m3", "speed": 135, "pitch": 25},
    {"name": "uz_m_mid", "voice": "uz", "speed": 150, "pitch": 45},
    {"name": "uz_m_klatt", "voice": "uz+klatt", "speed": 170, "pitch": 70},
    {"name": "uz_f_low", "voice": "uz+f4", "speed": 130, "pitch": 40},
    {"name": "uz_f_mid", "voice": "uz+f3", "speed": 150, "pitch": 55},
    {"name": "uz_f_high", "voice": "uz+f2", "speed": 170, "pitch": 75},
]

# Normalised Latin-script Uzbek: no digits, oʻ/gʻ with U+02BB, tutuq belgisi U+02BC only in the
# words that have it (maʼno, sheʼr, taʼlim, …).
UZBEK_SENTENCES: list[str] = [
    # everyday life
    "Ertalab turib, yuzimni yuvdim va nonushta qildim.",
    "Bugun bozordan non, sut va meva sotib oldim.",
    "Onam oshxonada mazali palov pishiryapti.",
    "Choy ichib, biroz dam olaylik.",
    "Men har kuni ertalab piyoda ishga boraman.",
    "Kechqurun butun oila bilan televizor koʻramiz.",
    "Doʻstim menga yangi kitob sovgʻa qildi.",
    "Avtobus bekatida uzoq kutishga toʻgʻri keldi.",
    "Bu doʻkonda narxlar ancha arzon ekan.",
    "Telefonimning quvvati tugab qolibdi, quvvatlagichingizni bera olasizmi?",
    "Ovqatdan keyin idishlarni yuvib, javonga qoʻydim.",
    "Qoʻshnimiz bizni oʻgʻlining toʻyiga taklif qildi.",
    "Shanba kuni uyni tozalab, gilamlarni qoqdik.",
    "Kino boshlanishiga oz qoldi, tezroq yuraylik.",
    "Sizga qanday yordam bera olaman?",
    "Kechirasiz, eng yaqin dorixona qayerda joylashgan?",
    "Rahmat, sizning maslahatingiz menga juda asqotdi.",
    "Ertaga soat nechada uchrashamiz?",
    "Mehmonlarga dasturxon yozib, issiq non va choy qoʻydik.",
    "Kompyuterda ishlayotganda koʻzlarga dam berish zarur.",
    # weather
    "Bugun havo juda issiq, soyada oʻtirgan maʼqul.",
    "Kechasi kuchli yomgʻir yogʻdi, koʻchalar hoʻl boʻlib qoldi.",
    "Qishda togʻlarga qalin qor yogʻadi.",
    "Ertaga havo bulutli boʻlib, kuchli shamol esishi kutilmoqda.",
    "Bahorda daraxtlar gullab, havo iliq boʻladi.",
    "Kuz kelishi bilan barglar sargʻayib, yerga toʻkiladi.",
    "Ertalab quyuq tuman tushgani uchun yoʻllar koʻrinmay qoldi.",
    "Yozning jaziramasida salqin suv ichish juda yoqimli.",
    "Osmonda kamalak paydo boʻldi, bolalar xursand boʻlishdi.",
    "Qor yogʻgani uchun bolalar hovlida qorbobo yasashdi.",
    # school
    "Oʻqituvchimiz bugun yangi mavzuni batafsil tushuntirib berdi.",
    "Ukam maktabda ingliz tilini oʻrganyapti.",
    "Imtihonga yaxshi tayyorlanish uchun har kuni takrorlash kerak.",
    "Kutubxonada jimjitlik hukm surardi, hamma kitob oʻqiyotgan edi.",
    "Biz darsdan keyin maktab hovlisida futbol oʻynadik.",
    "Talabalar taʼtil paytida oʻz qishloqlariga qaytishadi.",
    "Ustozning har bir soʻzi menga katta taʼsir qildi.",
    "Sinfimizda oʻttiz nafar oʻquvchi bor.",
    "Uy vazifasini bajarib boʻlgach, sayrga chiqdim.",
    "Bu yil universitetga kirish uchun koʻp harakat qildim.",
    "Taʼlim sifatini oshirish hammamizning vazifamiz.",
    "Matematika darsida masalalarni birgalikda yechdik.",
    # family
    "Buvim bizga qiziqarli ertaklar aytib berardi.",
    "Otam bogʻda olma va oʻrik daraxtlarini parvarish qiladi.",
    "Singlim rasm chizishni juda yaxshi koʻradi.",
    "Bayram kuni barcha qarindoshlar bizning uyimizga yigʻildi.",
    "Akam poytaxtda shifokor boʻlib ishlaydi.",
    "Bobom yoshligida haydovchi boʻlib ishlagan ekan.",
    "Oilamiz katta, biz besh farzandmiz.",
    "Onamning tugʻilgan kuniga chiroyli gullar olib keldim.",
    "Ota-onani hurmat qilish har bir farzandning burchidir.",
    "Dam olish kunlari bolalar bilan hayvonot bogʻiga bordik.",
    # city
    "Toshkent metrosi dunyodagi eng chiroyli metrolardan biri hisoblanadi.",
    "Samarqandning qadimiy obidalari sayyohlarni hayratga soladi.",
    "Shahar markazida yangi bogʻ barpo etildi.",
    "Chorsu bozorida har xil ziravorlar va quruq mevalar sotiladi.",
    "Koʻchalarda mashinalar koʻpayib, tirbandlik kuchaydi.",
    "Buxoro shahri oʻzining tarixiy madrasalari bilan mashhur.",
    "Kechqurun shahar chiroqlari juda goʻzal koʻrinadi.",
    "Yangi kutubxona binosi bekatning roʻparasida joylashgan.",
    "Taksi haydovchisi bizni aeroportga tez olib bordi.",
    "Xivadagi Ichan qalʼa ochiq osmon ostidagi muzeyga oʻxshaydi.",
    "Poyezd Toshkentdan Samarqandgacha ikki soatda yetib boradi.",
    # nature
    "Togʻ etagida tiniq buloq suvi oqib yotibdi.",
    "Daryo boʻyida baliqchilar tong otguncha oʻtirishdi.",
    "Bahorda adirlar lolaqizgʻaldoqlarga burkanadi.",
    "Qushlar erta tongda sayray boshlaydi.",
    "Choʻlda tuyalar karvoni sekin yurib borardi.",
    "Oʻrmonda qoʻziqorin terib, savatimizni toʻldirdik.",
    "Orol dengizining qurishi katta ekologik muammodir.",
    "Togʻ havosi salomatlik uchun juda foydali.",
    "Bogʻimizdagi uzumlar bu yil erta pishdi.",
    "Osmonda yulduzlar charaqlab, oy nur sochib turardi.",
    "Zarafshon daryosi koʻplab shaharlarni suv bilan taʼminlaydi.",
    # culture and sayings
    "Alisher Navoiy sheʼrlari koʻplab tillarga tarjima qilingan.",
    "Bu soʻzning maʼnosini lugʻatdan qidirib topdim.",
    "Baʼzi odamlar ertalab yugurishni yaxshi koʻradi.",
    "Milliy sanʼatimiz dunyo miqyosida tan olinmoqda.",
    "Yangi maʼlumotlarga koʻra, bu yil hosil moʻl boʻladi.",
    "U qatʼiy qaror qabul qilib, sport bilan shugʻullana boshladi.",
    "Navroʻz bayramida sumalak pishirish qadimiy anʼanadir.",
    "Hayot qisqa, har bir kunning qadriga yetish kerak.",
    "Yaxshi soʻz bilan ilon inidan chiqadi.",
    "Mehnat qilgan odam hech qachon xor boʻlmaydi.",
    # longer sentences
    "Yozgi taʼtilda oilamiz bilan togʻdagi dam olish maskaniga borib, u yerda bir hafta qoldik.",
    "Ertalab maktabga ketayotganimda yoʻlda eski sinfdoshimni uchratib, u bilan uzoq suhbatlashdim.",
    "Bahor kelishi bilan dehqonlar dalaga chiqib, paxta va bugʻdoy ekishga tayyorgarlik koʻrishadi.",
    "Kecha kechqurun doʻstlarim bilan shahar markazidagi yangi teatrga borib, ajoyib spektakl tomosha qildik.",
    "Agar ertaga havo yaxshi boʻlsa, biz bolalar bilan daryo boʻyiga sayrga boramiz.",
    "Kitob oʻqish inson dunyoqarashini kengaytiradi va nutqini boyitadi, shuning uchun har kuni oʻqing.",
    "Buvim har yili kuzda uzum va olmadan mazali murabbo tayyorlab, qishga saqlab qoʻyadi.",
    "Samolyot kechikkani uchun aeroportda ikki soat kutib, uyga faqat yarim tunda yetib keldik.",
]


class EspeakNotFoundError(UserError, RuntimeError):
    """espeak-ng is not installed (or not on PATH)."""


def espeak_available() -> bool:
    return shutil.which(ESPEAK) is not None


def require_espeak() -> None:
    """A demo's first check: EspeakNotFoundError (a UserError: one line, exit 2) saying how to get espeak-ng
    unless it runs."""
    if not espeak_available():
        raise EspeakNotFoundError(f"espeak-ng is needed for the demo corpus: {INSTALL_HINT}")


def _require_espeak() -> str:
    exe = shutil.which(ESPEAK)
    if exe is None:
        raise EspeakNotFoundError(f"{ESPEAK} not found on PATH: {INSTALL_HINT}")
    return exe


def to_espeak_text(text: str) -> str:
    """The text as espeak-ng `uz` reads it best: every apostrophe variant → ASCII "'"."""
    return text.translate(_APOSTROPHES)


def speak(
    text: str,
    out_path: str | os.PathLike,
    voice: str = "uz",
    speed: int = 150,
    pitch: int = 50,
    sample_rate: int | None = None,
) -> Path:
    """Synthesise `text` with espeak-ng into a 16-bit wav at `out_path` (espeak's own 22050 Hz,
    or resampled to `sample_rate`). `voice` is e.g. "uz" or "uz+f3"; `speed` is words per
    minute, `pitch` 0-99. The text goes in on stdin (no shell, no option injection) and the file
    appears atomically."""
    exe = _require_espeak()
    if not text or not text.strip():
        raise ValueError("speak: empty text")
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fd, raw = tempfile.mkstemp(prefix=f".{out_path.stem}.", suffix=".espeak.wav", dir=out_path.parent)
    os.close(fd)
    try:
        cmd = [
            exe,
            "-v",
            voice,
            "-s",
            str(int(speed)),
            "-p",
            str(int(pitch)),
            "-b",
            "1",
            "-w",
            raw,
            "--stdin",
        ]
        proc = subprocess.run(
            cmd, input=to_espeak_text(text).encode("utf-8"), capture_output=True, timeout=120
        )
        if proc.returncode != 0:
            err = proc.stderr.decode("utf-8", "replace").strip()
            raise RuntimeError(f"{ESPEAK} failed (exit {proc.returncode}) for voice {voice!r}: {err}")
        wav, sr = load_audio(raw, sr=sample_rate)
        save_wav(out_path, wav, sr)
    finally:
        if os.path.exists(raw):
            os.remove(raw)
    return out_path


def _make_one(job: tuple[Path, str, dict, int]) -> None:
    wav_path, text, spk, sample_rate = job
    speak(text, wav_path, voice=spk["voice"], speed=spk["speed"], pitch=spk["pitch"], sample_rate=sample_rate)
    write_text(wav_path.with_suffix(".txt"), text + "\n")


def _is_done(wav_path: Path, text: str) -> bool:
    txt = wav_path.with_suffix(".txt")
    return (
        wav_path.is_file()
        and wav_path.stat().st_size > 0
        and txt.is_file()
        and txt.read_text(encoding="utf-8").strip() == text.strip()
    )


def make_corpus(
    sentences: list[str],
    out_dir: str | os.PathLike,
    speakers: list[dict] = DEMO_SPEAKERS,
    sample_rate: int = 22050,
    num_workers: int = 2,
) -> list[dict]:
    """Every speaker reads every sentence: writes `<out_dir>/<speaker>/<nnnn>.wav` with the text
    beside it in `<nnnn>.txt`, and returns `[{"path", "text", "speaker"}, …]` (speaker-major).

    Resumable: a wav that exists, is non-empty and whose .txt matches the sentence is not
    redone (wavs are written atomically, so a non-empty one is complete). Runs `num_workers`
    espeak-ng processes at once (threads: the work happens in the subprocess and in soxr)."""
    _require_espeak()
    out_dir = Path(out_dir)
    for i, spk in enumerate(speakers):
        missing = {"name", "voice", "speed", "pitch"} - set(spk)
        if missing:
            raise ValueError(
                f"make_corpus: speaker #{i} lacks keys {sorted(missing)} (need name, voice, speed, pitch)"
            )
        if not spk["name"] or "/" in spk["name"] or "\\" in spk["name"]:
            raise ValueError(f"make_corpus: speaker name {spk['name']!r} must be a plain folder name")
    items, todo = [], []
    for spk in speakers:
        for n, text in enumerate(sentences):
            wav_path = out_dir / spk["name"] / f"{n:04d}.wav"
            items.append({"path": str(wav_path), "text": text, "speaker": spk["name"]})
            if not _is_done(wav_path, text):
                todo.append((wav_path, text, spk, sample_rate))
    if num_workers <= 1 or len(todo) <= 1:
        for job in todo:
            _make_one(job)
    else:
        with ThreadPoolExecutor(max_workers=num_workers) as pool:
            list(pool.map(_make_one, todo))  # list() re-raises the first worker error
    return items
