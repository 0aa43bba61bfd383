"""Coqui-style entry point: ``python tts/train_uzbek_tts.py --config config.yaml --data_dir ./data/preprocessed``.

The same trainer as tts/train.py (every flag of it works here: --run_dir, --resume, --init_from,
--set, torchrun); kept under this name because users coming from Coqui recipes look for it.
"""

from __future__ import annotations

import sys

from tts.vits.train import main

if __name__ == "__main__":
    sys.exit(main())
