"""A trained VAE for inference, from whichever file a run left: a training checkpoint, `vae_final.pt`
or the exported diffusers folder.

Why here and not in the trainer: `reconstruct.py`, the demo and users' scripts load weights without
importing the training loop (and its DDP, LPIPS and logging imports).

Why the model a file declares is checked before it is built: a file's `arch` (or a folder's
config.json) is a few bytes that can declare a model of any size (`channels [100000, ...]`: 360 GB of
weights from a 1.4 KB file). The model is first built on the `meta` device (shapes, no memory) and
must match the tensors the file really holds (`diffusers_io.declared_model`), name for name and shape
for shape, before it is built for real. A crafted or damaged file's content is one `CheckpointError` naming the file
(`malformed_is_one_line`, shared with `--init_from`), never a traceback.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from common.checkpoint import CheckpointError, fit_summary, load_checkpoint, refuse_other_kind
from common.errors import ConfigError
from common.hardware import is_oom
from vae.diffusers_io import declared_model, load_diffusers
from vae.model import AutoencoderKL, build_vae

# What reading a well-formed container with malformed content raises: missing or mistyped keys, odd shapes,
# a config nested past Python's recursion limit.
MALFORMED = (KeyError, AttributeError, RecursionError, TypeError, IndexError, RuntimeError, ValueError)

# What a weights file for `reconstruct.py` and the demo can be.
INFERENCE_FILES = "a checkpoint_*.pt or vae_final.pt of vae/train_vae.py, or a diffusers AutoencoderKL folder"


@contextmanager
def malformed_is_one_line(label: str, fix: str) -> Iterator[None]:
    """A crafted or damaged file's content (wrong ranks, mistyped config, nesting past the recursion limit)
    as one CheckpointError `<label>: not a usable VAE file (<error>); <fix>`. The project's own one-line
    errors (CheckpointError, ConfigError) and an out-of-memory error pass through as they are."""
    try:
        yield
    except MALFORMED as exc:
        if isinstance(exc, (CheckpointError, ConfigError)) or is_oom(exc):
            raise  # already one line of its own (a full disk while recording factors is not the file's fault)
        what = str(exc).splitlines()[0][:160] if str(exc) else ""
        raise CheckpointError(f"{label}: not a usable VAE file ({type(exc).__name__}: {what}); {fix}") from None


def _fitting(source: Path, arch: dict, state: dict, what: str = "its arch") -> AutoencoderKL:
    """The real model for `state` (our key names), built only after `declared_model` and a name-and-shape check."""
    shell = declared_model(source, arch, state, what, f"give {INFERENCE_FILES}")
    own = shell.state_dict()
    if set(own) != set(state) or any(tuple(own[k].shape) != tuple(getattr(state[k], "shape", ())) for k in own):
        raise CheckpointError(f"{source}: its weights do not fit the model {what} declares "
                              f"({fit_summary(own, state)}); give {INFERENCE_FILES}")
    model = build_vae(arch)
    model.load_state_dict(state)
    return model


def load_vae_weights(path: str | Path, use_ema: bool = True, ckpt: dict | None = None) -> tuple[AutoencoderKL, dict]:
    """(model, what was loaded). A checkpoint gives its EMA weights when it has them and `use_ema`. A file
    that cannot be used (damaged, another trainer's, a model its tensors do not hold, malformed content) is
    one CheckpointError naming it. ``ckpt``: the file at `path` already loaded (a caller that first read which
    trainer wrote it loads it once)."""
    path = Path(path)
    with malformed_is_one_line(str(path), f"give {INFERENCE_FILES}"):
        return _load(path, use_ema, ckpt)


def _load(path: Path, use_ema: bool, ckpt: dict | None = None) -> tuple[AutoencoderKL, dict]:
    if path.is_dir():
        model, cfg = load_diffusers(path, f"give {INFERENCE_FILES}")
        return model, {"source": "diffusers", "scaling_factor": cfg.get("scaling_factor")}
    ckpt = load_checkpoint(path) if ckpt is None else ckpt
    refuse_other_kind(path, ckpt, "vae")
    if "state_dict" in ckpt and "arch" in ckpt:  # vae_final.pt
        model = _fitting(path, ckpt["arch"], ckpt["state_dict"])
        return model, {"source": "final", **ckpt.get("latent_stats", {})}
    arch = ckpt.get("extra", {}).get("arch")
    if arch is None:
        raise CheckpointError(f"{path}: not a VAE checkpoint from vae/train_vae.py (no 'extra.arch')")
    ema = ckpt.get("ema", {}).get("vae")
    if use_ema and ema:
        return _fitting(path, arch, dict(ema["shadow"]), "its extra.arch"), {"source": "checkpoint (EMA weights)"}
    return _fitting(path, arch, ckpt["models"]["vae"], "its extra.arch"), {"source": "checkpoint"}
