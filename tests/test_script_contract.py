"""A full disk outside checkpoint saves (issue 28 item 2): every script that writes files goes through
`common.atomic_write`, so with the writer patched to fill the disk part-way each one exits 2 with
"disk full while writing FILE: N MiB free", no traceback, and no partial or temp file left behind.
The helper itself is tested first (old content kept, temp removed, EDQUOT, folders, devices)."""

from __future__ import annotations

import errno
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from PIL import Image

from common.atomic_write import DiskFullError, atomic_output, remove_stale_temp_folders, write_text
from common.checkpoint import save_atomic
from common.config import config_to_dict, load_config
from tests.tts.test_vits_train import TINY_YAML as VITS_TINY
from tests.tts.test_vits_train import _corpus
from tests.vae.helpers import write_images
from tests.vocoder.conftest import tiny_config, write_tones

FULL = OSError(errno.ENOSPC, "No space left on device")


def _partial_then_full(dest) -> None:
    """What a writer does when the disk fills: some bytes reach the file, then ENOSPC."""
    if hasattr(dest, "write"):
        dest.write(b"\0" * 64)
    else:
        with open(dest, "wb") as f:
            f.write(b"\0" * 64)
    raise OSError(FULL.errno, FULL.strerror)


def _leftovers(root: Path) -> list[str]:
    """Temp files / folders of an atomic write anywhere under `root`."""
    return sorted(str(p) for p in root.rglob("*") if re.search(r"\.tmp(\d+)?$", p.name))


# ------------------------------------------------------------------------------------------- the helper
def test_a_full_disk_keeps_the_old_file_and_leaves_no_temp(tmp_path):
    target = tmp_path / "report.json"
    write_text(target, "old")
    for code in (errno.ENOSPC, errno.EDQUOT):
        with pytest.raises(DiskFullError, match=rf"^disk full while writing {re.escape(str(target))}: \d+ MiB free$"):
            with atomic_output(target) as tmp:
                tmp.write_bytes(b"new, half")
                raise OSError(code, os.strerror(code))
        assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]
    with pytest.raises(ValueError, match="a bug"):  # any other error: the temp goes too, the error stays
        with atomic_output(target) as tmp:
            tmp.write_bytes(b"x")
            raise ValueError("a bug")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]


def test_a_folder_appears_whole_and_stale_temp_folders_of_dead_processes_go(tmp_path):
    item = tmp_path / "items" / "a"
    with atomic_output(item, folder=True) as tmp:
        (tmp / "mel.npy").write_bytes(b"1")
        assert not item.exists() and tmp.name == f"a.tmp{os.getpid()}"
    assert (item / "mel.npy").read_bytes() == b"1"
    with pytest.raises(DiskFullError):
        with atomic_output(item, folder=True) as tmp:
            (tmp / "mel.npy").write_bytes(b"2")
            raise OSError(errno.ENOSPC, "full")
    assert (item / "mel.npy").read_bytes() == b"1" and _leftovers(tmp_path) == []

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / "items" / f"b.tmp{int(dead.stdout)}").mkdir()  # left by a process that is gone
    (tmp_path / "items" / f"c.tmp{os.getppid()}").mkdir()  # a live process's unfinished item
    lines: list[str] = []
    assert [p.name for p in remove_stale_temp_folders(tmp_path / "items", log=lines.append)] == [f"b.tmp{int(dead.stdout)}"]
    assert (tmp_path / "items" / f"c.tmp{os.getppid()}").is_dir() and len(lines) == 1


def test_a_device_is_written_in_place_never_replaced():
    if not Path("/dev/null").exists():
        pytest.skip("no /dev/null")
    write_text("/dev/null", "x")
    assert Path("/dev/null").is_char_device()


