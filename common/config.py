"""YAML → typed dataclasses, with `base_config:` inheritance and `--set a.b=c` overrides.

Why typed dataclasses: a config key that nothing reads is a silent bug (a user believes a setting
took effect when it did not), so every key must map to a declared field, and a typo fails loudly
with the closest valid key.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import importlib
import json
import re
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from common.distributed import launched_as_rank0
from common.errors import ConfigError
from common.ranges import RangeError, check_annotations

T = TypeVar("T")


# ---------------------------------------------------------------------------------------------
# Reading YAML files with inheritance
# ---------------------------------------------------------------------------------------------
def _deep_merge(base: dict, child: dict) -> dict:
    out = dict(base)
    for key, value in child.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


# A YAML alias (`*name`) repeats the node its anchor (`&name`) marks. Nested aliases multiply ("billion
# laughs": 100 KB of them stand for 10**11 values), and every later walk of the config (merging layers,
# type checks, saving `config.yaml`) would expand them: minutes of CPU and gigabytes. No shipped config
# uses anchors; a few for shared blocks are fine, so what aliases add, counted expanded, is bounded.
MAX_ALIAS_EXPANSION = 10_000


class YAMLAliasError(yaml.YAMLError):
    """A YAML document whose aliases expand beyond MAX_ALIAS_EXPANSION values, or refer to themselves."""


def _children(node: yaml.Node) -> list:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def expanded_size(root: yaml.Node) -> tuple[int, int]:
    """(values the composed document `root` stands for with every alias expanded, distinct nodes in it).
    Linear in the document (each node is sized once); YAMLAliasError for an alias inside its own anchor."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()  # the nodes being sized: the path from the root
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            sizes[key] = 1 + sum(sizes[id(c)] for c in _children(node))
            open_.discard(key)
            continue
        if key in sizes:
            continue
        if key in open_:
            raise YAMLAliasError("an alias (*name) inside the block its anchor (&name) marks repeats it forever")
        open_.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node))
    return sizes[id(root)], len(sizes)


class ConfigLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses aliases which expand to more than MAX_ALIAS_EXPANSION extra values."""

    def compose_document(self):
        node = super().compose_document()
        if node is not None:
            total, distinct = expanded_size(node)
            if total - distinct > MAX_ALIAS_EXPANSION:
                raise YAMLAliasError(f"its aliases (*name) repeat their anchors (&name) into more than "
                                     f"{MAX_ALIAS_EXPANSION} values ({total} in all)")
        return node


def safe_load(text: str) -> Any:
    """yaml.safe_load with the alias bound of ConfigLoader (YAMLAliasError beyond it)."""
    return yaml.load(text, Loader=ConfigLoader)  # noqa: S506 - a SafeLoader subclass


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """A PyYAML error as one line: where (line, column) and what (its own text spans several lines)."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        return f"{where}{exc.problem}" + (f" ({exc.context})" if exc.context else "")
    if isinstance(exc, yaml.reader.ReaderError):
        code = ord(exc.character) if isinstance(exc.character, str) else exc.character
        return f"character #x{code:04x} at offset {exc.position}: {exc.reason}"
    return " ".join(str(exc).split())


