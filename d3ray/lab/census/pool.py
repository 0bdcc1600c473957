"""The census's actor pool: work goes on when one call fails or its worker dies.

``ray.util.ActorPool`` raises the first error and leaves the census with a dead actor. Here every call
ends as a result or as an error for that item alone: an exception inside the call leaves its actor in the
pool; a worker that died (``RayActorError``: killed, out of memory, a crashed process) is replaced by a new
one (``make``), which loads its checkpoint again on its first call. The caller decides what an error means
(census.py: a branch reported as failed, an S computed again once).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")


class WorkerPool:
    """``size`` actors from ``make()``, one call in flight on each."""

    def __init__(self, make: Callable[[], Any], size: int) -> None:
        self._make = make
        self.actors = [make() for _ in range(max(1, size))]
        self.replaced = 0

    def map(self, call: Callable[[Any, T], Any], items: list[T]) -> Iterator[tuple[T, Any, BaseException | None]]:
        """Run ``call(actor, item)`` (which returns an ObjectRef) for every item; yield ``(item, result, None)``
        in completion order, or ``(item, None, error)`` for an item whose call raised or whose actor died."""
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        queue, idle, pending = list(items), list(self.actors), {}
        while queue or pending:
            while idle and queue:
                actor, item = idle.pop(), queue.pop(0)
                pending[call(actor, item)] = (actor, item)
            [ref], _ = ray.wait(list(pending), num_returns=1)
            actor, item = pending.pop(ref)
            result, error = None, None
            try:
                result = ray.get(ref)
            except RayActorError as exc:
                error = exc
                actor = self._replace(actor, exc)
            except RayTaskError as exc:
                error = exc
            idle.append(actor)
            yield item, result, error

    def _replace(self, dead: Any, exc: BaseException) -> Any:
        import ray

        logger.warning("census worker died (%s); starting a new one", type(exc).__name__)
        ray.kill(dead, no_restart=True)
        fresh = self._make()
        self.actors[self.actors.index(dead)] = fresh
        self.replaced += 1
        return fresh

    def shutdown(self) -> None:
        import ray

        for actor in self.actors:
            ray.kill(actor)


def describe_error(exc: BaseException) -> str:
    """One line for a failed call: ``census worker died (ActorDiedError)`` or the exception's own first line."""
    from ray.exceptions import RayActorError, RayTaskError

    if isinstance(exc, RayActorError):
        return f"census worker died ({type(exc).__name__})"
    if isinstance(exc, RayTaskError):
        cause = getattr(exc, "cause", None)
        if cause is not None:
            return f"raised {type(cause).__name__}: {_cause_line(str(cause))}"
        lines = str(exc).strip().splitlines()
        return f"raised: {lines[-1] if lines else type(exc).__name__}"
    return f"{type(exc).__name__}: {exc}"


def _cause_line(text: str) -> str:
    """An exception's first line, and the line that names the cause where the first is a preamble (torch's
    weights-only unpickler: "Weights only load failed. ..." and, lines later, "Unsupported global: ...")."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return ""
    named = next((line for line in lines[1:] if "error:" in line.lower() or "unsupported global" in line.lower()), None)
    return f"{lines[0]} ({named})" if named else lines[0]
