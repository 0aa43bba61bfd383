"""vocoder/train_rtx5090.sh runs the RTX 5090 config end to end (1-2 steps, tiny overrides) and
passes every argument through; a second call resumes."""

import os
import subprocess
import sys

import yaml

from common.config import load_config
from vocoder.config import VocoderConfig
from vocoder.prepare_data import prepare

from .conftest import REPO, RTX_YAML, write_tones

TINY_5090 = [
    "max_updates=2", "batch_size=1", "crop_mel_frames=8", "num_workers=0", "num_sanity_val_steps=0",
    "valid_max_seconds=0.3", "val_check_interval=1000", "log_interval=1",
    "model_args.upsample_initial_channel=32", "model_args.resblock_kernel_sizes=[3]",
    "model_args.resblock_dilation_sizes=[[1]]", "model_args.mrd_channels=4", "model_args.fast_mpd_init_channel=2",
    "model_args.discriminator_periods=[2,3]",
]


def test_train_rtx5090_sh_runs_tiny_steps(tmp_path):
    cfg = load_config(RTX_YAML, VocoderConfig, ["val_num=1", "binarization_args.num_workers=0"])
    write_tones(tmp_path / "wavs", 2, 44100, seconds=0.6)
    prepare(cfg, [tmp_path / "wavs"], tmp_path / "bin", log=lambda *a: None)
    run = tmp_path / "run"
    cmd = ["bash", str(REPO / "vocoder" / "train_rtx5090.sh"), "--data_dir", str(tmp_path / "bin"),
           "--run_dir", str(run), "--device", "cpu"]
    cmd += [a for o in TINY_5090 for a in ("--set", o)]
    env = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS="2")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (run / "checkpoints" / "model_00000002.pt").is_file()
    resolved = yaml.safe_load((run / "config.yaml").read_text())
    assert resolved["task_cls"] == "nsf_HiFigan_fast_task.nsf_HiFigan"
    assert resolved["precision"] == "16-mixed"
    assert resolved["generator_optimizer_args"]["optimizer_cls"] == "common.muon.MuonAdamW"
    assert resolved["batch_size"] == 1 and resolved["model_args"]["upsample_initial_channel"] == 32
    assert "GradScaler on" in proc.stdout
    # a second call continues the run (the script adds --resume auto)
    proc = subprocess.run(cmd + ["--set", "max_updates=3"], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resumed from" in proc.stdout + proc.stderr
    assert (run / "checkpoints" / "model_00000003.pt").is_file()
