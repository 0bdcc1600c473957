"""NICE: the policy-gradient target on a hand-computed case, seeded sampling, the target on a tiny model
(the candidates that copy the rewarded responses win), the held-out SFT sets it reads, bad configs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from d3ray.config import RunConfig
from d3ray.config_loading import ConfigError, load_config
from d3ray.data.chunker import GlobalBatch
from d3ray.influence.config import IdentitySketchConfig
from d3ray.schedule.sampling import sample_responses
from d3ray.schedule.scheduler import BuildContext
from d3ray.schedule.select.base import top_k_decision
from d3ray.schedule.select.nice import (
    NiceScorer,
    example_seed,
    nice_directions,
    policy_gradient_feature,
    policy_gradient_weights,
    response_rows,
)

T = 48


# ---- the policy-gradient feature: a linear softmax policy ---------------------------------------
def token_mean_loss_gradient(W: torch.Tensor, x: torch.Tensor, response: list[int]) -> np.ndarray:
    """∇_W of the token-mean −log π(y_t | x) of a response under π = softmax(W x), by autograd."""
    W = W.clone().requires_grad_(True)
    log_p = torch.log_softmax(W @ x, dim=0)
    (-log_p[response].mean()).backward()
    return W.grad.numpy().ravel()


def test_policy_gradient_feature_on_a_linear_softmax_policy() -> None:
    # π = softmax(W x) with W = 0: p = (1/2, 1/2), and ∇_W −log π(y | x) = (p − e_y) xᵀ per token.
    W, x = torch.zeros(2, 2, dtype=torch.float64), torch.tensor([1.0, 2.0], dtype=torch.float64)
    responses, rewards = [[0], [1, 1], [0, 0]], np.array([1.0, 0.0, 1.0])
    phi = np.stack([token_mean_loss_gradient(W, x, y) for y in responses])  # (S, 4) token-mean gradients
    lengths = np.array([len(y) for y in responses])
    psi = policy_gradient_feature(phi, rewards, lengths)
    # (1/3)·[1·(p − e0) + 1·2·(p − e0)] xᵀ = (−1/2, 1/2)ᵀ (1, 2)
    np.testing.assert_allclose(psi, [-0.5, -1.0, 0.5, 1.0], rtol=1e-12)
    # ψ is −∇J for J = E[r] = p0 (reward 1 for y = 0): ∇J = p0 (e0 − p) xᵀ; a step θ − ηψ raises J.
    grad_j = (0.5 * np.outer([0.5, -0.5], [1.0, 2.0])).ravel()
    np.testing.assert_allclose(psi, -2 * grad_j, rtol=1e-12)
    # a reward-0 sample contributes nothing, whatever its gradient
    garbage = phi.copy()
    garbage[1] = 1e6
    np.testing.assert_array_equal(policy_gradient_feature(garbage, rewards, lengths), psi)
    # no rewarded sample: the zero feature
    assert not np.any(policy_gradient_feature(phi, np.zeros(3), lengths))


def test_policy_gradient_weights_with_the_mean_baseline() -> None:
    w = policy_gradient_weights(np.array([1.0, 0.0, 1.0]), np.array([1, 2, 2]), "mean")
    np.testing.assert_allclose(w, [1 / 9, -4 / 9, 2 / 9], rtol=1e-12)  # (r − 2/3)·n / 3
    assert not np.any(policy_gradient_weights(np.ones(4), np.arange(1, 5), "mean"))  # equal rewards: no signal
    with pytest.raises(ValueError, match="baseline 'max'"):
        policy_gradient_weights(np.ones(2), np.ones(2), "max")


def test_nice_directions_leave_out_zero_features_and_fail_without_any() -> None:
    a = np.array([[3.0, 4.0], [0.0, 0.0], [0.0, 2.0]])
    kept, directions = nice_directions({"a": a, "b": np.zeros((2, 2))})
    assert kept == ["a"]
    np.testing.assert_allclose(directions, [[0.3, 0.9]], rtol=1e-12)  # mean of (0.6, 0.8) and (0, 1)
    with pytest.raises(ValueError, match="no target example has a policy-gradient feature.*zero_reward=reference"):
        nice_directions({"a": np.zeros((3, 2))})


def test_response_rows_score_only_the_response() -> None:
    rows = response_rows(np.array([5, 6, 7]), [np.array([8, 2]), np.array([9])], eos_id=2)
    np.testing.assert_array_equal(rows["input_ids"], [[5, 6, 7, 8, 2], [5, 6, 7, 9, 2]])
    np.testing.assert_array_equal(rows["loss_mask"], [[0, 0, 0, 1, 1], [0, 0, 0, 1, 0]])
    np.testing.assert_array_equal(rows["n_tokens"], [5, 4])


def test_example_seeds_depend_on_seed_version_set_and_example() -> None:
    seeds = {example_seed(*args) for args in [(0, 0, "add", 0), (1, 0, "add", 0), (0, 1, "add", 0),
                                             (0, 0, "mul", 0), (0, 0, "add", 1)]}
    assert len(seeds) == 5 and example_seed(0, 0, "add", 0) == example_seed(0, 0, "add", 0)


# ---- the suite, its tokenizer, the held-out sets and a tiny model ------------------------------
@pytest.fixture(scope="module")
def suite_setup(tmp_path_factory):
    from d3ray.data.config import TokenizerConfig
    from d3ray.data.sft import SftDataConfig
    from d3ray.data.skills import generate_suite, write_sft_suite
    from d3ray.data.tokenizer import load_tokenizer, train_tokenizer_from_texts
    from d3ray.model import ModelConfig, build_model, model_config_dict
    from d3ray.run.prepare import sft_eval_sets
    from d3ray.schedule.scoring import ScoringWorker

    root = tmp_path_factory.mktemp("nice")
    suite = write_sft_suite(root / "suite", seed=2, train_per_skill=14, test_per_skill=7)
    texts = [t for r in generate_suite(2, 14, 7)["train"] for t in (r.prompt, r.response)]  # every digit and symbol
    tok_dir = train_tokenizer_from_texts(texts, TokenizerConfig(vocab_size=300, split_digits=True), root / "tok")
    tokenizer = load_tokenizer(tok_dir)
    sets = sft_eval_sets(SftDataConfig(paths=[str(suite / "train")], seq_len=T), [str(suite / "test")], tok_dir, 4)
    model_cfg = ModelConfig()
    model_config = model_config_dict(model_cfg, len(tokenizer), T, tokenizer.eos_token_id)
    torch.manual_seed(0)
    state = {k: v.detach().numpy().copy() for k, v in build_model(model_config, model_cfg).state_dict().items()}
    return ScoringWorker(model_config, model_cfg, micro_batch_size=4), state, tokenizer, str(tok_dir), sets


def test_sft_eval_sets_carry_each_rows_prompt_and_reference(suite_setup) -> None:
    _, _, tokenizer, _, sets = suite_setup
    assert sorted(sets) == ["add", "add1", "copy", "mul", "reverse", "sort", "word"]
    for data in sets.values():
        assert len(data["prompts"]) == len(data["references"]) == len(data["input_ids"]) == 4
        for i in range(4):
            mask, ids = data["loss_mask"][i], data["input_ids"][i]
            prompt_text = tokenizer.decode(ids[:np.argmax(mask)])
            response_text = tokenizer.decode(ids[mask][:-1])  # the response, without its EOS
            rendered = f"### user:\n{data['prompts'][i]}\n### assistant:\n"  # the plain template
            assert rendered.endswith(prompt_text) and response_text == data["references"][i]  # (prompts may be cut)


def test_sampling_is_seeded_and_greedy_matches_the_uncached_argmax(suite_setup) -> None:
    worker, state, tokenizer, _, sets = suite_setup
    worker._load([state])
    eos = tokenizer.eos_token_id
    prompt = sets["add"]["input_ids"][0][:np.argmax(sets["add"]["loss_mask"][0])].astype(np.int64)
    first = worker.sample_responses(prompt, 3, 6, 1.0, seed=11, eos_id=eos)
    again = worker.sample_responses(prompt, 3, 6, 1.0, seed=11, eos_id=eos)
    other = worker.sample_responses(prompt, 3, 6, 1.0, seed=12, eos_id=eos)
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other, strict=True))
    assert all(1 <= len(r) <= 6 and (r[-1] == eos or len(r) == 6) and eos not in r[:-1] for r in first)
    greedy = sample_responses(worker.model, prompt, 2, 5, 0.0, seed=0, eos_id=eos)
    ids = list(prompt)
    with torch.no_grad():  # argmax one token at a time over the whole sequence, no KV cache
        for _ in range(len(greedy[0])):
            ids.append(int(worker.model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    assert np.array_equal(greedy[0], ids[len(prompt):]) and np.array_equal(greedy[0], greedy[1])


def test_nice_keeps_the_candidates_that_copy_the_rewarded_responses(suite_setup) -> None:
    """A task the checker does not know is rewarded by its reference: examples 0 and 1 get the model's own
    greedy response as reference (reward 1), 2 and 3 one it never writes (reward 0). The candidates that
    train on the rewarded (prompt, response) pairs are kept; those copying the unrewarded targets are not."""
    worker, state, tokenizer, tok_dir, sets = suite_setup
    worker._load([state])
    eos = tokenizer.eos_token_id
    data = {k: np.array(v) for k, v in sets["add"].items()}
    prompts = [data["input_ids"][i][:np.argmax(data["loss_mask"][i])].astype(np.int64) for i in range(4)]
    greedy = [worker.sample_responses(p, 1, 8, 0.0, 0, eos)[0] for p in prompts]
    data["references"] = np.array([tokenizer.decode([t for t in greedy[0] if t != eos]),
                                   tokenizer.decode([t for t in greedy[1] if t != eos]), "never", "never"])
    targets = {"echo": data}
    scorer = NiceScorer(sketch=IdentitySketchConfig(), param_filter=r"^transformer\.h\.1\.", targets=[targets],
                        tokenizer_dir=tok_dir, seed=3, weights_version=0, samples=1, max_new_tokens=8,
                        temperature=0.0)
    target = scorer.target(worker)
    np.testing.assert_array_equal(target.rewards["echo"], [[1.0], [1.0], [0.0], [0.0]])
    rewarded = response_rows(prompts[0], [greedy[0]], eos), response_rows(prompts[1], [greedy[1]], eos)
    others = sets["mul"]
    width = T
    ids = np.full((8, width), eos, dtype=np.int32)
    mask = np.zeros((8, width), dtype=bool)
    n_tokens = np.zeros(8, dtype=np.int32)
    for row, r in enumerate(rewarded):
        n = int(r["n_tokens"][0])
        ids[row, :n], mask[row, :n], n_tokens[row] = r["input_ids"][0][:n], r["loss_mask"][0][:n], n
    for row, (src, i) in enumerate([(data, 2), (data, 3), (others, 0), (others, 1), (others, 2), (others, 3)], start=2):
        ids[row], mask[row], n_tokens[row] = src["input_ids"][i], src["loss_mask"][i], src["n_tokens"][i]
    batch = GlobalBatch(input_ids=ids, n_tokens=n_tokens, sample_ids=tuple(f"s{i}" for i in range(8)),
                        domains=("d",) * 8, loss_mask=mask)
    scores = worker.score([state], [batch], scorer)
    assert {i for b in top_k_decision(scores, 2, 1, {}).selection for i in b} == {0, 1}
    # with no rewarded example the target has no direction; the reference fallback gives it one
    nothing = {"echo": {**data, "references": np.array(["never"] * 4)}}
    with pytest.raises(ValueError, match="no target example has a policy-gradient feature"):
        dataclasses.replace(scorer, targets=[nothing]).target(worker)
    fallback = dataclasses.replace(scorer, targets=[nothing], zero_reward="reference").target(worker)
    assert fallback.kept_sets == ("echo",) and np.all(np.isfinite(fallback.directions))


def test_nice_target_is_a_function_of_seed_and_weights_version(suite_setup) -> None:
    """Sampled at temperature 1: the reference of each example is the first response its own seed
    (run seed 3, version 2, set, index) draws, so those draws are rewarded; another version draws others."""
    worker, state, tokenizer, tok_dir, sets = suite_setup
    worker._load([state])
    eos = tokenizer.eos_token_id
    data = {k: np.array(v) for k, v in sets["add"].items()}
    references = []
    for i in range(4):
        prompt = data["input_ids"][i][:np.argmax(data["loss_mask"][i])].astype(np.int64)
        first = worker.sample_responses(prompt, 2, 4, 1.0, example_seed(3, 2, "echo", i), eos)[0]
        references.append(tokenizer.decode([t for t in first if t != eos]))
    data["references"] = np.array(references)
    scorer = NiceScorer(sketch=IdentitySketchConfig(), param_filter=r"^transformer\.h\.1\.", targets=[{"echo": data}],
                        tokenizer_dir=tok_dir, seed=3, weights_version=2, samples=2, max_new_tokens=4,
                        temperature=1.0)
    a, b = scorer.target(worker), scorer.target(worker)
    assert np.all(a.rewards["echo"][:, 0] == 1.0)
    np.testing.assert_array_equal(a.directions, b.directions)
    np.testing.assert_array_equal(a.rewards["echo"], b.rewards["echo"])
    later = dataclasses.replace(scorer, weights_version=3, zero_reward="reference")
    assert not np.array_equal(later.target(worker).rewards["echo"], a.rewards["echo"])
    assert scorer.target_key() != later.target_key()


# ---- configs -------------------------------------------------------------------------------------
@pytest.mark.parametrize("overrides, message", [
    (["--schedule.reward=bleu"], r"schedule.reward='bleu' is not built; known: \['exact_match'\]"),
    (["--schedule.samples=0"], r"schedule.samples=0 must be >= 1"),
    (["--schedule.max_new_tokens=0"], r"schedule.max_new_tokens=0 must be >= 1"),
    (["--schedule.temperature=-1"], r"schedule.temperature=-1.0 must be >= 0"),
    (["--schedule.baseline=median"], r"schedule.baseline='median' must be one of"),
    (["--schedule.baseline=mean", "--schedule.samples=1"], r"schedule.baseline=mean needs schedule.samples >= 2"),
    (["--schedule.zero_reward=drop"], r"schedule.zero_reward='drop' must be one of"),
    (["--schedule.fraction=0"], r"schedule.fraction=0.0 must be in \(0, 1\]"),
])
def test_bad_nice_config_names_the_field(overrides, message) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(RunConfig, None, ["--schedule.type=nice", *overrides])


def test_nice_on_pre_training_targets_fails_when_built_naming_the_field() -> None:
    cfg = load_config(RunConfig, None, ["--schedule.type=nice"]).schedule
    assert cfg.kind == "select" and cfg.trainer_requests().snapshot is not None
    ctx = BuildContext(seed=0, model_config={}, model=None, run_name="t", run_dir="/tmp", batch_size=4,
                       total_chunks=2, tokenizer_dir="/tmp", eval_sets=[{"RedPajamaC4": np.zeros((3, T), np.int32)}])
    with pytest.raises(ConfigError, match=r"schedule.target_sets: NICE needs held-out SFT records .* 'RedPajamaC4'"):
        cfg.build(ctx)
