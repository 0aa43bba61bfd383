"""What the vocoder, both TTS models and serve share (speech/README.md); imports common only."""
