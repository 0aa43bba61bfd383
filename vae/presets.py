"""What `--preset {rtx4090,rtx5090,cpu}` sets for the VAE (`common.presets` applies it, into the keys
`VAEConfig.PRESET_KEYS` names: num_workers and precision only — the guide's resolution profiles fix
batch and crop, and `fit_batch_size` lowers the batch at start when memory says so).

Why these values: a KL autoencoder + LPIPS + patch discriminator at 1024 px is dominated by activations:
4 images per 24 GB card and 8 per 32 GB card in bf16. The batch here is the `--batch_size auto` answer
where memory cannot be measured (`vae.memory.choose_batch_size` on a CPU). The CPU preset: tiny settings
so tests and the demo finish, fp32 because it is the safe default there.
"""

from __future__ import annotations

from common.presets import CardPresets
from vae.config import VAEConfig

CARD_PRESETS = CardPresets(
    trainer="vae", script="vae/train_vae.py", schema=VAEConfig,
    values={  # crop: square crop in pixels
        "rtx4090": {"batch_size": 4, "num_workers": 6, "precision": "bf16-mixed", "crop": 1024},
        "rtx5090": {"batch_size": 8, "num_workers": 12, "precision": "bf16-mixed", "crop": 1024},
        "cpu": {"batch_size": 2, "num_workers": 0, "precision": "32-true", "crop": 256},
    },
)
