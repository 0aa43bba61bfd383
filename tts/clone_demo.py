"""`python tts/clone_demo.py ...` (or `python -m tts.clone_demo`): the voice-cloning CPU demo (make tts-clone-demo); the code lives in `tts.clone.demo`."""

from __future__ import annotations

import sys

from tts.clone.demo import main

if __name__ == "__main__":
    sys.exit(main())
