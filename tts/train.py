"""`python tts/train.py ...` (or `python -m tts.train`): trains Uzbek VITS; the code lives in `tts.vits.train`."""

from __future__ import annotations

import sys

from tts.vits.train import main

if __name__ == "__main__":
    sys.exit(main())
