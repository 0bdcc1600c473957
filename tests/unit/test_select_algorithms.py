"""The target-based and delta-loss selectors on cases with known answers; bad configs name the field.

Pure scoring math on constructed vectors worked out by hand; then each Scorer on a ScoringWorker
called directly (no Ray) with a tiny GPT-2, where candidates that copy target sequences must win.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from d3ray.config import RunConfig
from d3ray.config_loading import ConfigError, load_config
from d3ray.data.chunker import GlobalBatch
from d3ray.influence.config import IdentitySketchConfig, SjltSketchConfig
from d3ray.influence.optimizer import AdamWState
from d3ray.schedule.select.base import top_k_decision
from d3ray.schedule.select.delta_loss import DeltaLossScorer, delta_loss_scores, sigmoid_window
from d3ray.schedule.select.less import AdamMoments, LessScorer, adam_direction, less_scores, target_directions
from d3ray.schedule.select.near import NearScorer, near_scores
from d3ray.schedule.select.target import choose_target_sets
from d3ray.schedule.select.tsds import TsdsScorer, kde_densities, tsds_probabilities, tsds_scores

V, T = 64, 16


def kept(scores: np.ndarray, k: int) -> set[int]:
    """The candidates the selectors' shared rule keeps (batches of 1, k of them)."""
    return {i for b in top_k_decision(scores, k, 1, {}).selection for i in b}


# ---- LESS -----------------------------------------------------------------------------------------
def test_less_scores_are_the_max_over_sets_of_the_mean_cosine() -> None:
    sets = [np.array([[1.0, 0.0, 0.0], [1.0, 0.1, 0.0]]), np.array([[0.0, 3.0, 0.0]])]
    candidates = np.array([[2.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, 0.5, 0.0]])
    scores = less_scores(candidates, target_directions(sets))
    c = 1 / math.sqrt(1.01)  # cos((1, 0.1, 0), x-axis)
    np.testing.assert_allclose(scores, [(1 + c) / 2, 0.0, 1.0], rtol=1e-12)


def test_adam_direction_follows_the_bias_corrected_update() -> None:
    g = torch.tensor([[2.0, -1.0]])  # one sequence, one parameter of two entries
    moments = AdamMoments(exp_avg_sq={"w": np.array([4.0, 0.0])}, exp_avg={"w": np.array([1.0, 0.0])}, step=9,
                          betas=(0.9, 0.999), eps=1e-8)
    out = adam_direction({"w": g}, moments)["w"][0].double().numpy()
    m0 = (0.9 * 1 + 0.1 * 2) / (1 - 0.9**10)
    v0 = (0.999 * 4 + 0.001 * 4) / (1 - 0.999**10)
    m1 = (0.1 * -1) / (1 - 0.9**10)
    v1 = (0.001 * 1) / (1 - 0.999**10)
    np.testing.assert_allclose(out, [m0 / (math.sqrt(v0) + 1e-8), m1 / (math.sqrt(v1) + 1e-8)], rtol=1e-6)
    # a fresh optimizer (m = v = 0, t = 0): m̂ = g, v̂ = g², so Γ = g / (|g| + ε) = sign(g)
    fresh = AdamMoments(exp_avg_sq={"w": np.zeros(2)}, step=0)
    np.testing.assert_allclose(adam_direction({"w": g}, fresh)["w"][0].numpy(), [1.0, -1.0], rtol=1e-6)


def test_adam_moments_read_from_a_mapping_or_an_object_part() -> None:
    class State:  # issue 14's AdamWState has these attributes
        exp_avg_sq = {"w": np.ones(2)}
        exp_avg = {"w": np.zeros(2)}
        step = 3
        betas = (0.8, 0.99)
        eps = 1e-6

    from_object = AdamMoments.from_part(State())
    assert (from_object.step, from_object.betas, from_object.eps) == (3, (0.8, 0.99), 1e-6)
    from_mapping = AdamMoments.from_part({"exp_avg_sq": {"w": np.ones(2)}})
    assert (from_mapping.exp_avg, from_mapping.step, from_mapping.betas) == (None, None, (0.9, 0.999))
    with pytest.raises(ValueError, match=r"exp_avg_sq\['w'\] has shape \(2,\), the parameter \(3,\)"):
        from_mapping.check_covers({"w": (3,)})


