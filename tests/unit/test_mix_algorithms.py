"""The mixers' pure rules (no Ray): static proportions, ODM, DoReMi, RegMix, bad configs, resume."""

from __future__ import annotations

import math

import numpy as np
import pytest

from d3ray.config import RunConfig
from d3ray.config_loading import ConfigError, load_config
from d3ray.data.chunker import ChunkStream
from d3ray.data.config import DataConfig
from d3ray.data.sft import SftDataConfig
from d3ray.schedule.config import ScheduleConfig
from d3ray.schedule.mix.base import MixScheduler
from d3ray.schedule.mix.doremi import DoremiMixer, doremi_update, excess_losses
from d3ray.schedule.mix.odm import OdmMixer, chunk_rewards, exploration_rate, odm_policy, odm_step
from d3ray.schedule.mix.regmix import fit_and_choose, sample_mixtures
from d3ray.schedule.mix.static import RandomMixer
from d3ray.schedule.order.basic import RandomScheduler
from d3ray.schedule.scheduler import BuildContext, ChunkFeedback
from tests.fakes import make_source


def build_context(domains, seed=0):
    return BuildContext(seed=seed, model_config={}, model=None, run_name="t", run_dir="/tmp/mixt", batch_size=4,
                        total_chunks=10, domains=list(domains))


def schedule(*overrides):
    return load_config(RunConfig, None, list(overrides)).schedule


# ---- static -------------------------------------------------------------------------------------------
def test_static_mixer_long_draw_reproduces_its_proportions_within_binomial_bounds():
    domains = ("a", "b", "c")
    weights = {"a": 0.6, "b": 0.3, "c": 0.1}
    scheduler = schedule("--schedule.type=static", "--schedule.weights={a: 0.6, b: 0.3, c: 0.1}").build(
        build_context(domains))
    B, L, chunks = 4, 4, 150
    stream = ChunkStream(make_source(60, domains), B, L, seed=3, mixture_for_chunk=scheduler.mixture)
    drawn = []
    for chunk in stream:
        assert chunk.mixture == weights
        drawn += [d for batch in chunk.batches for d in batch.domains]
        if chunk.chunk_id + 1 == chunks:
            break
    n = len(drawn)
    for d, p in weights.items():
        sigma = math.sqrt(n * p * (1 - p))
        assert abs(drawn.count(d) - n * p) <= 4.5 * sigma, (d, drawn.count(d), n * p)
    assert stream.stats.domain_epochs["a"] > 0, "the small domains restart their epochs on such a long draw"


def test_random_mixer_is_a_pure_function_of_seed_and_period():
    mixer = RandomMixer(["a", "b", "c"], seed=1, update_every=3, concentration=1.0)
    assert mixer.decide(0) == mixer.decide(2) != mixer.decide(3)
    assert RandomMixer(["a", "b", "c"], seed=1, update_every=3, concentration=1.0).decide(4) == mixer.decide(5)
    assert abs(sum(mixer.decide(7).values()) - 1) < 1e-12


# ---- ODM -----------------------------------------------------------------------------------------------
def feedback(chunk_id, losses_by_domain, per_domain):
    """A chunk's feedback: ``per_domain[d]`` samples of domain d, each with loss ``losses_by_domain[d]``."""
    ids, domains, losses = [], [], []
    for d, count in per_domain.items():
        for i in range(count):
            ids.append(f"{d}:{chunk_id}:{i}")
            domains.append(d)
            losses.append(losses_by_domain[d])
    return ChunkFeedback(chunk_id, tuple(ids), tuple(domains), np.asarray(losses, dtype=np.float32))


def drive(scheduler, stream_of_losses, n=64):
    """Feed the scheduler chunk after chunk: each drawn in proportion to its own mixture."""
    history = []
    for c, losses in enumerate(stream_of_losses):
        mixture = scheduler.mixture(c)
        history.append(mixture)
        counts = {d: int(round(n * w)) for d, w in mixture.items()}
        scheduler.observe(feedback(c, losses, counts))
    return history


def test_odm_exploration_floor_and_uniform_start():
    assert exploration_rate(0, 4) == 0.25 and exploration_rate(1, 4) == 0.25
    assert math.isclose(exploration_rate(100, 4), math.sqrt(math.log(4) / 400))
    pi = odm_policy(np.array([50.0, 0.0, 0.0, 0.0]), 100)
    assert pi.min() >= exploration_rate(100, 4) - 1e-12 and math.isclose(pi.sum(), 1.0)
    assert np.allclose(odm_policy(np.zeros(3), 0), 1 / 3)


