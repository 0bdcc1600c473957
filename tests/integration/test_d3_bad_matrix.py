"""Bad input of issue 50: a solver given an S it cannot search (NaN, inf, wrong shape, not antisymmetric)
is refused at the chunk, in one line naming the chunk, and the chunk falls back to stream order (a counted
fallback); a searchable S is searched, and its row says by which solver and what the order predicts. Real
local Ray, a real solver pool, the D3 decision of d3ray/schedule/order/d3/decisions.py."""

from __future__ import annotations

import time

import numpy as np
import pytest

from d3ray.schedule.order.d3 import ActorsPlacement, D3ScheduleConfig
from d3ray.schedule.order.d3.decisions import D3Pending
from d3ray.solver import RsrConfig

pytestmark = pytest.mark.ray

CFG = D3ScheduleConfig(solver=RsrConfig(max_iters=200), placement=ActorsPlacement())


def _antisymmetric(n: int, seed: int) -> np.ndarray:
    X = np.random.default_rng(seed).normal(size=(n, n))
    return X - X.T


def _bad(kind: str) -> np.ndarray:
    S = _antisymmetric(4, 0)
    if kind == "nan":
        S[1, 2] = np.nan
    elif kind == "inf":
        S[0, 3], S[3, 0] = np.inf, -np.inf
    elif kind == "shape":
        S = _antisymmetric(3, 0)
    elif kind == "asymmetric":
        S[0, 1] += 1.0
    return S


@pytest.mark.parametrize("kind", ["nan", "inf", "shape", "asymmetric"])
def test_d3_refuses_an_unsearchable_s_at_its_chunk_in_one_line_and_trains_stream_order(ray_cluster, kind):
    ray = ray_cluster
    pool = CFG.solver_pool.build(CFG.solver)
    try:
        S_ref = ray.put(_bad(kind))
        pending = D3Pending(CFG, 7, 4, S_ref, ray.put({"influence_sec": 0.1}), pool.submit(7, S_ref, seed=0),
                            time.perf_counter())
        decision = pending.result(120.0)
    finally:
        pool.shutdown()
    assert decision.fallback and decision.order == (0, 1, 2, 3)
    reason = decision.record["fallback_reason"]
    assert reason.startswith("chunk 7: S cannot be searched") and "\n" not in reason, reason
    assert decision.record["fallback_order"] == "stream"


def test_d3_searches_a_searchable_s_and_logs_the_solver_and_the_predicted_change(ray_cluster):
    from d3ray.solver.loss_change import forward_weight

    ray = ray_cluster
    S = _antisymmetric(6, 1)
    pool = CFG.solver_pool.build(CFG.solver)
    try:
        S_ref = ray.put(S)
        decision = D3Pending(CFG, 3, 6, S_ref, ray.put({"influence_sec": 0.1}), pool.submit(3, S_ref, seed=0),
                             time.perf_counter()).result(120.0)
    finally:
        pool.shutdown()
    record = decision.record
    assert not decision.fallback and record["decided_by"] == "searched by rsr" and record["search"] is True
    chosen = forward_weight(S, decision.order)
    assert record["predicted_loss_change_vs_random_nats"] == pytest.approx(-chosen / 2)
    assert record["predicted_loss_change_vs_stream_nats"] == pytest.approx(-(chosen - forward_weight(S, range(6))) / 2)
    assert record["predicted_loss_change_vs_random_nats"] < 0  # the search put the positive weight forward
    assert decision.matrix is None  # S is written only when asked (save_matrices)


def test_d3_paper_with_an_overridden_solver_searches_with_it_and_each_row_names_the_departure(ray_cluster):
    from d3ray.config import RunConfig
    from d3ray.config_loading import load_config

    ray = ray_cluster
    cfg = load_config(RunConfig, None, ["--schedule.type=d3_paper", "--schedule.solver.type=ils",
                                        "--schedule.solver.max_iters=50"]).schedule
    pool = cfg.solver_pool.build(cfg.solver)
    try:
        S_ref = ray.put(_antisymmetric(6, 2))
        decision = D3Pending(cfg, 1, 6, S_ref, ray.put({"influence_sec": 0.1}), pool.submit(1, S_ref, seed=0),
                             time.perf_counter()).result(120.0)
    finally:
        pool.shutdown()
    assert decision.record["scheduler"] == "d3_paper" and decision.record["decided_by"] == "searched by ils"
    assert decision.record["preset_departures"] == ["schedule.solver.type=ils (paper: rsr)"]
