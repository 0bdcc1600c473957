"""InfluenceWorker as a plain object on a tiny GPT-2: exact values, weight loading, exclusion, splits."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
import transformers

from d3ray.influence import AdamWState
from d3ray.influence.config import IdentitySketchConfig, InfluenceConfig, SjltSketchConfig
from d3ray.influence.estimators import (
    FirstOrderConfig,
    FisherConfig,
    GnbConfig,
    HutchinsonConfig,
    LookaheadConfig,
)
from d3ray.influence.influence import influence_from_lookahead, influence_from_sketches
from d3ray.influence.worker import InfluenceWorker, sample_rows
from d3ray.model.lora import LoraConfig

MODEL = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=16).to_dict()
GAMMA = 0.05
EXACT = InfluenceConfig(
    estimator=FisherConfig(), sketch=IdentitySketchConfig(), control_variate=False, dtype="float64", device="cpu",
    gamma=GAMMA, preconditioner="none", sample_fraction=1.0,
)



def _batches(n: int = 3, b: int = 3, T: int = 12, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 64, size=(b, T)) for _ in range(n)]


def _reference_model(seed: int = 0) -> tuple[torch.nn.Module, dict[str, np.ndarray]]:
    """An independently built float64 GPT-2 and its float32 state dict (what a trainer publishes)."""
    torch.manual_seed(seed)
    cfg = transformers.AutoConfig.for_model(**MODEL)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").double().eval()
    weights = {k: v.detach().float().cpu().numpy() for k, v in model.state_dict().items()}
    model.load_state_dict({k: torch.from_numpy(v).double() for k, v in weights.items()})
    return model, weights


def _lm_loss(model: torch.nn.Module, ids: np.ndarray) -> torch.Tensor:
    """Mean next-token cross-entropy written out (transformers' own loss upcasts only to float32)."""
    x = torch.from_numpy(ids)
    logits = model(x).logits  # (b, T, V)
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1)
    )


def _hf_grad(model: torch.nn.Module, ids: np.ndarray) -> torch.Tensor:
    """Flat gradient of the causal-LM loss of the transformers model (labels = ids)."""
    model.zero_grad()
    _lm_loss(model, ids).backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()]).clone()


