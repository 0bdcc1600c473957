"""The coordinator's pure step (``d3ray/schedule/coordinator/decide.py``) and its mailbox's waits, on
hand-written chunks: no Ray, no threads (``put`` is a recording stand-in for ``ray.put``)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from d3ray.data.chunker import Chunk, GlobalBatch
from d3ray.schedule.coordinator.decide import CoordinatorState, serve_chunk
from d3ray.schedule.coordinator.mailbox import Mailbox
from d3ray.schedule.scheduler import ChunkDecision, ChunkFeedback, LossWeighting

B = 2


def batch(*ids: str) -> GlobalBatch:
    return GlobalBatch(input_ids=np.zeros((len(ids), 4), np.int32), n_tokens=np.full(len(ids), 4, np.int32),
                       sample_ids=ids, domains=tuple(i[0] for i in ids))


def chunk3() -> Chunk:
    """Chunk 5 of three batches of B = 2: a0 a1 | b0 b1 | c0 c1 (domain = first letter)."""
    return Chunk(chunk_id=5, epoch=1, batches=(batch("a0", "a1"), batch("b0", "b1"), batch("c0", "c1")),
                 capacity=3, mixture={"a": 0.5, "b": 0.25, "c": 0.25})


class Puts:
    def __init__(self) -> None:
        self.batches: list[GlobalBatch] = []

    def __call__(self, value: GlobalBatch) -> str:
        self.batches.append(value)
        return f"put{len(self.batches) - 1}"


REFS = ("ref_a", "ref_b", "ref_c")


def test_serve_chunk_order_puts_the_chunks_batches_in_training_order_with_their_weights() -> None:
    decision = ChunkDecision(order=(2, 0, 1), sample_weights=((1.0, 2.0), (3.0, 4.0), (5.0, 6.0)),
                             record={"scheduler": "x"})
    puts = Puts()
    got = serve_chunk(chunk3(), REFS, decision, weights_version=3, snapshot_fields=None, put=puts)
    assert got.batch_refs == ("ref_c", "ref_a", "ref_b")
    assert got.sample_ids == (("c0", "c1"), ("a0", "a1"), ("b0", "b1"))
    assert got.domains == (("c", "c"), ("a", "a"), ("b", "b"))
    assert got.sample_weights == ((5.0, 6.0), (1.0, 2.0), (3.0, 4.0))  # the weights follow their batches
    assert (got.chunk_id, got.epoch, got.steps, got.weights_version) == (5, 1, 3, 3)
    assert got.mixture == {"a": 0.5, "b": 0.25, "c": 0.25} and got.skipped == {}
    assert got.decision is decision and puts.batches == []  # no snapshot fields: the record as made


def test_serve_chunk_selection_regroups_the_kept_candidates_and_names_the_skipped() -> None:
    # keep (c1, a0) and (b1, a1) as two batches, trained second then first; skip b0, c0 (flat 2, 4)
    decision = ChunkDecision(order=(1, 0), selection=((5, 0), (3, 1)), skipped={"low_score": (2, 4)},
                             loss_weighting=LossWeighting("uniform"))
    puts = Puts()
    got = serve_chunk(chunk3(), REFS, decision, None, None, put=puts)
    assert [b.sample_ids for b in puts.batches] == [("c1", "a0"), ("b1", "a1")]  # gathered in selection order
    assert got.batch_refs == ("put1", "put0")
    assert got.sample_ids == (("b1", "a1"), ("c1", "a0"))
    assert got.domains == (("b", "a"), ("c", "a"))
    assert got.skipped == {"low_score": ("b0", "c0")}
    assert got.loss_weighting == LossWeighting("uniform") and got.sample_weights is None


def test_serve_chunk_selection_uses_the_schedulers_own_batch_refs_without_putting() -> None:
    decision = ChunkDecision(order=(0,), selection=((0, 1),), skipped={"r": (2, 3, 4, 5)}, batch_refs=("mine",))
    puts = Puts()
    got = serve_chunk(chunk3(), REFS, decision, None, None, put=puts)
    assert got.batch_refs == ("mine",) and puts.batches == []
    assert got.skipped == {"r": ("b0", "b1", "c0", "c1")}


@pytest.mark.parametrize("decision", [
    ChunkDecision(order=(0, 1), selection=((0, 1), (2, 3)), skipped={}),  # c0, c1 neither trained nor skipped
    ChunkDecision(order=(0, 1), selection=((0, 1), (2, 3)), skipped={"r": (4, 5, 0)}),  # a0 trained and skipped
    ChunkDecision(order=(0, 1, 2), skipped={"r": (1,)}),  # a1 trained (own batches) and skipped
])
def test_serve_chunk_refuses_a_decision_that_does_not_account_for_every_sample_once(decision) -> None:
    with pytest.raises(RuntimeError, match="chunk 5: the decision does not account for every sample exactly once"):
        serve_chunk(chunk3(), REFS, decision, None, None, put=Puts())


def test_serve_chunk_logs_the_snapshot_fields_in_a_copy_of_the_record() -> None:
    decision = ChunkDecision(order=(0, 1, 2), fallback=True, record={"fallback_reason": "deadline of 5s passed"})
    got = serve_chunk(chunk3(), REFS, decision, 4, {"snapshot_bytes": 1024, "snapshot_dtype": "bfloat16"}, put=Puts())
    assert got.decision.record == {"fallback_reason": "deadline of 5s passed", "snapshot_bytes": 1024,
                                   "snapshot_dtype": "bfloat16"}
    assert got.decision.fallback and got.decision.order == (0, 1, 2)
    assert decision.record == {"fallback_reason": "deadline of 5s passed"}  # the stored decision is unchanged


def test_coordinator_state_counts_each_request_served_and_reports_a_copy() -> None:
    state = CoordinatorState(chunks_produced=3)
    state.count_served(2)
    state.count_served(2)
    state.count_served(0)
    report = state.counters()
    assert report["served"] == {2: 2, 0: 1} and report["chunks_produced"] == 3
    report["served"][2] = 9
    assert state.served[2] == 2


# ---- the mailbox's waits, on one thread ---------------------------------------------------------------------
def never() -> None:
    return None


class Reseek(Exception):
    pass


def reseek() -> None:
    raise Reseek


def test_mailbox_weights_of_a_missing_version_are_the_oldest_newer_else_the_newest_past_the_deadline() -> None:
    box = Mailbox(threading.Condition())
    box.put_weights(4, ["w4"], 100, "float32")
    box.put_weights(6, ["w6"], None, None)
    assert box.wait_for_weights(2, None, never) == (4, ["w4"])  # a resumed run lacks 2: the oldest newer one
    assert box.wait_for_weights(-1, None, never) == (4, ["w4"])  # version c − staleness < 0 is version 0
    assert box.wait_for_weights(9, 0.0, never) == (6, ["w6"])  # past the deadline: the newest there is
    assert box.snapshot_fields(4) == {"snapshot_bytes": 100, "snapshot_dtype": "float32"}
    assert box.snapshot_fields(6) is None and box.snapshot_fields(None) is None
    assert Mailbox(threading.Condition()).wait_for_weights(0, 0.0, never) == (None, None)
    with pytest.raises(Reseek):  # a seek request ends the wait
        box.wait_for_weights(9, None, reseek)


def test_mailbox_observes_feedback_in_chunk_order_once_and_ignores_repeats() -> None:
    box = Mailbox(threading.Condition())
    seen: list[int] = []

    def feedback(c: int) -> ChunkFeedback:
        return ChunkFeedback(chunk_id=c, sample_ids=(), domains=(), losses=np.zeros(0))

    assert box.put_feedback(feedback(1)) and box.put_feedback(feedback(0))
    assert not box.put_feedback(feedback(1))  # a repeat (a restarted trainer) is ignored
    box.observe_through(1, lambda f: seen.append(f.chunk_id), threading.Lock(), never)
    assert seen == [0, 1] and box.observed_through == 1
    assert not box.put_feedback(feedback(0))  # observed already
    with pytest.raises(Reseek):  # chunk 2's feedback has not come: the wait ends only by the interrupt
        box.observe_through(2, lambda f: seen.append(f.chunk_id), threading.Lock(), reseek)
    box.put_feedback(feedback(3))
    box.observed_by_restore(3)  # a checkpoint's scheduler state covers chunks <= 3
    box.observe_through(3, lambda f: seen.append(f.chunk_id), threading.Lock(), reseek)
    assert seen == [0, 1]


def test_mailbox_sketch_request_hands_out_the_offered_batches_until_sketched_or_decided() -> None:
    box = Mailbox(threading.Condition())
    box.offer_for_sketching(3, ("r0", "r1"), [6, 7])
    assert box.sketch_request(3, lambda c: False, reseek) == (("r0", "r1"), [6, 7])
    assert box.sketch_request(4, lambda c: c == 4, reseek) is None  # decided (restored): nothing to sketch
    box.put_influence(3, ["S3"])
    assert box.sketch_request(3, lambda c: False, reseek) is None  # sketched already
    assert box.wait_for_influence(3, None, reseek) == ["S3"]
    assert box.wait_for_influence(5, 0.0, never) is None  # past the deadline: the scheduler falls back
    box.release(4, staleness=1)
    with pytest.raises(Reseek):
        box.wait_for_influence(3, None, reseek)
