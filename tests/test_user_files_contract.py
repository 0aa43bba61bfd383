"""The user's own files are sacred (issue "Never lose a run, round 3", data lost):
1. an output folder that is, contains or lies inside an input is refused before anything is written, by all
   three prepares (exit 2, one line naming both), so no recording is replaced by its prepared copy;
2. with `--overwrite` nothing the user had is moved aside either: not by a prepare, not by a trainer whose
   run folder is (or holds, or lies in) its data folder;
3. a short write with no errno (numpy's "N requested and M written") is a full disk: the run stops with the
   one disk-full line (exit 2) instead of skipping files or a traceback;
4. what the atomic writer writes has the mode a plain open() gives (0666 & ~umask), not mkstemp's 0600;
5. no export or inference script writes its output at, around or inside what it reads (its input audio, images or
   text, its checkpoint or export folder, a reference clip): refused before anything is loaded or written."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from common import atomic_write
from common.atomic_write import DiskFullError, atomic_output, is_disk_full, write_text
from common.errors import OutputPathError
from common.run_dir import check_apart, prepare_run_dir
from tests.test_script_contract import inputs  # noqa: F401 - module fixture: tiny inputs and models of every script
from tests.vae.helpers import write_images
from tests.vocoder.conftest import voiced_tone, write_tones

TEXT = "Bugun havo juda yaxshi, biz bogʻda sayr qildik."


def _snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under `root` with its bytes (None for a folder)."""
    return {p.relative_to(root).as_posix(): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def _lj_corpus(root: Path, n: int = 3) -> Path:
    """An LJSpeech folder as users download it: metadata.csv and wavs/ at 44.1 kHz / 24 bit."""
    (root / "wavs").mkdir(parents=True)
    for i in range(n):
        sf.write(root / "wavs" / f"LJ{i:03d}.wav", voiced_tone(2.5, 44100, seed=i), 44100, subtype="PCM_24")
    (root / "metadata.csv").write_text("".join(f"LJ{i:03d}|{TEXT}\n" for i in range(n)), encoding="utf-8")
    return root


# --------------------------------------------------------------------------------------------- the rule
def test_check_apart_names_the_relation_and_both_folders(tmp_path):
    data = tmp_path / "corpus"
    (data / "wavs").mkdir(parents=True)
    (data / "metadata.csv").write_text("x|y\n")
    given = {"--audio_dir": data / "wavs", "--metadata": data / "metadata.csv"}
    for out, how in ((data / "wavs", "is"), (data, "contains"), (data / "wavs" / "prep", "is inside"),
                     (tmp_path, "contains")):
        with pytest.raises(OutputPathError, match=rf"^--output_dir {out} {how} --audio_dir .*choose a separate folder"):
            check_apart(out, "--output_dir", given)
    link = tmp_path / "link"
    link.symlink_to(data / "wavs")
    with pytest.raises(OutputPathError, match="is --audio_dir"):  # the same folder under another name
        check_apart(link, "--output_dir", given)
    with pytest.raises(OutputPathError, match=r"contains --metadata .*metadata\.csv"):  # files next to it
        check_apart(data, "--output_dir", {"--metadata": data / "metadata.csv"})
    check_apart(data / "prepared", "--output_dir", given)  # beside the recordings: fine
    check_apart(tmp_path / "out", "--output_dir", {"--audio_dir": tmp_path / "gone", "--metadata": None})
    clip = data / "wavs" / "a.wav"  # an output file that is an input file: another name beside it
    clip.write_bytes(b"a recording")
    with pytest.raises(OutputPathError, match=r"^--output \S+a\.wav is --reference .*choose another name, e\.g\. \S+/a_out\.wav "):
        check_apart(clip, "--output", {"--reference": clip}, suffix="_out")


# ----------------------------------------------------------------------------- 1 + 2: the three prepares
@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_tts_prepare_into_the_corpus_itself_is_refused_and_no_recording_changes(tmp_path, overwrite, capsys):
    from tts import prepare_data

    corpus = _lj_corpus(tmp_path / "LJSpeech-1.1")
    before = _snapshot(corpus)
    for out in (corpus, corpus / "wavs" / "prepared"):
        code = prepare_data.main(["--metadata", str(corpus / "metadata.csv"), "--audio_dir", str(corpus / "wavs"),
                                  "--output_dir", str(out), "--num_workers", "1", *overwrite])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and str(out) in err[0] and str(corpus / "wavs") in err[0], err
        assert _snapshot(corpus) == before  # nothing written, replaced or moved aside
    # the metadata's folder, with the audio elsewhere: the outputs would land next to (and move) the metadata
    code = prepare_data.main(["--metadata", str(corpus / "metadata.csv"), "--audio_dir", str(corpus / "wavs"),
                              "--output_dir", str(corpus), "--num_workers", "1", *overwrite])
    assert code == 2 and _snapshot(corpus) == before


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_vocoder_prepare_around_its_input_is_refused_and_nothing_moves(tmp_path, overwrite, capsys):
    from vocoder import prepare_data

    write_tones(tmp_path / "project" / "raw", 2, 44100)
    before = _snapshot(tmp_path / "project")
    for out in (tmp_path / "project", tmp_path / "project" / "raw", tmp_path / "project" / "raw" / "bin"):
        code = prepare_data.main(["--input", str(tmp_path / "project" / "raw"), "--output", str(out),
                                  "--num_workers", "0", *overwrite])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and "--input" in err[0] and str(out) in err[0], err
        assert _snapshot(tmp_path / "project") == before


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_vae_prepare_around_its_input_is_refused_and_nothing_moves(tmp_path, overwrite, capsys):
    from vae import prepare_data

    write_images(tmp_path / "project" / "photos", 2, size=48)
    before = _snapshot(tmp_path / "project")
    for out in (tmp_path / "project", tmp_path / "project" / "photos" / "prep"):
        code = prepare_data.main(["--mode", "preprocess", "--input_dir", str(tmp_path / "project" / "photos"),
                                  "--output_dir", str(out), "--num_workers", "1", "--target_size", "32",
                                  "--min_size", "8", *overwrite])
        lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")]
        assert code == 2 and len(lines) == 1 and "--input_dir" in lines[0] and str(out) in lines[0], lines
        assert _snapshot(tmp_path / "project") == before


# ------------------------------------------------------------------------------------ 2: a trainer's run
def test_a_run_folder_overlapping_the_data_folder_is_refused_and_the_dataset_stays(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "manifest.json").write_text("{}")
    (data / "model_00000001.pt").write_bytes(b"a checkpoint of a run that trained here")  # a used folder
    before = _snapshot(tmp_path)
    for run in (data, data / "run", tmp_path):
        with pytest.raises(OutputPathError, match=r"^--run_dir .* --data_dir .*choose a separate folder"):
            prepare_run_dir(run, overwrite=True, is_main=True, inputs={"--data_dir": data}, log=lambda *a: None)
        assert _snapshot(tmp_path) == before  # nothing moved into overwritten-*/, no run.lock
    for is_main in (True, False):  # every rank says the same, before any of them waits for the others
        with pytest.raises(OutputPathError):
            prepare_run_dir(data, is_main=is_main, inputs={"--data_dir": data})
    # apart from the data, --init_from inside the run folder: the run starts as before
    run = tmp_path / "runs" / "a"
    assert prepare_run_dir(run, init_from=str(run / "x.pt"), is_main=True, inputs={"--data_dir": data}) == run


# ---------------------------------------------------------------------------- 3: a short write is a full disk
def _short_write(dest, *args, **kwargs):
    """What np.save does when fwrite comes back short (ndarray.tofile): some bytes, then an OSError with no errno."""
    with open(dest, "ab") if not hasattr(dest, "write") else open(os.devnull, "wb") as f:
        f.write(b"\x93NUMPY" + b"\0" * 58)
    raise OSError("4194304 requested and 1703936 written")


def test_numpy_short_write_counts_as_a_full_disk(tmp_path):
    assert is_disk_full(OSError("4194304 requested and 1703936 written"))
    assert not is_disk_full(OSError("some other failure")) and not is_disk_full(OSError(errno.EACCES, "denied"))
    with pytest.raises(DiskFullError, match=r"^disk full while writing .*item: \d+ MiB free$"):
        with atomic_output(tmp_path / "item", folder=True) as tmp:
            _short_write(tmp / "audio.npy")
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_during_vocoder_preparation_stops_it_with_one_line(tmp_path, monkeypatch, capsys):
    from vocoder import prepare_data

    write_tones(tmp_path / "raw", 3, 44100)
    monkeypatch.setattr(np, "save", _short_write)
    code = prepare_data.main(["--input", str(tmp_path / "raw"), "--output", str(tmp_path / "bin"),
                              "--num_workers", "0"])
    out, err = capsys.readouterr()
    assert code == 2 and "SKIPPED" not in out and "unexpected error" not in out, out
    assert err.strip().startswith("error: disk full while writing") and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "bin" / "manifest.json").exists()


