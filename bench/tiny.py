"""The smallest settings each trainer runs with: the CPU tests train with them, and `make gpu-check`'s dry run
(bench/gpu/trainers.py) uses the same, so a harness change and a test change cannot drift apart. Here, not in
tests/, because bench/ code must not import the test suite."""

# The vocoder: a model small enough for CPU unit tests; the audio front end is demo.yaml's (22.05 kHz, hop 256).
VOCODER_TINY = [
    "model_args.upsample_initial_channel=32",
    "model_args.resblock=2",
    "model_args.resblock_kernel_sizes=[3]",
    "model_args.resblock_dilation_sizes=[[1]]",
    "model_args.discriminators=[fast_mpd]",
    "model_args.discriminator_periods=[2,3]",
    "model_args.fast_mpd_init_channel=2",
    "crop_mel_frames=8",
    "batch_size=2",
    "num_workers=0",
    "precision=32-true",
    "loss_fft_sizes=[256,512]",
    "loss_hop_sizes=[64,128]",
    "loss_win_lengths=[256,512]",
    "lr_scheduler_args.warmup_steps=0",
    "num_sanity_val_steps=0",
    "num_valid_plots=1",
    "valid_max_seconds=0.5",
    "val_check_interval=1000",
    "log_interval=1",
    "volume_aug=false",
    "val_num=1",
    "binarization_args.num_workers=0",
    "discriminator_train_start_steps=0",  # the loop with its critics from step 0 (demo.yaml warms up 1500)
]

# Uzbek VITS (`--set` values): the tiny preset, batch 2, no evaluation.
VITS_FAST = ["model=tiny", "batch_size=2", "num_workers=0", "persistent_workers=false", "pin_memory=false",
             "precision=32-true", "run_eval=false", "eval_at_start=false", "test_sentences=[]", "print_step=1",
             "save_step=2", "val_check_interval=0", "data.num_buckets=2", "max_minutes=null", "progress_bar=false",
             "model_args.segment_frames=8", "model_args.upsample_initial_channel=32", "model_args.n_layers_q=2"]

# Voice cloning: the audio settings of the synthetic 22.05 kHz corpus (`tts.clone`'s default is 24 kHz / 100 mels).
CLONE_AUDIO = ["--set", "audio.sample_rate=22050", "--set", "audio.n_fft=1024", "--set", "audio.win_length=1024",
               "--set", "audio.hop_length=256", "--set", "audio.n_mels=80", "--set", "audio.fmin=40",
               "--set", "audio.fmax=8000"]
