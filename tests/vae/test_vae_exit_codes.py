"""The VAE trainer's exit codes: bad input (raised as the project's error classes) is one `error:` line and
exit 2; a bare ValueError from our own code is a bug and keeps its traceback (exit 1), not exit 2."""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers import REPO, TINY_CONFIG, write_images

from tests.child_env import child_env


def run(data, out, *args: str) -> int:
    import vae.train_vae as tv

    return tv.main(["--config", str(TINY_CONFIG), "--data_path", str(data), "--output_dir", str(out),
                    "--max_steps", "1", "--num_workers", "0", "--perceptual_weight", "0", *args])


def test_a_valueerror_from_our_code_propagates_instead_of_exit_2(image_dir, tmp_path, monkeypatch, capsys):
    import vae.train_vae as tv

    def bug(*args, **kwargs):
        raise ValueError("bug")
    monkeypatch.setattr(tv, "training_images", bug)  # a step inside the training path, after the config
    with pytest.raises(ValueError, match="^bug$"):
        run(image_dir, tmp_path / "out")
    assert "error: bug" not in capsys.readouterr().err


def test_a_valueerror_from_our_code_exits_1_with_its_traceback(image_dir, tmp_path):
    code = ("import sys, vae.train_vae as tv\n"
            "def bug(*a, **k):\n    raise ValueError('bug')\n"
            "tv.training_images = bug\n"
            "sys.exit(tv.main(sys.argv[1:]))\n")
    p = subprocess.run([sys.executable, "-c", code, "--config", str(TINY_CONFIG), "--data_path", str(image_dir),
                        "--output_dir", str(tmp_path / "out"), "--max_steps", "1"],
                       capture_output=True, text=True, cwd=REPO, env=child_env(OMP_NUM_THREADS="1"), timeout=300)
    assert p.returncode == 1, p.stderr[-2000:]
    assert "Traceback" in p.stderr and p.stderr.rstrip().endswith("ValueError: bug")
    assert "error: bug" not in p.stderr


@pytest.mark.parametrize("case", ["one image", "unknown optimizer"])
def test_bad_input_that_was_a_bare_valueerror_is_still_one_line_exit_2(case, image_dir, tmp_path, capsys):
    if case == "one image":
        data, extra, expect = write_images(tmp_path / "one", 1, size=48)[0].parent, [], "only 1 image(s)"
    else:
        data, extra, expect = image_dir, ["--set", "optimizer_cls=Nope"], "unknown optimizer class 'Nope'"
    assert run(data, tmp_path / "out", *extra) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and expect in err and "Traceback" not in err


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("content", ['{"settings": {}, "files": [{"path": "images/a.p', "\x00\x01garbage",
                                     '{"files": [{"name": "a.png"}]}', "[1, 2]"],
                         ids=["cut short", "garbage", "other layout", "a list"])
def test_a_damaged_manifest_is_one_line_naming_it_and_what_to_do(content, image_dir, tmp_path, capsys):
    data = tmp_path / "prepared"
    data.mkdir()
    (data / "manifest.json").write_text(content)
    assert run(data, tmp_path / "out") == 2
    err = _one_error_line(capsys)
    assert f"{data / 'manifest.json'} is damaged (" in err and "prepare the folder again" in err
    assert "vae/prepare_data.py --mode preprocess" in err and f"--output_dir {data}" in err


@pytest.mark.parametrize("content", [b"\x00\xff garbage", b'{"_class_name": "AutoencoderKL", "block_out_ch',
                                     b'{"_class_name": "AutoencoderKL"}', b'{"block_out_channels": "abc"}'],
                         ids=["binary", "cut short", "no layout", "wrong types"])
def test_a_damaged_diffusers_config_json_is_one_line_naming_it(content, image_dir, tmp_path, capsys):
    folder = tmp_path / "vae_download"
    folder.mkdir()
    (folder / "config.json").write_bytes(content)
    assert run(image_dir, tmp_path / "out", "--init_from", str(folder)) == 2
    err = _one_error_line(capsys)
    assert f"{folder / 'config.json'} is damaged (" in err and f"download {folder} again" in err


@pytest.mark.parametrize("case", ["binary", "billion laughs", "optimizer_cls"])
def test_an_unusable_config_is_one_line_exit_2(case, image_dir, tmp_path, capsys):
    import vae.train_vae as tv

    cfg = tmp_path / "bad.yaml"
    if case == "binary":
        cfg.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff")
        expect = f"{cfg}: not a UTF-8 text file"
    elif case == "billion laughs":
        lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
        lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 20)]
        cfg.write_text(f"base_config: {TINY_CONFIG}\n" + "\n".join(lines) + "\n")
        expect = f"{cfg}: refused: its aliases"
    else:
        cfg.write_text(f"base_config: {TINY_CONFIG}\noptimizer_cls: os.system\n")
        expect = "optimizer_cls: unknown optimizer class 'os.system'; use an alias (AdamW"
    code = tv.main(["--config", str(cfg), "--data_path", str(image_dir), "--output_dir", str(tmp_path / "out"),
                    "--max_steps", "1", "--num_workers", "0", "--perceptual_weight", "0"])
    assert code == 2
    assert expect in _one_error_line(capsys)


def test_reconstruct_turns_only_user_errors_into_exit_2(tmp_path, monkeypatch, capsys):
    """vae/reconstruct.py once made ANY exception while loading the weights exit 2; a bug there now keeps its
    traceback, and an unusable checkpoint (a UserError) is still one line and exit 2."""
    import vae.reconstruct as rec

    image = write_images(tmp_path / "in", 1, size=32)[0]
    argv = ["--checkpoint", str(tmp_path / "missing.pt"), "--input", str(image), "--output", str(tmp_path / "o.png"),
            "--device", "cpu"]
    assert rec.main(argv) == 2
    assert _one_error_line(capsys).startswith(f"error: checkpoint not found: {tmp_path / 'missing.pt'}")

    def bug(*args, **kwargs):
        raise ValueError("bug")

    monkeypatch.setattr(rec, "load_vae_weights", bug)
    with pytest.raises(ValueError, match="^bug$"):
        rec.main(argv)
    assert "error:" not in capsys.readouterr().err