def test_a_full_disk_during_tts_preparation_is_one_line_not_a_traceback(tmp_path, monkeypatch, capsys):
    from tts import prepare_data

    corpus = _lj_corpus(tmp_path / "lj", n=2)
    monkeypatch.setattr(np, "save", _short_write)
    code = prepare_data.main(["--metadata", str(corpus / "metadata.csv"), "--audio_dir", str(corpus / "wavs"),
                              "--output_dir", str(tmp_path / "prep"), "--num_workers", "1",
                              "--no_trim"])  # tones: no speech for the Silero VAD to keep
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: disk full while writing") and "Traceback" not in err, err


# ------------------------------------------------------------------------- 4: modes, as a plain open() gives
@pytest.fixture()
def umask():
    old = os.umask(0o022)
    os.umask(old)

    def set_to(mask: int) -> None:
        os.umask(mask)
    yield set_to
    os.umask(old)


@pytest.mark.skipif(os.name == "nt", reason="POSIX modes")
@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002])
@pytest.mark.parametrize("proc", [True, False], ids=["proc", "no-proc"])
def test_written_files_have_the_mode_a_plain_open_gives(tmp_path, umask, mask, proc, monkeypatch):
    from common.checkpoint import save_atomic
    from speech.audio import save_wav

    if not proc:  # elsewhere than Linux: the umask is read by setting and restoring it
        real_open = open
        monkeypatch.setattr("builtins.open", lambda f, *a, **k: (_ for _ in ()).throw(OSError("no /proc"))
                            if str(f) == "/proc/self/status" else real_open(f, *a, **k))
    umask(mask)
    with open(tmp_path / "plain", "w"):
        pass
    plain = (tmp_path / "plain").stat().st_mode & 0o777
    assert plain == 0o666 & ~mask
    write_text(tmp_path / "config.yaml", "a: 1\n")
    save_atomic({"w": 1}, tmp_path / "model_00000001.pt")
    save_wav(tmp_path / "a.wav", np.zeros(100, np.float32), 22050)
    atomic_write.save_png(np.zeros((4, 4, 3), np.uint8), tmp_path / "a.png")
    atomic_write.append_text(tmp_path / "metrics.jsonl", "{}\n")
    for name in ("config.yaml", "model_00000001.pt", "a.wav", "a.png", "metrics.jsonl"):
        assert (tmp_path / name).stat().st_mode & 0o777 == plain, name
    with atomic_output(tmp_path / "item", folder=True) as tmp:
        np.save(tmp / "mel.npy", np.zeros(3))
    assert (tmp_path / "item").stat().st_mode & 0o777 == 0o777 & ~mask
    assert (tmp_path / "item" / "mel.npy").stat().st_mode & 0o777 == plain
    assert atomic_write.current_umask() == mask and os.umask(mask) == mask  # reading it left it as it was


