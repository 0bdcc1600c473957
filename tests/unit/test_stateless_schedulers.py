"""Schedulers without state, feedback, weights or actors decide as pure functions of (chunk, seed).

The coordinator replay in tests/integration/test_scheduler_contract.py checks, on a real Ray stream,
that a restored coordinator decides like the uninterrupted one; for these schedulers that holds when
a freshly built scheduler decides a chunk exactly as another fresh one does and its (empty) state
round-trips, which is what this checks without Ray, together with the accounting of every sample.
"""

from __future__ import annotations

import numpy as np
import pytest

from d3ray.config import RunConfig
from d3ray.config_loading import load_config
from d3ray.data.chunker import Chunk, GlobalBatch
from d3ray.schedule.config import ScheduleConfig
from d3ray.schedule.scheduler import BuildContext, SubmitContext, TrainerRequests

B, L = 4, 3
STATELESS = ["loss_reweight", "mtl", "random", "sequential"]
"""Pure and Ray-free (random_select is pure too, but puts its selected batches in the object store: it
keeps its coordinator replay)."""


def pure(name: str) -> bool:
    cfg = ScheduleConfig.lookup(name)()
    return cfg.trainer_requests() == TrainerRequests() and not cfg.draws_mixture and not cfg.actor_requests()


def chunk_of(cid: int, capacity: int) -> Chunk:
    rng = np.random.default_rng(cid)
    domains = ["a", "b", "c"]
    batches = tuple(
        GlobalBatch(input_ids=rng.integers(0, 50, size=(B, 8)).astype(np.int32), n_tokens=np.full(B, 8, np.int32),
                    sample_ids=tuple(f"{cid}:{b}:{r}" for r in range(B)),
                    domains=tuple(domains[(b + r) % 3] for r in range(B)))
        for b in range(capacity))
    return Chunk(chunk_id=cid, epoch=0, batches=batches, capacity=capacity)


def test_the_stateless_schedulers_are_pure():
    assert set(STATELESS) <= {n for n in ScheduleConfig.known() if _builds_with_defaults(n) and pure(n)}


def _builds_with_defaults(name: str) -> bool:
    try:
        ScheduleConfig.lookup(name)()
    except ValueError:  # needs a required knob (e.g. doremi's reference): not stateless anyway
        return False
    return True


@pytest.mark.parametrize("name", STATELESS)
def test_stateless_scheduler_decides_as_a_pure_function_of_chunk_and_seed(name):
    cfg = load_config(RunConfig, None, [f"--schedule.type={name}", f"--schedule.L={L}"]).schedule
    ctx = BuildContext(seed=5, model_config={}, model=None, run_name="t", run_dir="/tmp", batch_size=B, total_chunks=4)
    first, second = cfg.build(ctx), cfg.build(ctx)
    second.load_state_dict(first.state_dict())
    capacity = cfg.window_batches()
    for cid in range(4):
        chunk = chunk_of(cid, capacity)
        refs = tuple(range(capacity))  # never read by these schedulers
        a = first.submit(chunk, refs, SubmitContext()).result(None)
        b = second.submit(chunk, refs, SubmitContext()).result(None)
        assert a.to_state() == b.to_state() and not a.fallback
        assert sorted(a.order) == list(range(len(a.order)))  # a permutation of the trained batches
        trained = [i for sel in (a.selection or [range(b * B, (b + 1) * B) for b in range(capacity)]) for i in sel]
        skipped = [i for idx in a.skipped.values() for i in idx]
        assert sorted(trained + skipped) == list(range(capacity * B)), "every candidate trains or is skipped once"
    other = cfg.build(BuildContext(seed=6, model_config={}, model=None, run_name="t", run_dir="/tmp", batch_size=B,
                                   total_chunks=4))
    decisions = [other.submit(chunk_of(c, capacity), tuple(range(capacity)), SubmitContext()).result(None).to_state()
                 for c in range(4)]
    again = [first.submit(chunk_of(c, capacity), tuple(range(capacity)), SubmitContext()).result(None).to_state()
             for c in range(4)]
    if name == "random":  # seeded: another seed draws other orders or selections
        assert decisions != again
