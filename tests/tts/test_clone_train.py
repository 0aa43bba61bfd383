"""tts/train_main.py end to end on a tiny espeak-ng corpus: the loss falls, resume is bitwise exact,
non-finite steps are skipped then stop the run, bad data/reference clips give clear errors, and
tts/infer_clone.py speaks through a freshly initialised NSF vocoder built by the vocoder package."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from common.checkpoint import CheckpointManager, load_checkpoint
from speech.audio import save_wav
from speech.demo_speech import DEMO_SPEAKERS, UZBEK_SENTENCES, espeak_available, make_corpus
from speech.speaker_similarity import resemblyzer_weights
from tts.clone import infer as infer_clone
from tts.clone.config import AudioConfig, DataConfig
from tts.clone.data import DataError, build_features, load_reference
from tts.clone.model import VoiceCloneTTS
from tts.clone.train import build_parser, main, resolve_config, train
from tts.text import SYMBOLS

pytestmark = pytest.mark.skipif(not espeak_available(), reason="espeak-ng is needed for the test corpus")

# the tiny model on the synthetic corpus's 22.05 kHz audio (tts.clone's default is 24 kHz / 100 mels)
TINY_YAML = Path(__file__).resolve().parents[2] / "tts" / "clone" / "configs" / "tiny.yaml"
SENTENCES = [UZBEK_SENTENCES[i] for i in (3, 14, 17, 8, 0)]
SPEAKERS = [DEMO_SPEAKERS[0], DEMO_SPEAKERS[5], DEMO_SPEAKERS[1]]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny shapes gain nothing from a second thread, and one thread cannot be slowed down by
    OpenMP threads waiting on each other when the CPU is shared (measured 5x slower at load 4)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """3 espeak-ng voices x 5 sentences → tts/prepare_data.py folder (12 train + 3 eval)."""
    from tts.prepare_data import prepare
    from tts.vits.config import TrainConfig

    root = tmp_path_factory.mktemp("clone_corpus")
    items = make_corpus(SENTENCES, root / "raw", SPEAKERS, sample_rate=22050, num_workers=2)
    flat = root / "flat"
    flat.mkdir()
    lines = ["file,text,speaker"]
    for it in items:
        name = f"{it['speaker']}_{Path(it['path']).stem}.wav"
        shutil.copy(it["path"], flat / name)
        lines.append(f'{name},"{it["text"]}",{it["speaker"]}')
    (root / "metadata.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    cfg = TrainConfig()
    cfg.data.eval_split_size = 3
    prepare(root / "metadata.csv", flat, root / "prep", cfg, num_workers=1, quiet=True)
    return root / "prep"


@pytest.fixture(scope="module")
def vocoder_dir(tmp_path_factory) -> Path:
    """A freshly initialised tiny NSF-HiFiGAN exported with the vocoder package's own code."""
    from common.checkpoint import save_atomic
    from speech.audio import AudioSettings
    from vocoder.config import ModelArgs, VocoderConfig
    from vocoder.layouts import export_info, generator_args, to_legacy_names
    from vocoder.model import Generator

    out = tmp_path_factory.mktemp("vocoder_export")
    cfg = VocoderConfig(audio=AudioSettings(sample_rate=22050, n_mels=80, hop_length=256, n_fft=1024, win_length=1024,
                                            fmin=40, fmax=8000), model_args=ModelArgs(
                            upsample_rates=[8, 8, 4], upsample_kernel_sizes=[16, 16, 8], upsample_initial_channel=32,
                            resblock="2", resblock_kernel_sizes=[3], resblock_dilation_sizes=[[1, 3]]))
    info = export_info(cfg)
    torch.manual_seed(0)
    gen = Generator(generator_args(info))
    save_atomic({"generator": to_legacy_names(gen.state_dict())}, out / "model.ckpt")
    (out / "config.json").write_text(json.dumps(info))
    return out


def resolved(corpus: Path, run: Path, *extra: str):
    return resolve_config(build_parser().parse_args(clone_argv(corpus, run, *extra)))


