import re
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import pytest

from common.config import (
    ConfigError,
    config_to_dict,
    file_overrides,
    import_from_string,
    load_config,
    override_value,
    parse_override,
    save_config,
)


@dataclass
class Optim:
    optimizer_cls: str = "torch.optim.AdamW"
    lr: float = 1e-4
    betas: list[float] = field(default_factory=lambda: [0.8, 0.99])


@dataclass
class Schema:
    ALIASES: ClassVar[dict[str, str]] = {"max_steps": "max_updates"}
    max_updates: int = 100
    crop_mel_frames: int = 32
    precision: Literal["32-true", "16-mixed", "bf16-mixed"] = "32-true"
    clip_grad_norm: float | None = None
    use_stftloss: bool = False
    optim: Optim = field(default_factory=Optim)
    extra: dict = field(default_factory=dict)


def write(path, text):
    path.write_text(text)
    return path


def test_inheritance_list_and_relative_paths(tmp_path):
    (tmp_path / "sub").mkdir()
    write(tmp_path / "base.yaml", "max_updates: 10\noptim:\n  lr: 0.001\n  betas: [0.9, 0.99]\n")
    write(tmp_path / "sub" / "mid.yaml", "crop_mel_frames: 48\n")
    child = write(tmp_path / "sub" / "child.yaml", "base_config: [../base.yaml, mid.yaml]\noptim:\n  lr: 0.0003\n")
    cfg = load_config(child, Schema)
    assert cfg.max_updates == 10 and cfg.crop_mel_frames == 48
    assert cfg.optim.lr == 3e-4 and cfg.optim.betas == [0.9, 0.99]  # deep merge kept betas


def test_a_files_own_keys_as_overrides_give_the_file_over_its_base(tmp_path):
    """file_overrides: a child's own keys as --set, laid over its base, give the child; the base's keys stay out."""
    base = write(tmp_path / "base.yaml", "max_updates: 10\noptim:\n  lr: 0.001\n  betas: [0.9, 0.99]\n")
    child = write(tmp_path / "child.yaml", "base_config: base.yaml\nprecision: 16-mixed\noptim:\n  lr: 1.0e-6\n"
                                           "clip_grad_norm: null\nuse_stftloss: true\n"
                                           "extra: {name: 'yes', note: 'a, b: #c', empty: {}, n: [1, 2.5]}\n")
    sets = file_overrides(child)
    assert sets[:2] == ["precision=16-mixed", "optim.lr=1.0e-06"] and not any(s.startswith("max_updates") for s in sets)
    assert config_to_dict(load_config(base, Schema, sets)) == config_to_dict(load_config(child, Schema))
    assert file_overrides(child, only=("optim",)) == ["optim.lr=1.0e-06"]
    assert file_overrides(child, skip=("extra", "optim")) == ["precision=16-mixed", "clip_grad_norm=null", "use_stftloss=true"]
    for value in (None, True, 0, -3, 0.5, 1e-6, float("inf"), "32-true", "yes", "a, b", "[x", "", [["a", 1]], {"k": "v w"}):
        assert parse_override(f"k={override_value(value)}") == ("k", value)


def test_overrides_convert_types_and_extra(tmp_path):
    f = write(tmp_path / "c.yaml", "max_updates: 10\n")
    cfg = load_config(f, Schema, overrides=["optim.lr=3e-4", "clip_grad_norm=1", "use_stftloss=true", "optim.betas=[0.5,0.9]"],
                      extra={"crop_mel_frames": 80, "max_updates": None})
    assert cfg.optim.lr == pytest.approx(3e-4) and isinstance(cfg.optim.lr, float)
    assert cfg.clip_grad_norm == 1.0 and cfg.use_stftloss is True and cfg.optim.betas == [0.5, 0.9]
    assert cfg.crop_mel_frames == 80 and cfg.max_updates == 10  # None in extra is skipped


def test_unknown_key_names_key_file_and_suggestion(tmp_path):
    f = write(tmp_path / "bad.yaml", "optim:\n  lrr: 0.1\n")
    with pytest.raises(ConfigError) as e:
        load_config(f, Schema)
    msg = str(e.value)
    assert "optim.lrr" in msg and "bad.yaml" in msg and "optim.lr" in msg


