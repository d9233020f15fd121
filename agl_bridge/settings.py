"""Settings declared once: each is a dataclass field whose metadata holds its help text.

A stage's configuration (conversion, training, judging, the loop) is a dataclass of
``setting(...)`` fields: the field gives the name, the type (its annotation; a ``Literal`` gives
the choices) and the default, the metadata the help. Everything else is made from that one
declaration, so a setting cannot mean two things at two doors:

- flags: ``add_flags(parser, Config)`` (``--learning-rate``; a nested configuration's settings
  as ``--train.learning-rate``, the way Hydra and verl users write overrides);
- files: ``read_file`` (TOML or JSON; nested configurations are tables, ``[train]``) and
  ``build`` (an unknown key, a wrong type or a value outside its choices is an error that names
  the file, the key, what was given and what is allowed; nothing is built from a half-read
  file);
- Python: the dataclass itself, and ``build`` for keyword dictionaries;
- what a run used: ``resolve`` keeps where each value came from (default, an override such as
  the demo's, the file, a flag) and ``describe`` prints it (``--print-config``).

No torch, no pyarrow: the CLI builds its parser from these without importing either.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import MISSING, Field
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

T = TypeVar("T")
HELP, PYTHON_ONLY = "agl_bridge.help", "agl_bridge.python_only"
DEFAULT = "default"  # the origin of a value no layer gave
MAX_FILE_BYTES = 1 << 20


def setting(default: Any = MISSING, *, help: str, default_factory: Callable[[], Any] | None = None,
            python_only: bool = False) -> Any:
    """A declared setting: its default and help text. ``python_only``: a value only Python can
    give (an object, not text), kept out of flags and files."""
    meta = {HELP: help, PYTHON_ONLY: python_only}
    if default_factory is not None:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


class SettingError(ValueError):
    """A setting that cannot be used, named with where it came from."""


# -- declarations ------------------------------------------------------------------------------
def declared(cls: type) -> Iterator[tuple[Field[Any], Any]]:
    """The declared settings of a configuration class, with their resolved types."""
    return iter(_declared(cls))


@functools.cache
def _declared(cls: type) -> tuple[tuple[Field[Any], Any], ...]:
    module = vars(sys.modules[cls.__module__])
    out = []
    for f in dataclasses.fields(cls):
        if HELP not in f.metadata:
            continue
        hint = f.type
        if isinstance(hint, str):
            try:
                hint = eval(hint, module)
            except NameError:
                if not f.metadata.get(PYTHON_ONLY):
                    raise
                hint = Any  # a type imported for the checker only: no flag, no file
        out.append((f, hint))
    return tuple(out)


def default_of(f: Field[Any]) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return MISSING


def is_config(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def choices_of(tp: Any) -> tuple[Any, ...] | None:
    """A ``Literal``'s values (also inside ``X | None``), else None."""
    if typing.get_origin(tp) is Literal:
        return typing.get_args(tp)
    if _is_union(tp):
        for arg in typing.get_args(tp):
            if typing.get_origin(arg) is Literal:
                return typing.get_args(arg)
    return None


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType)