def clone_argv(corpus: Path, run: Path, *extra: str) -> list[str]:
    return ["--config", str(TINY_YAML), "--train-data", str(corpus), "--checkpoint-dir", str(run), "--model-size",
            "tiny", "--batch-size", "4", "--num-workers", "0", "--precision", "32-true", "--lr", "3e-3", "--warmup-steps",
            "2", "--set", "val.batch_size=4", "--set", "train.log_interval=1", "--set", f"data.cache_dir={corpus.parent / 'cache'}",
            "--set", "val.sentences=[\"Salom dunyo.\"]", *extra]


@pytest.fixture(scope="module")
def trained(corpus, vocoder_dir, tmp_path_factory) -> dict:
    run = tmp_path_factory.mktemp("clone_run") / "run"
    res = resolved(corpus, run, "--set", "train.max_updates=16", "--set", "train.val_check_interval=16",
                   "--set", f"vocoder.path={vocoder_dir}")
    summary = train(res, progress=False, log=lambda *a: None)
    return {"run": run, "summary": summary, "cfg": res.cfg}


def test_training_lowers_the_validation_mel_loss_and_logs_audio(trained):
    s = trained["summary"]
    hist = s["history"]
    assert [h["step"] for h in hist] == [0, 16] and s["stopped"] is None and s["skipped"]["steps"] == 0
    assert json.loads(json.dumps(s))["validations"][-1]["step"] == 16  # the demo writes it as summary.json
    assert hist[-1]["mel_l1"] < 0.8 * hist[0]["mel_l1"], hist
    run = trained["run"]
    assert (run / "checkpoints" / "best.pt").is_file() and (run / "config.yaml").is_file()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "logs"), size_guidance={"audio": 0, "images": 0}).Reload()
    tags = acc.Tags()
    assert "synth/0/audio" in tags["audio"]  # through the vocoder (no "_griffinlim" suffix)
    assert {"val/alignment_mas", "synth/0/mel", "synth/0/alignment", "lr_schedule"} <= set(tags["images"])
    assert (run / "lr_schedule.png").is_file()
    assert {"val/mel_l1", "train/loss", "train/data_wait_fraction"} <= set(tags["scalars"])
    # the eval items spoken free-running against their recordings (tts.clone.evaluation.synthesis_metrics)
    synth = {"mcd", "f0_rmse", "f0_median_error", "f0_gross_error", "vuv_error", "periodicity"} | ({"speaker_sim"} if resemblyzer_weights() else set())
    assert {f"val/{k}" for k in synth} <= set(tags["scalars"]) and synth <= set(hist[-1])
    assert 0.0 <= hist[-1]["vuv_error"] <= 1.0 and hist[-1]["mcd"] > 0


def test_resume_is_bitwise_exact(corpus, tmp_path):
    extra = ("--set", "train.max_updates=6", "--set", "train.val_check_interval=100", "--set", "train.save_interval=100",
             "--set", "val.at_start=false")
    straight = train(resolved(corpus, tmp_path / "a", *extra), progress=False, log=lambda *a: None)
    half = train(resolved(corpus, tmp_path / "b", *extra), progress=False, log=lambda *a: None, stop_at_step=3)
    assert half["step"] == 3 and half["stopped"] == "stop_at_step"
    resumed = train(resolved(corpus, tmp_path / "b", *extra), resume="auto", progress=False, log=lambda *a: None)
    assert straight["step"] == resumed["step"] == 6
    a = load_checkpoint(CheckpointManager(tmp_path / "a", prefix="clone").latest())
    b = load_checkpoint(CheckpointManager(tmp_path / "b", prefix="clone").latest())
    for name, ta in a["models"]["model"].items():
        assert torch.equal(ta, b["models"]["model"][name]), name
    sa, sb = a["optimizers"]["optimizer"]["state"], b["optimizers"]["optimizer"]["state"]
    assert all(torch.equal(sa[k]["exp_avg_sq"], sb[k]["exp_avg_sq"]) for k in sa)
    assert a["schedulers"]["optimizer"]["last_epoch"] == b["schedulers"]["optimizer"]["last_epoch"] == 6


