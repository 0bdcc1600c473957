"""The one ObjectRef test and the one "result by the deadline, or the fallback" (``d3ray/ray_refs.py``),
without a Ray cluster: references are built from ids, Ray's failures are raised by hand."""

from __future__ import annotations

import pytest
import ray
from ray.exceptions import GetTimeoutError, RayError

from d3ray.ray_refs import Deadline, is_object_ref, ref_key, resolve, result_by_deadline


def test_is_object_ref_tells_references_from_values_that_also_have_hex() -> None:
    ref = ray.ObjectRef(bytes(28))
    assert is_object_ref(ref)
    assert not any(is_object_ref(v) for v in (1.5, b"ab", {"w": 1}, [ref], None))  # float and bytes have .hex()
    assert resolve({"w": 1}) == {"w": 1}
    assert ref_key(ref) == ref_key(ray.ObjectRef(bytes(28)))  # two handles of one object: one key
    value = {"w": 1}
    assert ref_key(value) == id(value) and ref_key(value) != ref_key({"w": 1})


def test_deadline_counts_down_and_none_waits_forever() -> None:
    assert Deadline(None).left() is None
    left = Deadline(30.0).left()
    assert left is not None and 29.0 < left <= 30.0
    assert Deadline(0.0).left() == 0.0


class FailedTask(RayError):
    def __init__(self, cause: Exception) -> None:
        super().__init__("ScoringWorker(actor_id=...)\n  traceback ...")
        self.cause = cause


def fallback(reason: str) -> str:
    return f"fallback: {reason}"


@pytest.mark.parametrize("raised, reason", [
    (GetTimeoutError("Get timed out: some object(s) not ready."), "deadline of 5s passed"),
    (FailedTask(ValueError("scores hold NaN\nmore")), "ValueError: scores hold NaN"),  # the cause, first line
    (RayError("actor died\ndetails"), "RayError: actor died"),
])
def test_result_by_deadline_falls_back_with_the_reason_when_ray_misses(raised, reason) -> None:
    def compute(deadline: Deadline) -> str:
        raise raised

    assert result_by_deadline(compute, fallback, 5.0) == f"fallback: {reason}"


def test_result_by_deadline_returns_the_result_and_lets_other_errors_propagate() -> None:
    assert result_by_deadline(lambda d: f"decided, {d.timeout_s}s", fallback, 2.0) == "decided, 2.0s"

    def unrankable(deadline: Deadline) -> str:
        raise ValueError("cannot rank")

    assert result_by_deadline(unrankable, fallback, None, also=(ValueError,)) == "fallback: ValueError: cannot rank"
    with pytest.raises(ValueError, match="cannot rank"):  # a bug, not a missed result
        result_by_deadline(unrankable, fallback, None)