def test_odm_exploration_rate_at_hand_computed_steps_follows_the_papers_schedule():
    # ε_t = min(1/K, sqrt(ln K / (K·t))), ln 7 = 1.945910: K = 7 stays at 1/7 through t = 13
    # (ln 7 / 91 = 0.021384 > 1/49 = 0.020408) and leaves it at t = 14 (ln 7 / 98 = 0.019856).
    assert exploration_rate(0, 7) == exploration_rate(13, 7) == 1 / 7
    assert exploration_rate(14, 7) == pytest.approx(0.1409121, abs=1e-7)  # sqrt(1.945910 / 98)
    assert exploration_rate(17, 7) == pytest.approx(0.1278757, abs=1e-7)  # sqrt(1.945910 / 119)
    assert exploration_rate(8, 2) == pytest.approx(0.2081387, abs=1e-7)  # sqrt(0.693147 / 16)


def test_odm_step_counts_the_training_steps_of_a_chunks_first_batch_after_the_warmup():
    assert [odm_step(c, 8, 0) for c in range(3)] == [1, 9, 17]
    assert [odm_step(c, 8, 2) for c in range(5)] == [0, 0, 1, 9, 17]  # warmup chunks: t = 0, uniform
    mixer = OdmMixer(["a", "b"], alpha=0.9, warmup_chunks=1, reward_scale=1.0, L=4)
    assert mixer.record(3)["odm_t"] == 9 and mixer.record(3)["odm_epsilon"] == exploration_rate(9, 2)


def test_odm_seven_domains_at_L_8_leave_uniform_at_the_third_chunk_with_one_chunks_feedback():
    """K = 7 and L = 8, the shipped real-data config (200 steps): chunk 2 (steps 17 to 24, the first
    10%) is drawn at the paper's t = 17 after the feedback of chunk 0 (staleness 1). Counting chunk
    updates instead (t = 1), ε_t = 1/K and the mixture is exactly uniform, whatever the feedback."""
    domains = [f"d{i}" for i in range(7)]
    odm = MixScheduler(OdmMixer(domains, alpha=0.9, warmup_chunks=0, reward_scale=1.0, L=8),
                       RandomScheduler(0), "odm")
    uniform = {d: pytest.approx(1 / 7, abs=1e-12) for d in domains}
    assert odm.mixture(0) == uniform and odm.mixture(1) == uniform
    # Chunk 0, drawn uniformly: 10 sequences of each domain, domain d_i at loss 6 + i, so r̂_i = 6 + i and,
    # smoothed over the chunk's 8 steps, R̂_i = (1 − 0.9^8)·(6 + i) = 0.5695328·(6 + i). With ε_16 = 0.1318112
    # and ε_17 = 0.1278757: π_17(d_6) = (1 − 7·ε_17)·exp(ε_16·R̂_6) / Σ_j exp(ε_16·R̂_j) + ε_17
    # = 0.1048703 · 0.1769403 + 0.1278757 = 0.1464315.
    odm.observe(feedback(0, {d: 6.0 + i for i, d in enumerate(domains)}, {d: 10 for d in domains}))
    assert odm.mixer.rewards == pytest.approx([0.5695328 * (6 + i) for i in range(7)], abs=1e-6)
    mixture = odm.mixture(2)
    assert mixture["d6"] == pytest.approx(0.1464315, abs=1e-6)
    assert [mixture[d] for d in domains] == sorted(mixture.values())  # the higher the loss, the more weight
    assert sum(mixture.values()) == pytest.approx(1.0)


def test_odm_importance_weighted_reward_is_unbiased_for_the_domain_loss():
    # 1/4 of the chunk from a (drawn with p = 0.25), 3/4 from b (p = 0.75): both rewards equal the loss.
    fb = feedback(0, {"a": 2.0, "b": 3.0}, {"a": 16, "b": 48})
    r = chunk_rewards(["a", "b"], fb.domains, fb.losses, {"a": 0.25, "b": 0.75})
    assert np.allclose(r, [2.0, 3.0])


def test_odm_shifts_weight_to_the_domain_whose_loss_stays_high_away_from_the_one_falling_fastest():
    domains = ("a", "b", "c")
    odm = MixScheduler(OdmMixer(list(domains), alpha=0.5, warmup_chunks=0, reward_scale=1.0, L=1),
                       RandomScheduler(0), "odm")
    # a's loss falls fastest (6 → 1), b's slowly (6 → 4.5), c stays at 3: the reward is the loss (the paper),
    # so ODM moves towards what is still hard (b) and away from what was learned (a).
    stream = [{"a": 6.0 * 0.8 ** t + 1.0 * (1 - 0.8 ** t), "b": 6.0 - 0.05 * t, "c": 3.0} for t in range(30)]
    history = drive(odm, stream)
    assert history[0] == pytest.approx({d: 1 / 3 for d in domains})
    last = history[-1]
    assert last["b"] > last["c"] > last["a"]
    assert last["b"] > 1 / 3 + 0.03 and last["a"] < history[5]["a"] < 1 / 3


