"""Long-text synthesis (sentence splitter, streaming), the espeak-ng phoneme front-end and the Piper
voice config of the ONNX export. The Piper check runs when the `piper` package is importable."""

from __future__ import annotations

import json
import shutil
import wave
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from common.checkpoint import load_checkpoint
from common.config import ConfigError, load_config
from tests.tts.test_vits_train import SR, _args, _corpus
from tts.prepare_data import prepare
from tts.text import normalize
from tts.text.phonemes import ESPEAK_SYMBOLS, Frontend, clauses, phonemize
from tts.text.sentences import paragraphs, plan, split_sentences
from tts.vits import export_onnx, synthesize
from tts.vits import train as train_mod
from tts.vits.config import TrainConfig

needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed")


@pytest.mark.parametrize("text, expected", [
    ("Bugun havo yaxshi. Ertaga yomgʻir yogʻadi! Siz qayerdasiz? Men uydaman.",
     ["Bugun havo yaxshi.", "Ertaga yomgʻir yogʻadi!", "Siz qayerdasiz?", "Men uydaman."]),
    ("Бугун ҳаво яхши. Эртага ёмғир ёғади! Сиз қаердасиз?",
     ["Бугун ҳаво яхши.", "Эртага ёмғир ёғади!", "Сиз қаердасиз?"]),
    # a known abbreviation ends the sentence before a capital, but not before a lower-case word
    ("Olma, nok va h.k. sotib oldik. Keyin ketdik. Non va h.k. Ertaga qaytamiz.",
     ["Olma, nok va h.k. sotib oldik.", "Keyin ketdik.", "Non va h.k.", "Ertaga qaytamiz."]),
    # titles, t.y. (a place follows), initials and unknown abbreviations never end one; Cyrillic titles too
    ("Prof. Karimov gapirdi. A. Navoiy 1441 t.y. Hirotda tugʻilgan. Sh.M. Mirziyoyev keldi. Проф. Каримов келди.",
     ["Prof. Karimov gapirdi.", "A. Navoiy 1441 t.y. Hirotda tugʻilgan.", "Sh.M. Mirziyoyev keldi.",
      "Проф. Каримов келди."]),
    # numbers: decimals and dates have no space after the dot; a digit can start a sentence
    ("Narxi 3.5 mln. soʻm. 2024-yil 5.09.2024 kuni keldi. 25% chegirma bor.",
     ["Narxi 3.5 mln. soʻm.", "2024-yil 5.09.2024 kuni keldi.", "25% chegirma bor."]),
    # quotes: "!" inside a quote before a lower-case word is not an end; an opening quote starts one
    ("«Salom!» dedi u. «Qalaysiz?» U javob bermadi. “Ha” dedi.",
     ["«Salom!» dedi u.", "«Qalaysiz?»", "U javob bermadi.", "“Ha” dedi."]),
    ("Toshkent sh. Chilonzor tumani. Kutdim... Keyin ketdim.",
     ["Toshkent sh. Chilonzor tumani.", "Kutdim...", "Keyin ketdim."]),
])
def test_split_sentences_uzbek(text, expected):
    assert split_sentences(text) == expected


def test_paragraphs_and_long_sentences():
    assert paragraphs("Bir qator\nikkinchi qator.\n\n \t\nYangi paragraf.\n") == [
        "Bir qator ikkinchi qator.", "Yangi paragraf."]
    long = ", ".join(["bugun havo juda yaxshi"] * 30) + "."
    pieces = split_sentences(long, max_chars=100)
    assert len(pieces) > 1 and all(len(p) <= 100 for p in pieces) and all(p.endswith((",", ".")) for p in pieces)
    assert " ".join(pieces) == long
    # the normaliser reads the splitter's pieces: t.y. is an abbreviation, not "tonna"
    assert normalize("1441 t.y. Hirotda") == "ming toʻrt yuz qirq bir tugʻilgan yili hirotda"


def test_clauses_keep_piper_terminators():
    assert clauses("salom, dunyo! bugun - havo; yaxshi") == [("salom", ","), ("dunyo", "!"), ("bugun - havo", ";"),
                                                              ("yaxshi", "")]
    with pytest.raises(ValueError, match="phoneme_type"):
        Frontend("ipa")
    with pytest.raises(ConfigError, match="phoneme_type"):
        load_config(None, TrainConfig, ["phoneme_type=ipa"])


