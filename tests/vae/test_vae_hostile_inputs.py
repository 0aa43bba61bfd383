"""`vae/reconstruct.py` with tiny hostile or malformed inputs (issue 38, items 5 and 10): a few bytes of
`arch` or config.json declaring a huge model, a 60 KB PNG declaring 16000x16000 pixels, a deflated `.ckpt`
that inflates to hundreds of MB. Each is one `error:` line naming the file, exit 2, refused before the
model is built or the image decoded: the hostile cases run in a child process whose address space may
grow by 1 GiB at most, and must come back in seconds."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from PIL import Image

from common.checkpoint import save_atomic
from tests.child_env import child_env
from vae.diffusers_io import save_diffusers
from vae.model import AutoencoderKL
from vae.reconstruct import main as reconstruct_main

TINY = {"channels": [8, 8], "z_channels": 4, "layers_per_block": 1, "norm_num_groups": 8}


def _tiny() -> AutoencoderKL:
    torch.manual_seed(0)
    return AutoencoderKL(**TINY)


def _deflated(src: bytes, dst: Path, inflated_mb: int) -> None:
    """`src` (a torch.save'd file) re-zipped with every record deflated, its first tensor record replaced by
    `inflated_mb` MB of zeros: a small file whose records declare far more than it holds."""
    with zipfile.ZipFile(io.BytesIO(src)) as old, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as new:
        for info in old.infolist():
            if info.filename.endswith("/data/0"):
                new.writestr(info.filename, bytes(inflated_mb * 2**20))
            else:
                new.writestr(info.filename, old.read(info))


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> dict[str, Path]:
    """name -> the file or folder given to --checkpoint or --input; 'image' is a usable small image."""
    d = tmp_path_factory.mktemp("hostile")
    model = _tiny()
    sd = model.state_dict()
    final = {"trainer": "vae", "arch": model.arch(), "state_dict": sd}
    out = {}
    # a vae_final.pt with real weights whose arch declares a huge model: 100000 channels, 10**6 latent channels
    out["wide"] = save_atomic({**final, "arch": {**model.arch(), "channels": [100000]}}, d / "wide.pt")
    out["latent"] = save_atomic({**final, "arch": {**model.arch(), "z_channels": 10**6}}, d / "latent.pt")
    # 10**5 levels: refused before even the meta build walks them
    out["levels"] = save_atomic({**final, "arch": {**model.arch(), "channels": [8] * 10**5}}, d / "levels.pt")
    # a diffusers folder of real weights whose 150-byte config.json declares a huge model
    folder = save_diffusers(model, d / "diffusers")
    (folder / "config.json").write_text(json.dumps({"_class_name": "AutoencoderKL", "block_out_channels": [100000],
                                                    "latent_channels": 4, "layers_per_block": 1}))
    out["folder"] = folder
    buf = io.BytesIO()
    torch.save(final, buf)
    out["deflated"] = d / "deflated.ckpt"
    _deflated(buf.getvalue(), out["deflated"], 64)
    out["big_png"] = d / "big.png"
    Image.new("1", (16000, 16000), 1).save(out["big_png"])  # 62 KB
    out["image"] = d / "small.png"
    Image.new("RGB", (16, 16), (10, 20, 30)).save(out["image"])
    out["good"] = save_atomic(final, d / "vae_final.pt")
    return out


CHILD = r"""
import contextlib, io, json, resource, sys, time
from vae.reconstruct import main
vm = int(next(line for line in open("/proc/self/status") if line.startswith("VmSize")).split()[1]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm + 2**30, vm + 2**30))  # at most 1 GiB more than after the imports
results = {}
for name, argv in json.loads(sys.argv[1]).items():
    err = io.StringIO()
    t = time.perf_counter()
    with contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except BaseException as exc:
            rc = f"{type(exc).__name__}: {exc}"
    results[name] = [rc, err.getvalue(), time.perf_counter() - t]
