"""Windows has no fork: DataLoader workers and preparation workers are spawned, so whatever a worker needs
must pickle and every entry point must guard `__main__`. Here, on Linux, a child interpreter switches the
default start method to `spawn` and runs every preparation with two workers and every trainer's CLI with one
loader worker (tiny sizes, `bench.gpu.trainers`), as a Windows machine would."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.child_env import child_env

REPO = Path(__file__).resolve().parents[1]

CHILD = """
import multiprocessing as mp, sys
from pathlib import Path

def main(root, part):
    mp.set_start_method("spawn", force=True)
    import numpy as np, soundfile as sf, torch
    torch.set_num_threads(1)
    from bench.gpu.trainers import TRAINERS, cli
    from tts.prepare_data import prepare as prepare_tts
    from tts.vits.config import TrainConfig
    from vae.prepare_data import main as prepare_vae

    done = []
    if part == "train":
        train(root, done, torch, TRAINERS, cli)
        print("SPAWNED OK:", ", ".join(done))
        return
    # preparations, two spawned workers each (the vocoder's always spawns: its own tests cover it)
    (root / "a").mkdir(parents=True)
    t = np.arange(22050) / 22050
    for i in range(4):
        sf.write(root / "a" / f"{i}.wav", (0.3 * np.sin(2 * np.pi * (110 + 7 * i) * t)).astype(np.float32), 22050)
    (root / "m.csv").write_text("".join(f"{i}|bugun havo juda yaxshi edi\\n" for i in range(4)))
    cfg = TrainConfig()
    cfg.data.eval_split_size = 1
    cfg.data.trim_silence = False  # pure tones: no speech for the Silero VAD to keep
    report = prepare_tts(root / "m.csv", root / "a", root / "tts", cfg, num_workers=2, quiet=True)
    assert len(list((root / "tts").rglob("*.wav"))) >= 4, report
    done.append("tts prepare")
    images = TRAINERS["vae"].make_data(root / "img", dry=True)
    assert prepare_vae(["--mode", "preprocess", "--input_dir", str(images), "--output_dir", str(root / "vae"),
                        "--num_workers", "2", "--min_size", "32"]) == 0
    done.append("vae prepare")
    print("SPAWNED OK:", ", ".join(done))


def train(root, done, torch, TRAINERS, cli):
    # each trainer's own CLI, one spawned loader worker (the cloning trainer two: its feature cache is a pool too)
    workers = {"vocoder": ["num_workers=1"], "vits": ["num_workers=1"], "clone": ["train.num_workers=2"],
               "vae": ["num_workers=1"]}
    for name, keys in workers.items():
        spec = TRAINERS[name]
        main_, argv = cli(spec, "base", keys, spec.make_data(root / f"d_{name}", dry=True), root / f"run_{name}",
                          torch.device("cpu"), dry=True, steps=2)
        rc = main_(argv)
        assert rc == 0, (name, rc)
        done.append(f"{name} train")

if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
"""


def spawned(tmp_path: Path, part: str) -> str:
    """CHILD's `part` ("prepare" or "train") in a child interpreter; its stdout. Two tests, so that the two
    halves run side by side under pytest-xdist (together they were the suite's longest test)."""
    script = tmp_path / "spawn_run.py"
    script.write_text(CHILD)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "work"), part], cwd=REPO,
                          env=child_env(OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=900)
    said = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, said
    return proc.stdout


def test_every_preparation_runs_with_spawned_workers(tmp_path):
    assert "SPAWNED OK: tts prepare, vae prepare" in spawned(tmp_path, "prepare")


def test_every_trainer_runs_with_spawned_loader_workers(tmp_path):
    assert "SPAWNED OK: vocoder train, vits train, clone train, vae train" in spawned(tmp_path, "train")
