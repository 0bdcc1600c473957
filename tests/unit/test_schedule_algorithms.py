"""Each scheduling rule on a case with a known answer, worked out by hand; bad configs name the field."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from d3ray.config import RunConfig
from d3ray.config_loading import ConfigError, load_config
from d3ray.model.lm_loss import sequence_losses, step_loss
from d3ray.schedule.order.regroup import curriculum_groups, round_robin_groups
from d3ray.schedule.scheduler import ChunkDecision, LossWeighting
from d3ray.schedule.select.base import keep_count, top_k_decision
from d3ray.schedule.staged import merge
from d3ray.schedule.weight.loss_reweight import loss_weights

E = math.e


@pytest.mark.parametrize(
    "strategy, unnormalised",
    [
        # losses 1, 2, 3 with δ = 1 normalise to x = -1, 0, 1; w ∝ exp(g(x))
        ("linupper", [1.0, E, E]),  # g = min(x + 1, 1) = 0, 1, 1
        ("uniform", [1 / E, 1.0, E]),  # g = x
        ("quadratic", [1.0, E, 1.0]),  # g = 1 - x² = 0, 1, 0
        ("extremes", [E, 1.0, E]),  # g = |x| = 1, 0, 1
    ],
)
def test_loss_weights_follow_the_strategy_on_a_hand_built_loss_vector(strategy, unnormalised) -> None:
    expected = np.array(unnormalised) / sum(unnormalised) * 3  # mean 1
    np.testing.assert_allclose(loss_weights(np.array([1.0, 2.0, 3.0]), strategy), expected, rtol=1e-12)


def test_loss_weights_temperature_flattens_and_equal_losses_weigh_equally() -> None:
    hot = loss_weights(np.array([1.0, 2.0, 3.0]), "uniform", temperature=1e6)
    np.testing.assert_allclose(hot, [1.0, 1.0, 1.0], atol=1e-5)
    np.testing.assert_allclose(loss_weights(np.array([2.0, 2.0]), "linupper"), [1.0, 1.0])


def test_weighted_step_loss_equals_the_hand_computed_weighted_loss() -> None:
    # Row 0: every logit 0 except the target's, 1: each scored token costs a = -log(e / (e + 3)) (V = 4).
    # Row 1: every logit 0: each scored token costs b = log 4. Unequal losses, so that a weighting that
    # is ignored, or applied to the wrong row, gives another number.
    ids = torch.tensor([[0, 1, 2, 3], [3, 2, 1, 0]])
    logits = torch.zeros(2, 4, 4)
    for t in range(3):
        logits[0, t, ids[0, t + 1]] = 1.0
    labels = ids.clone()
    labels[1, 3:] = -100  # row 1 scores only its first two targets
    sums, counts = sequence_losses(logits, labels)
    a, b = -math.log(E / (E + 3)), math.log(4)
    np.testing.assert_allclose(sums.numpy(), [3 * a, 2 * b], rtol=1e-6)
    np.testing.assert_allclose(counts.numpy(), [3, 2])
    assert float(step_loss(sums, counts)) == pytest.approx((3 * a + 2 * b) / 5, rel=1e-6)  # token mean, as HF
    weights = torch.tensor([0.5, 1.5])
    weighted = (0.5 * a + 1.5 * b) / 2  # the mean over rows of weight x the row's token-mean loss
    assert float(step_loss(sums, counts, weights)) == pytest.approx(weighted, rel=1e-6)
    assert float(step_loss(sums, counts, torch.tensor([1.5, 0.5]))) == pytest.approx((1.5 * a + 0.5 * b) / 2, rel=1e-6)
    assert float(step_loss(sums, counts, torch.tensor([0.0, 2.0]))) == pytest.approx(b, rel=1e-6)  # row 0 dropped


def test_curriculum_groups_sort_by_difficulty_in_both_directions_ties_in_stream_order() -> None:
    difficulty = np.array([3.0, 1.0, 2.0, 0.0, 1.0, 5.0])
    assert curriculum_groups(difficulty, 2, hard_first=False) == ((3, 1), (4, 2), (0, 5))
    assert curriculum_groups(difficulty, 2, hard_first=True) == ((5, 0), (2, 1), (4, 3))
    with pytest.raises(ValueError, match="non-finite"):
        curriculum_groups(np.array([1.0, np.nan]), 2, hard_first=False)


def test_round_robin_groups_deal_the_domains_in_turns() -> None:
    domains = ["b", "a", "a", "b", "a", "c"]
    # a: 1, 2, 4; b: 0, 3; c: 5 → dealt a1 b0 c5 | a2 b3 | a4
    assert round_robin_groups(domains, 3) == ((1, 0, 5), (2, 3, 4))


def test_top_k_decision_keeps_the_highest_scores_and_skips_the_rest_with_a_reason() -> None:
    scores = np.array([0.1, 0.9, 0.5, 0.7, 0.2, 0.8])
    decision = top_k_decision(scores, 2, 2, {"scheduler": "t"})
    assert decision.selection == ((1, 2), (3, 5))
    assert decision.skipped == {"not_selected": (0, 4)}
    assert decision.order == (0, 1)


def test_keep_count_keeps_l_of_the_window_and_at_least_one() -> None:
    assert keep_count(16, 8, 0.5) == 8
    assert keep_count(3, 8, 0.5) == 1  # a short last window
    assert keep_count(10, 8, 1.0) == 8


def test_staged_merge_composes_a_regrouping_order_stage_with_the_selection() -> None:
    head = ChunkDecision(order=(0, 1), selection=((0, 1), (4, 5)), sample_weights=((1.0, 2.0), (3.0, 4.0)),
                         skipped={"not_selected": (2, 3)}, record={"scheduler": "sel"})
    curriculum = ChunkDecision(order=(0, 1), selection=((2, 0), (3, 1)), record={"scheduler": "curriculum"})
    merged = merge(head, curriculum, refs=("r0", "r1"))
    assert merged.selection == ((4, 0), (5, 1))
    assert merged.sample_weights == ((3.0, 1.0), (4.0, 2.0))
    assert merged.batch_refs is None, "regrouped batches are not the head's batches"
    assert merged.skipped == {"not_selected": (2, 3)}
    assert merged.record["scheduler"] == "sel" and merged.record["order_scheduler"] == "curriculum"


def test_chunk_decision_state_round_trip() -> None:
    decision = ChunkDecision(order=(1, 0), selection=((3, 2), (0, 1)), sample_weights=((0.5, 1.5), (1.0, 1.0)),
                             loss_weighting=LossWeighting("linupper", {"delta": 1.0}), skipped={"x": (4,)},
                             fallback=True, record={"scheduler": "d3", "influence_placement": "in_trainer", "cost": 0.5})
    again = ChunkDecision.from_state(json.loads(json.dumps(decision.to_state())))  # as a checkpoint's state.json holds it
    assert (again.order, again.selection, again.sample_weights, again.loss_weighting, again.skipped, again.fallback) == (
        decision.order, decision.selection, decision.sample_weights, decision.loss_weighting, decision.skipped, True)
    # a resumed run logs the restored decision with what made it, marked as restored
    assert again.record == {**decision.record, "reused_from_checkpoint": True}


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["--schedule.type=no_such"], r"schedule.type: unknown ScheduleConfig type 'no_such'; known: .*d3"),
        (["--schedule.type=loss", "--schedule.fraction=0"], r"schedule.fraction=0.0 must be in \(0, 1\]"),
        (["--schedule.type=random_select", "--schedule.fraction=1.5"], r"schedule.fraction=1.5 must be in \(0, 1\]"),
        (["--schedule.type=loss_reweight", "--schedule.strategy=cubic"], r"schedule.strategy='cubic' is not one of"),
        (["--schedule.type=loss", "--schedule.order.type=loss"], r"schedule.order.type='loss' is a select scheduler"),
    ],
)
def test_bad_schedule_config_names_the_field(overrides, message) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(RunConfig, None, overrides)


def test_sequence_losses_equal_the_per_token_definition_on_random_logits() -> None:
    """Labels shifted, logits untouched: Σ_t −log softmax(logits[b, t])[labels[b, t + 1]] over targets."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 6, 11, generator=gen)
    labels = torch.randint(0, 11, (3, 6), generator=gen)
    labels[0, 4:] = -100  # padding at the end
    labels[2, :3] = -100  # a prompt without loss
    sums, counts = sequence_losses(logits, labels)
    logp = torch.log_softmax(logits.double(), dim=-1)
    for b in range(3):
        targets = [(t, int(labels[b, t + 1])) for t in range(5) if labels[b, t + 1] != -100]
        assert float(counts[b]) == len(targets)
        assert float(sums[b]) == pytest.approx(-sum(float(logp[b, t, y]) for t, y in targets), rel=1e-6)


def test_loss_weights_of_a_tensor_stay_a_tensor_and_equal_the_numpy_ones() -> None:
    losses = np.array([2.5, 0.7, 1.9, 3.1])
    for strategy in ("linupper", "uniform", "quadratic", "extremes"):
        as_tensor = loss_weights(torch.tensor(losses, dtype=torch.float32), strategy, delta=0.5, temperature=2.0)
        assert isinstance(as_tensor, torch.Tensor) and as_tensor.dtype == torch.float64
        np.testing.assert_allclose(as_tensor.numpy(), loss_weights(losses.astype(np.float32), strategy, 0.5, 2.0),
                                   rtol=1e-12)
        assert float(as_tensor.mean()) == pytest.approx(1.0)
