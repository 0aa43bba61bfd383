"""`python tts/export_onnx.py ...` (or `python -m tts.export_onnx`): VITS checkpoint → ONNX; the code lives in `tts.vits.export_onnx`."""

from __future__ import annotations

import sys

from tts.vits.export_onnx import main

if __name__ == "__main__":
    sys.exit(main())