def test_init_from_loads_weights_only_into_a_new_run_and_names_mismatched_tensors(trained, corpus, tmp_path):
    source = trained["run"] / "checkpoints" / "best.pt"
    lines: list[str] = []
    res = resolved(corpus, tmp_path / "ft", "--set", "train.max_updates=3", "--set", "train.val_check_interval=3",
                   "--set", "val.at_start=false", "--set", "model.ffn_mult=3")  # the feed-forward shapes change
    s = train(res, progress=False, log=lines.append, init_from=str(source))
    report = next(line for line in lines if line.startswith("init_from:"))
    src = load_checkpoint(source)["models"]["model"]
    own = VoiceCloneTTS(res.cfg.model, len(SYMBOLS), 80).state_dict()
    differ = sorted(k for k in own if own[k].shape != src[k].shape)
    assert differ and all(".ffn." in k for k in differ), differ
    assert f"init_from: loaded {len(own) - len(differ)} tensors" in report
    assert f"re-initialised (shape differs): {len(differ)}" in report
    for k in differ:  # each named, with both shapes
        assert f"{k}: checkpoint {tuple(src[k].shape)} vs model {tuple(own[k].shape)}" in report
    # a new run: fresh optimizer and step counter, no inherited history
    assert s["step"] == 3 and [h["step"] for h in s["history"]] == [3]
    new = load_checkpoint(CheckpointManager(tmp_path / "ft", prefix="clone").latest())
    assert new["counters"]["step"] == 3
    assert {float(v["step"]) for v in new["optimizers"]["optimizer"]["state"].values()} == {3.0}


def test_init_from_refuses_pickled_code_and_foreign_files(corpus, tmp_path, capsys):
    evil = tmp_path / "evil.pt"
    torch.save({"models": {"model": {}}, "payload": Path("x")}, evil)  # any non-tensor object needs pickle
    foreign = tmp_path / "foreign.pt"
    torch.save({"state_dict": {"w": torch.zeros(2)}}, foreign)
    assert main(clone_argv(corpus, tmp_path / "a", "--init_from", str(evil))) == 2
    assert "weights_only=True" in capsys.readouterr().err
    assert main(clone_argv(corpus, tmp_path / "b", "--init_from", str(foreign))) == 2
    assert "no 'model' weights" in capsys.readouterr().err


def _nan_losses(monkeypatch, bad_calls):
    """Training-mode loss calls whose number is in bad_calls return NaN (validation is untouched)."""
    original = VoiceCloneTTS.losses
    calls = {"n": 0}

    def losses(self, out, batch, weights):
        result = original(self, out, batch, weights)
        if self.training:
            calls["n"] += 1
            if bad_calls(calls["n"]):
                result["loss"] = result["loss"] * float("nan")
        return result

    monkeypatch.setattr(VoiceCloneTTS, "losses", losses)


def test_nonfinite_steps_are_skipped_and_counted(corpus, tmp_path, monkeypatch):
    _nan_losses(monkeypatch, lambda n: n in (2, 3))
    s = train(resolved(corpus, tmp_path / "r", "--set", "train.max_updates=5", "--set", "train.val_check_interval=100",
                       "--set", "val.at_start=false"),
              progress=False, log=lambda *a: None)
    assert s["stopped"] is None and s["step"] == 5 and s["skipped"]["steps"] == 2
    state = load_checkpoint(CheckpointManager(tmp_path / "r", prefix="clone").latest())
    assert all(torch.isfinite(v).all() for v in state["models"]["model"].values() if v.is_floating_point())


def test_repeated_nonfinite_steps_stop_with_the_last_good_checkpoint_intact(corpus, tmp_path, monkeypatch):
    _nan_losses(monkeypatch, lambda n: n >= 5)
    lines = []
    s = train(resolved(corpus, tmp_path / "r", "--set", "train.max_updates=20", "--set", "train.val_check_interval=100",
                       "--set", "train.save_interval=2", "--set", "train.max_nonfinite=3", "--set", "val.at_start=false"),
              progress=False, log=lines.append)
    # the third bad step is counted, then the streak is judged when the device's counters are read (at the log)
    assert s["stopped"] == "non-finite" and s["skipped"]["steps"] == 3 and s["step"] == 7
    assert any("consecutive" in str(x) for x in lines)
    manager = CheckpointManager(tmp_path / "r", prefix="clone")
    # nothing is written during a non-finite streak: the last checkpoint is step 4, not step 6 after 2 skips
    assert [step for step, _ in manager.checkpoints()][-1] == 4
    assert s["last_good"] == str(manager.latest()) and any(f"last good checkpoint: {manager.latest()}" in str(x)
                                                             for x in lines)
    latest = load_checkpoint(manager.latest())
    for v in latest["models"]["model"].values():
        assert torch.isfinite(v).all() if v.is_floating_point() else True