# ---- Delta-Loss -----------------------------------------------------------------------------------
def test_sigmoid_window_slides_from_the_top_to_the_bottom_of_the_ranking() -> None:
    assert sigmoid_window(0.0, 10, 4, 10.0) == (0, 4)  # ⌊σ(−5)·6⌋ = ⌊0.040⌋
    assert sigmoid_window(0.5, 10, 4, 10.0) == (3, 7)  # ⌊0.5·6⌋
    assert sigmoid_window(1.0, 10, 4, 10.0) == (5, 9)  # ⌊σ(5)·6⌋ = ⌊5.96⌋
    assert sigmoid_window(3.0, 10, 4, 10.0) == (5, 9)  # progress is clipped to 1


def test_delta_loss_keeps_the_window_of_the_ranking_on_a_hand_built_loss_vector() -> None:
    delta = np.array([0.5, 3.0, -1.0, 2.0, 1.0, 0.1, 4.0, 0.2, 0.3, 0.0])
    # ranking by Δ descending: 6, 1, 3, 4, 0, 8, 7, 5, 9, 2
    rng = np.random.default_rng(0)
    assert kept(delta_loss_scores(delta, 0.0, 4, 10.0, 0.0, rng), 4) == {6, 1, 3, 4}
    assert kept(delta_loss_scores(delta, 0.5, 4, 10.0, 0.0, rng), 4) == {4, 0, 8, 7}  # positions 3..6
    assert kept(delta_loss_scores(delta, 1.0, 4, 10.0, 0.0, rng), 4) == {8, 7, 5, 9}  # positions 5..8
    # The window ends at the first negative Δ (position 7 here): positions 5, 6, then the nearest ranks 4 and 7.
    clipped = np.array([0.5, 3.0, -1.0, 2.0, 1.0, -0.1, 4.0, 0.2, 0.3, -0.2])
    # ranking: 6, 1, 3, 4, 0, 8, 7, 5, 9, 2
    assert kept(delta_loss_scores(clipped, 1.0, 4, 10.0, 0.0, rng), 4) == {8, 7, 0, 5}
    # A NaN Δ ranks last; with a tiny outside weight the sampled selection is the window.
    nan = delta.copy()
    nan[6] = np.nan
    assert kept(delta_loss_scores(nan, 0.0, 4, 10.0, 1e-12, np.random.default_rng(1)), 4) == {1, 3, 4, 0}


def test_delta_loss_sampling_is_seeded() -> None:
    delta = np.linspace(1.0, 2.0, 20)
    a = delta_loss_scores(delta, 0.3, 5, 10.0, 0.5, np.random.default_rng([1, 2]))
    b = delta_loss_scores(delta, 0.3, 5, 10.0, 0.5, np.random.default_rng([1, 2]))
    np.testing.assert_array_equal(a, b)


# ---- TSDS ---------------------------------------------------------------------------------------
# One target at the origin; candidates a (distance 1), a cluster of three identical points c (distance
# 2), b (distance 3) and f (distance 10), all mutually farther apart than σ = 0.5: ρ = 1, 3, 3, 3, 1, 1.
QUERY = np.zeros((1, 2))
CANDIDATES = np.array([[1.0, 0.0], [0.0, 2.0], [0.0, 2.0], [0.0, 2.0], [-3.0, 0.0], [0.0, -10.0]])


def test_kde_densities_count_near_duplicates() -> None:
    np.testing.assert_allclose(kde_densities(CANDIDATES, 0.5), [1, 3, 3, 3, 1, 1])
    np.testing.assert_allclose(kde_densities(CANDIDATES, 0.0), np.ones(6))