def test_unknown_key_from_override_and_inherited_file(tmp_path):
    with pytest.raises(ConfigError, match=r"crop_mel_frame.*--set.*crop_mel_frames"):
        load_config(None, Schema, overrides=["crop_mel_frame=3"])
    write(tmp_path / "base.yaml", "use_stft_loss: true\n")
    child = write(tmp_path / "child.yaml", "base_config: base.yaml\n")
    with pytest.raises(ConfigError, match=r"use_stft_loss.*base\.yaml.*use_stftloss"):
        load_config(child, Schema)


def test_bad_types_and_literals():
    with pytest.raises(ConfigError, match="max_updates"):
        load_config(None, Schema, overrides=["max_updates=abc"])
    with pytest.raises(ConfigError, match="precision"):
        load_config(None, Schema, overrides=["precision=fp64"])
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        load_config(None, Schema, overrides=["max_updates"])


def test_alias_and_missing_file(tmp_path):
    assert load_config(None, Schema, overrides=["max_steps=7"]).max_updates == 7
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml", Schema)
    bad = write(tmp_path / "cyc.yaml", "base_config: cyc.yaml\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_config(bad, Schema)


def test_save_config_round_trip(tmp_path):
    cfg = load_config(None, Schema, overrides=["optim.lr=0.01"])
    path = save_config(cfg, tmp_path / "run")
    assert load_config(path, Schema) == cfg


def test_import_from_string():
    import torch
    assert import_from_string("torch.optim.AdamW") is torch.optim.AdamW
    with pytest.raises(ConfigError, match="no 'Nope'"):
        import_from_string("torch.optim.Nope")


# ------------------------------------------------------------------------------------ error messages
def test_wrong_type_from_set_names_set_not_the_yaml_file(tmp_path):
    f = write(tmp_path / "c.yaml", "optim:\n  lr: 0.001\n")
    with pytest.raises(ConfigError) as e:
        load_config(f, Schema, overrides=["optim.lr=fast"])
    msg = str(e.value)
    assert "optim.lr" in msg and "--set optim.lr=fast" in msg and "c.yaml" not in msg


def test_union_type_error_says_the_type_in_words():
    with pytest.raises(ConfigError) as e:
        load_config(None, Schema, overrides=["clip_grad_norm=abc"])
    assert "Union" not in str(e.value) and "expected a number or null" in str(e.value)


def test_explicit_keys_are_the_command_line_ones_with_aliases_resolved(tmp_path):
    from common.config import explicit_keys, mark_explicit

    f = write(tmp_path / "c.yaml", "crop_mel_frames: 48\noptim:\n  lr: 0.001\n")
    cfg = load_config(f, Schema, overrides=["optim.lr=3e-4", "max_steps=5"], extra={"use_stftloss": True,
                                                                                    "precision": None})
    keys = explicit_keys(cfg)
    assert set(keys) == {"optim.lr", "max_updates", "use_stftloss"}  # not the YAML's crop_mel_frames
    assert keys["optim.lr"] == "--set optim.lr=3e-4"
    mark_explicit(cfg, "optim.betas", "--preset")
    assert "optim.betas" in explicit_keys(cfg) and explicit_keys(load_config(f, Schema)) == {}


# --------------------------------------------------------------------------------- aliases and layers
def test_the_later_layer_wins_whichever_spelling_it_uses(tmp_path):
    write(tmp_path / "canon.yaml", "max_updates: 5\n")
    write(tmp_path / "alias.yaml", "max_steps: 6\n")
    assert load_config(write(tmp_path / "a.yaml", "base_config: canon.yaml\nmax_steps: 7\n"), Schema).max_updates == 7
    assert load_config(write(tmp_path / "b.yaml", "base_config: alias.yaml\nmax_updates: 9\n"), Schema).max_updates == 9
    # --set and a trainer's flags are later layers too, in either spelling
    assert load_config(tmp_path / "canon.yaml", Schema, overrides=["max_steps=8"]).max_updates == 8
    assert load_config(tmp_path / "alias.yaml", Schema, extra={"max_updates": 4}).max_updates == 4
    # one file giving both spellings is ambiguous: an error naming it
    both = write(tmp_path / "both.yaml", "max_updates: 5\nmax_steps: 6\n")
    with pytest.raises(ConfigError, match=r"max_steps.*both\.yaml.*twice"):
        load_config(both, Schema)


def test_config_sources_name_the_file_the_flag_and_set(tmp_path):
    from common.config import config_sources, explicit_keys, mark_explicit

    f = write(tmp_path / "c.yaml", "crop_mel_frames: 48\noptim:\n  lr: 0.001\n")
    cfg = load_config(f, Schema, overrides=["max_steps=5"], extra={"use_stftloss": True},
                      extra_sources={"use_stftloss": "--stft"})
    sources = config_sources(cfg)
    assert sources["crop_mel_frames"] == sources["optim.lr"] == str(f.resolve())
    assert sources["use_stftloss"] == explicit_keys(cfg)["use_stftloss"] == "--stft"
    assert sources["max_updates"] == "--set max_steps=5" and "clip_grad_norm" not in sources
    mark_explicit(cfg, "clip_grad_norm", "--preset cpu")
    assert config_sources(cfg)["clip_grad_norm"] == "--preset cpu"



# ------------------------------------------------------------------ files that are not usable YAML text
def _laughs(levels: int, width: int = 10) -> str:
    """The "billion laughs": each level's list repeats the previous level's anchor `width` times."""
    lines = ["lol0: &lol0 [" + ", ".join(["lol"] * width) + "]"]
    lines += [f"lol{i}: &lol{i} [" + ", ".join([f"*lol{i - 1}"] * width) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_yaml_aliases_that_expand_beyond_the_bound_are_refused_in_one_line(tmp_path):
    import time

    # 10**5 values from a few lines (under `extra`, a free mapping: without the bound it simply loads)
    small = write(tmp_path / "small.yaml", "extra:\n  " + _laughs(5).replace("\n", "\n  "))
    with pytest.raises(ConfigError) as e:
        load_config(small, Schema)
    msg = str(e.value)
    assert msg.startswith(f"{small.resolve()}: refused: its aliases") and "\n" not in msg
    # 100 KB of them (10**1000 values): refused at once, in a base_config too
    big = write(tmp_path / "big.yaml", "extra:\n  " + _laughs(1000).replace("\n", "\n  ") + "\n")
    assert big.stat().st_size > 100_000
    child = write(tmp_path / "child.yaml", "base_config: big.yaml\nmax_updates: 3\n")
    start = time.monotonic()
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(big.resolve()))}: refused: its aliases"):
        load_config(child, Schema)
    assert time.monotonic() - start < 5
    # an alias inside its own anchor repeats forever
    with pytest.raises(ConfigError, match="repeats it forever"):
        load_config(write(tmp_path / "self.yaml", "extra: &a {x: [1, *a]}\n"), Schema)
    # and on the command line
    with pytest.raises(ConfigError, match=r"^--set extra=…: refused"):
        load_config(None, Schema, overrides=["extra={" + _laughs(6).strip().replace("\n", ", ") + "}"])