def test_data_check_skips_and_reports_bad_rows(corpus, tmp_path):
    rows = [json.loads(x) for x in (corpus / "train.jsonl").read_text(encoding="utf-8").splitlines()]
    for r in rows:
        r["wav"] = str(corpus / r["wav"])
    bad = [dict(rows[0], id="missing", wav=str(tmp_path / "nope.wav")),
           dict(rows[1], id="silent", wav=str(tmp_path / "silent.wav")),
           dict(rows[2], id="cyrillic", text="привет", raw_text="\u2603\u2603")]
    save_wav(tmp_path / "silent.wav", np.zeros(22050, np.float32), 22050)
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows[:3] + bad) + "\n{not json\n",
                        encoding="utf-8")
    audio = AudioConfig(22050, 1024, 1024, 256, 80, 40.0, 8000.0)
    log: list[str] = []
    items = build_features(manifest, audio, DataConfig(), tmp_path / "cache", 1, log.append)
    assert [i["id"] for i in items] == [r["id"] for r in rows[:3]]
    text = "\n".join(log)
    assert "[missing]: audio file not found" in text and "[silent]: audio silent" in text
    assert "[cyrillic]: " in text and "not valid JSON" in text
    only_bad = tmp_path / "bad.jsonl"
    only_bad.write_text(json.dumps(bad[0]) + "\n")
    with pytest.raises(DataError, match="nothing usable"):
        build_features(only_bad, audio, DataConfig(), tmp_path / "cache", 1, log.append)