def type_name(tp: Any) -> str:
    """How an error message names a type: ``a number``, ``one of 'a', 'b'``, ..."""
    if tp is type(None):
        return "none"
    if _is_union(tp):
        return " or ".join(type_name(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    origin = typing.get_origin(tp)
    if origin in (list, tuple):
        return f"a list of {type_name(typing.get_args(tp)[0])}"
    if origin is not None and issubclass(origin, Mapping):
        return f"a table of {type_name(typing.get_args(tp)[1])}"
    return {bool: "true or false", int: "an integer", float: "a number",
            str: "a string"}.get(tp, getattr(tp, "__name__", str(tp)))


# -- checking a value against its type ---------------------------------------------------------
_NOT = object()


def coerce(tp: Any, value: Any) -> Any:
    """``value`` as type ``tp`` (an int where a float is wanted becomes a float), or ``_NOT``."""
    if tp is Any:
        return value
    if tp is type(None):
        return None if value is None else _NOT
    if _is_union(tp):
        for arg in typing.get_args(tp):
            out = coerce(arg, value)
            if out is not _NOT:
                return out
        return _NOT
    origin = typing.get_origin(tp)
    if origin is Literal:
        return value if any(value == a and type(value) is type(a)
                            for a in typing.get_args(tp)) else _NOT
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            return _NOT
        items = [coerce(typing.get_args(tp)[0], v) for v in value]
        return _NOT if any(i is _NOT for i in items) else (
            list(items) if origin is list else tuple(items))
    if origin is not None and issubclass(origin, Mapping):
        if not isinstance(value, Mapping):
            return _NOT
        kt, vt = typing.get_args(tp)
        out = {coerce(kt, k): coerce(vt, v) for k, v in value.items()}
        return _NOT if any(k is _NOT or v is _NOT for k, v in out.items()) else out
    if tp is bool:
        return value if isinstance(value, bool) else _NOT
    if tp is int:
        return value if isinstance(value, int) and not isinstance(value, bool) else _NOT
    if tp is float:  # nan compares false with every bound: never a setting's value
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
        return float(value) if ok else _NOT
    if isinstance(tp, type):
        return value if isinstance(value, tp) else _NOT
    return value


def build(cls: type[T], values: Mapping[str, Any], source: str = "<settings>",
          prefix: str = "", *, construct: bool = True) -> T:
    """A configuration from plain values (a file's, keywords, flags): every key declared,
    every value of its type and among its choices; nested configurations from tables.
    ``construct=False`` checks the keys and types only (one layer of several)."""
    if isinstance(values, cls):
        return values
    if not isinstance(values, Mapping):
        raise SettingError(f"{source}: {prefix.rstrip('.') or 'the settings'} must be a table, "
                           f"got {_shown(values)}")
    fields = {f.name: (f, tp) for f, tp in declared(cls)}
    python = {f.name for f, _ in declared(cls) if f.metadata.get(PYTHON_ONLY)}
    unknown = sorted(set(values) - set(fields) - python)
    if unknown:
        raise SettingError(f"{source}: unknown setting {prefix}{unknown[0]}"
                           + (f" (and {', '.join(prefix + u for u in unknown[1:])})"
                              if unknown[1:] else "")
                           + "; known: " + ", ".join(prefix + k for k in sorted(fields)
                                                     if k not in python))
    kwargs: dict[str, Any] = {}
    for name, value in values.items():
        if name not in fields:  # a Python-only value, given from Python
            kwargs[name] = value
            continue
        tp = fields[name][1]
        if is_config(tp):
            kwargs[name] = build(tp, value, source, f"{prefix}{name}.", construct=construct)
            continue
        out = coerce(tp, value)
        if out is _NOT:
            raise SettingError(f"{source}: {prefix}{name} = {_shown(value)}: expected "
                               f"{type_name(tp)}")
        kwargs[name] = out
    if not construct:
        return kwargs  # type: ignore[return-value]
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as exc:  # the class's own checks
        raise SettingError(f"{source}: {exc}") from None


def _shown(value: Any) -> str:
    text = json.dumps(value, default=repr) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# -- files -------------------------------------------------------------------------------------
def read_file(path: str | Path) -> dict[str, Any]:
    """A TOML (``.toml``) or JSON file of settings, as plain values; errors name the file."""
    p = Path(path)
    if p.suffix not in (".toml", ".json"):
        raise SettingError(f"{p}: a settings file is .toml or .json")
    values = loads(read_text(p), str(p), toml=p.suffix == ".toml")
    if not isinstance(values, dict):
        raise SettingError(f"{p}: expected a table of settings, got {_shown(values)}")
    return values


def read_text(path: str | Path, what: str = "") -> str:
    """A small text file (settings, a recipe, a rubric): a regular file (a FIFO or a device
    would block or never end) of at most ``MAX_FILE_BYTES``, UTF-8; errors name it."""
    p = Path(path)
    where = f"{what} {p}" if what else str(p)
    try:
        if not p.is_file():
            raise SettingError(f"{where}: cannot read it (not a regular file)")
        size = p.stat().st_size
        if size > MAX_FILE_BYTES:
            raise SettingError(f"{where}: {size} bytes; a file read here is at most "
                               f"{MAX_FILE_BYTES}")
        return p.read_bytes().decode()
    except OSError as exc:
        raise SettingError(f"{where}: cannot read it ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise SettingError(f"{where}: not text ({exc})") from None


def replace_text(path: str | Path, text: str) -> None:
    """Write ``path`` atomically (a temporary beside it, then a rename): readers see the old
    text or the new, never a mix."""
    import os
    import threading

    p = Path(path)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.{threading.get_ident()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, p)


def loads(text: str, source: str, *, toml: bool = True) -> Any:
    """TOML or JSON text as plain values: the one parser of settings, recipes and rubrics; a
    syntax error names ``source``."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    try:
        return tomllib.loads(text) if toml else json.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise SettingError(f"{source}: not valid {'TOML' if toml else 'JSON'}: {exc}") from None


# -- flags -------------------------------------------------------------------------------------
def flag_name(path: str) -> str:
    return "--" + path.replace("_", "-")


def add_flags(parser: argparse.ArgumentParser | Any, cls: type, *, prefix: str = "",
              only: Iterator[str] | list[str] | tuple[str, ...] | None = None,
              defaults: Mapping[str, Any] | None = None) -> None:
    """A flag for each declared setting of ``cls`` (nested ones as ``--table.name``), its help
    and default from the declaration; ``defaults`` (dotted paths) are shown instead where a
    client sets its own. ``only``: these dotted paths (and their tables' settings) alone.
    Values given are stored under the dotted path; settings not given are absent."""
    wanted = set(only) if only is not None else None
    defaults = defaults or {}
    for f, tp in declared(cls):
        if f.metadata.get(PYTHON_ONLY):
            continue
        path = prefix + f.name
        if is_config(tp):
            inner = None if wanted is None or path in wanted else [
                w for w in wanted if w.startswith(path + ".")]
            if inner is None or inner:
                add_flags(parser, tp, prefix=path + ".", only=inner, defaults=defaults)
            continue
        if wanted is not None and path not in wanted:
            continue
        default = defaults.get(path, default_of(f))
        shown = "" if default is None or default is MISSING else \
            f" (default: {_flag_text(default)})"
        kwargs: dict[str, Any] = {"dest": path, "default": argparse.SUPPRESS,
                                  "help": f.metadata[HELP] + shown}
        choices = choices_of(tp)
        if _strip_none(tp) is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif typing.get_origin(_strip_none(tp)) in (list, tuple):
            kwargs.update(nargs="+", type=_parser(typing.get_args(_strip_none(tp))[0]),
                          metavar=f.name.upper().split("_")[-1])
        elif _is_mapping(tp) and typing.get_args(_strip_none(tp))[1] is Any:
            kwargs.update(type=_json_object, metavar="JSON")
        elif _is_mapping(tp):
            kwargs.update(action="append", type=_pair, metavar="NAME=NUMBER")
            kwargs["help"] += "; repeatable"
        else:  # choices as the metavar only where they are all that is allowed
            listed = choices if typing.get_origin(_strip_none(tp)) is Literal else None
            kwargs.update(type=_parser(tp), metavar=("{" + ",".join(map(str, listed)) + "}")
                          if listed else f.name.upper().split("_")[-1])
        parser.add_argument(flag_name(path), **kwargs)


def _strip_none(tp: Any) -> Any:
    if _is_union(tp):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _is_mapping(tp: Any) -> bool:
    origin = typing.get_origin(_strip_none(tp))
    return origin is not None and isinstance(origin, type) and issubclass(origin, Mapping)


def _flag_text(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return " ".join(map(str, value)) or "none"
    return str(value)


def _parser(tp: Any) -> Callable[[str], Any]:
    """Text of a flag -> a value of ``tp`` (the same check as a file's value, after)."""
    def parse(text: str) -> Any:
        for candidate in _readings(text):
            if coerce(tp, candidate) is not _NOT:
                return coerce(tp, candidate)
        raise argparse.ArgumentTypeError(f"{text!r}: expected {type_name(tp)}")
    parse.__name__ = type_name(tp)
    return parse


def _readings(text: str) -> list[Any]:
    """What a flag's text can mean, most specific first: an integer, a number, the text."""
    out: list[Any] = []
    for kind in (int, float):
        try:
            out.append(kind(text))
        except ValueError:
            pass
    return out + [text]


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{text!r:.80}: expected a JSON object")
    return value


def _pair(text: str) -> tuple[str, float]:
    name, sep, number = text.rpartition("=")
    try:
        value = float(number)
    except ValueError:
        value = float("nan")
    if not sep or not name or value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=NUMBER")
    return name, value


def add_file_flags(parser: argparse.ArgumentParser, what: str) -> None:
    """``--config`` and ``--print-config``, the same for every command with settings."""
    parser.add_argument("--config", metavar="FILE.toml|FILE.json",
                        help=f"a file of {what} (the names of the flags; flags win over it)")
    parser.add_argument("--print-config", action="store_true",
                        help="print the settings this run would use, each with where its "
                             "value came from (default, file, flag), and exit")


def file_layer(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """The ``--config`` file's settings, read once, and its label (``file PATH``)."""
    if not getattr(args, "config", None):
        return "file", {}
    return f"file {args.config}", read_file(args.config)


def given_flags(args: argparse.Namespace, cls: type, prefix: str = "") -> dict[str, Any]:
    """The settings of ``cls`` given as flags, as nested plain values."""
    out: dict[str, Any] = {}
    for f, tp in declared(cls):
        path = prefix + f.name
        if is_config(tp):
            inner = given_flags(args, tp, path + ".")
            if inner:
                out[f.name] = inner
        elif hasattr(args, path):
            value = getattr(args, path)
            out[f.name] = dict(value) if isinstance(value, list) and _is_mapping(tp) else value
    return out


# -- resolving and showing ---------------------------------------------------------------------
def paths_values(nested: Mapping[str, Any], prefix: str = "", sep: str = ".") -> dict[str, Any]:
    """Nested tables of settings as dotted paths (``{"train": {"seed": 1}}`` ->
    ``{"train.seed": 1}``); a table value of a setting stays whole only in ``build``."""
    out: dict[str, Any] = {}
    for key, value in nested.items():
        if isinstance(value, Mapping):
            out.update(paths_values(value, f"{prefix}{key}{sep}", sep))
        else:
            out[f"{prefix}{key}"] = value
    return out


def merge(*layers: Mapping[str, Any]) -> dict[str, Any]:
    """Later layers win, table by table."""
    out: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            if isinstance(value, Mapping) and isinstance(out.get(key), dict):
                out[key] = merge(out[key], value)
            else:
                out[key] = value
    return out


def paths(cls: type, layer: Mapping[str, Any], prefix: str = "") -> list[str]:
    """The dotted paths of the settings a layer gives (nested configurations walked)."""
    types_ = {f.name: tp for f, tp in declared(cls)}
    out: list[str] = []
    for key, value in layer.items():
        tp = types_.get(key)
        if tp is not None and is_config(tp) and isinstance(value, Mapping):
            out += paths(tp, value, f"{prefix}{key}.")
        else:
            out.append(prefix + key)
    return out


def resolve(cls: type[T], *, layers: Sequence[tuple[str, Mapping[str, Any]]],
            source: str | None = None) -> tuple[T, dict[str, str]]:
    """The configuration from named layers (defaults first, later wins: e.g. ``[("demo",
    overrides), ("file loop.toml", values), ("flag", flags)]``) and where each setting's value
    came from (dotted path -> layer name; ``default`` for the rest)."""
    origin: dict[str, str] = {}
    for name, layer in layers:
        build(cls, layer, name if name != "flag" else "flags", construct=False)
        for path in paths(cls, layer):
            origin[path] = name
    config = build(cls, merge(*(layer for _, layer in layers)),
                   source or " + ".join(n for n, _ in layers) or "<settings>")
    return config, origin


def values(config: Any) -> dict[str, Any]:
    """A configuration's settings as plain nested values (what a run records)."""
    out: dict[str, Any] = {}
    for f, tp in declared(type(config)):
        if f.metadata.get(PYTHON_ONLY):
            continue
        value = getattr(config, f.name)
        out[f.name] = values(value) if is_config(tp) else (
            dict(value) if isinstance(value, Mapping) else
            list(value) if isinstance(value, tuple) else value)
    return out


def record(path: str | Path, **configs: Any) -> Path:
    """Write what a run used (``{name: settings}``) as JSON at ``path``, atomically: the
    record a run leaves beside its outputs."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    replace_text(p, json.dumps({name: values(c) for name, c in configs.items()}, indent=2,
                               default=str))
    return p


def describe(config: Any, origin: Mapping[str, str] | None = None) -> str:
    """The effective configuration as TOML, each value with where it came from."""
    origin = origin or {}
    lines: list[str] = []

    def table(obj: Any, prefix: str) -> None:
        nested = []
        for f, tp in declared(type(obj)):
            if f.metadata.get(PYTHON_ONLY):
                continue
            if is_config(tp):
                nested.append(f.name)
                continue
            value = getattr(obj, f.name)
            text = "# unset" if value is None else f"= {_toml(value)}"
            lines.append(f"{f.name} {text}".ljust(44)
                         + f"  # {origin.get(prefix + f.name, DEFAULT)}")
        for name in nested:
            lines.append("")
            lines.append(f"[{prefix}{name}]")
            table(getattr(obj, name), f"{prefix}{name}.")

    table(config, "")
    return "\n".join(lines)


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return repr(value)


def one_of(names: tuple[Any, ...]) -> str:
    """``a, b or c``: the choices as an error message names them."""
    names = tuple(map(str, names))
    return ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else names[0]


def check_choices(config: Any) -> None:
    """For ``__post_init__``: every setting of ``config`` of its declared type and among its
    choices (Python callers skip ``build``'s checks)."""
    for f, tp in declared(type(config)):
        value = getattr(config, f.name)
        if f.metadata.get(PYTHON_ONLY) or is_config(tp) or coerce(tp, value) is not _NOT:
            continue
        choices = choices_of(tp)
        wanted = one_of(choices) if typing.get_origin(tp) is Literal and choices else \
            type_name(tp)
        raise ValueError(f"{f.name} must be {wanted}, got {value!r}")


def at_least(config: Any, minimum: int, *names: str) -> None:
    """For ``__post_init__``: each named setting of ``config``, unless unset, is at least
    ``minimum``."""
    for name in names:
        value = getattr(config, name)
        if value is not None and value < minimum:
            raise ValueError(f"{name} must be at least {minimum}, got {value!r}")
