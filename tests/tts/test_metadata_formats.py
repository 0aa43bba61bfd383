"""The input formats of tts/prepare_data.py that Piper, coqui and Hugging Face users already have (issue 40):
Piper's '|' layouts told apart over the whole file (never a silent guess), phoneme ids and IPA phonemes carried
to a VITS training step unchanged, and `datasets` folders / parquet files written by `datasets` itself, read
offline. The speech is real speech, made here with espeak-ng (speech/demo_speech.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from speech.demo_speech import speak
from tts import metadata
from tts.prepare_data import PrepareError, main, prepare
from tts.text import intersperse, normalize, text_to_ids
from tts.text.phonemes import ESPEAK_SYMBOLS, Frontend
from tts.vits import train as train_mod
from tts.vits.config import AudioConfig, TrainConfig
from tts.vits.data import DataError, VitsDataset

TINY_YAML = Path(__file__).resolve().parents[2] / "tts" / "vits" / "configs" / "tiny.yaml"

pytestmark = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng makes the test speech")

TEXTS = ["Bugun havo juda yaxshi.", "Biz bogʻda sayr qildik.", "Choy ichib, dam olaylik.",
         "Men kitob oʻqiyapman.", "Onam palov pishiryapti.", "Doʻstim menga xat yozdi."]
VOICES = {"anna": "uz+f3", "bobur": "uz"}


@pytest.fixture(scope="module")
def speech(tmp_path_factory) -> Path:
    """Six utterances, three per speaker: wavs/<speaker>_<n>.wav."""
    root = tmp_path_factory.mktemp("speech")
    for i, text in enumerate(TEXTS):
        spk = list(VOICES)[i % 2]
        speak(text, root / "wavs" / f"{spk}_{i}.wav", voice=VOICES[spk])
    return root / "wavs"


def _cfg(**sets) -> TrainConfig:
    cfg = TrainConfig()
    cfg.data.eval_split_size = 1
    for k, v in sets.items():
        setattr(cfg, k, v)
    return cfg


def _records(out: Path) -> list[dict]:
    return [json.loads(x) for name in ("train.jsonl", "eval.jsonl")
            for x in (out / name).read_text(encoding="utf-8").splitlines()]


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_pipe_layouts_are_told_over_the_whole_file(tmp_path):
    def layout(lines, fmt="auto"):
        return metadata.parse_metadata(_write(tmp_path / "m.csv", lines), fmt)[2]

    assert layout(["a|Salom dunyo.", "b|Xayr."]) == "ljspeech"  # id|text: LJSpeech and Piper read it alike
    assert layout(["a|Salom dunyo.", "b|Xayr."], "piper") == "piper"
    assert layout(["a|2 ta olma.|ikki ta olma.", "b|Xayr.|Xayr."]) == "ljspeech"
    piper = [f"u{i}|{'anna' if i % 2 else 'bobur'}|{t}" for i, t in enumerate(TEXTS)]
    assert layout(piper) == "piper_speaker"
    assert layout(["a|1 5 23|ignored", "b|Salom dunyo.|Salom dunyo."]) == "ljspeech"  # a sentence in column 2
    assert layout(["a|Salom.|12 20 3", "b|Xayr.|30 1"]) == "piper_ids"
    assert layout(["a|anna|Salom.|12 20 3", "b|bobur|Xayr.|30 1"]) == "piper_speaker_ids"
    ambiguous = ["a|anna|Salom.", "b|bobur|Xayr."]  # two one-word speakers in two lines: cannot be told
    with pytest.raises(PrepareError, match="--format ljspeech or --format piper"):
        layout(ambiguous)
    assert layout(ambiguous, "piper") == "piper_speaker" and layout(ambiguous, "ljspeech") == "ljspeech"
    with pytest.raises(PrepareError, match="column 2 holds text"):
        layout(["a|Salom dunyo.|Salom dunyo."], "piper")
    with pytest.raises(PrepareError, match="--audio_dir is needed"):
        prepare(tmp_path / "m.csv", None, tmp_path / "out", quiet=True)


def test_piper_multi_speaker_prepares_with_its_speakers(speech, tmp_path, capsys):
    lines = [f"{p.stem}|{p.stem.split('_')[0]}|{TEXTS[int(p.stem.split('_')[1])]}" for p in sorted(speech.glob("*.wav"))]
    meta = _write(tmp_path / "metadata.csv", lines + ["lost|anna"])  # a line with 2 fields: dropped, named
    report = prepare(meta, speech, tmp_path / "out", _cfg())
    out = capsys.readouterr().out
    assert "metadata: Piper id|speaker|text, 6 line(s) read, 2 speakers, the model reads text" in out.splitlines()
    assert report["format"] == "piper_speaker" and report["layout"].startswith("metadata: Piper id|speaker|text")
    assert report["kept"] == 6 and report["speakers"] == 2
    assert "expected 3 '|'-separated fields" in report["dropped"][0]["reason"]
    assert json.loads((tmp_path / "out" / "speakers.json").read_text()) == {"anna": 0, "bobur": 1}
    assert {r["speaker"] for r in _records(tmp_path / "out")} == {"anna", "bobur"}


def test_phoneme_ids_reach_a_vits_training_step(speech, tmp_path):
    """Piper's id|text|phoneme_ids with this model's ids: checked, kept as given, trained on; ids outside the
    symbols or with Piper's pad are dropped with the reason; the cloning model and another front-end refuse."""
    given = {p.stem: text_to_ids(normalize(TEXTS[int(p.stem.split("_")[1])])) for p in speech.glob("*.wav")}
    lines = [f"{k}|{TEXTS[int(k.split('_')[1])]}|{' '.join(map(str, v))}" for k, v in sorted(given.items())]
    lines += ["anna_0|x|1 999 3", "bobur_1|y|1 0 12"]  # duplicates would drop anyway; these go first
    meta = _write(tmp_path / "metadata.csv", lines[-2:] + lines[:-2])
    out = tmp_path / "out"
    report = prepare(meta, speech, out, _cfg(), quiet=True)
    assert report["format"] == "piper_ids" and report["kept"] == 6 and report["layout"].endswith("reads phoneme ids")
    reasons = [d["reason"] for d in report["dropped"]]
    assert any("999 not in the config's symbol set" in r for r in reasons)
    assert any("pad/blank" in r for r in reasons)
    records = _records(out)
    assert {r["id"]: r["ids"] for r in records} == given
    ds = VitsDataset(out, "train", AudioConfig())
    item = ds[0]
    assert item["ids"].tolist() == intersperse(given[item["id"]])
    with pytest.raises(DataError, match="phoneme_type: text"):
        VitsDataset(out, "train", AudioConfig(), frontend=Frontend("espeak"))
    from tts.clone.data import DataError as CloneDataError
    from tts.clone.data import read_manifest
    with pytest.raises(CloneDataError, match="only the VITS trainer reads"):
        read_manifest(out / "train.jsonl")
    assert train_mod.main(["--config", str(TINY_YAML), "--data_dir", str(out), "--run_dir", str(tmp_path / "run"), "--device", "cpu",
                           "--set", "max_steps=1"]) == 0