@pytest.mark.parametrize(
    "alpha, C, expected",
    [
        # α = 1: pure alignment, all mass on the nearest candidate.
        (1.0, 1.0, [1, 0, 0, 0, 0, 0]),
        # α = 0: the level s of the last breakpoint, S = 1 + 1/3·3 + 1 = 3; caps 1/(s·ρ); the
        # farthest neighbour gets what is left (nothing). The cluster takes the mass of one point.
        (0.0, 1.0, [1 / 3, 1 / 9, 1 / 9, 1 / 9, 1 / 3, 0]),
        # α = 1/2, C = 2.5: stop when Σc ≥ 2.5. Breakpoints (S, c): (1, 1), (4/3, 1), (5/3, 1), (2, 3):
        # s = 2, caps 1/2 for a, 1/6 for each c; b gets nothing.
        (0.5, 2.5, [1 / 2, 1 / 6, 1 / 6, 1 / 6, 0, 0]),
        # α = 1/2, C = 1: c = 1 at the first breakpoint already: s = 1, a takes everything.
        (0.5, 1.0, [1, 0, 0, 0, 0, 0]),
    ],
)
def test_tsds_probabilities_on_constructed_embeddings(alpha, C, expected) -> None:
    p = tsds_probabilities(QUERY, CANDIDATES, alpha=alpha, C=C, knn=6, sigma=0.5)
    np.testing.assert_allclose(p, expected, atol=1e-12)


def test_tsds_probabilities_split_the_mass_over_targets() -> None:
    queries = np.array([[0.0, 0.0], [10.0, 0.0]])
    candidates = np.array([[0.1, 0.0], [9.9, 0.0], [5.0, 5.0]])
    p = tsds_probabilities(queries, candidates, alpha=1.0, C=1.0, knn=3, sigma=0.0)
    np.testing.assert_allclose(p, [0.5, 0.5, 0.0], atol=1e-12)


def test_tsds_scores_keep_the_probable_then_the_nearest() -> None:
    p = np.array([0.0, 0.5, 0.0, 0.3, 0.2])
    nearest = np.array([0.9, 0.1, 0.2, 0.1, 0.1])
    assert kept(tsds_scores(p, nearest, "top", np.random.default_rng(0)), 2) == {1, 3}
    assert kept(tsds_scores(p, nearest, "top", np.random.default_rng(0)), 4) == {1, 3, 4, 2}
    # a draw without replacement takes every candidate with p > 0 before any with p = 0
    assert kept(tsds_scores(p, nearest, "sample", np.random.default_rng(3)), 3) == {1, 3, 4}


# ---- NEAR ---------------------------------------------------------------------------------------
def test_near_scores_are_the_mean_cosine_to_the_nearest_targets() -> None:
    targets = np.array([[1.0, 0.0], [0.0, 2.0]])
    candidates = np.array([[1.0, 0.1], [-1.0, 0.0], [3.0, 3.0]])
    c = 1 / math.sqrt(1.01)
    np.testing.assert_allclose(near_scores(candidates, targets, 1), [c, 0.0, 1 / math.sqrt(2)], rtol=1e-12)
    np.testing.assert_allclose(near_scores(candidates, targets, 2), [(c + 0.1 * c) / 2, -0.5, 1 / math.sqrt(2)],
                               rtol=1e-12)
    np.testing.assert_allclose(near_scores(candidates, targets, 5), near_scores(candidates, targets, 2))


# ---- target sets --------------------------------------------------------------------------------
def test_target_sets_default_to_the_in_domain_sets_and_unknown_names_fail() -> None:
    sets = {"a": np.zeros((5, T)), "b": np.ones((2, T)), "ood:wiki": np.ones((3, T))}
    chosen = choose_target_sets(sets, [], 3)
    assert sorted(chosen) == ["a", "b"] and chosen["a"].shape == (3, T)
    assert sorted(choose_target_sets(sets, ["ood:wiki"], 3)) == ["ood:wiki"]
    with pytest.raises(ConfigError, match=r"schedule.target_sets: unknown held-out set 'c'; known: a, b, ood:wiki"):
        choose_target_sets(sets, ["c"], 3)
    with pytest.raises(ConfigError, match=r"schedule.target_sets: the run has no held-out sets"):
        choose_target_sets({}, [], 3)


