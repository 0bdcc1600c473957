"""The default D3's decision of a chunk (d3ray/schedule/order/d3/decisions.py ``potential_decision``): the sort of the
trainers' potential f, no S built and no solver, the row saying so, with the predicted loss change from f;
a potential of the wrong length is refused at the chunk (stream order, one line naming it)."""

from __future__ import annotations

import numpy as np
import pytest

from d3ray.config import FIRST_RUN_SCHEDULE
from d3ray.influence.influence import ChunkPotential
from d3ray.schedule.order.d3.decisions import SORTED_BY_POTENTIAL, potential_decision


def _potential(f, excluded=(), ids=(10, 11, 12, 13)):
    return ChunkPotential(batch_ids=list(ids), potential=np.array(f, dtype=np.float64), excluded=list(excluded),
                          losses=np.zeros(len(f)), step_size=0.5)


def test_potential_decision_sorts_f_and_says_no_search_with_the_predicted_change():
    decision = potential_decision(FIRST_RUN_SCHEDULE, 2, [10, 11, 12, 13], _potential([0.3, -0.2, 0.1, 0.0]), {}, 0.0)
    assert decision.order == (1, 3, 2, 0) and not decision.fallback and decision.matrix is None
    record = decision.record
    assert record["decided_by"] == SORTED_BY_POTENTIAL == "sorted by potential, no search"
    assert record["search"] is False and record["solver"] == "sort"
    # F(sorted) = η·Σ_{a<b}|f_b − f_a| = 0.5·(0.1+0.2+0.3+0.1+0.2+0.5) ... worked pairwise: |−.2−0|=.2, |−.2−.1|=.3,
    # |−.2−.3|=.5, |0−.1|=.1, |0−.3|=.3, |.1−.3|=.2: sum 1.6, F = 0.8
    assert record["predicted_loss_change_vs_random_nats"] == pytest.approx(-0.4)
    # stream order (0, 1, 2, 3): F = 0.5·((−.2−.3)+(.1−.3)+(0−.3)+(.1+.2)+(0+.2)+(0−.1)) = 0.5·(−0.6) = −0.3
    assert record["predicted_loss_change_vs_stream_nats"] == pytest.approx(-(0.8 + 0.3) / 2)


def test_potential_decision_places_an_excluded_batch_as_the_merged_s_does_and_leaves_it_out():
    decision = potential_decision(FIRST_RUN_SCHEDULE, 2, [10, 11, 12, 13], _potential([0.3, np.nan, -0.1, 0.0], [11]),
                                  {}, 0.0)
    assert decision.order == (2, 3, 1, 0)  # batch 11 sorts at the others' mean f (0.0667)
    assert decision.record["potential"][1] is None and decision.record["excluded_batches"] == [11]


def test_potential_decision_writes_s_only_when_asked():
    import dataclasses

    asked = dataclasses.replace(FIRST_RUN_SCHEDULE, save_matrices=True)
    decision = potential_decision(asked, 2, [10, 11, 12, 13], _potential([0.3, -0.2, 0.1, 0.0]), {}, 0.0)
    assert decision.matrix[1, 0] == pytest.approx(0.5 * (0.3 + 0.2))  # S[i, j] = η·(f_j − f_i)


def test_potential_decision_refuses_a_potential_of_the_wrong_length_at_the_chunk():
    decision = potential_decision(FIRST_RUN_SCHEDULE, 5, [10, 11, 12, 13], _potential([0.3, -0.2, 0.1], ids=(10, 11, 12)),
                                  {}, 0.0)
    assert decision.fallback and decision.order == (0, 1, 2, 3)
    assert decision.record["fallback_reason"].startswith("chunk 5: a potential of shape (3,)")
