# Voice-cloning TTS (tts/train_main.py, tts/CLONE.md). Included by the root Makefile, which
# defines PY and setup. Override on the command line, e.g.
#   make tts-clone-train CLONE_DATA=data/my_prepared CLONE_ARGS="--fast-convergence"
CLONE_CONFIG ?= tts/clone/configs/clone_base.yaml
CLONE_DATA ?= data/tts_prepared
CLONE_RUN ?= runs/tts_clone
CLONE_ARGS ?=

.PHONY: tts-clone-train tts-clone-demo

# Resumes automatically from the newest checkpoint in CLONE_RUN.
tts-clone-train: setup
	$(PY) tts/train_main.py --config $(CLONE_CONFIG) --train-data $(CLONE_DATA) \
		--checkpoint-dir $(CLONE_RUN) --resume auto $(CLONE_ARGS)

tts-clone-demo: setup
	$(DEMO_ENV) $(PY) tts/clone_demo.py $(DEMO_ARGS)

# After the vocoder demo (its export vocodes the samples) and the VITS demo's corpus (tts-data).
DEMO_JOBS += --job 'clone@vocoder,tts-data=$(MAKE) --no-print-directory tts-clone-demo'

# Vocoder fine-tuning on the cloning model's teacher-forced (GTA) mels (tts/clone/gta_demo.py): reuses
# the vocoder and cloning demos' runs/ outputs (runs those demos first when missing), then GTA mels →
# vocoder fine-tune → held-out MCD-DTW and level before/after. Not part of `make demo`.
.PHONY: gta-demo
gta-demo: setup
	$(DEMO_ENV) $(PY) tts/clone/gta_demo.py $(DEMO_ARGS) $(GTA_ARGS)
