"""Each config field's doc line, read from the source, and a resolved config printed as commented YAML.

Config fields are documented the way the style guide asks, by a string under each field::

    L: int = 8
    \"\"\"Chunk length: consecutive global batches scheduled together (the paper: 60).\"\"\"

Python keeps no such string at run time, so :func:`field_docs` reads it from the class's source
(``ast``), base classes included. ``d3ray config show`` and ``d3ray schedulers NAME`` print it beside
each value, so that the resolved config explains itself.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
from typing import Any

import yaml

from d3ray.config_loading import to_dict


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Field name → the first sentence of the string under it, for ``cls`` and its dataclass bases."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass) and klass.__dict__.get("__annotations__") is None:
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for stmt, following in zip(body, body[1:], strict=False):
            if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                    and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
                    and isinstance(following.value.value, str)):
                docs[stmt.target.id] = first_sentence(following.value.value)
    return docs


def first_sentence(doc: str) -> str:
    """The first sentence of a docstring, on one line (``e.g.`` and ``et al.`` do not end it)."""
    text = " ".join(doc.split())
    end = 0
    while True:
        end = text.find(". ", end)
        if end < 0:
            return text
        if not text[:end].endswith(("e.g", "i.e", "et al", "vs")):
            return text[: end + 1]
        end += 2


def describe(cfg: Any, indent: int = 0, width: int = 44) -> list[str]:
    """``cfg`` (a config dataclass) as YAML lines, each field with its doc line as a comment."""
    lines: list[str] = []
    pad = "  " * indent
    docs = field_docs(type(cfg))
    if getattr(cfg, "type_name", ""):
        lines.append(f"{pad}type: {cfg.type_name}")
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        doc = docs.get(f.name, "")
        if dataclasses.is_dataclass(value):
            lines.append(f"{pad}{f.name}:" + (f"  # {doc}" if doc else ""))
            lines.extend(describe(value, indent + 1, width))
            continue
        text = yaml.safe_dump(to_dict(value), default_flow_style=True, width=10**6).strip()
        text = text.removesuffix("\n...").removesuffix("...").strip()
        entry = f"{pad}{f.name}: {text}"
        lines.append(f"{entry:<{width}}  # {doc}" if doc else entry)
    return lines


def describe_class(cls: type, width: int = 44) -> list[str]:
    """The fields of config class ``cls`` with their defaults and doc lines, as YAML lines; unlike
    :func:`describe` it needs no valid instance (a scheduler whose defaults alone do not validate)."""
    docs = field_docs(cls)
    lines = [f"type: {cls.type_name}"] if getattr(cls, "type_name", "") else []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        value = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        doc = docs.get(f.name, "")
        if dataclasses.is_dataclass(value):
            lines.append(f"{f.name}:" + (f"  # {doc}" if doc else ""))
            lines.extend(describe(value, 1, width))
            continue
        text = yaml.safe_dump(to_dict(value), default_flow_style=True, width=10**6).strip()
        entry = f"{f.name}: {text.removesuffix('...').strip()}"
        lines.append(f"{entry:<{width}}  # {doc}" if doc else entry)
    return lines


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "config", help="print the resolved config of a run, each field with its doc line",
        description="d3ray config show [--config F] [--finetune] [--key=value ...]: the RunConfig that "
        "`d3ray pretrain` (or `finetune`) would run with these arguments, as YAML that --config accepts, "
        "each field with its doc line as a comment. D3's placement is a typed choice: "
        "--schedule.placement.type=in_trainer (the trainers score each next chunk, the no-argument run's) or "
        "'--schedule.placement={type: actors, num_gpus: 0.25}' (influence actors one chunk ahead); "
        "`d3ray schedulers d3` lists each placement's keys.")
    parser.add_argument("action", choices=["show"])
    parser.add_argument("--config", help="values-only YAML file (see jobs/configs/)")
    parser.add_argument("--finetune", action="store_true", help="start from `d3ray finetune`'s defaults")
    parser.set_defaults(func=run_show, accepts_overrides=True)


def run_show(args: Any) -> int:
    from d3ray.config import RunConfig
    from d3ray.config_loading import load_config
    from d3ray.run.command import FINETUNE_DEFAULTS

    defaults = FINETUNE_DEFAULTS if args.finetune and not args.config else []
    print("\n".join(describe(load_config(RunConfig, args.config, [*defaults, *args.overrides]))))
    return 0