def test_ipa_phonemes_are_read_not_phonemized_again(speech, tmp_path):
    ipa = {"anna_0": "buɡun havɔ dʒuda jɑxʃi.", "bobur_1": "biz boʁda sajr qildik.", "anna_2": "tʃɔj itʃib, dam ɔlajlik."}
    lines = [f"{k}|{v}" for k, v in ipa.items()] + ["bobur_3|men ☃ kitɔb"]
    meta = _write(tmp_path / "metadata.csv", lines)
    with pytest.raises(PrepareError, match="phoneme_type: espeak"):
        prepare(meta, speech, tmp_path / "no", _cfg(), quiet=True, text_kind="phonemes")
    report = prepare(meta, speech, tmp_path / "out", _cfg(phoneme_type="espeak"), quiet=True, text_kind="phonemes")
    assert report["kept"] == 3 and "'☃' (U+2603" in report["dropped"][0]["reason"]
    assert report["layout"].endswith("the model reads IPA phonemes")
    index = {s: i for i, s in enumerate(ESPEAK_SYMBOLS)}
    assert {r["id"]: r["ids"] for r in _records(tmp_path / "out")} == {k: [index[c] for c in v] for k, v in ipa.items()}
    assert not (tmp_path / "out" / "phonemes_uz.json").exists() or \
        json.loads((tmp_path / "out" / "phonemes_uz.json").read_text()) == {}  # espeak-ng ran on nothing


