"""What `--preset {rtx4090,rtx5090,cpu}` sets for the vocoder (`common.presets` applies it, into the keys
`VocoderConfig.PRESET_KEYS` names: batch_size, num_workers, crop_mel_frames, precision).

Why these values: bf16-mixed on both cards. openvpi's NSF-HiFiGAN recipe trains in fp16 and warns that
bf16 costs audio quality, but cites no measurement; measured here (bench/README.md, "Fast-path keys of the
vocoder"), bf16 learns as fast per step as fp32 on identical batches (held-out MR-STFT, mel L1, MCD, V/UV
at 200 demo steps: bf16 level or ahead at 150 and 200), and on an H200 its step is 3.00x plain fp32
against fp16's 2.90x at the same memory. It needs no GradScaler either: no skipped steps while the
scale settles, no scaler state. A long full-size run on a card is what would overturn it.
The generator + MPD/MSD at batch 16 x 48-frame mel crops fits a 24 GB card; the 5090
guide's 32 x 80 frames fits 32 GB. Waveform crops are cheap to load but f0/mel caching still wants
workers, hence 6 / 12 (the 5090 eats batches twice as fast). The CPU preset: tiny settings so tests
and the demo finish, fp32 because it is the safe default there.
"""

from __future__ import annotations

from common.presets import CardPresets
from vocoder.config import VocoderConfig

CARD_PRESETS = CardPresets(
    trainer="vocoder", script="vocoder/train.py", schema=VocoderConfig,
    values={  # crop: mel frames
        "rtx4090": {"batch_size": 16, "num_workers": 6, "precision": "bf16-mixed", "crop": 48},
        "rtx5090": {"batch_size": 32, "num_workers": 12, "precision": "bf16-mixed", "crop": 80},
        "cpu": {"batch_size": 2, "num_workers": 0, "precision": "32-true", "crop": 32},
    },
)
