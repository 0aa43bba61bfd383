"""`make clean-demo` removes what `make demo` made (the demos' run folders, data/demo/) and never a user's runs or data."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_clean_demo_removes_the_demos_outputs_only(tmp_path):
    demo = ["runs/vocoder_demo/checkpoints", "runs/tts_demo", "runs/tts_clone_demo/checkpoints", "runs/vae_demo",
            "runs/gta_demo", "runs/demo_logs", "data/demo/tts_raw"]
    mine = ["runs/uzbek_vits/checkpoints", "runs/vocoder", "data/tts_raw", "data/vocoder_bin"]
    for folder in demo + mine:
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "file.pt").write_bytes(b"x")
    done = subprocess.run(["make", "--no-print-directory", "-f", str(REPO / "Makefile"), "clean-demo"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert not any((tmp_path / folder.split("/")[0] / folder.split("/")[1]).exists() for folder in demo)
    assert all((tmp_path / folder / "file.pt").is_file() for folder in mine)
