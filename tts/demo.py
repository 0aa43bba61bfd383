"""`python tts/demo.py ...` (or `python -m tts.demo`): the VITS CPU demo (make tts-demo); the code lives in `tts.vits.demo`."""

from __future__ import annotations

import sys

from tts.vits.demo import main

if __name__ == "__main__":
    sys.exit(main())
