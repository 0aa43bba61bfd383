"""Every schema key of every trainer is read by code: a key that is accepted but never read is a
setting a user believes took effect when nothing changed (`eval_batch_size` was one).

How (static, so it covers all four trainers in well under a second): each trainer declares its
schema as dataclasses in one config module. A key counts as read when the trainer's own source
files (and common/ and speech/, which read configs they are handed) contain it
- as an attribute read (`cfg.eval_batch_size`, `t.compile`, `args.hidden_channels`: an `ast.Attribute`
  in Load context, f-strings included), or
- as a string constant outside dict literals (`getattr(cfg, "lr_gen")`, a loop over
  `("sample_rate", "n_fft", ...)`, `item["key"]`).
Dataclass field declarations are annotated names (not attributes), `self.x = ...` is a store, and
dict literals (ALIASES, PRESETS, override tables) are excluded: none of them counts as a read.
Limits, accepted: a same-named attribute of another object in the same files also counts (so a key
named `lr` is not proven read); generic readers (`config_to_dict`) do not count.

ALLOWED lists keys this check finds unread, each with why; keys owned by another issue-12 slice are
listed for that slice to make work or remove (it names the slice).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMMON = sorted((ROOT / "common").glob("*.py")) + sorted((ROOT / "speech").glob("*.py"))  # shared readers
CLONE_SCRIPTS = ("train_main.py", "infer_clone.py", "export_clone_onnx.py", "clone_demo.py")  # tts/ entry points
VITS_FILES = [p for p in sorted((ROOT / "tts").rglob("*.py"))
              if "clone" not in p.relative_to(ROOT / "tts").parts and p.name not in CLONE_SCRIPTS]
CLONE_FILES = [p for p in sorted((ROOT / "tts").rglob("*.py"))
               if "clone" in p.relative_to(ROOT / "tts").parts or p.name in CLONE_SCRIPTS
               or p.relative_to(ROOT / "tts").as_posix() in ("prepare_data.py", "vits/data.py", "vits/config.py")
               ]  # check_item and its DataConfig

# trainer → (config module, the files that read it)
TRAINERS = {
    "vits": ("tts.vits.config", VITS_FILES),
    "clone": ("tts.clone.config", CLONE_FILES),
    "vocoder": ("vocoder.config", sorted((ROOT / "vocoder").glob("*.py"))),
    "vae": ("vae.config", sorted((ROOT / "vae").glob("*.py"))),
}

# "trainer:Class.key" → why it is allowed to be unread here.
ALLOWED: dict[str, str] = {}


def schema_keys(module_name: str) -> list[str]:
    """'Class.key' for every field of every dataclass defined in the config module."""
    module = importlib.import_module(module_name)
    keys = []
    for name, cls in inspect.getmembers(module, inspect.isclass):
        if dataclasses.is_dataclass(cls) and cls.__module__ == module_name:
            keys += [f"{name}.{f.name}" for f in dataclasses.fields(cls) if f.init]
    return keys


def names_read(files: list[Path]) -> set[str]:
    read: set[str] = set()
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        in_dict: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Dict):
                in_dict |= {id(n) for n in (*node.keys, *node.values) if n is not None}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                read.add(node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in in_dict:
                read.add(node.value)
    return read


def unread(trainer: str) -> list[str]:
    module, files = TRAINERS[trainer]
    read = names_read([*files, *COMMON])
    return [f"{trainer}:{k}" for k in schema_keys(module) if k.split(".", 1)[1] not in read]


@pytest.mark.parametrize("trainer", list(TRAINERS))
def test_every_schema_key_is_read(trainer):
    missing = [k for k in unread(trainer) if k not in ALLOWED]
    assert not missing, ("config keys accepted but never read by code (make them work, remove them, or list "
                         f"them in ALLOWED with the reason): {missing}")


def test_allow_list_is_not_stale():
    still_unread = {k for t in TRAINERS for k in unread(t)}
    assert not set(ALLOWED) - still_unread, f"now read, remove from ALLOWED: {sorted(set(ALLOWED) - still_unread)}"


def test_the_check_catches_an_unread_key(tmp_path):
    """The check can fail: a file that only declares a key does not read it; one that reads it does."""
    (tmp_path / "declares.py").write_text("class C:\n    eval_batch_size: int = 16\nA = {'eval_batch_size': 1}\n")
    (tmp_path / "reads.py").write_text("def f(cfg):\n    return cfg.eval_batch_size\n")
    assert "eval_batch_size" not in names_read([tmp_path / "declares.py"])
    assert "eval_batch_size" in names_read([tmp_path / "reads.py"])
