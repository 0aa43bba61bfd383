"""prepare_data.py on every awkward file: each is reported with its reason, the run continues."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import numpy as np
import pytest
from helpers import REPO, write_images, write_robustness_set
from PIL import Image

from vae.data import BadImage, ImageDataset, open_image_rgb
from vae.prepare_data import main as prepare_main


def _tree_digest(folder):
    return {p.name: hashlib.sha1(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def robust(tmp_path_factory):
    folder = tmp_path_factory.mktemp("robust")
    return folder, write_robustness_set(folder)


def test_preprocess_reports_each_bad_file_and_continues(robust, tmp_path, capsys):
    src, expected = robust
    before = _tree_digest(src)
    out = tmp_path / "prepared"
    rc = prepare_main(["--mode", "preprocess", "--input_dir", str(src), "--output_dir", str(out),
                       "--target_size", "32", "--min_size", "16", "--num_workers", "1"])
    assert rc == 0
    assert _tree_digest(src) == before, "the input folder must never be modified"
    report = json.loads((out / "preprocess_report.json").read_text())
    skipped = {r["file"].split("/")[-1]: r for r in report["skipped"]}
    for name, outcome in expected.items():
        if outcome == "ok":
            assert name not in skipped, f"{name} should have been prepared: {skipped.get(name)}"
        else:
            assert name in skipped, f"{name} should have been skipped as {outcome}"
            assert skipped[name]["kind"] == outcome, (name, skipped[name])
            assert skipped[name]["reason"]
    printed = capsys.readouterr().out
    assert "truncated.jpg" in printed and "not an image" in printed
    manifest = json.loads((out / "manifest.json").read_text())
    ok = [n for n, o in expected.items() if o == "ok"]
    assert len(manifest["files"]) == len(ok) == report["counts"]["written"]
    for item in manifest["files"]:
        im = Image.open(out / item["path"])
        assert im.mode == "RGB" and im.size == (32, 32)


def test_converted_modes_keep_their_content(robust, tmp_path):
    src, _ = robust
    g16 = np.asarray(open_image_rgb(src / "gray16.png", min_size=1)[0]).astype(float)
    assert 100 < g16.mean() < 155 and g16.max() > 240 and g16.min() < 15  # a ramp, not a white image
    ref = np.asarray(open_image_rgb(src / "good.jpg", min_size=1)[0]).astype(float)
    cmyk = np.asarray(open_image_rgb(src / "cmyk.jpg", min_size=1)[0]).astype(float)
    assert np.abs(cmyk - ref).mean() < 12  # colours survive the CMYK round trip
    rgba = np.asarray(open_image_rgb(src / "rgba.png", min_size=1)[0]).astype(float)
    raw = np.asarray(Image.open(src / "rgba.png"))[..., :3].astype(float)
    assert np.allclose(rgba, raw * 128 / 255 + 255 * 127 / 255, atol=2)  # composited on white


def test_preprocess_is_resumable(robust, tmp_path):
    src, _ = robust
    args = ["--mode", "preprocess", "--input_dir", str(src), "--output_dir", str(tmp_path / "p"),
            "--target_size", "32", "--min_size", "16", "--num_workers", "2"]
    assert prepare_main(args) == 0
    first = json.loads((tmp_path / "p" / "preprocess_report.json").read_text())["counts"]
    assert prepare_main(args) == 0
    second = json.loads((tmp_path / "p" / "preprocess_report.json").read_text())["counts"]
    assert second["written"] == 0 and second["already_done"] == first["written"] > 0
    changed = args[:-4] + ["--target_size", "64", "--min_size", "16"]
    assert prepare_main(changed) == 2  # another size into the same folder is refused


@pytest.mark.parametrize("mode,size", [("cover", (32, 32)), ("contain", (32, 32)), ("stretch", (32, 32))])
def test_resize_modes(tmp_path, mode, size):
    src = tmp_path / "in"
    src.mkdir()
    arr = np.zeros((40, 80, 3), np.uint8)
    arr[:, :40] = (255, 0, 0)
    arr[:, 40:] = (0, 0, 255)
    Image.fromarray(arr).save(src / "wide.png")
    assert prepare_main(["--mode", "preprocess", "--input_dir", str(src), "--output_dir", str(tmp_path / "o"),
                         "--target_size", "32", "--resize_mode", mode, "--num_workers", "1"]) == 0
    out = np.asarray(Image.open(tmp_path / "o" / "images" / "wide.png"))
    assert out.shape[:2] == size
    if mode == "contain":
        assert (out[0, 16] == 255).all()  # padded with the white background above the image
    else:
        assert out[16, 2, 0] > 200 and out[16, 29, 2] > 200  # red left, blue right


def test_validate_report(robust, tmp_path):
    src, expected = robust
    report_file = tmp_path / "validation_report.json"
    rc = prepare_main(["--mode", "validate", "--input_dir", str(src), "--output_file", str(report_file),
                       "--min_size", "16", "--num_workers", "1"])
    assert rc == 0
    r = json.loads(report_file.read_text())
    names = lambda key: {e["file"].split("/")[-1] for e in r[key]}  # noqa: E731
    assert {"truncated.jpg", "garbage.png", "empty.png"} <= names("corrupt")
    assert names("not_images") == {"notes.jpg"}
    assert names("too_small") == {"one.png", "eight.png"}
    assert names("too_large") == {"huge.png"}
    assert names("animated") == {"animated.gif"}
    assert names("blank") == {"black.png"}
    assert [sorted(p.split("/")[-1] for p in g) for g in r["duplicates"]] == [["good.jpg", "zz_copy_of_good.jpg"]]
    assert r["modes"]["CMYK"] == 1 and r["modes"]["I;16"] == 1 and r["modes"]["RGBA"] == 1
    assert r["counts"]["files"] == len(expected) and r["counts"]["non_image_files_ignored"] == 1
    assert r["sizes"]["min_width"] == 1 and r["sizes"]["max_width"] == 80


def test_cli_runs_as_script_and_module(robust, tmp_path):
    src, _ = robust
    for cmd in ([sys.executable, str(REPO / "vae" / "prepare_data.py")], [sys.executable, "-m", "vae.prepare_data"]):
        out = tmp_path / cmd[-1].replace("/", "_")
        p = subprocess.run([*cmd, "--mode", "validate", "--input_dir", str(src), "--output_file", str(out / "r.json"),
                            "--num_workers", "1"], capture_output=True, text=True, cwd=REPO, timeout=120)
        assert p.returncode == 0, p.stderr
        assert json.loads((out / "r.json").read_text())["counts"]["problems"] > 0


def test_training_dataset_never_returns_a_black_image_for_a_bad_file(tmp_path):
    good = tmp_path / "a.png"
    arr = np.full((40, 40, 3), 200, np.uint8)
    arr[0, 0, 0] = 201  # not blank: training applies prepare_data.py's filters, and those skip blank images
    Image.fromarray(arr).save(good)
    bad = tmp_path / "b.png"
    bad.write_bytes(b"not a png")
    ds = ImageDataset([bad, good], 32, train=True)
    with pytest.warns(UserWarning, match="b.png"):
        x = ds[(0, 0, 0)]
    assert x.shape == (3, 32, 32) and x.mean().item() == pytest.approx(200 / 127.5 - 1, abs=1e-5)
    with pytest.raises(BadImage):
        open_image_rgb(bad)


def test_exif_orientation_is_applied(tmp_path):
    arr = np.zeros((20, 40, 3), np.uint8)
    arr[:, :20] = 255  # left half white
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90° clockwise to display"
    Image.fromarray(arr).save(tmp_path / "rotated.jpg", exif=exif, quality=95)
    im, info = open_image_rgb(tmp_path / "rotated.jpg", min_size=1)
    assert (info["width"], info["height"]) == (40, 20) and im.size == (20, 40)
    top = np.asarray(im)[:10].mean()
    assert top > 200  # the white half is on top once displayed upright


def test_a_flag_of_the_other_mode_is_refused(tmp_path, capsys):
    """--mode validate read no --format / --output_dir (and preprocess no --output_file): accepted, ignored."""
    src = tmp_path / "src"
    src.mkdir()
    assert prepare_main(["--mode", "validate", "--input_dir", str(src), "--format", "webp",
                         "--output_dir", str(tmp_path / "o")]) == 2
    assert "error: --output_dir, --format go with the other --mode, not --mode validate" in capsys.readouterr().err
    assert prepare_main(["--mode", "preprocess", "--input_dir", str(src), "--output_dir", str(tmp_path / "o"),
                         "--output_file=r.json"]) == 2
    assert "error: --output_file goes with the other --mode, not --mode preprocess" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("mode", ["preprocess", "validate"])
def test_a_missing_module_stops_the_run_instead_of_calling_every_image_bad(tmp_path, monkeypatch, capsys, mode):
    """An image decoder whose module is not installed is no file's fault: one error naming the module and
    what to install (exit 2), not every image skipped as an "error" (preprocess: "no usable image")."""
    import vae.prepare_data as prep

    def missing(*args, **kwargs):
        raise ModuleNotFoundError("No module named 'PIL'")

    monkeypatch.setattr(prep, "open_image_rgb", missing)
    src = tmp_path / "src"
    write_images(src, 5)
    out = ["--output_dir", str(tmp_path / "o")] if mode == "preprocess" else ["--output_file", str(tmp_path / "r.json")]
    rc = prepare_main(["--mode", mode, "--input_dir", str(src), *out, "--num_workers", "1",
                       "--target_size", "32", "--min_size", "16"])
    captured = capsys.readouterr()
    assert rc == 2, captured
    assert "'PIL' is not installed" in captured.err and "pip install pillow" in captured.err
    assert "no usable image" not in captured.out and "with problems" not in captured.out


def test_a_damaged_prepared_image_is_made_again_on_a_rerun(tmp_path, capsys):
    """The skip-if-done check reads the output back: a file cut short, garbage, or one of another size is
    made again with one line each (it used to be a traceback, or a wrong image kept)."""
    src = tmp_path / "src"
    write_images(src, 4, size=48)
    out = tmp_path / "p"
    args = ["--mode", "preprocess", "--input_dir", str(src), "--output_dir", str(out), "--target_size", "32",
            "--min_size", "16", "--num_workers", "1"]
    assert prepare_main(args) == 0
    images = sorted((out / "images").glob("*.png"))
    first = {p.name: p.read_bytes() for p in images}
    images[0].write_bytes(first[images[0].name][: len(first[images[0].name]) // 2])  # cut short
    images[1].write_bytes(b"\x89PNG\r\n\x1a\n" + b"garbage" * 20)  # a damaged header
    Image.new("RGB", (40, 40)).save(images[2])  # another size (whole, but wrong)
    capsys.readouterr()
    assert prepare_main(args) == 0
    said = capsys.readouterr().out
    for p in images[:3]:
        assert f"making images/{p.name} again: the prepared file " in said
    assert "is 40x40, not 32x32" in said and "Traceback" not in said
    assert {p.name: p.read_bytes() for p in images} == first  # made again exactly as the first run did
    counts = json.loads((out / "preprocess_report.json").read_text())["counts"]
    assert counts["written"] == 3 and counts["already_done"] == 1
