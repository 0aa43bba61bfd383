"""Writes, once at `make setup`, the byte-code and numba caches that every run of the trainers would
otherwise write on its first start: pip installs with --no-compile (byte-compiling all of torch takes
~25 s), so the first processes of the demo or the test suite, several at once, each compiled the same
torch, librosa and trainer modules and numba functions again (the CI's clean clone spent ~40 s more test
time than a warm tree on it). Importing what the trainers import, and calling the numba functions they
call once at a tiny size, compiles only what is used (~10 s)."""

from __future__ import annotations

import importlib

MODULES = ("torch._dynamo", "torch.distributed.run", "vocoder.train", "vocoder.prepare_data", "tts.vits.train",
           "tts.clone.train", "tts.prepare_data", "vae.train_vae", "vae.prepare_data")


def main() -> None:
    for name in MODULES:
        importlib.import_module(name)
    import librosa
    import numpy as np
    import torch

    from tts.alignment import maximum_path_numba

    maximum_path_numba(torch.zeros(1, 2, 3), torch.ones(1, 2, 3))  # cache=True: written beside tts/alignment.py
    librosa.pyin(np.zeros(2048, dtype=np.float32), fmin=50, fmax=600, sr=22050, frame_length=1024)  # its numba


if __name__ == "__main__":
    main()
