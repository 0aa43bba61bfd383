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
