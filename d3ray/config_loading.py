"""Typed configs from YAML files and dotted command-line overrides.

Configs are frozen ``kw_only`` dataclasses. This module turns plain dicts (from YAML) into
them and back, with errors that name the offending key path (``train.steps: expected int,
got 'ten'``). Unknown keys are errors. Fields typed with a :class:`~d3ray.registry.ChoiceConfig`
family pick their concrete class from the ``type`` key; a plain string is short for ``{type: string}``
(``estimator: fisher``, ``--schedule.influence.estimator=fisher``).

A config class may name the keys it no longer has (``replaced_keys: ClassVar[dict[str, str]]``, old key →
the key that replaced it): such a key is refused in one line naming its replacement.

Overrides use dotted keys: ``--train.steps=200 --solver.type=rsr``; values are parsed as YAML
scalars/lists (``--data.train_paths='[a, b]'``).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin

import yaml

from d3ray.errors import UserError
from d3ray.registry import ChoiceConfig

C = TypeVar("C")


class ConfigError(UserError, ValueError):
    """A config value or key is wrong; the message names the key path (``key``: dotted, for
    :func:`load_config` to say where in the file it is)."""

    def __init__(self, message: str, key: str = "") -> None:
        super().__init__(message)
        self.key = key


def from_dict(cls: type[C], data: dict[str, Any] | None, path: str = "", base: Any = None) -> C:
    """Build dataclass ``cls`` from a plain dict, recursively; unknown keys raise ConfigError.

    ``base`` is the value the dict overrides (a field's default instance, e.g. the no-argument
    run's ``schedule``): keys the dict does not name keep ``base``'s values, at every depth, so
    ``--schedule.L=16`` changes ``L`` and nothing else. A dict that selects another ``type`` than
    ``base``'s starts from that type's own defaults.
    """
    data = dict(data or {})
    if isinstance(cls, type) and issubclass(cls, ChoiceConfig) and ChoiceConfig in cls.__bases__:
        name = data.pop("type", None)
        if name is None:
            raise ConfigError(f"{path or '<root>'}: missing 'type' (one of {cls.known()})", key=path)
        try:
            cls = cls.lookup(str(name))
        except ValueError as err:
            raise ConfigError(f"{_join(path, 'type')}: {err}", key=_join(path, "type")) from None
    else:
        data.pop("type", None) if getattr(cls, "type_name", "") else None
    if type(base) is not cls:
        base = None
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    replaced = [key for key in unknown if key in getattr(cls, "replaced_keys", {})]
    if replaced:  # an old key: one line naming the key that replaced it
        raise ConfigError(f"{_join(path, replaced[0])} was replaced by {_join(path, cls.replaced_keys[replaced[0]])}",
                          key=_join(path, replaced[0]))
    if unknown:
        raise ConfigError(
            f"unknown key {_join(path, unknown[0])!r} for {cls.__name__}; known keys: {', '.join(sorted(fields))}",
            key=_join(path, unknown[0]))
    kwargs: dict[str, Any] = {}
    for name, field in fields.items():
        default = getattr(base, name) if base is not None else _default(field)
        if name not in data:
            if base is not None:
                kwargs[name] = default
            continue
        value = data[name]
        if isinstance(value, dict) and "type" not in value and getattr(default, "type_name", ""):
            value = {"type": default.type_name, **value}  # a choice given without `type` keeps the default's
        kwargs[name] = _convert(hints[name], value, _join(path, name), default)
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{path or cls.__name__}: {err}", key=path) from err


def to_dict(obj: Any) -> Any:
    """Dataclass → plain dict (with ``type`` for registered choices), YAML-safe."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out: dict[str, Any] = {}
        if getattr(obj, "type_name", ""):
            out["type"] = obj.type_name
        for f in dataclasses.fields(obj):
            out[f.name] = to_dict(getattr(obj, f.name))
        return out
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    if isinstance(obj, Path):
        return str(obj)
    return obj


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key.sub=value`` overrides (leading ``--`` optional) to a nested dict copy."""
    out = _deepcopy(data)
    for item in overrides:
        item = item[2:] if item.startswith("--") else item
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key.path=value")
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError as err:
            raise ConfigError(f"override --{item}: the value is not valid YAML ({_yaml_problem(err)}); quote it, "
                              f"e.g. --{key}='\"{raw}\"'", key=key) from None
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.get(part)
            if isinstance(child, str):  # a choice named by a plain string, now given sub-keys
                child = node[part] = {"type": child}
            if not isinstance(child, dict):
                child = {} if child is None else _fail(key, part)
                node[part] = child
            node = child
        node[parts[-1]] = value
    return out


def flatten_dotted(values: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """Dotted ``(key, value)`` pairs of a nested mapping: a non-empty mapping value sets the keys below
    its key (``{schedule: {L: 4}}`` → ``[("schedule.L", 4)]``); an empty one is a value."""
    items: list[tuple[str, Any]] = []
    for key, value in values.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping) and value:
            items.extend(flatten_dotted(value, path))
        else:
            items.append((path, value))
    return items


def load_config(cls: type[C], file: str | Path | None = None, overrides: list[str] | None = None) -> C:
    """Read ``file`` (YAML, values only) if given, apply dotted overrides, build ``cls``.

    Raises:
        ConfigError: the file is missing or not valid YAML, its top level or a section is not a mapping, a
            key is unknown or a value wrong; a message about the file says where: ``FILE:LINE:COLUMN: ...``.
    """
    data: dict[str, Any] = {}
    marks: dict[str, Any] = {}
    if file is not None:
        data, marks = read_yaml_config(file)
    data = apply_overrides(data, overrides or [])
    try:
        return from_dict(cls, data)
    except ConfigError as err:
        overridden = {(o[2:] if o.startswith("--") else o).split("=", 1)[0] for o in overrides or []}
        mark = _mark_of(marks, err.key) if err.key not in overridden else None
        where = f"{file}:{mark.line + 1}:{mark.column + 1}" if mark is not None else file
        raise ConfigError(f"{where}: {err}" if file else str(err), key=err.key) from None


def read_yaml_config(file: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """A config file's mapping, and where each dotted key of it starts (a ``yaml`` mark: 0-based line, column).

    Raises:
        ConfigError: ``FILE:LINE:COLUMN: ...`` for a missing file, a YAML syntax error, or a top level that is
            not a mapping.
    """
    try:
        text = Path(file).read_text()
    except OSError as err:
        raise ConfigError(f"{file}: cannot read the config file ({err.strerror or err})") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
        where = f"{file}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(file)
        raise ConfigError(f"{where}: not valid YAML: {_yaml_problem(err)}") from None
    if loaded is None:
        return {}, {}
    if not isinstance(loaded, dict):
        mark = node.start_mark
        raise ConfigError(f"{file}:{mark.line + 1}:{mark.column + 1}: the top level must be a mapping of sections "
                          f"(train:, data:, ...), got a {type(loaded).__name__}")
    marks: dict[str, Any] = {}
    _collect_marks(node, "", marks)
    return loaded, marks


def _collect_marks(node: Any, prefix: str, marks: dict[str, Any]) -> None:
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = _join(prefix, str(key_node.value))
            marks[key] = key_node.start_mark
            _collect_marks(value_node, key, marks)


def _mark_of(marks: dict[str, Any], key: str) -> Any:
    """The mark of ``key`` or of its nearest enclosing key in the file (``train.betas[0]`` → ``train.betas``)."""
    key = key.split("[", 1)[0]
    while key:
        if key in marks:
            return marks[key]
        key = key.rpartition(".")[0]
    return None


def _yaml_problem(err: yaml.YAMLError) -> str:
    problem = getattr(err, "problem", None)
    context = getattr(err, "context", None)
    return " ".join(p for p in (context, problem) if p) or str(err).splitlines()[0]


def _convert(tp: Any, value: Any, path: str, base: Any = None) -> Any:
    """``value`` as type ``tp``; a dataclass value given as a dict overrides ``base`` (see :func:`from_dict`)."""
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(arg, value, path, base)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{path}: {value!r} matches none of {tp}", key=path)
    if origin is Literal:
        if value not in get_args(tp):
            raise ConfigError(f"{path}: {value!r} is not one of {list(get_args(tp))}", key=path)
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{path}: expected a list, got {value!r}", key=path)
        args = get_args(tp)
        item_tp = args[0] if args else Any
        items = [_convert(item_tp, v, f"{path}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping, got {value!r}", key=path)
        _, val_tp = get_args(tp) or (Any, Any)
        return {str(k): _convert(val_tp, v, f"{path}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp) or (isinstance(tp, type) and issubclass(tp, ChoiceConfig)):
        if dataclasses.is_dataclass(value):
            return value
        if isinstance(value, str) and isinstance(tp, type) and issubclass(tp, ChoiceConfig):
            value = {"type": value}  # a choice named by a plain string
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping, got {value!r}", key=path)
        return from_dict(tp, value, path, base)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{path}: expected true/false, got {value!r}", key=path)
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{path}: expected an integer, got {value!r}", key=path)
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{path}: expected a number, got {value!r}", key=path)
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{path}: expected a string, got {value!r}", key=path)
    return value


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _deepcopy(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _deepcopy(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_deepcopy(v) for v in data]
    return data


def _fail(key: str, part: str) -> dict:
    raise ConfigError(f"override {key!r}: {part!r} is a value, not a section")
