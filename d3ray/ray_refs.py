"""Ray object references: the one test for them, and the one "result by the deadline, or the fallback".

Model work runs ahead of the trainers on actors and comes back as ObjectRefs. Two things about those
references are needed all over the tree, and are done here only:

    is_object_ref(x) / resolve(x) / ref_key(x)   a reference, or the value itself (a snapshot part, a
                                                 target set, a batch handed over in-process)
    result_by_deadline(compute, fallback, timeout_s)
        compute(deadline) ── deadline.get(ref) ... ──► the decision
             │ a get past the deadline (GetTimeoutError) or a failed task / actor (RayError)
             ▼
        fallback(reason) ──► the fallback decision; reason = "deadline of Ns passed", or the error's
                             type and first line (the cause's, for a task that raised)

A foundation module: Ray is imported lazily, and never by ``is_object_ref`` when no Ray is loaded in
the process (a process without Ray holds no ObjectRef).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

T = TypeVar("T")


def is_object_ref(value: Any) -> bool:
    """Whether ``value`` is a Ray ``ObjectRef``."""
    ray = sys.modules.get("ray")  # not loaded: no ObjectRef can exist in this process
    return ray is not None and isinstance(value, ray.ObjectRef)


def resolve(value: Any) -> Any:
    """``ray.get`` of an ObjectRef; anything else passes through."""
    if is_object_ref(value):
        import ray

        return ray.get(value)
    return value


def ref_key(value: Any) -> Hashable:
    """A hashable identity of ``value``: the reference's id for an ObjectRef (stable across handles to the
    same object), else the object's ``id``."""
    return value.hex() if is_object_ref(value) else id(value)


class Deadline:
    """A moment ``timeout_s`` seconds from now (None: no deadline); each ``get`` waits only the time left."""

    def __init__(self, timeout_s: float | None) -> None:
        self.timeout_s = timeout_s
        self._at = None if timeout_s is None else time.monotonic() + timeout_s

    def left(self) -> float | None:
        """Seconds left (0 once passed), or None without a deadline."""
        return None if self._at is None else max(0.0, self._at - time.monotonic())

    def get(self, ref: Any) -> Any:
        """``ray.get(ref)`` by the deadline.

        Raises:
            ray.exceptions.GetTimeoutError: the deadline passed first.
            ray.exceptions.RayError: the task or actor failed.
        """
        import ray

        return ray.get(ref, timeout=self.left())


def missed_reason(err: BaseException, timeout_s: float | None) -> str:
    """Why a result was missed, for the schedule log's ``fallback_reason``."""
    from ray.exceptions import GetTimeoutError

    if isinstance(err, GetTimeoutError):
        return f"deadline of {timeout_s or 0:.0f}s passed"
    cause = getattr(err, "cause", None)  # a RayTaskError's first line is the actor's repr: say why instead
    shown = cause if isinstance(cause, Exception) else err
    return f"{type(shown).__name__}: {(str(shown).splitlines() or [''])[0][:300]}"


def result_by_deadline(compute: Callable[[Deadline], T], fallback: Callable[[str], T], timeout_s: float | None,
                       also: tuple[type[Exception], ...] = ()) -> T:
    """``compute(deadline)``, or ``fallback(reason)`` when one of its ``deadline.get`` passes the
    deadline or a Ray task or actor it waits for failed.

    Args:
        compute: makes the result; waits for references with ``deadline.get`` (and may return a
            fallback itself, e.g. for an error a task returned rather than raised).
        fallback: the result without the missed work, given the reason (see :func:`missed_reason`).
        timeout_s: the deadline from now; None waits as long as it takes.
        also: further exceptions of ``compute`` that mean "use the fallback" (e.g. scores it cannot rank).
    """
    from ray.exceptions import RayError

    deadline = Deadline(timeout_s)
    try:
        return compute(deadline)
    except (RayError, *also) as err:
        return fallback(missed_reason(err, timeout_s))
