# Uzbek VITS targets (included by the root Makefile, which defines PY and setup).
#   make tts-prepare TTS_METADATA=my/metadata.csv TTS_AUDIO_DIR=my/wavs
#   make tts-train   [TTS_CONFIG=tts/vits/configs/uzbek_vits_rtx5090.yaml] [TTS_ARGS="--set batch_size=32"]
#   make tts-demo    (espeak-ng corpus, tiny model, a few CPU minutes)
TTS_CONFIG ?= tts/vits/configs/uzbek_vits.yaml
TTS_METADATA ?= data/tts_raw/metadata.csv
TTS_AUDIO_DIR ?= data/tts_raw/wavs
TTS_DATA ?= data/preprocessed
TTS_RUN ?= runs/uzbek_vits
TTS_WORKERS ?= 4
TTS_ARGS ?=

.PHONY: tts-prepare tts-train tts-demo tts-demo-data

tts-prepare: setup
	$(PY) tts/prepare_data.py --config $(TTS_CONFIG) --metadata $(TTS_METADATA) --audio_dir $(TTS_AUDIO_DIR) \
		--output_dir $(TTS_DATA) --num_workers $(TTS_WORKERS)

tts-train: setup
	$(PY) tts/train.py --config $(TTS_CONFIG) --data_dir $(TTS_DATA) --run_dir $(TTS_RUN) --resume auto $(TTS_ARGS)

tts-demo: setup
	$(DEMO_ENV) $(PY) tts/demo.py $(DEMO_ARGS)

# The demo corpus alone: make demo starts the cloning demo on it while the VITS demo trains.
tts-demo-data: setup
	$(PY) tts/demo.py --data_only

DEMO_JOBS += --job 'tts-data=$(MAKE) --no-print-directory tts-demo-data'
DEMO_JOBS += --job 'tts@tts-data=$(MAKE) --no-print-directory tts-demo'