def test_the_feature_cache_reports_its_f0_and_is_keyed_by_the_extractor_and_its_weights(corpus, tmp_path):
    """build_features writes the f0 report (speech/f0_report.py) into the cache folder and logs it, with the
    cloning keys in its warning; the extractor and rmvpe's weights (by content) are part of the cache's name,
    and a bad audio.f0_method / audio.f0_weights is one DataError before any file."""
    import dataclasses
    import hashlib

    from speech.f0 import F0_METHODS
    from tests.speech.test_rmvpe import stand_in
    from tts.clone.data import features_tag

    rows = [json.loads(x) for x in (corpus / "train.jsonl").read_text(encoding="utf-8").splitlines()][:2]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps(dict(r, wav=str(corpus / r["wav"])), ensure_ascii=False) + "\n"
                                for r in rows), encoding="utf-8")
    audio = AudioConfig(22050, 1024, 1024, 256, 80, 40.0, 8000.0, f0_min=40.0, f0_max=1000.0, f0_method="parselmouth")
    log: list[str] = []
    build_features(manifest, audio, DataConfig(), tmp_path / "cache", 1, log.append)
    cache = tmp_path / "cache" / features_tag(audio)
    found = json.loads((cache / "m_f0.json").read_text())
    assert found["f0_method"] == "parselmouth" and found["voiced_fraction"] > 0.3 and found["cut"] == []
    assert (cache / "m_f0.png").stat().st_size > 1000 and (cache / "m_f0.txt").read_text().splitlines() == log[-1:]
    assert log[-1].startswith("f0 (parselmouth, f0_min 40 Hz, f0_max 1000 Hz): ")
    low = dataclasses.replace(audio, f0_max=0.9 * found["p50"])  # a bound inside the voice's range
    build_features(manifest, low, DataConfig(), tmp_path / "cache", 1, log.append)
    assert log[-1].startswith(f"WARNING: f0_max={low.f0_max:g} Hz cuts a voice off") and "train again with --set " \
        f"audio.f0_max={json.loads((tmp_path / 'cache' / features_tag(low) / 'm_f0.json').read_text())['suggest']['f0_max']}" \
        in log[-1]
    # the cache's identity: a cache made before f0_weights existed keeps its name; the extractor and the weights'
    # content (not their path) change it
    old = {k: v for k, v in dataclasses.asdict(audio).items() if k != "f0_weights"}
    assert features_tag(audio) == "feat_" + hashlib.sha1(json.dumps(old, sort_keys=True).encode()).hexdigest()[:10]
    a, b = stand_in(tmp_path / "a.onnx", f0=180.0), stand_in(tmp_path / "b.onnx", f0=300.0)
    (tmp_path / "moved.onnx").write_bytes(a.read_bytes())
    tags = {m: features_tag(dataclasses.replace(audio, f0_method=m, f0_weights=str(a) if m == "rmvpe" else ""))
            for m in F0_METHODS}
    assert len(set(tags.values())) == len(F0_METHODS)
    assert features_tag(dataclasses.replace(audio, f0_method="rmvpe", f0_weights=str(tmp_path / "moved.onnx"))) \
        == tags["rmvpe"] != features_tag(dataclasses.replace(audio, f0_method="rmvpe", f0_weights=str(b)))
    rm = dataclasses.replace(audio, f0_method="rmvpe", f0_weights=str(a))
    items = build_features(manifest, rm, DataConfig(), tmp_path / "cache", 1, log.append)
    with np.load(items[0]["path"]) as z:
        assert z["voiced"].mean() > 0.3 and np.abs(z["f0"][z["voiced"]] - 180).max() < 0.1
    assert json.loads((tmp_path / "cache" / tags["rmvpe"] / "m_f0.json").read_text())["f0_weights_sha256"]
    for change, words in (({"f0_method": "swipe"}, "audio.f0_method: unknown f0 extractor 'swipe'"),
                          ({"f0_method": "rmvpe"}, "audio.f0_weights: the f0 extractor rmvpe needs its weights"),
                          ({"f0_weights": str(a)}, "audio.f0_weights is set but audio.f0_method is 'parselmouth'")):
        with pytest.raises(DataError, match=words):
            build_features(manifest, dataclasses.replace(audio, **change), DataConfig(), tmp_path / "x", 1, log.append)
    assert not (tmp_path / "x").exists()


def test_bad_reference_clips_are_refused_with_a_clear_reason(tmp_path):
    audio, data = AudioConfig(22050, 1024, 1024, 256, 80, 40.0, 8000.0), DataConfig()
    t = np.arange(22050 * 2) / 22050
    save_wav(tmp_path / "short.wav", 0.3 * np.sin(2 * np.pi * 150 * t[:6000]), 22050)
    save_wav(tmp_path / "silent.wav", np.zeros(44100, np.float32), 22050)
    (tmp_path / "text.wav").write_text("this is not audio")
    cases = {"short.wav": "too short", "silent.wav": "silent", "text.wav": "not readable as audio",
             "missing.wav": "file not found"}
    for name, reason in cases.items():
        with pytest.raises(DataError, match=reason) as e:
            load_reference(tmp_path / name, audio, data)
        assert name in str(e.value) and "give" in str(e.value)
    t44 = np.arange(44100 * 2) / 44100
    sf.write(tmp_path / "ok.flac", 0.3 * np.sin(2 * np.pi * 150 * t44), 44100)  # any format and rate
    ref = load_reference(tmp_path / "ok.flac", audio, data)
    assert ref.mel.shape[:2] == (1, 80) and ref.mel.shape[2] == 2 * 22050 // 256 and ref.seconds == 2.0