# ---- DoReMi --------------------------------------------------------------------------------------------
def test_doremi_update_follows_the_paper_formula():
    alpha = np.array([0.5, 0.25, 0.25])
    new = doremi_update(alpha, np.array([1.0, 0.0, 2.0]), eta=1.0, smoothing=0.1)
    raw = alpha * np.exp([1.0, 0.0, 2.0])
    assert np.allclose(new, 0.9 * raw / raw.sum() + 0.1 / 3)


def test_doremi_excess_is_clipped_per_sample_and_averaged_per_domain():
    lam = excess_losses(["a", "b"], ("a", "a", "b"), np.array([3.0, 1.0, 2.0]), np.array([2.0, 2.0, 2.5]))
    assert np.allclose(lam, [0.5, 0.0])


def test_doremi_up_weights_the_domain_with_the_largest_excess_loss():
    domains = ["a", "b", "c"]
    mixer = DoremiMixer(domains, eta=1.0, smoothing=1e-3)
    doremi = MixScheduler(mixer, RandomScheduler(0), "doremi")
    losses = {"a": 3.0, "b": 3.0, "c": 3.0}
    reference = {"a": 2.9, "b": 1.5, "c": 3.5}  # excess: a 0.1, b 1.5 (largest), c 0 (clipped)
    for c in range(6):
        mixture = doremi.mixture(c)
        fb = feedback(c, losses, {d: 10 for d in domains})
        mixer.set_reference(c, {s: reference[d] for s, d in zip(fb.sample_ids, fb.domains, strict=True)})
        doremi.observe(fb)
    final = doremi.mixture(6)
    assert final["b"] > 0.9 and final["b"] > final["a"] > final["c"]
    assert mixture["b"] < final["b"]


# ---- resume: a restored scheduler decides the same mixtures ----------------------------------------------
def test_mix_scheduler_restored_from_its_state_decides_like_the_uninterrupted_one():
    domains = ["a", "b"]

    def odm():
        return MixScheduler(OdmMixer(domains, 0.9, 1, 1.0, L=4), RandomScheduler(0), "odm")

    stream = [{"a": 5.0 - 0.1 * t, "b": 4.0} for t in range(12)]
    full = odm()
    uninterrupted, state = [], None
    for c in range(12):
        uninterrupted.append(full.mixture(c))  # staleness 1: chunk c is drawn after the feedback of chunk c - 2
        if c >= 1:
            m = full.mixture(c - 1)
            full.observe(feedback(c - 1, stream[c - 1], {d: int(64 * w) for d, w in m.items()}))
        if c == 5:  # checkpoint at next chunk 5: observed through 4, chunk 6 already drawn by the prefetch
            full.mixture(6)
            state = full.state_dict()
    resumed = odm()
    resumed.mixture(0)  # a fresh coordinator starts streaming before the checkpoint is restored
    resumed.load_state_dict(state)
    again = [resumed.mixture(5), resumed.mixture(6)]
    for c in range(7, 12):
        m = resumed.mixture(c - 2)
        resumed.observe(feedback(c - 2, stream[c - 2], {d: int(64 * w) for d, w in m.items()}))
        again.append(resumed.mixture(c))
    assert again == uninterrupted[5:]


# ---- RegMix --------------------------------------------------------------------------------------------
def planted_table(n, planted, seed=0, noise=0.002):
    x = sample_mixtures(n, len(planted), 1.0, seed)
    rng = np.random.default_rng(seed)
    y = 2.0 + 3.0 * ((x - planted) ** 2).sum(axis=1) + noise * rng.standard_normal(n)
    return [{"mixture": {d: float(w) for d, w in zip("abc", row, strict=True)}, "target": float(t)}
            for row, t in zip(x, y, strict=True)]


class Cfg:
    regressor, search_samples, top_k, concentration, ridge_alpha = "ridge", 20_000, 50, 1.0, 1e-4


@pytest.mark.parametrize("regressor,n,tol", [("ridge", 24, 0.05), ("lightgbm", 512, 0.12)])
def test_regmix_regression_recovers_a_planted_best_mixture(regressor, n, tol):
    planted = np.array([0.2, 0.5, 0.3])
    fit = fit_and_choose(planted_table(n, planted), list("abc"), regressor, 20_000, 50, 1.0, seed=1)
    chosen = np.array([fit["mixture"][d] for d in "abc"])
    assert np.abs(chosen - planted).max() < tol, fit
    assert fit["held_out_spearman"] > 0.8 and fit["held_out_r2"] > 0.5, fit


