"""KL-autoencoder (image VAE) trainer."""

from common.trainers import TrainerInfo


def _recognise(ckpt: dict) -> str | None:
    """A VAE file that records no trainer: a training checkpoint saved before checkpoints recorded one (a
    `vae` network, or the architecture in `extra.arch`), or an older `vae_final.pt` (`state_dict` + `arch`)."""
    models = ckpt.get("models") if isinstance(ckpt.get("models"), dict) else {}
    extra = ckpt.get("extra") if isinstance(ckpt.get("extra"), dict) else {}
    if "vae" in models or "arch" in extra or ("state_dict" in ckpt and "arch" in ckpt):
        return "vae"
    return None


TRAINER = TrainerInfo(
    name="vae",
    files={"vae": ("a VAE checkpoint (vae/train_vae.py)", "vae/reconstruct.py, or --init_from of vae/train_vae.py")},
    recognise=_recognise,
    presets="vae.presets.CARD_PRESETS",
)
