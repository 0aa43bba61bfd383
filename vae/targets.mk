# VAE targets, included by the root Makefile (which defines PY and `setup`).
#   make vae-prepare DATA=path/to/raw_images OUT=data/vae SIZE=1024
#   make vae-validate DATA=path/to/raw_images
#   make vae-train DATA=data/vae OUT=runs/vae CONFIG=vae/configs/standard_1024.yaml ARGS="--batch_size auto"
#   make vae-demo
# DATA/OUT/CONFIG/SIZE/ARGS are read only when given on the command line or in the environment, so
# another trainer's defaults for the same names never leak in here. Train resumes (--resume auto;
# ARGS="--overwrite" starts over, moving the old run aside).
vae_arg = $(if $(filter command line environment,$(origin $(1))),$($(1)),$(2))

.PHONY: vae-prepare vae-validate vae-train vae-demo

vae-prepare: setup
	$(PY) vae/prepare_data.py --mode preprocess --input_dir $(call vae_arg,DATA,data/vae_raw) \
		--output_dir $(call vae_arg,OUT,data/vae) --target_size $(call vae_arg,SIZE,1024)

vae-validate: setup
	$(PY) vae/prepare_data.py --mode validate --input_dir $(call vae_arg,DATA,data/vae_raw) \
		--output_file $(call vae_arg,OUT,data/vae)/validation_report.json

vae-train: setup
	$(PY) vae/train_vae.py --config $(call vae_arg,CONFIG,vae/configs/standard_1024.yaml) \
		--data_path $(call vae_arg,DATA,data/vae) --output_dir $(call vae_arg,OUT,runs/vae) --resume auto \
		$(call vae_arg,ARGS,)

vae-demo: setup
	$(DEMO_ENV) $(PY) vae/demo.py $(DEMO_ARGS)

DEMO_JOBS += --job 'vae=$(MAKE) --no-print-directory vae-demo'