def test_worker_fisher_identity_matches_independent_transformers_computation():
    model, weights = _reference_model()
    batches = _batches()
    g = [_hf_grad(model, b) for b in batches]
    # Empirical Fisher: (1/b) Σ_n T_n ∇ℓ_n², T_n = 11 scored tokens per sequence.
    h = [sum(11 * _hf_grad(model, b[n : n + 1]) ** 2 for n in range(3)) / 3 for b in batches]
    A_expected = np.array(
        [
            [float(-GAMMA * g[i] @ g[j] + 0.5 * GAMMA**2 * (g[i] ** 2) @ h[j]) for j in range(3)]
            for i in range(3)
        ]
    )

    parts = InfluenceWorker(MODEL, EXACT).sketch_batches([weights], batches, [0, 1, 2])
    A, S, excluded = influence_from_sketches([parts], [0, 1, 2])

    np.testing.assert_allclose(A, A_expected, rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(S, A_expected.T - A_expected, rtol=1e-7, atol=1e-15)
    assert excluded == [] and np.any(S != 0)


@pytest.mark.parametrize("lora", [None, LoraConfig(r=2)])
def test_worker_logits_skip_the_last_position_and_equal_the_full_forwards(lora):
    """The LM head runs on positions 0..T−2 only (``logits_to_keep``), also through the LoRA wrapper;
    the logits equal the full forward's, shifted."""
    worker = InfluenceWorker(MODEL, replace(EXACT, sample_fraction=1.0), lora=lora)
    x = torch.from_numpy(_batches(1)[0])
    params = {n: p.detach() for n, p in worker.model.named_parameters() if n in worker.names}
    assert worker._keeps_logits
    logits = worker._logits(params, x)
    full = worker.model(x).logits[:, :-1]
    assert logits.shape == (3, 11, 64) and logits.is_contiguous()
    torch.testing.assert_close(logits, full, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("preconditioner", ["none", "adam"])
def test_worker_control_variate_with_identity_sketch_leaves_a_unchanged(preconditioner):
    _, weights = _reference_model()
    batches = _batches()
    config = replace(EXACT, estimator=GnbConfig(), preconditioner=preconditioner)
    state = AdamWState(  # a state whose drift (momentum, decay) and preconditioner are far from trivial
        lr=0.01, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, step=4, max_grad_norm=1.0,
        exp_avg={k: np.full(v.shape, 0.01) for k, v in weights.items() if k != "lm_head.weight"},
        exp_avg_sq={k: np.full(v.shape, 1e-4) for k, v in weights.items() if k != "lm_head.weight"},
    )
    snapshot = [weights, state]
    plain = InfluenceWorker(MODEL, config).sketch_batches(snapshot, batches, [0, 1, 2])
    with_cv = InfluenceWorker(MODEL, replace(config, control_variate=True)).sketch_batches(snapshot, batches, [0, 1, 2])

    A_plain, S_plain, _ = influence_from_sketches([plain], [0, 1, 2])
    A_cv, S_cv, _ = influence_from_sketches([with_cv], [0, 1, 2])

    assert with_cv.G.shape[1] == plain.G.shape[1] + 3
    np.testing.assert_allclose(A_cv, A_plain, rtol=1e-10, atol=1e-16)
    np.testing.assert_allclose(S_cv, S_plain, rtol=1e-8, atol=1e-16)


def test_worker_bf16_state_without_lm_head_loads_like_rounded_float32():
    _, weights = _reference_model()
    bf16 = {k: torch.from_numpy(v).to(torch.bfloat16) for k, v in weights.items() if k != "lm_head.weight"}
    rounded = {k: v.float().numpy() for k, v in bf16.items()}
    config = replace(EXACT, estimator=FirstOrderConfig(), dtype="float32")

    a = InfluenceWorker(MODEL, config).sketch_batches(bf16, _batches(), [0, 1, 2])
    b = InfluenceWorker(MODEL, config).sketch_batches(rounded, _batches(), [0, 1, 2])

    np.testing.assert_array_equal(a.G, b.G)
    np.testing.assert_array_equal(a.losses, b.losses)
    assert np.all(np.isfinite(a.losses))


def _trained_snapshot(dtype: str, steps: int = 3) -> list:
    """The parts a trainer publishes (d3ray.train.scheduling.snapshot) after ``steps`` real torch AdamW steps on
    random batches: weights and an optimizer state whose m, v are the optimizer's own, in ``dtype``."""
    from d3ray.train.scheduling.snapshot import ship_optimizer_state, ship_state

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.for_model(**MODEL), attn_implementation="eager")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    for ids in _batches(n=steps, b=4, seed=7):
        x = torch.from_numpy(ids)
        opt.zero_grad()
        model(input_ids=x, labels=x).loss.backward()
        opt.step()
    state = AdamWState.from_torch(opt, model.named_parameters(), max_grad_norm=1.0)
    return [ship_state(model.state_dict(), dtype), ship_optimizer_state(state, dtype)]


def _widened(parts: list) -> list:
    """A float32 numpy snapshot holding exactly the values of a bfloat16 one (widening is exact)."""
    weights, state = parts
    wide = {k: v.float().numpy() for k, v in weights.items()}
    return [wide, replace(state, exp_avg={n: m.float().numpy() for n, m in state.exp_avg.items()},
                          exp_avg_sq={n: v.float().numpy() for n, v in state.exp_avg_sq.items()})]


#: bfloat16's machine epsilon (8 significant bits): one rounding moves a value by at most half of it.
BF16_EPS = 2.0**-8


def test_worker_bf16_snapshot_round_trips_and_sketches_close_to_float32():
    """A bfloat16 snapshot (weights and AdamW m, v, as d3 runs ship them by default) through the
    default influence config: (1) its only effect is the rounding, since it sketches bit for bit like a
    float32 snapshot of the same rounded values; (2) the potential f and S stay within 2·eps (bf16's
    machine epsilon, 2^-8 ≈ 0.4%) of the float32 snapshot's, relative Frobenius error. Why that tolerance:
    each shipped value is rounded once, by at most eps/2 relative; f_i = ⟨g_i, w⟩ and S are smooth
    functions of the weights and of m, v (sums and products of a few rounded factors), so their
    relative error is a small multiple of eps/2 (measured ~eps/2 here); a wrong cast, lost moments or
    weights left unloaded give errors of order 1."""
    config = InfluenceConfig(device="cpu")  # the defaults: drift (the exact potential alone), adam
    batches, ids = _batches(n=6, b=8, seed=3), list(range(6))
    fp32, bf16 = _trained_snapshot("float32"), _trained_snapshot("bfloat16")
    assert all(v.dtype == torch.bfloat16 for v in bf16[0].values())
    assert all(m.dtype == torch.bfloat16 for m in [*bf16[1].exp_avg.values(), *bf16[1].exp_avg_sq.values()])

    a = InfluenceWorker(MODEL, config).sketch_batches(fp32, batches, ids)
    b = InfluenceWorker(MODEL, config).sketch_batches(bf16, batches, ids)
    exact = InfluenceWorker(MODEL, config).sketch_batches(_widened(bf16), batches, ids)

    for rows in ("G", "U", "Q", "losses", "potential"):
        np.testing.assert_array_equal(getattr(b, rows), getattr(exact, rows))
    S32, S16 = influence_from_sketches([a], ids)[1], influence_from_sketches([b], ids)[1]
    for name, x, ref in (("potential", b.potential, a.potential), ("S", S16, S32)):
        error = np.linalg.norm(x - ref) / np.linalg.norm(ref)
        assert 0 < error <= 2 * BF16_EPS, f"{name}: relative error {error:.2e} of the bfloat16 snapshot"


def test_worker_fp16_module_prefixed_state_loads():
    _, weights = _reference_model()
    fp16 = {f"module.{k}": v.astype(np.float16) for k, v in weights.items()}
    worker = InfluenceWorker(MODEL, replace(EXACT, estimator=FirstOrderConfig()))

    worker.load_weights(fp16)

    wte = worker.model.state_dict()["transformer.wte.weight"].numpy()
    np.testing.assert_array_equal(
        wte, weights["transformer.wte.weight"].astype(np.float16).astype(np.float64)
    )


def test_worker_missing_or_unknown_weight_raises():
    _, weights = _reference_model()
    worker = InfluenceWorker(MODEL, EXACT)
    missing = {k: v for k, v in weights.items() if k != "transformer.h.0.mlp.c_fc.weight"}

    with pytest.raises(ValueError, match="lack 'transformer.h.0.mlp.c_fc.weight'"):
        worker.load_weights(missing)
    with pytest.raises(ValueError, match="keys the model does not"):
        worker.load_weights({**weights, "transformer.h.9.attn.c_attn.weight": weights["lm_head.weight"]})


def test_worker_batch_without_scored_tokens_is_excluded_and_others_unchanged():
    _, weights = _reference_model()
    batches = _batches()
    bad = (batches[1], np.full_like(batches[1], -100))
    worker = InfluenceWorker(MODEL, replace(EXACT, estimator=HutchinsonConfig()))

    clean = worker.sketch_batches(weights, batches, [0, 1, 2])
    mixed = worker.sketch_batches(weights, [batches[0], bad, batches[2]], [0, 1, 2])
    A, S, excluded = influence_from_sketches([mixed], [0, 1, 2])

    assert mixed.excluded == [1] and excluded == [1]
    assert np.all(mixed.H[1] == 0) and np.all(S[1] == 0) and np.all(S[:, 1] == 0)
    np.testing.assert_array_equal(mixed.Q[[0, 2]], clean.Q[[0, 2]])
    np.testing.assert_array_equal(mixed.H[[0, 2]], clean.H[[0, 2]])


def test_worker_rows_do_not_depend_on_how_the_chunk_is_split():
    _, weights = _reference_model()
    batches = _batches(n=4)
    config = replace(
        EXACT, estimator=HutchinsonConfig(), sketch=SjltSketchConfig(k=32, seed=3), control_variate=True
    )
    worker = InfluenceWorker(MODEL, config)
    reference = worker.sketch_batches(weights, _batches(n=2, seed=9), [100, 101], return_means=True).means

    whole = worker.sketch_batches(weights, batches, [0, 1, 2, 3], reference=reference)
    other = InfluenceWorker(MODEL, config)
    parts = [
        other.sketch_batches(weights, batches[2:], [2, 3], reference=reference),
        worker.sketch_batches(weights, batches[:2], [0, 1], reference=reference),
    ]
    A_whole, S_whole, _ = influence_from_sketches([whole], [0, 1, 2, 3])
    A_parts, S_parts, _ = influence_from_sketches(parts, [0, 1, 2, 3])

    np.testing.assert_allclose(A_parts, A_whole, rtol=1e-12, atol=1e-18)
    np.testing.assert_allclose(S_parts, S_whole, rtol=1e-12, atol=1e-18)


def test_worker_self_referenced_parts_refuse_to_merge():
    _, weights = _reference_model()
    batches = _batches(n=4)
    worker = InfluenceWorker(
        MODEL, replace(EXACT, estimator=GnbConfig(), sketch=SjltSketchConfig(k=16), control_variate=True)
    )
    parts = [
        worker.sketch_batches(weights, batches[:2], [0, 1]),
        worker.sketch_batches(weights, batches[2:], [2, 3]),
    ]

    with pytest.raises(ValueError, match="different sketches"):
        influence_from_sketches(parts, [0, 1, 2, 3])


def test_worker_param_filter_and_sample_fraction_restrict_the_statistics():
    model, weights = _reference_model()
    batches = _batches(b=4)
    config = replace(EXACT, estimator=FirstOrderConfig(), param_filter=r"h\.0\.mlp\.c_proj", sample_fraction=0.5)

    out = InfluenceWorker(MODEL, config).sketch_batches(weights, batches, [7, 8, 9])

    proj = model.transformer.h[0].mlp.c_proj
    assert out.G.shape == (3, proj.weight.numel() + proj.bias.numel())
    rows = sample_rows(4, 0.5, 0, 8)
    model.zero_grad()
    loss = _lm_loss(model, batches[1][rows])
    loss.backward()
    assert len(rows) == 2
    assert out.losses[1] == pytest.approx(float(loss.detach()), rel=1e-12)
    np.testing.assert_allclose(
        out.G[1], torch.cat([proj.weight.grad.reshape(-1), proj.bias.grad]).numpy(), rtol=1e-10
    )


def test_worker_lookahead_rows_match_a_manual_step_and_split_by_rows():
    model, weights = _reference_model()
    batches = _batches()
    worker = InfluenceWorker(MODEL, replace(EXACT, estimator=LookaheadConfig()))

    full = worker.lookahead_matrix(weights, batches, [0, 1, 2], gamma=GAMMA)
    split = [
        worker.lookahead_matrix(weights, batches, [0, 1, 2], gamma=GAMMA, rows=[2]),
        worker.lookahead_matrix(weights, batches, [0, 1, 2], gamma=GAMMA, rows=[0, 1]),
    ]

    g0 = _hf_grad(model, batches[0])
    with torch.no_grad():
        before = _lm_loss(model, batches[2])
        at = 0
        for p in model.parameters():
            p -= GAMMA * g0[at : at + p.numel()].reshape(p.shape)
            at += p.numel()
        after = _lm_loss(model, batches[2])
    assert full.A_rows[0, 2] == pytest.approx(float(after - before), rel=1e-9)
    A_full, S_full, _ = influence_from_lookahead([full], [0, 1, 2])
    A_split, S_split, _ = influence_from_lookahead(split, [0, 1, 2])
    np.testing.assert_array_equal(A_split, A_full)
    np.testing.assert_array_equal(S_full, -S_full.T)


def test_worker_sketch_batches_rejects_lookahead_estimator():
    worker = InfluenceWorker(MODEL, replace(EXACT, estimator=LookaheadConfig()))

    with pytest.raises(ValueError, match="lookahead_matrix"):
        worker.sketch_batches({}, _batches(), [0, 1, 2])
