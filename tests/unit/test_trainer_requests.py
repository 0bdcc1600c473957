"""What a scheduler asks of the trainers (``TrainerRequests``, declared by its config) and the pure parts of
the trainers' side that carries them out (d3ray/train/scheduling/trainer_side.py): the staged merge, the chunks a
sketch request makes due, the feedback of a chunk, and which estimators can run on parameter shards (the
in-trainer placement's own checks: tests/unit/test_d3_placements.py)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from d3ray.config import RunConfig
from d3ray.config_loading import ConfigError, load_config
from d3ray.data.chunker import total_chunks
from d3ray.influence.config import InfluenceConfig
from d3ray.influence.estimators import FirstOrderConfig
from d3ray.schedule.config import ScheduleConfig
from d3ray.schedule.scheduler import (
    FeedbackRequest,
    Kind,
    SketchRequest,
    SnapshotRequest,
    TrainerRequests,
)
from d3ray.train.scheduling.trainer_side import TrainerSide, chunk_feedback
from d3ray.train.trainer_rank import TrainerRank


def requests_of(*overrides: str) -> TrainerRequests:
    return load_config(RunConfig, None, list(overrides)).schedule.trainer_requests()


@pytest.mark.parametrize("preconditioner, optimizer_state", [("adam", True), ("none", False)])
def test_d3_on_actors_asks_a_16_bit_snapshot_with_the_adam_state_when_its_preconditioner_reads_it(
        preconditioner, optimizer_state):
    requests = requests_of("--schedule.type=d3", "--schedule.placement.type=actors",
                           f"--schedule.influence.preconditioner={preconditioner}")
    assert requests == TrainerRequests(snapshot=SnapshotRequest(dtype="bfloat16", optimizer_state=optimizer_state,
                                                                staleness=1))


def test_a_merged_snapshot_keeps_the_smaller_staleness():
    """One snapshot for two readers: published first if either reads it for the next chunk."""
    ahead, now = SnapshotRequest(staleness=1), SnapshotRequest(dtype="bfloat16", staleness=0)
    assert (ahead | now).staleness == (now | ahead).staleness == 0
    assert (ahead | SnapshotRequest(staleness=1)).staleness == 1


def test_d3_in_trainer_asks_sketches_with_its_influence_config_and_no_snapshot():
    cfg = load_config(RunConfig, None, ["--schedule.type=d3", "--schedule.placement.type=in_trainer",
                                        "--schedule.L=5", "--schedule.staleness=0"]).schedule
    # the no-argument run decides chunk 0 in stream order (first_chunk: stream): no sketch of it
    assert cfg.trainer_requests() == TrainerRequests(sketch=SketchRequest(influence=cfg.influence, staleness=0, L=5,
                                                                          first_chunk_scored=False))


def test_staged_requests_merge_into_one_float32_snapshot_with_the_optimizer_state_of_either_stage():
    # the loss selector reads float32 weights; its d3 order reads 16 bits and the AdamW state
    requests = requests_of("--schedule.type=loss", "--schedule.order.type=d3",
                           "--schedule.order.influence.preconditioner=adam")
    assert requests == TrainerRequests(snapshot=SnapshotRequest(dtype="float32", optimizer_state=True))


def test_a_mixer_asks_feedback_and_keeps_its_orders_snapshot_and_only_mixers_draw_by_domain():
    cfg = load_config(RunConfig, None, ["--schedule.type=odm", "--schedule.order.type=d3",
                                        "--schedule.order.influence.preconditioner=none"]).schedule
    assert cfg.trainer_requests() == TrainerRequests(snapshot=SnapshotRequest(dtype="bfloat16", staleness=1),
                                                     feedback=FeedbackRequest())
    # the run decides at the mixer's staleness (the coordinator's), whatever the order stage declares
    at_zero = load_config(RunConfig, None, ["--schedule.type=odm", "--schedule.order.type=d3",
                                            "--schedule.staleness=0"]).schedule
    assert at_zero.order.staleness == 1 and at_zero.trainer_requests().snapshot.staleness == 0
    drawing = {name for name in ScheduleConfig.known() if _draws_mixture(name)}
    assert drawing and all(ScheduleConfig.lookup(name).kind is Kind.MIX for name in drawing)
    assert not _draws_mixture("d3") and not _draws_mixture("loss")


def _draws_mixture(name: str) -> bool:
    try:
        return ScheduleConfig.lookup(name)().draws_mixture
    except (TypeError, ValueError):  # a scheduler whose defaults alone do not validate (e.g. DoReMi's reference)
        return ScheduleConfig.lookup(name).kind is Kind.MIX


def test_merge_of_two_different_sketch_requests_is_refused():
    a = TrainerRequests(sketch=SketchRequest(influence=InfluenceConfig(), staleness=1, L=4))
    b = TrainerRequests(sketch=SketchRequest(influence=InfluenceConfig(), staleness=0, L=4))
    assert (a | TrainerRequests(feedback=FeedbackRequest())).sketch == a.sketch
    with pytest.raises(ValueError, match="different sketches"):
        a | b


def test_an_in_trainer_order_under_a_selector_is_refused_naming_the_field():
    with pytest.raises(ConfigError, match=r"schedule\.order\.placement\.type=in_trainer under a select"):
        load_config(RunConfig, None, ["--schedule.type=loss", "--schedule.order.type=d3",
                                      "--schedule.order.placement.type=in_trainer"])


def test_a_bad_snapshot_dtype_is_refused():
    with pytest.raises(ValueError, match="float16"):
        SnapshotRequest(dtype="float16")


@pytest.mark.parametrize("staleness, version, due", [
    (1, 0, [0, 1]),   # before the first step: chunk 0 and the one staleness ahead
    (1, 3, [4]),
    (1, 4, []),       # chunk 5 is past the run's end (9 steps, L = 2: chunks 0..4)
    (0, 0, [0]),
    (0, 4, [4]),
])
def test_sketch_request_due_chunks_by_weights_version(staleness, version, due):
    request = SketchRequest(influence=InfluenceConfig(), staleness=staleness, L=2)
    assert request.due(version, total_chunks(9, request.L)) == due


@pytest.mark.parametrize("staleness, version, due", [(1, 0, [1]), (1, 3, [4]), (0, 0, [])])
def test_sketch_request_skips_a_chunk_0_decided_in_stream_order(staleness, version, due):
    request = SketchRequest(influence=InfluenceConfig(), staleness=staleness, L=2, first_chunk_scored=False)
    assert request.due(version, total_chunks(9, request.L)) == due
    assert not request.sketched(0) and request.sketched(1)
    cfg = load_config(RunConfig, None, ["--schedule.type=d3", "--schedule.placement.type=in_trainer",
                                        "--schedule.first_chunk=stream"]).schedule
    assert cfg.trainer_requests().sketch.first_chunk_scored is False


def test_chunk_feedback_keeps_the_trained_steps_only_in_chunk_order():
    chunk = SimpleNamespace(chunk_id=7, sample_ids=(("a", "b"), ("c", "d"), ("e", "f")),
                            domains=(("x", "y"), ("x", "x"), ("y", "y")))
    losses = np.array([[1.0, 2.0], [3.0, 4.0], [np.nan, np.nan]], dtype=np.float32)  # the run stopped after step 2
    feedback = chunk_feedback(chunk, losses)
    assert feedback.chunk_id == 7
    assert feedback.sample_ids == ("a", "b", "c", "d") and feedback.domains == ("x", "y", "x", "x")
    np.testing.assert_array_equal(feedback.losses, np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32))


class _Handle:
    """A Ray actor handle's method stand-in: ``.remote(*args)`` records the call."""

    def __init__(self, calls: list, name: str) -> None:
        self.calls, self.name = calls, name

    def remote(self, *args):
        self.calls.append((self.name, args))