@needs_espeak
def test_espeak_phonemes_piper_sequence():
    texts = ["salom, dunyo!", "bugun havo juda yaxshi.", "choy ichamiz: ertaga; keyin", "taʼlim va oʻzbekiston."]
    got = phonemize(texts)
    assert got == [phonemize([t])[0] for t in texts]  # one espeak-ng call for all = one call each
    first = got[0]
    assert first.endswith("!") and ", " in first and "ˈ" in first and "(" not in first
    assert got[2].count(": ") == 1 and got[2].count("; ") == 1 and not got[2].endswith(" ")
    assert all(c in ESPEAK_SYMBOLS for p in got for c in p)
    ids = Frontend("espeak").ids(texts[0], on_unknown="error")
    assert [ESPEAK_SYMBOLS[i] for i in ids] == list(first)
    with pytest.raises(ConfigError, match="espeak_voice"):
        phonemize(["salom"], voice="zz")


@pytest.fixture(scope="module")
def espeak_run(tmp_path_factory) -> Path:
    """Data prepared for graphemes, prepared again with phoneme_type=espeak (phonemes cached), 2 steps."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed")
    root = tmp_path_factory.mktemp("espeak")
    data = _corpus(root, ["anna", "bobur"])
    cfg = load_config(None, TrainConfig, ["phoneme_type=espeak", "data.eval_split_size=1", "data.trim_silence=false"])
    prepare(root / "metadata.csv", root / "audio", data, cfg, quiet=True, speaker_from_path=True)
    cache = json.loads((data / "phonemes_uz.json").read_text(encoding="utf-8"))
    assert cache["salom dunyo"].startswith("s") and "ˈ" in cache["salom dunyo"]
    run = root / "run"
    assert train_mod.main(_args(data, run, "phoneme_type=espeak", steps=2)) == 0
    return run


def test_espeak_checkpoint_keeps_its_front_end(espeak_run):
    ckpt = load_checkpoint(espeak_run / "checkpoints" / "vits_00000002.pt")
    assert ckpt["extra"]["phoneme_type"] == "espeak" and ckpt["extra"]["symbols"] == ESPEAK_SYMBOLS
    assert ckpt["models"]["generator"]["enc_p.emb.weight"].shape[0] == len(ESPEAK_SYMBOLS)
    model, cfg, _ = synthesize.load_generator(espeak_run / "checkpoints" / "vits_00000002.pt")
    assert Frontend.of(cfg) == Frontend("espeak", "uz")


def test_long_text_streams_sentence_by_sentence(espeak_run, tmp_path, capsys):
    ckpt = espeak_run / "checkpoints" / "vits_00000002.pt"
    model, cfg, _ = synthesize.load_generator(ckpt)
    text = "Salom, dunyo! Bugun 5-sentabr.\n\nЭртага ёмғир ёғади. Prof. Karimov va h.k. keladi."
    out, sizes, lengths = tmp_path / "long.wav", [], []

    def on_sentence(i, chunk):
        # streamed: the temp file beside `out` grows while later sentences are still to come; `out`
        # itself appears only when the text is done (never a truncated wav)
        (tmp,) = tmp_path.glob(".long.wav.*.tmp")
        assert not out.exists()
        sizes.append(tmp.stat().st_size)
        lengths.append(round(chunk.seconds * SR))

    torch.manual_seed(0)
    chunks = synthesize.stream(model, cfg, plan(text), 1, sentence_pause=0.25, paragraph_pause=0.5)
    stats = synthesize.write_stream(chunks, out, SR, on_sentence)
    assert stats["sentences"] == 4
    assert sizes == sorted(sizes) and sizes[0] >= 44 + 2 * lengths[0] and sizes[1] > sizes[0]
    wav, sr = sf.read(out, dtype="int16")
    pauses = [round(0.25 * SR), round(0.5 * SR), round(0.25 * SR)]  # between the sentences, none after the last
    assert sr == SR and len(wav) == sum(lengths) + sum(pauses)
    start = lengths[0] + lengths[1] + round(0.25 * SR)  # the paragraph pause is silence
    assert not wav[start:start + pauses[1]].any()
    # the CLI: a --text_file of paragraphs, one streamed file
    (tmp_path / "book.txt").write_text(text + "\n\n***\n", encoding="utf-8")
    rc = synthesize.main(["--checkpoint", str(ckpt), "--text_file", str(tmp_path / "book.txt"),
                          "--out", str(tmp_path / "book.wav"), "--paragraph_pause", "1.0"])
    printed = capsys.readouterr().out
    assert rc == 0 and "4 sentence(s)" in printed and "skipped 1 sentence" in printed and "RTF" in printed
    assert synthesize.main(["--checkpoint", str(ckpt), "--text", "a", "--sentence_pause", "-1"]) == 2


def test_piper_voice_config(espeak_run, tmp_path, capsys):
    ckpt = espeak_run / "checkpoints" / "vits_00000002.pt"
    onnx_path = tmp_path / "uz_espeak.onnx"
    assert export_onnx.main(["--checkpoint", str(ckpt), "--out", str(onnx_path)]) == 0
    meta = json.loads(Path(str(onnx_path) + ".json").read_text(encoding="utf-8"))
    assert meta["phoneme_type"] == "espeak" and meta["espeak"]["voice"] == "uz"
    assert meta["audio"]["sample_rate"] == SR and meta["num_speakers"] == 2
    assert meta["speaker_id_map"] == {"anna": 0, "bobur": 1} and meta["num_symbols"] == len(ESPEAK_SYMBOLS)
    assert set(meta["inference"]) == {"noise_scale", "length_scale", "noise_w"}
    id_map = meta["phoneme_id_map"]
    assert id_map["^"] == [] and id_map["$"] == [] and id_map["_"] == [0] and all(len(k) == 1 for k in id_map)
    # Piper's id rule (^ _ p1 _ p2 ... _ $) over our map is exactly our model's input
    ph = phonemize(["salom, dunyo!"])[0]
    piper_ids = [*id_map["^"], *id_map["_"]]
    for c in ph:
        piper_ids += [*id_map[c], *id_map["_"]]
    piper_ids += id_map["$"]
    assert piper_ids == synthesize.text_to_input("salom, dunyo!", True, Frontend("espeak"))[0].tolist()
    # a grapheme model: capitals map like their letters, digraph tokens cannot be Piper keys
    text_meta = export_onnx.piper_config(load_config(None, TrainConfig, ["data.add_blank=false"]), {"a": 0})
    assert text_meta["phoneme_type"] == "text" and text_meta["phoneme_id_map"]["_"] == []
    assert text_meta["phoneme_id_map"]["S"] == text_meta["phoneme_id_map"]["s"] and "sh" not in text_meta["phoneme_id_map"]
    assert text_meta["num_speakers"] == 1 and text_meta["speaker_id_map"] == {}


def test_piper_runs_the_exported_voice(espeak_run, tmp_path):
    """With the `piper-tts` package: it loads our voice, phonemizes like us and synthesises the same audio."""
    piper = pytest.importorskip("piper", reason="the piper-tts package is not installed (optional check)")
    from piper.config import SynthesisConfig

    ckpt = espeak_run / "checkpoints" / "vits_00000002.pt"
    onnx_path = tmp_path / "uz.onnx"
    assert export_onnx.main(["--checkpoint", str(ckpt), "--out", str(onnx_path), "--no_check"]) == 0
    voice = piper.PiperVoice.load(onnx_path)
    text = "salom, dunyo! bugun havo juda yaxshi."
    sentences = voice.phonemize(text)
    assert len(sentences) == 2  # Piper synthesises sentence by sentence
    model, cfg, _ = synthesize.load_generator(ckpt)
    ours = synthesize.text_to_input("salom, dunyo!", cfg.data.add_blank, Frontend.of(cfg))[0].tolist()
    assert voice.phonemes_to_ids(sentences[0]) == ours
    syn = SynthesisConfig(speaker_id=1, noise_scale=0.0, noise_w_scale=0.0, normalize_audio=False)
    audio = np.concatenate([c.audio_float_array for c in voice.synthesize("salom, dunyo!", syn)])
    with torch.no_grad():
        x = torch.tensor([ours])
        ref, _, _ = model.infer(x, torch.tensor([x.size(1)]), torch.tensor([1]), 0.0, 1.0, 0.0)
    assert audio.shape == (ref.numel(),) and np.abs(audio - ref.flatten().numpy()).max() < 1e-3
    with wave.open(str(tmp_path / "piper.wav"), "wb") as w:  # Piper's own CLI path: the whole text
        voice.synthesize_wav(text, w)
    wav, sr = sf.read(tmp_path / "piper.wav")
    assert sr == SR and len(wav) > len(audio)


@pytest.mark.parametrize("module, flags", [("tts.vits.export_onnx", ["--tolerance", "0.1"]),
                                           ("tts.clone.export_onnx", ["--reference", "voice.wav"])])
def test_an_export_refuses_check_settings_with_no_check(module, flags, tmp_path, capsys):
    """--tolerance / --reference only shape the onnxruntime check: with --no_check they changed nothing."""
    import importlib

    with pytest.raises(SystemExit) as exit_:
        importlib.import_module(module).main(["--checkpoint", "x.pt", "--out", str(tmp_path / "m.onnx"), "--no_check",
                                              *flags])
    assert exit_.value.code == 2 and f"{flags[0]} with --no_check" in capsys.readouterr().err
    assert not (tmp_path / "m.onnx").exists()