def _hf_dataset(speech: Path, named: bool = True):
    """A datasets Dataset of the speech, its audio embedded as datasets' own Audio feature writes it (with the file
    names, or none as when a dataset was made from arrays)."""
    from datasets import Audio, Dataset
    files = sorted(speech.glob("*.wav"))
    return Dataset.from_dict({
        "audio": [{"bytes": f.read_bytes(), "path": f.name if named else None} for f in files],
        "sentence": [TEXTS[int(f.stem.split("_")[1])] for f in files],
        "speaker_id": [f.stem.split("_")[0] for f in files],
        "path": [f"clips/{f.stem}.mp3" for f in files],  # as Common Voice's: the Audio column is the audio
    }).cast_column("audio", Audio())


def test_datasets_folder_and_parquet(speech, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    ds = _hf_dataset(speech)
    ds.save_to_disk(str(tmp_path / "saved"))
    report = prepare(tmp_path / "saved", None, tmp_path / "out", _cfg(), quiet=True)
    assert report["format"] == "hf" and report["kept"] == 6 and report["speakers"] == 2
    assert {r["id"] for r in _records(tmp_path / "out")} == {f.stem for f in speech.glob("*.wav")}
    assert not (tmp_path / "out" / metadata.TABLE_AUDIO).exists()  # the audio taken out is gone again

    _hf_dataset(speech, named=False).to_parquet(str(tmp_path / "train.parquet"))
    assert main(["--metadata", str(tmp_path / "train.parquet"), "--output_dir", str(tmp_path / "pq"),
                 "--num_workers", "1", "--speaker_column", "speaker_id"]) == 0
    assert "metadata: Hugging Face datasets table, 6 line(s) read, 2 speakers" in capsys.readouterr().out
    report = json.loads((tmp_path / "pq" / "report.json").read_text())
    assert report["kept"] == 6 and {r["id"] for r in _records(tmp_path / "pq")} == {f"{i:06d}" for i in range(1, 7)}
    assert len(report.get("levels", "123456")) == 6  # the report's entry of each file (no names: the row's own)

    # a parquet whose audio column is a plain path, columns named by the user: the audio from --audio_dir only
    from datasets import Dataset
    files = sorted(speech.glob("*.wav"))
    shutil.copy(files[0], speech.parent / "secret.wav")  # a real file, but outside --audio_dir
    Dataset.from_dict({"file": [f.name for f in files] + ["../secret.wav"],
                       "words": [TEXTS[int(f.stem.split("_")[1])] for f in files] + ["salom"]}
                      ).to_parquet(str(tmp_path / "paths.parquet"))
    with pytest.raises(PrepareError, match="--text_column words_x is not one of its columns"):
        prepare(tmp_path / "paths.parquet", speech, tmp_path / "p2", _cfg(), quiet=True, columns=(None, "words_x", None))
    report = prepare(tmp_path / "paths.parquet", speech, tmp_path / "p2", _cfg(), quiet=True,
                     columns=("file", "words", None))
    assert report["kept"] == 6 and "leads outside --audio_dir" in report["dropped"][0]["reason"]


def test_tables_that_cannot_be_read_say_what_to_do(tmp_path, monkeypatch):
    from datasets import Dataset, DatasetDict
    ds = Dataset.from_dict({"text": ["salom"]})
    DatasetDict({"train": ds, "test": ds}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(PrepareError, match=r"several splits \(test, train\): pass one, e.g. --metadata .*dd/test"):
        prepare(tmp_path / "dd", None, tmp_path / "out", quiet=True)
    monkeypatch.setitem(__import__("sys").modules, "pyarrow", None)  # as if it were not installed
    with pytest.raises(PrepareError, match=r"needs pyarrow: `pip install pyarrow==26.0.1`"):
        prepare(tmp_path / "dd" / "train", None, tmp_path / "out", quiet=True)