def test_target_sets_take_sft_sets_in_their_own_form() -> None:
    sft = {"input_ids": np.ones((5, T), np.int32), "n_tokens": np.full(5, T), "loss_mask": np.ones((5, T), bool)}
    chosen = choose_target_sets({"add": sft}, [], 2)["add"]
    assert sorted(chosen) == ["input_ids", "loss_mask", "n_tokens"] and chosen["loss_mask"].shape == (2, T)


# ---- the scorers on a tiny model ----------------------------------------------------------------
@pytest.fixture(scope="module")
def worker_and_state():
    from d3ray.model import ModelConfig, build_model, model_config_dict
    from d3ray.schedule.scoring import ScoringWorker

    model_cfg = ModelConfig()
    model_config = model_config_dict(model_cfg, V, T, 0)
    torch.manual_seed(0)
    state = {k: v.detach().numpy().copy() for k, v in build_model(model_config, model_cfg).state_dict().items()}
    return ScoringWorker(model_config, model_cfg, micro_batch_size=4), state


def copies_and_noise(seed: int) -> tuple[dict[str, np.ndarray], GlobalBatch, set[int]]:
    """Target sets (4 + 2 sequences) and a batch of 12 candidates: 3 copies of target sequences at known
    rows, the rest random sequences."""
    rng = np.random.default_rng(seed)
    targets = {"x": rng.integers(1, V, (4, T)).astype(np.int32), "y": rng.integers(1, V, (2, T)).astype(np.int32)}
    ids = rng.integers(1, V, (12, T)).astype(np.int32)
    copies = {2: targets["x"][0], 7: targets["x"][3], 10: targets["y"][1]}
    for row, seq in copies.items():
        ids[row] = seq
    batch = GlobalBatch(input_ids=ids, n_tokens=np.full(12, T, dtype=np.int32),
                        sample_ids=tuple(f"s{i}" for i in range(12)), domains=("d",) * 12)
    return targets, batch, set(copies)


def test_less_keeps_the_candidates_aligned_with_the_target(worker_and_state) -> None:
    worker, state = worker_and_state
    targets, batch, copies = copies_and_noise(0)
    scorer = LessScorer(sketch=SjltSketchConfig(k=512, seed=1), param_filter=None, targets=[targets])
    plain = worker.score([state], [batch], scorer)
    assert kept(plain, 3) == copies
    # The optimizer part of the snapshot switches the Adam features on.
    rng = np.random.default_rng(1)
    adam = AdamWState(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, step=10,
                      exp_avg_sq={n: rng.random(v.shape).astype(np.float32) * 1e-4 for n, v in state.items()},
                      exp_avg={n: np.zeros(v.shape, np.float32) for n, v in state.items()})
    preconditioned = worker.score([state, adam], [batch], scorer)
    assert kept(preconditioned, 3) == copies
    assert not np.allclose(plain, preconditioned)


def test_less_identity_sketch_gives_a_copy_cosine_one_with_its_original(worker_and_state) -> None:
    worker, state = worker_and_state
    targets, batch, _ = copies_and_noise(2)
    one = {"x": targets["x"][:1]}  # a single target example: the score is the cosine with it
    scorer = LessScorer(sketch=IdentitySketchConfig(), param_filter=r"^transformer\.h\.1\.", targets=[one])
    scores = worker.score([state], [batch], scorer)
    assert scores[2] == pytest.approx(1.0, abs=1e-5) and np.all(np.delete(scores, 2) < 0.999)


