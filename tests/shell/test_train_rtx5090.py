"""shell/train_rtx5090.sh {vocoder|tts|vae}: usage errors, a real tiny run, and the .bat twin."""

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.vae.helpers import write_images

REPO = Path(__file__).resolve().parents[2]
SH = REPO / "shell" / "train_rtx5090.sh"
BAT = REPO / "shell" / "train_rtx5090.bat"
TRAINERS = ("vocoder", "tts", "vae")


def run(*args: str, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(["bash", str(SH), *args], capture_output=True, text=True, cwd=REPO, env=env, timeout=300, **kw)


@pytest.mark.parametrize("args", [(), ("speech",), ("--help",)])
def test_usage_message_on_missing_or_unknown_trainer(args):
    p = run(*args)
    assert p.returncode == 2
    assert "usage:" in p.stderr and "{vocoder|tts|vae}" in p.stderr
    if args and args[0] == "speech":
        assert "unknown trainer 'speech'" in p.stderr


def test_runs_a_tiny_vae_training_with_the_5090_profile(tmp_path):
    images = tmp_path / "images"
    write_images(images, 6, size=40)
    out = tmp_path / "run"
    p = run("vae", "--data_path", str(images), "--output_dir", str(out), "--channels", "16", "32",
            "--set", "norm_num_groups=8", "--image_size", "32", "--batch_size", "2", "--max_steps", "2",
            "--perceptual_weight", "0", "--num_workers", "0", "--accumulation_steps", "1",
            "--set", "num_val_images=2", "--no-gradient_checkpointing", "--no-export_diffusers")
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["precision"] == "bf16-mixed" and saved["channels_last"]  # the RTX 5090 profile was applied
    assert (out / "checkpoint_last.pt").is_file()



@pytest.mark.parametrize("trainer", TRAINERS)
def test_bat_takes_the_same_arguments_and_preset(trainer):
    bat = BAT.read_text()
    assert f'"{trainer}"' in bat and "train_rtx5090.bat" in bat and "%ARGS%" in bat and "usage" in bat
    sh = (REPO / trainer / "train_rtx5090.sh").read_text()
    twin = (REPO / trainer / "train_rtx5090.bat").read_text()
    assert '"$@"' in sh and "%*" in twin  # extra arguments pass through on both

    def preset_files(text: str) -> set[str]:
        names = re.findall(r"configs[/\\]([\w${}%.-]+)\.yaml", text)
        return {re.sub(r"\$\{(\w+)\}|%(\w+)%", lambda m: "{" + (m[1] or m[2]) + "}", n) for n in names}

    assert preset_files(sh) and preset_files(sh) == preset_files(twin)
    sh_default = re.findall(r"PROFILE:-(\w+)", sh)
    bat_default = re.findall(r"^if .*set PROFILE=(\w+)", twin, re.M)
    assert sh_default == bat_default
