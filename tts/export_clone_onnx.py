"""`python tts/export_clone_onnx.py ...` (or `python -m tts.export_clone_onnx`): voice-cloning acoustic model → ONNX; the code lives in `tts.clone.export_onnx`."""

from __future__ import annotations

import sys

from tts.clone.export_onnx import main

if __name__ == "__main__":
    sys.exit(main())
