"""NSF-HiFiGAN vocoder trainer (mel + f0 -> waveform)."""

from common.trainers import TrainerInfo


def _recognise(ckpt: dict) -> str | None:
    """A vocoder file that records no trainer: a training checkpoint saved before checkpoints recorded one
    (a generator, and the export block or a seed `task_cls` config), or an exported / released generator
    (`{'generator': state_dict}`, or a Lightning `state_dict` with `generator.*` keys)."""
    models = ckpt.get("models") if isinstance(ckpt.get("models"), dict) else {}
    extra = ckpt.get("extra") if isinstance(ckpt.get("extra"), dict) else {}
    config = ckpt.get("config") if isinstance(ckpt.get("config"), dict) else {}
    if "generator" in models and ("export" in extra or "task_cls" in config):
        return "vocoder"
    if isinstance(ckpt.get("generator"), dict):
        return "vocoder_export"
    state = ckpt.get("state_dict")
    if isinstance(state, dict) and any(str(k).startswith("generator.") for k in state):
        return "vocoder_export"
    return None


TRAINER = TrainerInfo(
    name="vocoder",
    files={
        "vocoder": ("a vocoder training checkpoint (vocoder/train.py)",
                    "vocoder/infer.py, vocoder/export.py, or --init_from of vocoder/train.py"),
        "vocoder_export": ("an exported vocoder (vocoder/export.py, or a DiffSinger / SingingVocoders release)",
                           "vocoder/infer.py, or --init_from of vocoder/train.py"),
    },
    recognise=_recognise,
    presets="vocoder.presets.CARD_PRESETS",
)