def _read_yaml(path: Path) -> dict:
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        utf16 = " (it is UTF-16, Windows' 'Unicode')" if exc.object[:2] in (b"\xff\xfe", b"\xfe\xff") else ""
        raise ConfigError(f"{path}: not a UTF-8 text file{utf16} (byte 0x{exc.object[exc.start]:02x} at offset "
                          f"{exc.start}); a config is YAML text: save it as UTF-8, or give the right file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    try:
        data = safe_load(text)
    except YAMLAliasError as exc:
        raise ConfigError(f"{path}: refused: {exc}; write the values out instead of aliasing them") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML/JSON: {_yaml_problem(exc)}") from None
    except RecursionError:
        raise ConfigError(f"{path}: not a usable config: its blocks nest too deeply") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys, got {type(data).__name__}")
    return data


def read_config_file(path: str | Path, _seen: tuple[Path, ...] = (),
                     schema: type | None = None) -> tuple[dict, dict[str, Path]]:
    """Returns the merged mapping and, for every dotted key, the file that set it last.

    With `schema`, each file's keys are first renamed to the schema's field names (its `ALIASES`),
    so a layer that spells a key the other way (`generater_optimizer_args` over a base's
    `generator_optimizer_args`) replaces it like any later layer does, instead of setting it twice."""
    path = Path(path).resolve()
    if path in _seen:
        chain = " -> ".join(str(p) for p in (*_seen, path))
        raise ConfigError(f"base_config cycle: {chain}")
    data = _read_yaml(path)
    bases = data.pop("base_config", None) or []
    if isinstance(bases, str):
        bases = [bases]
    merged: dict = {}
    sources: dict[str, Path] = {}
    for base in bases:
        base_path = Path(base) if Path(base).is_absolute() else path.parent / base
        if not base_path.is_file():
            raise ConfigError(f"{path}: base_config '{base}' not found (looked at {base_path})")
        base_data, base_sources = read_config_file(base_path, (*_seen, path), schema)
        merged = _deep_merge(merged, base_data)
        sources.update(base_sources)
    if schema is not None:
        data = canonical_names(schema, combine_multi_key_aliases(schema, data, merged, str(path)), str(path))
    merged = _deep_merge(merged, data)
    for key in _dotted_keys(data):
        sources[key] = path
    return merged, sources


def _dotted_keys(d: dict, prefix: str = "") -> list[str]:
    keys = []
    for k, v in d.items():
        full = f"{prefix}{k}"
        keys.append(full)
        if isinstance(v, dict):
            keys.extend(_dotted_keys(v, full + "."))
    return keys


# ---------------------------------------------------------------------------------------------
# Building the dataclass with type checks
# ---------------------------------------------------------------------------------------------
def _aliases(cls: type) -> dict[str, str]:
    return dict(getattr(cls, "ALIASES", {}) or {})


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    """A schema class's resolved field types, `Annotated` ranges kept. Cached: resolving the string
    annotations costs milliseconds per class, and a load asks for them once per key."""
    return typing.get_type_hints(cls, include_extras=True)


def _field_schema(cls: Any, name: str) -> type | None:
    """The dataclass type of field `name` of `cls` (None when it is not a nested dataclass)."""
    if cls is None or not dataclasses.is_dataclass(cls):
        return None
    hint = _type_hints(cls).get(name)
    return hint if hint is not None and dataclasses.is_dataclass(hint) else None


def _flatten_nested_aliases(aliases: dict[str, str], data: dict, source: str, prefix: str):
    """Yields (key, value) of `data`, a mapping whose keys have dotted aliases (a seed recipe's
    `muon_args: {weight_decay: x}` → `muon_weight_decay`) replaced by their targets."""
    for raw_key, value in data.items():
        nested = {a: t for a, t in aliases.items() if a.startswith(f"{raw_key}.")}
        if not nested or not isinstance(value, dict):
            yield raw_key, value
            continue
        for sub, sub_value in value.items():
            dotted = f"{raw_key}.{sub}"
            if dotted not in nested:
                known = ", ".join(f"{prefix}{a}" for a in nested)
                raise ConfigError(f"'{prefix}{dotted}' ({source}) has no equivalent here; the keys of "
                                  f"'{prefix}{raw_key}' that are read: {known}")
            yield dotted, sub_value


def canonical_names(schema: type, data: dict, source: str, prefix: str = "") -> dict:
    """`data` with every alias renamed to its field name, level by level (unknown keys kept, so the
    schema check still names them). One mapping giving both spellings is an error: which one was meant?
    An alias may be dotted (`adamw_args.weight_decay` → `weight_decay`): the nested mapping is flattened;
    an alias's target may be dotted (`hop_size` → `audio.hop_length`): the value moves into that block."""
    aliases, out, lifted = _aliases(schema), {}, []
    for raw_key, value in _flatten_nested_aliases(aliases, data, source, prefix):
        key = aliases.get(raw_key, raw_key)
        if "." in key:  # a flat seed key of a nested block (e.g. `hop_size` → `audio.hop_length`)
            lifted.append((raw_key, key, value))
            continue
        if key in out:
            raise ConfigError(f"'{prefix}{raw_key}' ({source}) sets '{prefix}{key}' twice (once through an "
                              "alias): keep one spelling")
        sub = _field_schema(schema, key)
        out[key] = canonical_names(sub, value, source, f"{prefix}{key}.") if sub and isinstance(value, dict) else value
    for raw_key, key, value in lifted:
        head, leaf = key.split(".", 1)
        node = out.setdefault(head, {})
        if not isinstance(node, dict) or leaf in node:
            raise ConfigError(f"'{prefix}{raw_key}' ({source}) sets '{prefix}{key}' twice (once through an "
                              "alias): keep one spelling")
        node[leaf] = value
    return out


def _multi_key_aliases(schema: type) -> tuple:
    return tuple(getattr(schema, "MULTI_KEY_ALIASES", ()) or ())


def _field_default(schema: type, name: str) -> Any:
    f = next(f for f in dataclasses.fields(schema) if f.name == name)
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def combine_multi_key_aliases(schema: type, layer: dict, below: dict, source: str) -> dict:
    """`layer` (one YAML file, or the command line) with the keys of each of `schema`'s
    `MULTI_KEY_ALIASES` replaced by the one field they spell. Such an alias (e.g.
    `common.precision.MixedPrecisionSwitch`: `mixed_precision` + `amp_dtype` → `precision`) has
    `keys`, `field` and `combine(given, below_value)`, `below_value` being what the layers under
    this one set (`below`, canonical names) or the field's default. Top-level keys only."""
    out = dict(layer)
    for alias in _multi_key_aliases(schema):
        given = {k: out.pop(k) for k in alias.keys if k in out}
        if not given:
            continue
        if alias.field in {_aliases(schema).get(k, k) for k in out}:
            raise ConfigError(f"{', '.join(given)} and '{alias.field}' ({source}) both set '{alias.field}': "
                              "keep one spelling")
        try:
            out[alias.field] = alias.combine(given, below.get(alias.field, _field_default(schema, alias.field)))
        except ValueError as exc:
            raise ConfigError(f"{exc} ({source})") from None
    return out


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


_WORDS = {bool: "true/false", int: "an integer", float: "a number", str: "a string", type(None): "null",
          list: "a list", tuple: "a list", dict: "a mapping"}


def type_in_words(tp: Any) -> str:
    """`float | None` → "a number or null": what a user must write, not Python's spelling of it."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        rules = [r.words() for r in tp.__metadata__ if hasattr(r, "words")]
        return " ".join([type_in_words(typing.get_args(tp)[0]), *rules])
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_in_words(a) for a in typing.get_args(tp))
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if dataclasses.is_dataclass(tp):
        return f"a mapping of {tp.__name__} keys"
    return _WORDS.get(origin or tp, _type_name(tp))


def _convert(value: Any, tp: Any, key: str, source: str, sources: dict[str, Any] | None = None) -> Any:
    """Converts `value` to the annotated type `tp`, or raises ConfigError naming `key`. `sources`
    (dotted key → where it was set) lets a nested key name its own source, e.g. `--set`."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin is typing.Annotated:  # a declared range (common.ranges): convert, then check
        converted = _convert(value, args[0], key, source, sources)
        check_annotations(converted, tp.__metadata__, key, source)
        return converted
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        out_of_range = None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(value, arg, key, source, sources)
            except RangeError as exc:  # the right type, a wrong value: that is the message
                out_of_range = exc
            except ConfigError:
                pass
        if out_of_range is not None:
            raise out_of_range
        raise ConfigError(f"{key} ({source}): expected {type_in_words(tp)}, got {value!r}")
    if origin is typing.Literal:
        if value in args:
            return value
        raise ConfigError(f"{key} ({source}): {value!r} is not one of {list(args)}")
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{key} ({source}): expected a mapping of {tp.__name__} keys, got {value!r}")
        return _build(tp, value, key + ".", sources or {}, source)
    if origin in (list, tuple) or tp in (list, tuple):
        if isinstance(value, (list, tuple)):
            if origin is tuple and args and args[-1] is not Ellipsis:
                if len(args) != len(value):
                    raise ConfigError(f"{key} ({source}): expected {len(args)} values, got {len(value)}")
                return tuple(_convert(v, a, f"{key}[{i}]", source) for i, (v, a) in enumerate(zip(value, args)))
            item = args[0] if args else Any
            items = [_convert(v, item, f"{key}[{i}]", source) for i, v in enumerate(value)]
            return tuple(items) if (origin is tuple or tp is tuple) else items
        raise ConfigError(f"{key} ({source}): expected a list, got {value!r}")
    if origin is dict or tp is dict:
        if isinstance(value, dict):
            return dict(value)
        raise ConfigError(f"{key} ({source}): expected a mapping, got {value!r}")
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
            return value.lower() in ("true", "yes", "1")
        raise ConfigError(f"{key} ({source}): expected true/false, got {value!r}")
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(f"{key} ({source}): expected an integer, got {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                number = None
            if number is not None and number.is_integer():
                return int(number)
        raise ConfigError(f"{key} ({source}): expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{key} ({source}): expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{key} ({source}): expected a string, got {value!r}")
    return value


def _build(cls: type[T], data: dict, prefix: str, sources: dict[str, Path], default_source: str) -> T:
    hints = _type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    aliases = _aliases(cls)
    kwargs: dict[str, Any] = {}
    for raw_key, value in data.items():
        key = aliases.get(raw_key, raw_key)
        dotted = prefix + str(raw_key)
        source = str(sources.get(dotted, default_source))
        if key not in fields:
            foreign = getattr(cls, "NOT_READ_HERE", {}).get(raw_key)
            if foreign:  # another tool's key we know: say what replaces it here
                raise ConfigError(f"config key '{dotted}' in {source} is {foreign}; remove it")
            valid = sorted(set(fields) | set(aliases))
            close = difflib.get_close_matches(str(raw_key), valid, n=1, cutoff=0.5)
            hint = f"; did you mean '{prefix}{close[0]}'?" if close else f"; valid keys here: {', '.join(valid)}"
            raise ConfigError(f"unknown config key '{dotted}' in {source}{hint}")
        kwargs[key] = _convert(value, hints[key], prefix + key, source, sources)
    for name, f in fields.items():
        if name in kwargs:
            continue
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"missing required config key '{prefix}{name}' ({default_source})")
    try:
        return cls(**kwargs)
    except ConfigError:  # a nested check (a free mapping built in __post_init__) already says where
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{prefix or 'config'} ({default_source}): {exc}") from None


def build_dataclass(cls: type[T], data: dict, prefix: str, source: str) -> T:
    """`data` → `cls` with a loaded config's checks (unknown keys, types, ranges), for a block the
    schema keeps as a free mapping and builds later (e.g. `model_args` over a model-size preset)."""
    return _build(cls, data, prefix, {}, source)


def _set_dotted(d: dict, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = d
    for part in parts[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[parts[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """`a.b=[1,2]` → ("a.b", [1, 2]); the value is parsed as YAML so numbers and lists work."""
    if "=" not in text:
        raise ConfigError(f"--set '{text}': expected KEY=VALUE, e.g. --set optimizer.lr=3e-4")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"--set '{text}': the key is empty")
    try:
        value = safe_load(raw) if raw.strip() else ""
    except YAMLAliasError as exc:
        raise ConfigError(f"--set {key}=…: refused: {exc}") from None
    except (yaml.YAMLError, RecursionError):
        value = raw
    return key, value


_BARE = re.compile(r"[A-Za-z0-9_.+/-]+")


def override_value(value: Any) -> str:
    """`value` (what YAML reads: None, bool, int, float, str, list, dict) as the text after `KEY=` in a `--set`
    that `parse_override` reads back as the same value: YAML flow style, a string bare where that is
    unambiguous (`32-true`, `[fast_mpd]`) and quoted otherwise, a float always with its dot (PyYAML reads
    `1e-06` as a string)."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return {"nan": ".nan", "inf": ".inf", "-inf": "-.inf"}[repr(value)]
        text = repr(value)
        return text if "." in text else text.replace("e", ".0e", 1)
    if isinstance(value, str):
        bare = _BARE.fullmatch(value) is not None and safe_load(value) == value
        return value if bare else json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(override_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{override_value(str(k))}: {override_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no --set text for a {type(value).__name__}")


def file_overrides(path: str | Path, only: typing.Iterable[str] | None = None,
                   skip: typing.Iterable[str] = ()) -> list[str]:
    """The keys the YAML file `path` sets itself (not those of its `base_config:`), in its order, as `--set`
    overrides (`["model_args.resblock=2", "batch_size=2"]`; nested mappings as dotted keys). Why: a file's
    changes can then be laid over another config than the one it inherits, which `base_config:` cannot do
    (a check that measures each shipped config at test size lays a small config's own keys over it).
    `only` / `skip` choose by top-level key. `load_config(base, S, file_overrides(child))` equals
    `load_config(child, S)` when `child`'s only base is `base`."""
    data = _read_yaml(Path(path))
    data.pop("base_config", None)
    only, skip = (None if only is None else set(only)), set(skip)

    def flat(d: dict, prefix: str) -> list[str]:
        out = []
        for key, value in d.items():
            if isinstance(value, dict) and value:
                out += flat(value, f"{prefix}{key}.")
            else:
                out.append(f"{prefix}{key}={override_value(value)}")
        return out

    return flat({k: v for k, v in data.items() if (only is None or k in only) and k not in skip}, "")


def load_config(
    path: str | Path | None,
    schema: type[T],
    overrides: typing.Iterable[str] = (),
    extra: dict[str, Any] | None = None,
    extra_sources: dict[str, str] | None = None,
) -> T:
    """Loads `path` (with its `base_config:` chain), then `extra` (dotted keys, None skipped), then
    `--set` overrides, into `schema`. Any unknown key or bad type raises ConfigError.

    `extra_sources` names where an `extra` key came from (its flag, e.g. `--batch-size`; default
    "command-line flag"). The result remembers where each key was set: `explicit_keys` (the command
    line) and `config_sources` (the command line and the YAML files)."""
    data: dict = {}
    sources: dict[str, Any] = {}
    if path is not None:
        data, sources = read_config_file(path, schema=schema)
    explicit: dict[str, str] = {}
    multi_keys = {k for alias in _multi_key_aliases(schema) for k in alias.keys}
    typed = [(dotted, value, (extra_sources or {}).get(dotted, "command-line flag"), True)
             for dotted, value in (extra or {}).items() if value is not None]
    typed += [(*parse_override(text), f"--set {text}", False) for text in overrides or ()]
    switches: dict[str, tuple[Any, str]] = {}  # the command line's multi-key alias spellings: one layer
    for dotted, value, source, is_flag in typed:
        dotted = _canonical_key(schema, dotted)
        if dotted in multi_keys:
            switches[dotted] = (value, source)
            continue
        _set_dotted(data, dotted, value)
        sources[dotted] = explicit[dotted] = source
        for i in range(1, dotted.count(".") + 1 if is_flag else 1):
            sources.setdefault(".".join(dotted.split(".")[:i]), source)
    if switches:
        where = ", ".join(dict.fromkeys(src for _, src in switches.values()))
        layer = {k: v for k, (v, _) in switches.items()}
        for key, value in combine_multi_key_aliases(schema, layer, data, where).items():
            if key in explicit:
                raise ConfigError(f"{where} and {explicit[key]} both set '{key}': keep one spelling")
            data[key] = value
            sources[key] = explicit[key] = where
    cfg = _build(schema, data, "", sources, str(path) if path else "defaults")
    object.__setattr__(cfg, _EXPLICIT_ATTR, explicit)
    object.__setattr__(cfg, _SOURCES_ATTR, {k: str(v) for k, v in sources.items()})
    return cfg


_EXPLICIT_ATTR = "_explicit_keys"
_SOURCES_ATTR = "_config_sources"


def _canonical_key(schema: type, dotted: str) -> str:
    """`lr` → `learning_rate` (through each level's ALIASES); unknown parts are kept as given."""
    parts, out, cls = dotted.split("."), [], schema
    while parts:
        aliases = _aliases(cls) if cls is not None else {}
        pair = ".".join(parts[:2])
        part = pair if len(parts) > 1 and pair in aliases else parts[0]  # a dotted alias takes two parts
        parts = parts[part.count(".") + 1:]
        name = aliases.get(part, part)
        out.append(name)
        cls = _field_schema(cls, name)
    return ".".join(out)


def explicit_keys(cfg: Any) -> dict[str, str]:
    """The dotted keys (aliases resolved) the user set on the command line for this `load_config`
    result — a trainer's own flags (`extra`) or `--set` — each with where it was set. A value from a
    YAML file or a default is not listed: on resume, only what the user asked for now replaces the
    checkpoint's state (e.g. a lowered learning rate, see `common.training.apply_optimizer_overrides`)."""
    return dict(getattr(cfg, _EXPLICIT_ATTR, {}))


def note_prepare_keys(cfg: Any, prepare_keys: tuple[str, ...], prepare_command: str, log=print) -> None:
    """One line (rank 0) when the command line of a training run sets a key only data preparation reads
    (a filter, the split, the f0 extractor): training reads the prepared folder as it is, so the value
    changes nothing here (one list of --set for both commands is common). A trainer may also refuse a
    dataset whose recorded settings differ from its config (its own manifest check)."""
    hits = [f"{key} ({src})" for key, src in explicit_keys(cfg).items()
            if any(key == p or key.startswith(p + ".") for p in prepare_keys)]
    if hits and launched_as_rank0():
        log(f"note: {', '.join(hits)}: read when the data is prepared ({prepare_command}); training uses the "
            "prepared folder as it is (prepare it again for another value)")


def config_sources(cfg: Any) -> dict[str, str]:
    """Every dotted key (aliases resolved) this `load_config` result did not take from the schema's
    defaults, with where it was set: the YAML file that set it last (`base_config` chain resolved),
    the flag, `--set …`, or what `mark_explicit` recorded. A parent of a set key is listed too."""
    return dict(getattr(cfg, _SOURCES_ATTR, {}))


def mark_explicit(cfg: Any, key: str, source: str) -> None:
    """Records `key` as set by the user (a preset or flag applied after `load_config`)."""
    object.__setattr__(cfg, _EXPLICIT_ATTR, {**explicit_keys(cfg), key: source})
    object.__setattr__(cfg, _SOURCES_ATTR, {**config_sources(cfg), key: source})


# ---------------------------------------------------------------------------------------------
# Writing, printing, CLI helpers
# ---------------------------------------------------------------------------------------------
def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, Path):
        return str(value)
    return value


def config_to_dict(cfg: Any) -> dict:
    return _plain(cfg)


def format_config(cfg: Any) -> str:
    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False, allow_unicode=True).rstrip()


def save_config(cfg: Any, run_dir: str | Path, name: str = "config.yaml") -> Path:
    """Writes the resolved config next to the checkpoints so a run can be reproduced exactly."""
    from common.atomic_write import write_text  # (common.atomic_write imports this module)

    return write_text(Path(run_dir) / name, format_config(cfg) + "\n")


def key_aliases(schema: type, prefix: str = "") -> dict[str, list[str]]:
    """Every canonical dotted key of `schema` that has other spellings, with them: each level's `ALIASES`
    (alias -> field, either side may be dotted) and `MULTI_KEY_ALIASES` (several keys spelling one field)."""
    out: dict[str, list[str]] = {}
    for alias, target in _aliases(schema).items():
        out.setdefault(prefix + target, []).append(prefix + alias)
    for multi in _multi_key_aliases(schema):
        out.setdefault(prefix + multi.field, []).append(" + ".join(prefix + k for k in multi.keys))
    for f in dataclasses.fields(schema):
        sub = _field_schema(schema, f.name)
        if sub is not None:
            for key, names in key_aliases(sub, f"{prefix}{f.name}.").items():
                out.setdefault(key, []).extend(names)
    return out


def describe_config(cfg: Any) -> str:
    """The resolved config, one key a line: its dotted name, value, what it accepts (type and range, from the
    schema's annotations) and its other spellings; `--print_config` prints it. Why every key: a user can see
    what a run would use, and what may be written instead, without reading the schema's source."""
    schema = type(cfg)
    aliases = key_aliases(schema)
    lines: list[str] = []

    def walk(obj: Any, cls: type, prefix: str) -> None:
        hints = _type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.name.startswith("_"):
                continue
            value, key = getattr(obj, f.name), prefix + f.name
            if dataclasses.is_dataclass(value):
                walk(value, type(value), key + ".")
                continue
            shown = json.dumps(_plain(value), ensure_ascii=False)
            also = f"; aliases: {', '.join(aliases[key])}" if aliases.get(key) else ""
            lines.append(f"{key} = {shown}  ({type_in_words(hints.get(f.name, type(value)))}{also})")

    walk(cfg, schema, "")
    return "\n".join(lines)


def print_config_if_asked(args: argparse.Namespace, cfg: Any) -> None:
    """`--print_config`: the resolved config (`describe_config`), then exit 0, as `--help` does, before any run
    folder, data or model is touched. A trainer calls it where its config is complete (after a preset)."""
    if getattr(args, "print_config", False):
        print(describe_config(cfg), flush=True)
        raise SystemExit(0)


SET_EXAMPLE = "model_args.upsample_initial_channel=256"  # a trainer with another schema passes its own


def add_config_args(parser: argparse.ArgumentParser, default_config: str | None = None,
                    set_example: str = SET_EXAMPLE) -> None:
    """`--config`, `--set` and `--print_config`. `set_example` is a `--set` that works on this trainer (the
    tests load each trainer's example through `load_config`), so the help never shows a key it refuses."""
    parser.add_argument("--config", default=default_config, help="YAML config (base_config: inherits another)")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help=f"override a config key, e.g. --set {set_example} (repeatable)",
    )
    parser.add_argument("--print_config", action="store_true",
                        help="print the resolved config (every key, its value, range and aliases) and exit")


def import_from_string(dotted: str) -> Any:
    """`torch.optim.AdamW` → the class; a clear error when the module or name does not exist."""
    module_name, _, attr = dotted.rpartition(".")
    if not module_name:
        raise ConfigError(f"'{dotted}' is not a dotted path like 'torch.optim.AdamW'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import module '{module_name}' (from '{dotted}'): {exc}") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ConfigError(f"module '{module_name}' has no '{attr}' (from '{dotted}')") from None