class _CoordinatorHandle:
    def __init__(self) -> None:
        self.calls: list = []
        self.feedback = _Handle(self.calls, "feedback")
        self.publish_weights = _Handle(self.calls, "publish_weights")


@pytest.mark.parametrize("requests, rank, sent", [
    (TrainerRequests(feedback=FeedbackRequest()), 0, True),
    (TrainerRequests(feedback=FeedbackRequest()), 1, False),  # one call per chunk, from rank 0
    (TrainerRequests(), 0, False),                            # not asked
])
def test_trainer_side_sends_a_chunks_feedback_only_when_asked_and_from_rank_0(requests, rank, sent):
    coordinator = _CoordinatorHandle()
    side = TrainerSide(requests, TrainerRank(engine=None, rank=rank, world=2, zero_stage=0), coordinator, steps=8)
    chunk = SimpleNamespace(chunk_id=0, sample_ids=(("a",),), domains=(("x",),))
    side.chunk_trained(chunk, np.array([[0.5]], dtype=np.float32), step=1, more=True)
    assert [name for name, _ in coordinator.calls] == (["feedback"] if sent else [])


def test_in_trainer_refuses_what_cannot_be_split_over_shards_but_not_the_potential_alone():
    from d3ray.influence.config import IdentitySketchConfig
    from d3ray.influence.estimators import HutchinsonConfig

    InfluenceConfig(sketch=IdentitySketchConfig()).check_shardable()  # the potential alone sketches nothing
    with pytest.raises(ValueError, match="identity sketch cannot be split"):
        InfluenceConfig(estimator=FirstOrderConfig(), sketch=IdentitySketchConfig()).check_shardable()
    with pytest.raises(ValueError, match="not 'hutchinson'"):
        InfluenceConfig(estimator=HutchinsonConfig()).check_shardable()
