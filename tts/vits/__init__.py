"""VITS text-to-speech trainer (text -> waveform, end to end)."""

from common.trainers import TrainerInfo


def _recognise(ckpt: dict) -> str | None:
    """A VITS training checkpoint saved before checkpoints recorded their trainer: a generator, with the
    speaker list or the text front-end's symbols beside it."""
    models = ckpt.get("models") if isinstance(ckpt.get("models"), dict) else {}
    extra = ckpt.get("extra") if isinstance(ckpt.get("extra"), dict) else {}
    return "vits" if "generator" in models and ("speakers" in extra or "symbols" in extra) else None


TRAINER = TrainerInfo(
    name="vits",
    files={"vits": ("a VITS checkpoint (tts/train.py)",
                    "tts/synthesize.py, tts/export_onnx.py, or --init_from of tts/train.py")},
    recognise=_recognise,
    presets="tts.vits.presets.CARD_PRESETS",
)
