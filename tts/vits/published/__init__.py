"""Published VITS voices as `--init_from` sources: Piper training checkpoints and transformers
`VitsModel` folders (MMS-TTS), each read by its own module into one `SourceVoice`.

`source.SourceVoice` is the contract between the readers (`piper.py`, `mms.py`) and the code that
starts a run from one, `start.py` (shape from the source, text embedding mapped by symbol, speakers,
licence), which `tts/vits/train.py` runs before the run folder changes.
"""