def test_infer_clone_speaks_through_a_fresh_tiny_vocoder(trained, corpus, vocoder_dir, tmp_path, capsys):
    ckpt = trained["run"] / "checkpoints" / "best.pt"
    ref = sorted((corpus / "wavs").glob("*.wav"))[0]
    out = tmp_path / "out.wav"
    rc = infer_clone.main(["--checkpoint", str(ckpt), "--reference", str(ref), "--text", "Бугун ҳаво яхши, 25 daraja.",
                           "--vocoder", str(vocoder_dir), "--output", str(out), "--device", "cpu"])
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    assert "RTF" in printed.out
    wav, sr = sf.read(out)
    assert sr == 22050 and len(wav) > 0 and len(wav) % 256 == 0 and np.isfinite(wav).all()
    # the model's mel settings must equal the vocoder's: a mismatch is refused by name
    info = json.loads((vocoder_dir / "config.json").read_text())
    other = tmp_path / "voc64"
    other.mkdir()
    shutil.copy(vocoder_dir / "model.ckpt", other / "model.ckpt")
    (other / "config.json").write_text(json.dumps(dict(info, fmax=7000)))
    rc = infer_clone.main(["--checkpoint", str(ckpt), "--reference", str(ref), "--text", "Salom.",
                           "--vocoder", str(other), "--output", str(tmp_path / "x.wav"), "--device", "cpu"])
    err = capsys.readouterr().err
    assert rc == 2 and "fmax: vocoder 7000.0 vs model 8000.0" in err
    rc = infer_clone.main(["--checkpoint", str(ckpt), "--reference", str(tmp_path / "none.wav"), "--text", "Salom.",
                           "--vocoder", str(vocoder_dir), "--output", str(tmp_path / "y.wav"), "--device", "cpu"])
    assert rc == 2 and "file not found" in capsys.readouterr().err


def test_a_signal_on_another_rank_stops_this_one_at_the_same_step(corpus, tmp_path, monkeypatch):
    """The stop decision goes through any_rank: when another DDP rank was signalled (any_rank says
    True though this rank saw nothing), this rank stops too, at that step, with a checkpoint."""
    import common.stopping as stopping

    monkeypatch.setattr(stopping, "any_rank", lambda flag: True)
    extra = ("--set", "train.max_updates=6", "--set", "train.val_check_interval=100", "--set", "val.at_start=false")
    summary = train(resolved(corpus, tmp_path / "r", *extra), progress=False, log=lambda *a: None)
    assert summary["stopped"] == "signal" and summary["step"] == 1
    assert CheckpointManager(tmp_path / "r", prefix="clone").latest() is not None


def test_teacher_forced_mels_have_the_frames_the_vocoder_prepares(trained, corpus, tmp_path, capsys):
    """tts/infer_clone.py --teacher_forced writes one mel per utterance that vocoder/prepare_data.py --mel_dir
    takes as it is: every file usable, the same frame count as the prepared audio, the settings recorded."""
    from speech.mel_files import read_mel_settings
    from tts.clone.data import read_manifest
    from vocoder.prepare_data import main as vocoder_prepare

    out = tmp_path / "gta"
    argv = ["--teacher_forced", "--checkpoint", str(trained["run"] / "checkpoints" / "best.pt"), "--data", str(corpus),
            "--output", str(out), "--device", "cpu"]
    assert infer_clone.main(argv) == 0
    rows = [r for m in ("train.jsonl", "eval.jsonl") for r in read_manifest(corpus / m)[0]]
    mels = {p.stem: np.load(p) for p in out.glob("*.npy")}
    assert set(mels) == {Path(r["wav"]).stem for r in rows}
    assert read_mel_settings(out) == trained["cfg"].audio.mel_kwargs
    assert infer_clone.main(argv) == 2 and "--overwrite" in capsys.readouterr().err
    assert infer_clone.main([*argv, "--overwrite"]) == 0
    # a flag of the other mode is refused, not ignored
    with pytest.raises(SystemExit) as exit_:
        infer_clone.main([*argv, "--overwrite", "--text", "Salom.", "--length-scale", "1.2"])
    assert exit_.value.code == 2 and "--text, --length-scale do nothing with --teacher_forced" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        infer_clone.main(["--checkpoint", "x.pt", "--reference", "r.wav", "--text", "a", "--data", str(corpus)])
    assert "--data does nothing without --teacher_forced" in capsys.readouterr().err
    for name, mel in mels.items():  # eval mode and a fixed reference per utterance: the same mels again
        np.testing.assert_array_equal(np.load(out / f"{name}.npy"), mel)
    demo_yaml = Path(__file__).resolve().parents[2] / "vocoder" / "configs" / "demo.yaml"
    rc = vocoder_prepare(["--config", str(demo_yaml), "--input", str(corpus / "wavs"), "--output", str(tmp_path / "bin"),
                          "--mel_dir", str(out), "--num_workers", "0", "--set", "val_num=1"])
    assert rc == 0
    items = json.loads((tmp_path / "bin" / "manifest.json").read_text())["items"]
    assert len(items) == len(rows)
    for item in items.values():
        source = Path(item["source"])
        assert item["frames"] == mels[source.stem].shape[1] == sf.info(str(source)).frames // 256


