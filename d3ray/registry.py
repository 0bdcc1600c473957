"""Registries of swappable parts: solvers, sketches, schedulers, estimators.

A registered part is selected in YAML by ``type: <name>``. The *config class* is the registry
entry (levanter's ``register_subclass``) and its ``build()`` makes the thing (torchtitan).
Unlike draccus' ChoiceRegistry, registering a name twice raises, and a lookup of an unknown
name lists the known ones.

    class SolverConfig(ChoiceConfig): ...

    @SolverConfig.register("rsr")
    @dataclass(frozen=True, kw_only=True)
    class RsrConfig(SolverConfig):
        max_iters: int = 10_000
"""

from __future__ import annotations

from typing import Any, ClassVar, TypeVar

T = TypeVar("T", bound=type)


class ChoiceConfig:
    """Base of a family of configs chosen by a ``type`` name.

    Each direct subclass of ``ChoiceConfig`` (for example ``SolverConfig``) owns its own
    registry; concrete configs register on it with ``@SolverConfig.register("name")``.
    """

    _registry: ClassVar[dict[str, type]]
    type_name: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if ChoiceConfig in cls.__bases__:
            cls._registry = {}

    @classmethod
    def register(cls, name: str):
        """Class decorator that registers a concrete config under ``name``."""

        def wrap(sub: T) -> T:
            if name in cls._registry and cls._registry[name] is not sub:
                raise ValueError(
                    f"{cls.__name__}: the name {name!r} is already registered by "
                    f"{cls._registry[name].__qualname__}"
                )
            sub.type_name = name
            cls._registry[name] = sub
            return sub

        return wrap

    @classmethod
    def lookup(cls, name: str) -> type:
        """The registered config class for ``name``; ValueError naming the known ones."""
        try:
            return cls._registry[name]
        except KeyError:
            known = ", ".join(sorted(cls._registry)) or "(none)"
            raise ValueError(f"unknown {cls.__name__} type {name!r}; known: {known}") from None

    @classmethod
    def known(cls) -> list[str]:
        return sorted(cls._registry)
