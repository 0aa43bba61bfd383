"""`python tts/train_main.py ...` (or `python -m tts.train_main`): trains the voice-cloning TTS; the code lives in `tts.clone.train`."""

from __future__ import annotations

import sys

from tts.clone.train import main

if __name__ == "__main__":
    sys.exit(main())