def test_a_checkpoint_save_says_the_earlier_ones_are_intact(tmp_path, monkeypatch):
    monkeypatch.setattr(torch, "save", lambda obj, f, *a, **k: _partial_then_full(f))
    with pytest.raises(DiskFullError, match=r"MiB free; earlier checkpoints are intact$"):
        save_atomic({"w": 1}, tmp_path / "model_00000001.pt")
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------------- every script
@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    """Small inputs and models for every script: audio, a TTS corpus, images, a vocoder, VITS, cloning and
    VAE checkpoints (random weights: only the writing is tested)."""
    from tts.clone.config import CloneConfig
    from tts.clone.model import VoiceCloneTTS
    from tts.text import SYMBOLS
    from tts.text.phonemes import Frontend
    from tts.vits.config import TrainConfig
    from tts.vits.model import VITS
    from vae.diffusers_io import save_diffusers
    from vae.model import build_vae
    from vocoder.prepare_data import prepare
    from vocoder.train import VocoderTrainer

    root = tmp_path_factory.mktemp("disk_full")
    write_tones(root / "wavs", 3, 22050)
    prepare(tiny_config(), [root / "wavs"], root / "vocoder_bin", num_workers=0, log=lambda *a: None)
    VocoderTrainer(tiny_config("max_updates=1"), root / "vocoder_bin", root / "vocoder_run", device="cpu",
                   log=lambda *a, **k: None).fit()
    write_images(root / "images", 3, size=48)
    _corpus(root / "tts", ["anna"])
    torch.manual_seed(0)
    cfg = load_config(VITS_TINY, TrainConfig)
    vits = VITS(len(Frontend.of(cfg).symbols), cfg.audio.n_fft // 2 + 1, 1, cfg.args(), cfg.audio.hop_length)
    save_atomic({"models": {"generator": vits.state_dict()}, "config": config_to_dict(cfg),
                 "extra": {"speakers": {"anna": 0}}}, root / "vits.pt")
    ccfg = CloneConfig()
    ccfg.model.size, ccfg.audio.n_mels = "tiny", 80
    clone = VoiceCloneTTS(ccfg.model, len(SYMBOLS), 80)
    save_atomic({"models": {"model": clone.state_dict()}, "config": config_to_dict(ccfg)}, root / "clone.pt")
    save_diffusers(build_vae({"channels": [8, 16], "z_channels": 4, "layers_per_block": 1, "norm_num_groups": 4}),
                   root / "vae")
    return {"root": root, "wavs": root / "wavs", "tts": root / "tts" / "prepared", "images": root / "images",
            "vocoder": root / "vocoder_run" / "checkpoints" / "model_00000001.pt", "vits": root / "vits.pt",
            "clone": root / "clone.pt", "vae": root / "vae"}


def _patch_soundfile_object(m) -> None:
    m.setattr(sf.SoundFile, "write", lambda self, data: _partial_then_full(self.name))


# case -> (the writer it uses, patched to fill the disk; the command; the file the message names)
def _cases(i: dict[str, Path], out: Path) -> dict[str, tuple[Callable, Callable[[], int], str]]:
    from tts import export_onnx, synthesize
    from tts import prepare_data as tts_prepare
    from tts.clone import export_onnx as clone_export
    from vae import prepare_data as vae_prepare
    from vae import reconstruct
    from vocoder import export, infer
    from vocoder import prepare_data as voc_prepare

    corpus = i["tts"].parent  # metadata.csv + audio/
    return {
        "vocoder/prepare_data.py": (
            lambda m: m.setattr(np, "save", lambda f, arr, *a, **k: _partial_then_full(f)),
            lambda: voc_prepare.main(["--input", str(i["wavs"]), "--output", str(out), "--num_workers", "0",
                                      *sum((["--set", s] for s in ("binarization_args.num_workers=0",)), [])]),
            r"items/\S+"),
        "tts/prepare_data.py": (
            lambda m: m.setattr(sf, "write", lambda f, *a, **k: _partial_then_full(f)),
            lambda: tts_prepare.main(["--metadata", str(corpus / "metadata.csv"), "--audio_dir", str(corpus / "audio"),
                                      "--output_dir", str(out), "--num_workers", "1", "--no_trim"]),
            r"wavs/\S+\.wav"),
        "vae/prepare_data.py": (
            lambda m: m.setattr(Image.Image, "save", lambda self, fp, *a, **k: _partial_then_full(fp)),
            lambda: vae_prepare.main(["--mode", "preprocess", "--input_dir", str(i["images"]), "--output_dir",
                                      str(out), "--num_workers", "1", "--target_size", "32", "--min_size", "8"]),
            r"images/\S+\.png"),
        "vocoder/infer.py": (lambda m: m.setattr(sf, "write", lambda f, *a, **k: _partial_then_full(f)),
                             lambda: infer.main(["--model", str(i["vocoder"]), "--input", str(i["wavs"]),
                                                 "--output", str(out), "--device", "cpu"]),
                             r"\S+\.wav"),
        "vocoder/export.py": (lambda m: m.setattr(torch, "save", lambda obj, f, *a, **k: _partial_then_full(f)),
                              lambda: export.main(["--ckpt", str(i["vocoder"]), "--out", str(out)]),
                              r"model\.ckpt"),  # and no claim about checkpoints: an export is not one
        "tts/synthesize.py --out": (_patch_soundfile_object,
                                    lambda: synthesize.main(["--checkpoint", str(i["vits"]), "--text", "salom dunyo",
                                                             "--out", str(out / "s.wav")]),
                                    r"s\.wav"),
        "tts/export_onnx.py": (lambda m: m.setattr(torch.onnx, "export", lambda mod, args, f, **k: _partial_then_full(f)),
                               lambda: export_onnx.main(["--checkpoint", str(i["vits"]), "--out", str(out / "m.onnx"),
                                                         "--no_check"]),
                               r"m\.onnx"),
        "tts/export_clone_onnx.py": (
            lambda m: m.setattr(torch.onnx, "export", lambda mod, args, f, **k: _partial_then_full(f)),
            lambda: clone_export.main(["--checkpoint", str(i["clone"]), "--out", str(out / "c.onnx"), "--no_check"]),
            r"c\.onnx"),
        "vae/reconstruct.py": (
            lambda m: m.setattr(Image.Image, "save", lambda self, fp, *a, **k: _partial_then_full(fp)),
            lambda: reconstruct.main(["--checkpoint", str(i["vae"]), "--input", str(i["images"]),
                                      "--output", str(out), "--device", "cpu"]),
            r"\S+\.png"),
    }


CASES = ["vocoder/prepare_data.py", "tts/prepare_data.py", "vae/prepare_data.py", "vocoder/infer.py",
         "vocoder/export.py", "tts/synthesize.py --out", "tts/export_onnx.py", "tts/export_clone_onnx.py", "vae/reconstruct.py"]


@pytest.mark.parametrize("case", CASES)
def test_a_full_disk_is_one_line_exit_2_and_no_partial_file(case, inputs, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    fill_disk, command, names = _cases(inputs, out)[case]
    if case == "vocoder/prepare_data.py":  # an unfinished item of an earlier, killed prepare: removed at start
        dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
        (out / "items" / f"old.tmp{int(dead.stdout)}").mkdir(parents=True)
    with monkeypatch.context() as m:
        fill_disk(m)
        rc = command()
    text = "".join(capsys.readouterr())
    assert rc == 2, text[-2000:]
    errors = [ln for ln in text.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in text, text[-2000:]
    assert re.fullmatch(rf"error: disk full while writing {re.escape(str(out))}/{names}: \d+ MiB free", errors[0]), errors
    written = Path(errors[0].split("writing ", 1)[1].rsplit(": ", 1)[0])
    assert not written.exists(), written  # no partial file (or item folder)
    assert _leftovers(tmp_path) == []


def test_the_cloning_feature_cache_on_a_full_disk(inputs, tmp_path, monkeypatch, capsys):
    from tests.test_run_contract import TRAINERS

    t = TRAINERS["clone"]
    real = Path.write_bytes

    def write_bytes(self, data):
        return _partial_then_full(self) if ".npz." in self.name else real(self, data)

    monkeypatch.setattr(Path, "write_bytes", write_bytes)
    assert t.main(t.argv(inputs, tmp_path / "run", 1)) == 2
    err = capsys.readouterr().err
    assert re.fullmatch(r"error: disk full while writing \S+\.npz: \d+ MiB free", err.strip()), err
    cache = inputs["tts"].parent / "clone_cache"
    assert not list(cache.rglob("*.npz")) and _leftovers(cache) == []


# ------------------------------------------------------------------------------ outputs never replaced silently
def _one_error(capsys) -> str:
    text = "".join(capsys.readouterr())
    errors = [ln for ln in text.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in text, text[-2000:]
    return errors[0]


def test_an_existing_output_file_is_replaced_only_with_overwrite(inputs, tmp_path, capsys):
    from tts import export_onnx, infer_clone, synthesize
    from tts.clone import export_onnx as clone_export

    missing = str(tmp_path / "missing.pt")  # refused before any model is loaded
    for name, main, argv in (
            ("s.wav", synthesize.main, ["--checkpoint", str(inputs["vits"]), "--text", "salom", "--out"]),
            ("c.wav", infer_clone.main, ["--checkpoint", missing, "--reference", missing, "--text", "salom", "--output"]),
            ("m.onnx", export_onnx.main, ["--checkpoint", missing, "--no_check", "--out"]),
            ("c.onnx", clone_export.main, ["--checkpoint", missing, "--no_check", "--out"])):
        out = tmp_path / name
        out.write_bytes(b"an earlier result")
        assert main([*argv, str(out)]) == 2, name
        assert _one_error(capsys) == (f"error: --out{'put' if name == 'c.wav' else ''} {out} already exists; "
                                      "pass --overwrite to replace it, or choose another name")
        assert out.read_bytes() == b"an earlier result"
    # with --overwrite the new result replaces it
    out = tmp_path / "s.wav"
    assert synthesize.main(["--checkpoint", str(inputs["vits"]), "--text", "salom", "--out", str(out), "--overwrite"]) == 0
    assert sf.info(str(out)).frames > 0
    onnx = tmp_path / "m.onnx"
    (tmp_path / "m.onnx.json").write_text("{}")
    assert export_onnx.main(["--checkpoint", str(inputs["vits"]), "--out", str(onnx), "--no_check"]) == 2
    assert "m.onnx already exists" in _one_error(capsys)
    assert export_onnx.main(["--checkpoint", str(inputs["vits"]), "--out", str(onnx), "--no_check", "--overwrite"]) == 0
    assert onnx.stat().st_size > 1000 and (tmp_path / "m.onnx.json").read_text() != "{}"


def test_vocoding_or_reconstructing_again_into_a_used_folder_needs_overwrite(inputs, tmp_path, capsys):
    """vocoder/infer.py and vae/reconstruct.py wrote over the wavs / images of an earlier run without a word."""
    from vae import reconstruct
    from vocoder import infer

    for main, argv, name in (
            (infer.main, ["--model", str(inputs["vocoder"]), "--input", str(inputs["wavs"]), "--device", "cpu"],
             f"{sorted(inputs['wavs'].glob('*.wav'))[0].stem}.wav"),
            (reconstruct.main, ["--checkpoint", str(inputs["vae"]), "--input", str(inputs["images"]), "--device", "cpu"],
             f"{sorted(inputs['images'].iterdir())[0].stem}.png")):
        out = tmp_path / main.__module__.replace(".", "_")
        out.mkdir()
        (out / name).write_bytes(b"an earlier result")
        assert main([*argv, "--output", str(out)]) == 2, main.__module__
        assert _one_error(capsys) == (f"error: --output {out / name} already exists; pass --overwrite to replace "
                                      "it, or choose another name")
        assert (out / name).read_bytes() == b"an earlier result"
        assert main([*argv, "--output", str(out), "--overwrite"]) == 0, main.__module__
        assert (out / name).read_bytes() != b"an earlier result"


def test_preparing_again_with_other_settings_is_refused_without_overwrite(inputs, tmp_path, capsys):
    from tests.vocoder.conftest import TINY_YAML
    from tts import prepare_data as tts_prepare
    from vae import prepare_data as vae_prepare
    from vocoder import prepare_data as voc_prepare

    corpus = inputs["tts"].parent
    runs = {
        "vocoder": (voc_prepare.main, ["--config", str(TINY_YAML), "--input", str(inputs["wavs"]), "--num_workers",
                                       "0", "--output"],
                    ["--set", "fmax=7000"], "manifest.json", "--output"),
        "tts": (tts_prepare.main, ["--metadata", str(corpus / "metadata.csv"), "--audio_dir", str(corpus / "audio"),
                                   "--num_workers", "1", "--output_dir"], ["--set", "audio.fmax=7000"],
                "prepare_state.json", "--output_dir"),
        "vae": (vae_prepare.main, ["--mode", "preprocess", "--input_dir", str(inputs["images"]), "--num_workers", "1",
                                   "--min_size", "8", "--output_dir"], ["--target_size", "16"], "manifest.json",
                "--output_dir"),
    }
    for name, (main, argv, other, product, flag) in runs.items():
        out = tmp_path / name
        first = [*argv, str(out)] + (["--target_size", "32"] if name == "vae" else [])
        assert main(first) == 0, name
        before = (out / product).read_bytes()
        assert main(first) == 0, name  # the same settings again: resumable, nothing refused
        capsys.readouterr()
        assert main([*argv, str(out), *other]) == 2, name
        error = _one_error(capsys)
        assert error.startswith(f"error: {flag} {out} was prepared with other settings (") and "--overwrite" in error
        assert re.search(r"\(fmax (8000\.0|None) -> 7000(\.0)?\)" if name != "vae" else r"\(target_size 32 -> 16\)",
                         error), error
        assert (out / product).read_bytes() == before and not list(out.glob("overwritten-*"))
        assert main([*argv, str(out), *other, "--overwrite"]) == 0, name
        (aside,) = out.glob("overwritten-*")
        assert (aside / product).read_bytes() == before and (out / product).read_bytes() != before


# ------------------------------------------------------------------------------ inference inputs (item 6)
def test_vocoder_infer_skips_bad_mels_vocodes_the_rest_and_exits_non_zero(inputs, tmp_path, capsys):
    from vocoder import infer

    n_mels = infer.load_vocoder(inputs["vocoder"], "cpu").n_mels
    given = tmp_path / "in"
    given.mkdir()
    good = sorted(inputs["wavs"].glob("*.wav"))[0]
    (given / "good.wav").write_bytes(good.read_bytes())
    np.savez(given / "empty.npz", mel=np.zeros((n_mels, 0), np.float32), f0=np.zeros(0, np.float32))
    np.savez(given / "nan.npz", mel=np.full((n_mels, 20), np.nan, np.float32), f0=np.full(20, 200.0, np.float32))
    (given / "text.npz").write_text("these are not the mels you are looking for\n")
    out = tmp_path / "out"
    rc = infer.main(["--model", str(inputs["vocoder"]), "--input", str(given), "--output", str(out), "--device", "cpu"])
    text = "".join(capsys.readouterr())
    assert rc == 2 and "Traceback" not in text, text
    assert sorted(p.name for p in out.iterdir()) == ["good.wav"] and sf.info(str(out / "good.wav")).frames > 0
    assert f"skipped {given / 'empty.npz'}: 0 frames: nothing to vocode" in text
    assert f"skipped {given / 'nan.npz'}: all of its {n_mels * 20} mel values are NaN or infinite" in text
    assert re.search(rf"skipped {re.escape(str(given / 'text.npz'))}: \S+: not a mel file \(", text) and "pickled" not in text
    assert f"error: 3 of 4 input file(s) could not be vocoded (reasons above); the other 1 are in {out}" in text


def test_text_with_nothing_to_say_is_refused(inputs, tmp_path, capsys):
    from tts import infer_clone, synthesize

    for text in ("🎉 👍", "😀.", ""):
        out = tmp_path / "s.wav"
        assert synthesize.main(["--checkpoint", str(inputs["vits"]), "--text", text, "--out", str(out)]) == 2, text
        assert _one_error(capsys).startswith("error: nothing to say") and not out.exists()
        missing = str(tmp_path / "missing.pt")  # refused before the model is looked for
        assert infer_clone.main(["--checkpoint", missing, "--reference", missing, "--text", text, "--output",
                                 str(out)]) == 2, text
        assert _one_error(capsys).startswith("error: nothing speakable in the text") and not out.exists()


def test_reconstruct_checks_the_output_extension_at_start(inputs, tmp_path, capsys):
    from vae import reconstruct

    image = sorted(inputs["images"].glob("*.png"))[0]
    assert reconstruct.main(["--checkpoint", str(tmp_path / "missing.pt"), "--input", str(image),
                             "--output", str(tmp_path / "x.xyz")]) == 2
    assert _one_error(capsys) == (f"error: --output {tmp_path / 'x.xyz'}: not an image file name; end it in .png "
                                  "(lossless), .webp, .jpg or .tif")


# ------------------------------------------------------------------------------ another trainer's checkpoint
def test_a_checkpoint_of_another_trainer_is_named_with_the_scripts_that_use_it(inputs, tmp_path, capsys):
    from tts import export_onnx, infer_clone, synthesize
    from tts.clone import export_onnx as clone_export
    from vae import reconstruct
    from vocoder import export, infer

    voc, vits, clone = str(inputs["vocoder"]), str(inputs["vits"]), str(inputs["clone"])
    wav, image = str(sorted(inputs["wavs"].glob("*.wav"))[0]), str(sorted(inputs["images"].glob("*.png"))[0])
    out = tmp_path / "out"
    made = {voc: "a vocoder training checkpoint (vocoder/train.py)", vits: "a VITS checkpoint (tts/train.py)",
            clone: "a voice-cloning checkpoint (tts/train_main.py)"}
    for main, given, wanted, argv in (
            (synthesize.main, voc, "a VITS checkpoint", ["--text", "salom", "--out", str(out / "s.wav")]),
            (export_onnx.main, voc, "a VITS checkpoint", ["--out", str(out / "m.onnx"), "--no_check"]),
            (infer_clone.main, vits, "a voice-cloning checkpoint",
             ["--reference", wav, "--text", "salom", "--output", str(out / "c.wav"), "--device", "cpu"]),
            (clone_export.main, voc, "a voice-cloning checkpoint", ["--out", str(out / "c.onnx"), "--no_check"]),
            (reconstruct.main, clone, "a VAE checkpoint", ["--input", image, "--output", str(out / "r.png"),
                                                           "--device", "cpu"]),
            (infer.main, vits, "a vocoder training checkpoint", ["--input", wav, "--output", str(out), "--device", "cpu"]),
            (export.main, clone, "a vocoder training checkpoint", ["--out", str(out)])):
        flag = {infer.main: "--model", export.main: "--ckpt"}.get(main, "--checkpoint")
        assert main([flag, given, *argv]) == 2, main.__module__
        error = _one_error(capsys)
        assert error.startswith(f"error: {given} is {made[given]}, not {wanted}") and "use it with " in error, error
        assert "task_cls" not in error
    assert not out.exists() or not any(out.iterdir())