def test_where_chmod_cannot_the_write_still_succeeds(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(atomic_write.os, "chmod", refuse)  # a mount without permissions
    write_text(tmp_path / "a.txt", "x")
    monkeypatch.setattr(atomic_write, "ON_WINDOWS", True)  # Windows: not even tried
    calls = []
    monkeypatch.setattr(atomic_write.os, "chmod", lambda *a, **k: calls.append(a))
    write_text(tmp_path / "b.txt", "y")
    assert (tmp_path / "a.txt").read_text() == "x" and (tmp_path / "b.txt").read_text() == "y" and calls == []


@pytest.mark.parametrize("trainer", ["vocoder", "vits", "clone", "vae"])
def test_a_run_folder_that_is_the_dataset_is_refused_even_with_overwrite(trainer, tmp_path, capsys):
    """`--run_dir` = `--data_dir` with `--overwrite` used to move the dataset into `overwritten-*/`, then fail
    with "manifest.json not found": every trainer refuses before it touches anything."""
    import torch

    from bench.gpu.trainers import TRAINERS, cli

    spec = TRAINERS[trainer]
    data = spec.make_data(tmp_path / "data", dry=True)
    before = sorted(p.relative_to(data) for p in data.rglob("*"))
    main, argv = cli(spec, "base", [], data, data, torch.device("cpu"), dry=True, steps=1)
    assert main([*argv, "--overwrite"]) == 2
    assert "would overwrite or mix with your files" in capsys.readouterr().err
    assert sorted(p.relative_to(data) for p in data.rglob("*")) == before  # nothing moved, nothing added


def test_a_vae_run_folder_inside_its_image_folder_is_refused(tmp_path, capsys):
    """Its lr_schedule.png and samples would join the training set on the next run (round 3, item 12)."""
    import torch

    from bench.gpu.trainers import TRAINERS, cli

    spec = TRAINERS["vae"]
    images = spec.make_data(tmp_path / "images", dry=True)
    main, argv = cli(spec, "base", [], images, images / "runs" / "vae", torch.device("cpu"), dry=True, steps=1)
    assert main(argv) == 2
    assert "is inside --data_path" in capsys.readouterr().err and not (images / "runs").exists()


# ------------------------------------------------- 7: only files inside the given folders are read
def test_tts_metadata_cannot_pull_in_files_outside_the_audio_folder(tmp_path):
    """Absolute paths, `..` paths and links to elsewhere are skipped with their reason; no prepared file is
    named like a hidden file."""
    import json

    from tts import prepare_data

    corpus = _lj_corpus(tmp_path / "corpus", n=3)
    secret = tmp_path / "elsewhere" / "private.wav"
    secret.parent.mkdir()
    sf.write(secret, voiced_tone(2.5, 44100, seed=9), 44100)
    (corpus / "wavs" / "link.wav").symlink_to(secret)
    lines = (corpus / "metadata.csv").read_text(encoding="utf-8")
    lines += f"abs|{TEXT}\n".replace("abs|", f"{secret}|", 1)  # an absolute path as the audio name
    lines += f"../../elsewhere/private|{TEXT}\n" + f"link|{TEXT}\n"
    (corpus / "metadata.csv").write_text(lines, encoding="utf-8")
    out = tmp_path / "prepared"
    code = prepare_data.main(["--metadata", str(corpus / "metadata.csv"), "--audio_dir", str(corpus / "wavs"),
                              "--output_dir", str(out), "--num_workers", "1", "--no_trim"])  # tones
    assert code == 0
    said = (out / "report.json").read_text(encoding="utf-8")
    dropped = {d["line"] for d in json.loads(said)["dropped"] if "leads outside --audio_dir" in d["reason"]}
    assert dropped == {4, 5, 6}, said
    written = [p.name for p in out.rglob("*") if p.is_file()]
    assert not any(name.startswith(".") for name in written), written


def test_vocoder_and_vae_preparations_skip_links_that_leave_their_input(tmp_path, capsys):
    from common.run_dir import outside
    from vocoder import prepare_data as vocoder_prepare

    raw = tmp_path / "raw"
    write_tones(raw, 2, 44100)
    elsewhere = tmp_path / "elsewhere"
    write_tones(elsewhere, 1, 44100)
    (raw / "linked.wav").symlink_to(next(elsewhere.glob("*.wav")))
    assert [p.name for p in outside(sorted(raw.glob("*.wav")), raw)] == ["linked.wav"]
    assert vocoder_prepare.main(["--input", str(raw), "--output", str(tmp_path / "bin"), "--num_workers", "0"]) == 0
    assert "skipped 1 file(s) that lead outside --input" in capsys.readouterr().out
    assert len(list((tmp_path / "bin" / "items").iterdir())) == 2

    from bench.gpu.trainers import TRAINERS
    from vae import prepare_data as vae_prepare

    images = TRAINERS["vae"].make_data(tmp_path / "images", dry=True)
    other = TRAINERS["vae"].make_data(tmp_path / "other_images", dry=True)
    (images / "linked.png").symlink_to(next(other.glob("*.png")))
    n = len(list(images.glob("*.png")))
    assert vae_prepare.main(["--mode", "preprocess", "--input_dir", str(images), "--output_dir",
                             str(tmp_path / "vae"), "--num_workers", "1", "--min_size", "32"]) == 0
    said = capsys.readouterr().out
    assert "skipped 1 image(s) that lead outside --input_dir" in said and f"found {n - 1} image files" in said


def test_overwrite_refuses_to_move_away_the_init_from_checkpoint_it_lies_in(tmp_path, capsys):
    """`--init_from run/checkpoints/x.pt --overwrite` moved x.pt into overwritten-*/ and then failed with
    "not found" (the cloning trainer read it after the move): refused first, nothing moved."""
    from common.errors import OutputPathError
    from common.run_dir import prepare_run_dir

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    ckpt = run / "checkpoints" / "checkpoint_100.pt"
    ckpt.write_bytes(b"weights")
    with pytest.raises(OutputPathError, match="--init_from .* lies inside .*copy it out"):
        prepare_run_dir(run, run / "checkpoints", None, True, str(ckpt), is_main=True, log=lambda *_: None)
    assert ckpt.read_bytes() == b"weights" and not list(run.glob("overwritten-*"))
    elsewhere = tmp_path / "pretrained.pt"
    elsewhere.write_bytes(b"w")
    prepare_run_dir(run, run / "checkpoints", None, True, str(elsewhere), is_main=True, log=lambda *_: None)
    assert list(run.glob("overwritten-*/checkpoints/checkpoint_100.pt"))


# ------------------------------------------------------------- 5: exports and inference never write over their inputs
def _at_or_in_an_input(i: dict[str, Path]) -> dict[str, tuple]:
    """case -> (main, argv, the output flag and path, the input flag and path it is refused for)."""
    from tts import export_onnx, infer_clone, synthesize
    from tts.clone import export_onnx as clone_export
    from vae import reconstruct
    from vocoder import export, infer

    wav, ckpt, text = i["wavs"] / "tone_0.wav", i["vocoder"], i["root"] / "texts" / "sentences.txt"
    image = sorted(i["images"].glob("*.png"))[0]
    return {  # (the copy-synthesis and the single image with the flags the user would type to replace them)
        "vocoder/infer.py": (infer.main, ["--model", str(ckpt), "--input", str(i["wavs"]), "--device", "cpu"],
                             ("--output", i["wavs"]), ("--input", i["wavs"])),
        "vocoder/export.py": (export.main, ["--ckpt", str(ckpt), "--onnx"], ("--out", ckpt.parent), ("--ckpt", ckpt)),
        "tts/synthesize.py": (synthesize.main, ["--checkpoint", str(i["vits"]), "--text", "salom", "--overwrite"],
                              ("--out", i["vits"]), ("--checkpoint", i["vits"])),
        "tts/synthesize.py --out_dir": (synthesize.main, ["--checkpoint", str(i["vits"]), "--text_file", str(text),
                                                          "--overwrite"],
                                        ("--out_dir", text.parent), ("--text_file", text)),
        "tts/export_onnx.py": (export_onnx.main, ["--checkpoint", str(i["vits"]), "--no_check", "--overwrite"],
                               ("--out", i["vits"]), ("--checkpoint", i["vits"])),
        "tts/infer_clone.py": (infer_clone.main, ["--checkpoint", str(i["clone"]), "--reference", str(wav), "--text",
                                                  "salom", "--vocoder", str(ckpt), "--device", "cpu", "--overwrite"],
                               ("--output", wav), ("--reference", wav)),
        "tts/infer_clone.py --teacher_forced": (infer_clone.main, ["--checkpoint", str(i["clone"]), "--teacher_forced",
                                                                   "--data", str(i["tts"]), "--device", "cpu",
                                                                   "--overwrite"],
                                                ("--output", i["tts"] / "gta_mels"), ("--data", i["tts"])),
        "tts/export_clone_onnx.py": (clone_export.main, ["--checkpoint", str(i["clone"]), "--overwrite"],
                                     ("--out", i["clone"]), ("--checkpoint", i["clone"])),
        "vae/reconstruct.py": (reconstruct.main, ["--checkpoint", str(i["vae"]), "--input", str(image), "--device", "cpu"],
                               ("--output", image), ("--input", image)),
        "vae/reconstruct.py folder": (reconstruct.main, ["--checkpoint", str(i["vae"]), "--input", str(i["images"]),
                                                         "--device", "cpu"],
                                      ("--output", i["images"] / "reconstructed"), ("--input", i["images"])),
        "vae/reconstruct.py into the model": (reconstruct.main, ["--checkpoint", str(i["vae"]), "--input",
                                                                 str(i["images"]), "--device", "cpu"],
                                              ("--output", i["vae"]), ("--checkpoint", i["vae"])),
    }


@pytest.mark.parametrize("case", ["vocoder/infer.py", "vocoder/export.py", "tts/synthesize.py",
                                  "tts/synthesize.py --out_dir", "tts/export_onnx.py", "tts/infer_clone.py",
                                  "tts/infer_clone.py --teacher_forced", "tts/export_clone_onnx.py",
                                  "vae/reconstruct.py", "vae/reconstruct.py folder",
                                  "vae/reconstruct.py into the model"])
def test_no_export_or_inference_writes_at_around_or_in_its_input(case, inputs, capsys):  # noqa: F811
    root = inputs["root"]
    (root / "texts").mkdir(exist_ok=True)
    (root / "texts" / "sentences.txt").write_text("Salom dunyo.\n\nBugun havo yaxshi.\n", encoding="utf-8")
    main, argv, (out_flag, out), (in_flag, given) = _at_or_in_an_input(inputs)[case]
    before = _snapshot(root)
    assert main([*argv, out_flag, str(out)]) == 2
    text = "".join(capsys.readouterr())
    errors = [ln for ln in text.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in text, text[-2000:]
    assert errors[0].startswith(f"error: {out_flag} {out} ") and f" {in_flag} {given}: " in errors[0], errors
    assert "would overwrite or mix with your files" in errors[0], errors
    assert _snapshot(root) == before  # the input byte-identical, nothing written beside it, nothing moved


def test_an_export_beside_its_checkpoint_in_the_run_folder_is_still_written(inputs, tmp_path):  # noqa: F811
    from vocoder import export

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    ckpt = run / "checkpoints" / inputs["vocoder"].name
    ckpt.write_bytes(inputs["vocoder"].read_bytes())
    assert export.main(["--ckpt", str(ckpt), "--out", str(run / "export")]) == 0
    assert (run / "export" / "model.ckpt").is_file() and ckpt.read_bytes() == inputs["vocoder"].read_bytes()