print(json.dumps(results))
"""


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads VmSize from /proc")
def test_tiny_inputs_declaring_huge_sizes_are_refused_before_allocating(hostile, tmp_path):
    def argv(ckpt: Path, image: Path) -> list[str]:
        return ["--checkpoint", str(ckpt), "--input", str(image), "--output", str(tmp_path / "rec.png"),
                "--device", "cpu"]

    cases = {name: argv(hostile[name], hostile["image"]) for name in ("wide", "latent", "levels", "folder", "deflated")}
    cases["big_png"] = argv(hostile["good"], hostile["big_png"])
    run = subprocess.run([sys.executable, "-c", CHILD, json.dumps(cases)], capture_output=True, text=True,
                         env=child_env(), timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads(run.stdout.splitlines()[-1])
    expect = {"wide": "declares a model of", "latent": "declares a model of", "levels": "declares 100000 levels",
              "folder": "declares a model of", "deflated": "compressed", "big_png": "16000x16000"}
    for name, (rc, err, seconds) in results.items():
        lines = err.strip().splitlines()
        assert rc == 2, (name, rc, err)
        assert len(lines) == 1 and lines[0].startswith("error: "), (name, err)
        named = hostile["big_png" if name == "big_png" else name]
        assert str(named) in lines[0] and expect[name] in lines[0], (name, lines[0])
        assert "refused before" in lines[0] or name == "big_png", lines[0]
        assert seconds < 10, (name, seconds)


def _one_line(capsys, argv: list[str]) -> str:
    assert reconstruct_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def _final(model: AutoencoderKL, **change) -> dict:
    return {"trainer": "vae", "arch": model.arch(), "state_dict": model.state_dict(), **change}


def test_malformed_checkpoints_and_folders_are_one_line_naming_the_file(hostile, tmp_path, capsys):
    """Well-formed containers with malformed content: each one line naming the file and what to give, not
    a raw KeyError / a multi-line load_state_dict report (item 10)."""
    model = _tiny()
    sd = model.state_dict()
    bad_rank = {**sd, "decoder.conv_out.weight": sd["decoder.conv_out.weight"][0]}
    ckpt_layout = {"trainer": "vae", "extra": {"arch": model.arch()}, "models": {"vae": sd}}
    files = {
        "rank.pt": _final(model, state_dict=bad_rank),  # was 9 lines of load_state_dict's report
        "arch_list.pt": _final(model, arch=[8, 8]),  # was "list indices must be integers or slices, not str"
        "groups.pt": _final(model, arch={**model.arch(), "norm_num_groups": 3}),
        "no_shadow.pt": {**ckpt_layout, "ema": {"vae": {"decay": 0.999}}},  # was "'shadow'"
        "no_models.pt": {"trainer": "vae", "extra": {"arch": model.arch()}},  # was "'models'"
    }
    for name, content in files.items():
        path = save_atomic(content, tmp_path / name)
        line = _one_line(capsys, ["--checkpoint", str(path), "--input", str(hostile["image"]),
                                  "--output", str(tmp_path / "rec.png"), "--device", "cpu"])
        assert str(path) in line and line.endswith("or a diffusers AutoencoderKL folder"), line
    # a diffusers folder whose safetensors is cut short, or whose config.json names a layout the weights do not fit
    cut = save_diffusers(model, tmp_path / "cut")
    weights = cut / "diffusion_pytorch_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:200])
    other = save_diffusers(model, tmp_path / "other")
    cfg = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**cfg, "layers_per_block": 2}))
    for folder in (cut, other):
        line = _one_line(capsys, ["--checkpoint", str(folder), "--input", str(hostile["image"]),
                                  "--output", str(tmp_path / "rec.png"), "--device", "cpu"])
        assert str(folder) in line and line.endswith("or a diffusers AutoencoderKL folder"), line


def test_bad_images_are_one_line_each_and_exit_2(hostile, tmp_path, capsys):
    """A single bad --input is one error line (exit 2, was exit 1); in a folder each bad image is a
    `skipped` line, the others are reconstructed, and the run ends with exit 2 saying how many."""
    not_image = tmp_path / "notes.png"
    not_image.write_text("not an image")
    line = _one_line(capsys, ["--checkpoint", str(hostile["good"]), "--input", str(not_image),
                              "--output", str(tmp_path / "rec.png"), "--device", "cpu"])
    assert str(not_image) in line and "not an image" in line
    line = _one_line(capsys, ["--checkpoint", str(hostile["good"]), "--input", str(hostile["big_png"]),
                              "--output", str(tmp_path / "rec.png"), "--device", "cpu"])
    assert "16000x16000" in line and "--max_pixels 33554432" in line
    folder = tmp_path / "images"
    folder.mkdir()
    for p in (not_image, hostile["image"]):
        (folder / p.name).write_bytes(p.read_bytes())
    line = _one_line(capsys, ["--checkpoint", str(hostile["good"]), "--input", str(folder),
                              "--output", str(tmp_path / "out"), "--device", "cpu"])
    assert "1 of the 2 images" in line
    assert (tmp_path / "out" / "small.png").is_file()
    # --max_pixels raised: the size is the user's to choose
    small = ["--checkpoint", str(hostile["good"]), "--input", str(hostile["image"]), "--output", str(tmp_path / "r.png")]
    assert reconstruct_main([*small, "--max_pixels", "100"]) == 2
    assert "16x16 = 256 pixels" in capsys.readouterr().err
    assert reconstruct_main([*small, "--max_pixels", "256"]) == 0


def test_real_files_still_load(hostile, tmp_path):
    """The same tiny model as vae_final.pt, a training checkpoint's layout (EMA and not) and a diffusers folder."""
    model = _tiny()
    ckpt = {"trainer": "vae", "extra": {"arch": model.arch()}, "models": {"vae": model.state_dict()},
            "ema": {"vae": {"decay": 0.999, "num_updates": 1, "shadow": model.state_dict()}}}
    sources = [hostile["good"], save_atomic(ckpt, tmp_path / "checkpoint_last.pt"),
               save_diffusers(model, tmp_path / "diffusers")]
    for i, source in enumerate(sources):
        for ema in ("--ema", "--no-ema"):
            assert reconstruct_main(["--checkpoint", str(source), "--input", str(hostile["image"]),
                                     "--output", str(tmp_path / f"rec{i}{ema}.png"), "--device", "cpu", ema]) == 0, source
