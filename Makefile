# Two commands for a newcomer: `make demo` and `make test`. Both set themselves up first and are
# idempotent: a second run skips what is already installed.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
SYSDEPS := $(VENV)/.sysdeps
TESTDEPS := $(VENV)/.testdeps
export PYTHONUNBUFFERED := 1
# Imports write their byte-code once (pip installs with --no-compile): where the environment sets
# PYTHONDONTWRITEBYTECODE, every process of the demo and the tests would compile torch's modules
# again (~3-8 s of CPU each).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup test lint serve demo bench bench-learning check clean-demo gpu-check gpu-wheels

$(STAMP): requirements.txt requirements-nodeps.txt pyproject.toml shell/warm_caches.py
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-compile -r requirements.txt  # no byte-compiling all of torch up front (~25 s): imports compile what they use
	$(PY) -m pip install -q --no-compile --no-deps -r requirements-nodeps.txt  # their dependencies are not needed (the file says why)
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	$(PY) shell/warm_caches.py  # the byte-code and numba caches every run uses, once (~10 s; the file says why)
	@touch $@

# Debian packages for demo speech: espeak-ng (voice `uz`) and sox; installed only where missing.
$(SYSDEPS):
	@bash shell/install_sysdeps.sh
	@touch $@

setup: $(STAMP) $(SYSDEPS)

# The originating code the loaders are verified against (diffusers, transformers, piper-tts) and the browser the
# page's tests drive (Playwright + Debian's chromium): tests only.
$(TESTDEPS): requirements-test.txt $(STAMP) shell/install_test_sysdeps.sh
	$(PY) -m pip install -q --no-compile -r requirements-test.txt
	@bash shell/install_test_sysdeps.sh
	@touch $@

# The suite on every core (pytest-xdist; each worker computes with one torch thread: tests/conftest.py).
test: setup $(TESTDEPS)
	$(PY) -m pytest tests -n auto

lint: setup
	$(PY) -m ruff check common speech vocoder tts vae bench serve tests

# The page and HTTP API over trained models (docs/serve.md): CKPT="a.pt b/export ..." (default: the demo's
# outputs under runs/), ARGS="--port 8001 --device cuda ...". Listens on 127.0.0.1 unless ARGS says --host.
serve: setup
	$(PY) -m serve $(CKPT) $(ARGS)

check: setup
	$(PY) -m common.check

bench: setup
	$(PY) -m bench.run_all

# Everything about CUDA in one run on a GPU (8 min by default): README "Validating on a GPU", bench/README.md.
# Uses a CUDA torch (>= 2.11) already installed, else makes .venv; installs only what that one lacks
# (from .whl/ with no network when `make gpu-wheels` put the wheels there). ARGS go to `python -m bench.gpu`.
gpu-check:
	bash shell/gpu_check.sh $(ARGS)

# The wheels gpu-check needs beyond a CUDA PyTorch image, for a machine with no network (PYVER=3.12).
gpu-wheels:
	bash shell/gpu_wheels.sh $(or $(PYVER),3.12)

# Per-step learning of each trainer, two settings side by side (TRAINER=vocoder|vits|vae, ARGS=...).
bench-learning: setup
	$(PY) -m bench.learning --trainer $(or $(TRAINER),all) $(ARGS)

# Each trainer adds its targets (prepare / train / demo) in its own file. The order is make demo's:
# a free slot takes the first listed demo whose needs have ended.
-include tts/targets.mk vocoder/targets.mk tts/clone_targets.mk vae/targets.mk

# The four demos run two at a time, one thread each (common/demo.py says why), the cloning demo after
# the vocoder demo (its export) and the VITS demo's corpus (tts-demo-data). Every demo runs, even after one misses its
# plausibility check (each writes its outputs and pictures first); the end repeats every verdict and
# the exit status is 1 when any demo missed or failed. DEMO_SLOTS=1 runs them one after another.
# DEMO_THREADS=N pins each demo's torch threads (default: cores / slots); DEMO_SEED=N trains every
# demo with that seed instead of its config's (how the README's ranges were measured).
DEMO_SLOTS ?= 2
DEMO_ARGS = $(if $(DEMO_SEED),--seed $(DEMO_SEED))
# DEMO_THREADS and DEMO_SEED reach a demo run on its own too (make vocoder-demo DEMO_THREADS=2 DEMO_SEED=7).
DEMO_ENV = $(if $(DEMO_THREADS),OMP_NUM_THREADS=$(DEMO_THREADS))
demo: setup
	$(DEMO_ENV) $(PY) -m common.demo --slots $(DEMO_SLOTS) --log_dir runs/demo_logs $(DEMO_JOBS)

# What `make demo` made and nothing else: the demos' run folders and their generated data (all under data/demo/).
# Your own runs/ and data/ folders are never touched. A new demo adds its run folder here.
DEMO_RUNS := runs/vocoder_demo runs/tts_demo runs/tts_clone_demo runs/vae_demo runs/gta_demo runs/demo_logs
clean-demo:
	rm -rf $(DEMO_RUNS) data/demo