def test_a_few_anchors_and_base_config_still_load(tmp_path):
    write(tmp_path / "base.yaml", "optim: &o\n  lr: 0.001\n  betas: [0.9, 0.99]\nextra: {a: *o, b: *o}\n")
    child = write(tmp_path / "child.yaml", "base_config: base.yaml\noptim:\n  <<: {lr: 0.002}\n")
    cfg = load_config(child, Schema, overrides=["extra={a: &x [1, 2], b: *x}"])
    assert cfg.optim.lr == 0.002 and cfg.optim.betas == [0.9, 0.99] and cfg.extra == {"a": [1, 2], "b": [1, 2]}


@pytest.mark.parametrize("content", [b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe", "max_updates: 5\n".encode("utf-16"),
                                     "crop_mel_frames: 48  # caf\xe9\n".encode("latin-1")],
                         ids=["binary", "utf-16", "latin-1"])
@pytest.mark.parametrize("where", ["--config", "base_config"])
def test_a_config_that_is_not_utf8_text_is_one_line_naming_it(tmp_path, content, where):
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(content)
    path = bad if where == "--config" else write(tmp_path / "child.yaml", "base_config: bad.yaml\n")
    with pytest.raises(ConfigError) as e:
        load_config(path, Schema)
    msg = str(e.value)
    assert msg.startswith(f"{bad.resolve()}: not a UTF-8 text file") and "save it as UTF-8" in msg and "\n" not in msg


def test_invalid_yaml_is_one_line_with_line_and_column(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_config(write(tmp_path / "c.yaml", "optim:\n  lr: [0.1\nmax_updates: 3\n"), Schema)
    assert "c.yaml: not valid YAML/JSON: line " in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=r"nul\.yaml: not valid YAML/JSON: character #x0000 at offset 13") as e:
        load_config(write(tmp_path / "nul.yaml", "max_updates: \x003\n"), Schema)
    with pytest.raises(ConfigError, match="nest too deeply"):
        load_config(write(tmp_path / "deep.yaml", "extra: " + "[" * 20_000 + "\n"), Schema)
