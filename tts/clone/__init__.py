"""Voice-cloning trainer (text + reference audio -> mel, vocoded by the vocoder)."""

from common.trainers import TrainerInfo


def _recognise(ckpt: dict) -> str | None:
    """A voice-cloning training checkpoint saved before checkpoints recorded their trainer: one network,
    named `model`."""
    models = ckpt.get("models") if isinstance(ckpt.get("models"), dict) else {}
    return "clone" if "model" in models else None


TRAINER = TrainerInfo(
    name="clone",
    files={"clone": ("a voice-cloning checkpoint (tts/train_main.py)",
                     "tts/infer_clone.py, tts/export_clone_onnx.py, or --init_from of tts/train_main.py")},
    recognise=_recognise,
    presets="tts.clone.presets.CARD_PRESETS",
)
