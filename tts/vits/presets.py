"""What `--preset {rtx4090,rtx5090,cpu}` sets for VITS (`common.presets` applies it, into the keys
`TrainConfig.PRESET_KEYS` names: batch_size, num_workers, model_args.segment_frames, precision).

Why these values: jaywalnut310's base config is batch 64 per GPU with 32-frame segments (8192 samples /
hop 256), decoded from random slices; it fits 24 GB under autocast, and the 5090 recipe
(tts/vits/configs/uzbek_vits_rtx5090.yaml) takes 96 with 8 workers. bf16 avoids fp16 overflow in the
flow/duration losses. The CPU preset: tiny settings so tests and the demo finish, fp32 because it is the
safe default there.
"""

from __future__ import annotations

from common.presets import CardPresets
from tts.vits.config import TrainConfig

CARD_PRESETS = CardPresets(
    trainer="tts", script="tts/train.py", schema=TrainConfig,
    values={  # crop: latent segment frames
        "rtx4090": {"batch_size": 64, "num_workers": 6, "precision": "bf16-mixed", "crop": 32},
        "rtx5090": {"batch_size": 96, "num_workers": 8, "precision": "bf16-mixed", "crop": 32},
        "cpu": {"batch_size": 4, "num_workers": 0, "precision": "32-true", "crop": 16},
    },
)
