"""`python tts/synthesize.py ...` (or `python -m tts.synthesize`): VITS checkpoint + text → wav; the code lives in `tts.vits.synthesize`."""

from __future__ import annotations

import sys

from tts.vits.synthesize import main

if __name__ == "__main__":
    sys.exit(main())