def test_less_on_an_sft_target_scores_with_the_response_gradients(worker_and_state) -> None:
    worker, state = worker_and_state
    targets, batch, copies = copies_and_noise(6)
    mask = np.zeros((4, T), bool)
    mask[:, T // 2:] = True  # the second half of each target sequence is its "response"
    sft = {"x": {"input_ids": targets["x"], "n_tokens": np.full(4, T), "loss_mask": mask}}
    candidates = GlobalBatch(input_ids=batch.input_ids, n_tokens=batch.n_tokens, sample_ids=batch.sample_ids,
                             domains=batch.domains, loss_mask=np.tile(mask[:1], (12, 1)))
    scorer = LessScorer(sketch=IdentitySketchConfig(), param_filter=r"^transformer\.h\.1\.", targets=[sft])
    scores = worker.score([state], [candidates], scorer)
    assert kept(scores, 2) == copies - {10}  # rows 2 and 7 copy set x; row 10 copies set y, not a target here


@pytest.mark.parametrize("make", [
    lambda t: NearScorer(neighbours=1, targets=[t]),
    lambda t: TsdsScorer(alpha=0.9, C=1.0, knn=4, sigma=0.0, keep="top", seed=0, chunk_id=0, targets=[t]),
])
def test_embedding_selectors_keep_the_copies_of_target_sequences(worker_and_state, make) -> None:
    worker, state = worker_and_state
    targets, batch, copies = copies_and_noise(4)
    assert kept(worker.score([state], [batch], make(targets)), 3) == copies


def test_delta_loss_scorer_ranks_by_the_loss_drop_from_the_reference(worker_and_state, tmp_path) -> None:
    worker, state = worker_and_state
    _, batch, _ = copies_and_noise(5)
    reference = str(tmp_path / "initial_weights.npz")
    assert worker.save_weights([state], reference) and not worker.save_weights([state], reference)
    rng = np.random.default_rng(3)
    current = {k: v + 0.05 * rng.standard_normal(v.shape).astype(v.dtype) for k, v in state.items()}
    before = worker.losses([state], [batch])
    after = worker.losses([current], [batch])
    scorer = DeltaLossScorer(reference=reference, progress=0.0, width_fraction=0.25, steepness=10.0,
                             outside_weight=0.0, seed=0, chunk_id=0)
    scores = worker.score([current], [batch], scorer)
    assert kept(scores, 3) == set(np.argsort(-(before - after), kind="stable")[:3].tolist())


# ---- bad configs --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides, message",
    [
        (["--schedule.type=less", "--schedule.fraction=0"], r"schedule.fraction=0.0 must be in \(0, 1\]"),
        (["--schedule.type=tsds", "--schedule.fraction=1.2"], r"schedule.fraction=1.2 must be in \(0, 1\]"),
        (["--schedule.type=less", "--schedule.param_filter=h.("], r"schedule.param_filter='h.\(' is not a valid regex"),
        (["--schedule.type=near", "--schedule.reference=/no/such/model"],
         r"schedule.reference='/no/such/model' must be 'current' or an existing local Hugging Face model directory"),
        (["--schedule.type=tsds", "--schedule.reference=/no/such/model"], r"schedule.reference='/no/such/model'"),
        (["--schedule.type=delta_loss", "--schedule.reference=/no/such/model"],
         r"schedule.reference='/no/such/model' must be 'initial' or"),
        (["--schedule.type=delta_loss", "--schedule.window_fraction=0"], r"schedule.window_fraction=0.0 must be in"),
        (["--schedule.type=tsds", "--schedule.keep=all"], r"schedule.keep='all' must be 'sample' or 'top'"),
        (["--schedule.type=tsds", "--schedule.alpha=2"], r"schedule.alpha=2.0 must be in \[0, 1\]"),
        (["--schedule.type=near", "--schedule.target_sets=[a, a]"], r"schedule.target_sets=\['a', 'a'\] must be"),
        (["--schedule.type=near", "--schedule.neighbours=0"], r"schedule.neighbours=0 must be >= 1"),
    ],
)
def test_bad_selector_config_names_the_field(overrides, message) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(RunConfig, None, overrides)
