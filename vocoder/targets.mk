# Vocoder targets, included by the root Makefile (which defines PY and `setup`).
#   make vocoder-prepare DATA=path/to/audio_folder [OUT=data/vocoder_bin] [CONFIG=...] [WORKERS=8]
#   make vocoder-train   [DATA=data/vocoder_bin] [RUN=runs/vocoder] [CONFIG=...] [ARGS="--set batch_size=8"]
#   make vocoder-demo    (espeak-ng speech, tiny model, ~5 CPU minutes, then copy-synthesis + export)
# DATA/OUT/RUN/CONFIG/WORKERS/ARGS are read only when given on the command line or in the environment,
# so another trainer's defaults for the same names never leak in here. Train resumes (--resume auto).
vocoder_arg = $(if $(filter command line environment,$(origin $(1))),$($(1)),$(2))
VOCODER_CONFIG = $(call vocoder_arg,CONFIG,vocoder/configs/base_hifi_gpu.yaml)

.PHONY: vocoder-prepare vocoder-train vocoder-demo

vocoder-prepare: setup
	$(PY) vocoder/prepare_data.py --config $(VOCODER_CONFIG) --input $(call vocoder_arg,DATA,data/vocoder_raw) \
		--output $(call vocoder_arg,OUT,data/vocoder_bin) \
		$(if $(call vocoder_arg,WORKERS,),--num_workers $(call vocoder_arg,WORKERS,),)

vocoder-train: setup
	$(PY) vocoder/train.py --config $(VOCODER_CONFIG) --data_dir $(call vocoder_arg,DATA,data/vocoder_bin) \
		--run_dir $(call vocoder_arg,RUN,runs/vocoder) --resume auto $(call vocoder_arg,ARGS,)

vocoder-demo: setup
	$(DEMO_ENV) $(PY) vocoder/demo.py $(DEMO_ARGS)

DEMO_JOBS += --job 'vocoder=$(MAKE) --no-print-directory vocoder-demo'
