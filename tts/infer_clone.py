"""`python tts/infer_clone.py ...` (or `python -m tts.infer_clone`): voice-cloning checkpoint + text + reference clip → wav; the code lives in `tts.clone.infer`."""

from __future__ import annotations

import sys

from tts.clone.infer import main

if __name__ == "__main__":
    sys.exit(main())
