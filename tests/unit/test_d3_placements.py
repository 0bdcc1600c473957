"""D3's placement is a typed choice (issue 48.1): ``schedule.placement: {type: actors, ...}`` or ``{type:
in_trainer}``, each one file that declares its checks, what it asks of the trainers, its actors, and builds the
object that submits a chunk. A new placement is a new file: one registered in this test module resolves,
validates and decides chunks through an unchanged ``D3Scheduler`` (no Ray). Then each built-in placement's
checks, exactly, and the one line an old key gives.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from d3ray.config import FIRST_RUN_SCHEDULE, RunConfig
from d3ray.config_loading import ConfigError, load_config
from d3ray.data.chunker import Chunk
from d3ray.influence.config import InfluenceConfig
from d3ray.influence.estimators import FirstOrderConfig, HutchinsonConfig
from d3ray.schedule.order.d3 import ActorsPlacement, D3ScheduleConfig, InTrainerPlacement, PlacementConfig
from d3ray.schedule.order.d3.scheduler import D3Scheduler
from d3ray.schedule.scheduler import (
    ActorRequest,
    BuildContext,
    ChunkDecision,
    Decided,
    FeedbackRequest,
    SnapshotRequest,
    SubmitContext,
    TrainerRequests,
)

REPO = Path(__file__).resolve().parents[2]


# ---- a new placement, in this file alone --------------------------------------------------------------------
@PlacementConfig.register("test_reversed_group")
@dataclass(frozen=True, kw_only=True)
class ReversedGroupPlacement(PlacementConfig):
    """A stand-in for a new placement (an influence worker group): ``workers`` actors, at most ``max_ranks``
    trainer ranks beside them, and every chunk decided in reverse stream order."""

    workers: int = 2
    max_ranks: int = 2

    def check_train(self, d3: D3ScheduleConfig, train: Any) -> None:
        if train.num_workers > self.max_ranks:
            raise ValueError(f"schedule.placement.max_ranks={self.max_ranks} < train.num_workers={train.num_workers}")

    def trainer_requests(self, d3: D3ScheduleConfig) -> TrainerRequests:
        return TrainerRequests(snapshot=SnapshotRequest(dtype="float32"), feedback=FeedbackRequest())

    def actor_requests(self, d3: D3ScheduleConfig) -> list[ActorRequest]:
        return [ActorRequest("influence", self.workers, {"CPU": 0.5})]

    def build(self, d3: D3ScheduleConfig, ctx: BuildContext, solver_pool: Any) -> ReversedSubmitter:
        return ReversedSubmitter(self.workers, solver_pool)


class ReversedSubmitter:
    def __init__(self, workers: int, solver_pool: Any) -> None:
        self.workers, self.solver_pool, self.closed = [f"worker-{i}" for i in range(workers)], solver_pool, False

    def submit(self, chunk: Chunk, batch_refs: Any, context: SubmitContext) -> Decided:
        return Decided(ChunkDecision(order=tuple(reversed(range(chunk.size))), record={"by": "reversed group"}))

    def influence_actors(self) -> list[Any]:
        return list(self.workers)

    def close(self) -> None:
        self.closed = True


def _context() -> BuildContext:
    return BuildContext(seed=0, model_config={}, model=None, run_name="t", run_dir="/tmp/t", batch_size=2,
                        total_chunks=3)


def _chunk(size: int, chunk_id: int) -> Chunk:
    return Chunk(chunk_id=chunk_id, epoch=0, batches=(None,) * size, capacity=size)  # type: ignore[arg-type]


def test_a_placement_registered_in_one_file_resolves_validates_and_decides_through_d3scheduler():
    cfg = load_config(RunConfig, None, ["--schedule.placement={type: test_reversed_group, workers: 3}"])
    schedule = cfg.schedule
    assert schedule.placement == ReversedGroupPlacement(workers=3)
    assert schedule.trainer_requests() == TrainerRequests(snapshot=SnapshotRequest(dtype="float32"),
                                                          feedback=FeedbackRequest())
    assert schedule.actor_requests() == [ActorRequest("influence", 3, {"CPU": 0.5})]  # the sort: no solver pool
    with pytest.raises(ConfigError, match=r"^schedule\.placement\.max_ranks=2 < train\.num_workers=4$"):
        load_config(RunConfig, None, ["--schedule.placement.type=test_reversed_group", "--train.num_workers=4",
                                      "--train.global_batch_size=16"])
    scheduler = D3Scheduler(schedule, _context())  # no Ray: the order is a sort, so no solver pool either
    assert scheduler.solver_pool is None and scheduler.actors() == {"influence": ["worker-0", "worker-1", "worker-2"]}
    first = scheduler.submit(_chunk(4, 0), (), SubmitContext()).result(0.0)  # first_chunk: stream is D3's own
    assert first.order == (0, 1, 2, 3) and first.record["first_chunk"] == "stream_order"
    assert first.record["influence_placement"] == "test_reversed_group"
    later = scheduler.submit(_chunk(4, 1), (), SubmitContext()).result(0.0)
    assert later.order == (3, 2, 1, 0) and later.record == {"by": "reversed group"}
    scheduler.close()
    assert scheduler.submitter.closed


# ---- the built-in placements' checks -----------------------------------------------------------------------
def test_the_no_argument_run_names_in_trainer_the_class_default_is_actors_and_tiny_yaml_is_the_default():
    assert FIRST_RUN_SCHEDULE.placement == InTrainerPlacement()
    assert D3ScheduleConfig().placement == ActorsPlacement()
    assert load_config(RunConfig, REPO / "jobs" / "configs" / "tiny.yaml").schedule == FIRST_RUN_SCHEDULE
    gpu = load_config(RunConfig, REPO / "jobs" / "configs" / "sft_qwen_lora_gpu.yaml").schedule.placement
    assert gpu == ActorsPlacement(num_gpus=0.25, nice=19)


@pytest.mark.parametrize(("estimator", "zero_stage", "refused"), [
    (None, 0, False), (None, 2, False), (None, 3, False),  # the potential alone: the whole module or the shards
    (FirstOrderConfig(), 3, False),                         # sketched on ZeRO-3 shards
    (FirstOrderConfig(), 2, True), (FirstOrderConfig(), 0, True),
])
def test_in_trainer_sketches_need_zero_3_but_the_potential_alone_does_not(estimator, zero_stage, refused):
    influence = InfluenceConfig() if estimator is None else InfluenceConfig(estimator=estimator)
    overrides = [f"--train.zero_stage={zero_stage}", "--schedule.placement.type=in_trainer"]
    if estimator is not None:
        overrides.append(f"--schedule.influence.estimator.type={estimator.type_name}")
    if not refused:
        assert load_config(RunConfig, None, overrides).schedule.influence == influence
        return
    with pytest.raises(ConfigError) as err:
        load_config(RunConfig, None, overrides)
    assert str(err.value) == (
        f"schedule.placement.type=in_trainer sketches on ZeRO-3 parameter shards: set --train.zero_stage=3 (got "
        f"{zero_stage}), or use schedule.placement.type=actors (under ZeRO 0-2 the trainers compute the drift "
        f"potential alone: drift, residual none, potential step or jvp)")


def test_in_trainer_refuses_an_estimator_that_cannot_run_on_shards_and_actors_take_it():
    with pytest.raises(ValueError, match=r"^schedule\.placement\.type=in_trainer supports the estimators .* not "
                                         r"'hutchinson' .*use schedule\.placement\.type=actors for it$"):
        D3ScheduleConfig(placement=InTrainerPlacement(), influence=InfluenceConfig(estimator=HutchinsonConfig()))
    D3ScheduleConfig(placement=ActorsPlacement(), influence=InfluenceConfig(estimator=HutchinsonConfig()))


def test_in_trainer_under_a_selector_is_refused_and_actors_are_not():
    with pytest.raises(ConfigError, match=r"schedule\.order\.placement\.type=in_trainer under a select scheduler"):
        load_config(RunConfig, None, ["--schedule.type=loss", "--schedule.order.type=d3",
                                      "--schedule.order.placement.type=in_trainer"])
    staged = load_config(RunConfig, None, ["--schedule.type=loss", "--schedule.order.type=d3"]).schedule
    assert staged.order.placement == ActorsPlacement()


@pytest.mark.parametrize(("fields", "message"), [
    ({"nice": 20}, "schedule.placement.nice=20 must be in 0..19"),
    ({"nice": -1}, "schedule.placement.nice=-1 must be in 0..19"),
    ({"count": 0}, "schedule.placement.count=0 must be >= 1"),
    ({"snapshot_dtype": "float16"}, "schedule.placement.snapshot_dtype='float16' must be one of bfloat16, float32"),
])
def test_actors_placement_refuses_its_bad_fields_naming_them(fields, message):
    with pytest.raises(ValueError) as err:
        ActorsPlacement(**fields)
    assert str(err.value) == message


def test_actors_ask_a_snapshot_and_their_own_actors_in_trainer_asks_sketches_and_none():
    actors = D3ScheduleConfig(placement=ActorsPlacement(count=2, num_gpus=0.25, resources={"gpu_node": 0.01}))
    assert actors.trainer_requests() == TrainerRequests(snapshot=SnapshotRequest(dtype="bfloat16", optimizer_state=True,
                                                                                 staleness=1))
    assert actors.actor_requests() == [ActorRequest("influence", 2, {"CPU": 1.0, "GPU": 0.25, "gpu_node": 0.01})]
    in_trainer = D3ScheduleConfig(placement=InTrainerPlacement(), L=5)
    assert in_trainer.trainer_requests().snapshot is None and in_trainer.trainer_requests().sketch.L == 5
    assert in_trainer.actor_requests() == []


@pytest.mark.parametrize(("old", "new"), [
    ("influence_placement=actors", "schedule.placement: {type: in_trainer|actors, ...}"),
    ("influence_num_gpus=0.25", "schedule.placement.num_gpus (placement: {type: actors, num_gpus: N})"),
    ("influence_nice=19", "schedule.placement.nice (placement: {type: actors, nice: N})"),
    ("influence_actors=2", "schedule.placement.count (placement: {type: actors, count: N})"),
    ("snapshot_dtype=float32", "schedule.placement.snapshot_dtype (placement: {type: actors, snapshot_dtype: float32})"),
])
def test_an_old_key_gives_one_line_naming_the_key_that_replaced_it(old, new):
    with pytest.raises(ConfigError) as err:
        load_config(RunConfig, None, [f"--schedule.{old}"])
    assert str(err.value) == f"schedule.{old.split('=')[0]} was replaced by {new}"


def test_an_old_key_in_a_file_says_where(tmp_path):
    path = tmp_path / "old.yaml"
    path.write_text("schedule:\n  type: d3\n  L: 8\n  influence_placement: auto\n")
    with pytest.raises(ConfigError) as err:
        load_config(RunConfig, path)
    assert str(err.value) == (f"{path}:4:3: schedule.influence_placement was replaced by "
                              f"schedule.placement: {{type: in_trainer|actors, ...}}")


def test_config_help_names_both_placements(capsys):
    from d3ray.cli import main

    with pytest.raises(SystemExit) as done:
        main(["config", "--help"])
    assert done.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--schedule.placement.type=in_trainer" in out and "{type: actors, num_gpus: 0.25}" in out