def test_a_damaged_feature_cache_file_is_made_again_on_resume_and_named_when_read(corpus, tmp_path, capsys):
    """A cached feature file damaged after it was written (garbage, cut short, a NaN in its mel): the next
    start (a resume) makes it again with one line naming it, and training goes on; one damaged while the run
    trains is named in one line (exit 2) when it is read, not a traceback or a divergence."""
    from common.prepared import PreparedFileError
    from tts.clone.data import CloneDataset, cache_problem

    cache, run = tmp_path / "cache", tmp_path / "run"
    fast = ("--set", f"data.cache_dir={cache}", "--set", "train.val_check_interval=100",
            "--set", "train.save_interval=100", "--set", "val.at_start=false")
    assert main(clone_argv(corpus, run, *fast, "--set", "train.max_updates=4")) == 0
    files = sorted(cache.rglob("*.npz"))
    files[0].write_bytes(np.random.default_rng(0).bytes(300))
    files[1].write_bytes(files[1].read_bytes()[: files[1].stat().st_size // 2])
    with np.load(files[2]) as z:
        arrays = dict(z)
    arrays["mel"][0, 0] = np.nan
    np.savez(files[2], **arrays)
    capsys.readouterr()
    assert main(clone_argv(corpus, run, *fast, "--set", "train.max_updates=6", "--resume", "auto")) == 0
    out = capsys.readouterr().out
    for f in files[:3]:
        assert f"damaged cached features {f} " in out
    assert not [line for line in out.splitlines() if line.startswith("skipped ")]  # made again, not dropped
    audio = AudioConfig(22050, 1024, 1024, 256, 80, 40.0, 8000.0)
    assert all(cache_problem(f, audio) is None for f in files)
    items = [{"id": f.stem, "speaker": "s", "path": str(f), "frames": 1, "n_text": 1} for f in files[:2]]
    files[0].write_bytes(b"garbage")
    with pytest.raises(PreparedFileError, match=f"^prepared file {files[0]} is damaged .*--resume auto"):
        CloneDataset(items, 16)[0]


def test_loader_workers_live_across_epochs_and_change_no_batch(corpus, tmp_path):
    """One training loader for the run, its 2 workers kept from epoch to epoch (a loader per epoch started
    them again every epoch: 44 % data wait on a lent H200 with 3 batches an epoch), and the weights after
    6 steps over several epochs are bitwise those of a run without workers: no item depends on a worker."""
    from tts.clone.train import CloneTrainer

    extra = ("--set", "train.max_updates=6", "--set", "train.val_check_interval=100", "--set", "train.save_interval=100",
             "--set", "val.at_start=false")
    plain = train(resolved(corpus, tmp_path / "a", *extra), progress=False, log=lambda *a: None)
    workers = train(resolved(corpus, tmp_path / "b", *extra, "--num-workers", "2"), progress=False, log=lambda *a: None)
    assert plain["step"] == workers["step"] == 6
    a = load_checkpoint(CheckpointManager(tmp_path / "a", prefix="clone").latest())["models"]["model"]
    b = load_checkpoint(CheckpointManager(tmp_path / "b", prefix="clone").latest())["models"]["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    tr = CloneTrainer(resolved(corpus, tmp_path / "c", *extra, "--num-workers", "2"), log=lambda *a: None)
    assert tr.steps_per_epoch < 6  # the run above crossed epochs
    first = tr.data.epoch_loader(0, 0, 0)
    next(iter(first))
    assert tr.data.epoch_loader(1, 0, 0) is first and first.persistent_workers