# ---- bad configuration ---------------------------------------------------------------------------------
@pytest.mark.parametrize("overrides,message", [
    (["--schedule.type=static", "--schedule.weights={a: 1.2, b: -0.2}"], r"schedule\.weights\.b: weight must be >= 0"),
    (["--schedule.type=static", "--schedule.weights={a: 0.5, b: 0.4}"], r"schedule\.weights: weights must sum to 1"),
    (["--schedule.type=odm", "--schedule.order.type=loss"], r"schedule\.order\.type='loss' is a select scheduler"),
    (["--schedule.type=doremi"], r"schedule\.reference=''.*give exactly one"),
    (["--schedule.type=regmix", "--schedule.proxy_runs=2"], r"schedule\.proxy_runs=2 must be >= 3"),
])
def test_mix_config_errors_name_the_field(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(RunConfig, None, overrides)


def two_domain_corpus(tmp_path, domains=("RedPajamaC4", "RedPajamaBook"), n=(30, 3)):
    import json

    path = tmp_path / "train"
    path.mkdir()
    lines = [json.dumps({"text": f"doc {d} {i}", "meta": {"redpajama_set_name": d}})
             for d, k in zip(domains, n, strict=True) for i in range(k)]
    (path / "part.jsonl").write_text("\n".join(lines) + "\n")
    from d3ray.data.shards import list_shards

    return list_shards([str(path)])


@pytest.mark.parametrize("overrides,message", [
    (["--schedule.type=static", "--schedule.weights={RedPajamaC4: 0.5, Nope: 0.5}"],
     r"schedule\.weights: unknown domain\(s\) \['Nope'\]"),
    (["--schedule.type=static", "--schedule.weights={RedPajamaC4: 0.5, RedPajamaGithub: 0.5}"],
     r"schedule\.weights\.RedPajamaGithub: .*the corpus has no records of it"),
    (["--schedule.type=odm", "--schedule.domains=[RedPajamaC4]"],
     r"schedule\.domains: a domain mixer needs a corpus of at least two domains"),
    (["--schedule.type=odm", "--schedule.domains=[RedPajamaC4, Nope]"], r"schedule\.domains: unknown domain"),
])
def test_mix_domains_errors_name_the_field(tmp_path, overrides, message):
    from d3ray.schedule.mix.domains import resolve_mix_domains

    cfg = load_config(RunConfig, None, overrides)
    with pytest.raises(ConfigError, match=message):
        resolve_mix_domains(cfg.schedule, cfg.data, two_domain_corpus(tmp_path))


def test_mixer_on_a_one_domain_corpus_is_an_error_naming_schedule_type(tmp_path):
    from d3ray.schedule.mix.domains import resolve_mix_domains

    shards = two_domain_corpus(tmp_path, domains=("RedPajamaC4",), n=(20,))
    with pytest.raises(ConfigError, match=r"schedule\.type: a domain mixer needs a corpus of at least two domains"):
        resolve_mix_domains(schedule("--schedule.type=odm"), DataConfig(), shards)
    # SFT (the task as the domain): a one-task set is the same error (tests/unit/test_sft_lanes.py: mixable sets)
    sft = tmp_path / "sft.jsonl"
    sft.write_text("".join(f'{{"prompt": "{i}+1=", "response": "{i + 1}", "task": "add1"}}\n' for i in range(4)))
    with pytest.raises(ConfigError, match=r"schedule\.type: a domain mixer needs a corpus of at least two domains; "
                                          r"this corpus has \['add1'\]"):
        resolve_mix_domains(schedule("--schedule.type=odm"), DataConfig(), [], SftDataConfig(paths=[str(sft)]))


def test_mix_domains_default_to_the_corpus_domains(tmp_path):
    from d3ray.schedule.mix.domains import resolve_mix_domains

    domains = resolve_mix_domains(schedule("--schedule.type=random_mix"), DataConfig(), two_domain_corpus(tmp_path))
    assert domains == ["RedPajamaBook", "RedPajamaC4"]


def test_every_mixer_is_registered_as_kind_mix_with_a_paper():
    from d3ray.schedule.config import known_of_kind
    from d3ray.schedule.scheduler import Kind

    assert set(known_of_kind(Kind.MIX)) == {"static", "random_mix", "doremi", "odm", "regmix"}
    assert all(ScheduleConfig.lookup(n).paper for n in known_of_kind(Kind.MIX))
