"""The AdamW step of the influence path against torch's AdamW; the plain step against the numbers the
code gave before the estimator registry; bad optimizer states fail before any work."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

from d3ray.influence import AdamWState, EstimatorConfig, InfluenceConfig, SjltSketchConfig
from d3ray.influence.chunk import sketch_chunk
from d3ray.influence.optimizer import adamw_direction
from d3ray.influence.worker import InfluenceWorker

GOLDEN = Path(__file__).parent / "data" / "influence_before_registry.npz"
MODEL = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=16).to_dict()


def test_adamw_direction_is_the_step_torch_adamw_takes():
    rng = np.random.default_rng(0)
    theta = torch.tensor(rng.normal(size=(3, 4)))
    grad = torch.tensor(rng.normal(size=(3, 4)))
    m0, v0 = rng.normal(size=(3, 4)) * 0.1, rng.random(size=(3, 4)) * 0.01
    state = AdamWState(lr=0.01, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.2, step=5,
                       exp_avg={"w": m0}, exp_avg_sq={"w": v0})
    # torch's AdamW, put into the same state and stepped once with the same gradient
    p = torch.nn.Parameter(theta.clone())
    opt = torch.optim.AdamW([p], lr=0.01, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.2)
    p.grad = grad.clone()
    opt.step()  # creates the state; overwrite it with ours and redo the step from θ
    with torch.no_grad():
        p.copy_(theta)
    opt.state[p].update(step=torch.tensor(5.0), exp_avg=torch.tensor(m0), exp_avg_sq=torch.tensor(v0))
    opt.step()

    u = adamw_direction({"w": theta}, {"w": grad}, state, state.tensors(["w"], torch.device("cpu"), torch.float64))

    torch.testing.assert_close(theta - state.lr * u["w"], p.detach(), rtol=1e-14, atol=1e-16)


def test_plain_step_reproduces_the_numbers_from_before_the_registry():
    """S and A of every estimator (and the look-ahead A) as the code computed them before the estimator
    registry and the preconditioner existed (tests/unit/data/influence_before_registry.npz, written by
    that code at commit 54e2363 with one torch thread, as tests/conftest.py runs every test), from the
    same weights, batches and seeds: to float64 rounding. Bit for bit holds only on one machine and
    install: the same install (transformers 5.24.0, numpy 2.4.6, torch 2.13.0) on two machines of this
    workplace sums in two orders (2026-12-02, both seen: the golden rewritten on one by
    tests/unit/data/write_influence_before_registry.py failed on the other by 8.9e-16 on the look-ahead A
    and <= 1.4e-17 on the sketches, for the old code and the new alike). The bounds: 16 float64 ulps
    of the compared values, and for the look-ahead 16 ulps of the loss (about ln 64) divided by gamma;
    any change of the method moves these numbers by orders of magnitude more."""
    golden = np.load(GOLDEN)
    model = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=32).to_dict()
    weights = {k[len("weights/"):]: golden[k] for k in golden.files if k.startswith("weights/")}
    batches, ids = list(golden["batches"]), list(range(6))
    base = {"dtype": "float64", "device": "cpu", "gamma": 0.01, "sketch": SjltSketchConfig(k=64, seed=3),
            "preconditioner": "none"}

    look = InfluenceConfig(estimator=EstimatorConfig.lookup("lookahead")(), sample_fraction=1.0, **base)
    A_look = look.estimator.merge([InfluenceWorker(model, look).lookahead_matrix(weights, batches, ids)], ids)[0]
    eps = np.finfo(np.float64).eps
    np.testing.assert_allclose(A_look, golden["lookahead_A"], rtol=0, atol=16 * eps * np.log(64) / base["gamma"])
    for name in ("first_order", "fisher", "gnb", "hutchinson"):
        for cv in (True, False):
            config = InfluenceConfig(
                estimator=EstimatorConfig.lookup(name)(), control_variate=cv, sample_fraction=0.75, seed=5, **base
            )
            part = InfluenceWorker(model, config).sketch_batches(weights, batches, ids)
            A, S, _ = config.estimator.merge([part], ids)
            for got, key in ((A, f"{name}_cv{int(cv)}_A"), (S, f"{name}_cv{int(cv)}_S")):
                np.testing.assert_allclose(got, golden[key], rtol=0, atol=16 * eps * np.abs(golden[key]).max(),
                                           err_msg=key)


@pytest.fixture(scope="module")
def worker_and_weights():
    worker = InfluenceWorker(MODEL, InfluenceConfig(preconditioner="adam", dtype="float64", device="cpu"))
    weights = {k: v.detach().float().numpy() for k, v in worker.model.state_dict().items()}
    shapes = {n: tuple(p.shape) for n, p in worker.model.named_parameters()}
    return worker, weights, shapes


def _state(shapes: dict[str, tuple]) -> AdamWState:
    return AdamWState.fresh(shapes, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def _batches() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.integers(0, 64, size=(2, 8)) for _ in range(2)]


def test_adam_without_optimizer_state_fails_before_computing(worker_and_weights):
    worker, weights, _ = worker_and_weights
    never = iter(())  # statistics would raise StopIteration if anything were computed

    with pytest.raises(ValueError, match="needs the optimizer state"):
        worker.sketch_batches(weights, _batches(), [0, 1])
    with pytest.raises(ValueError, match="needs the optimizer state"):
        sketch_chunk(never, [0, 1], worker.leaves(), worker.config, worker.sketch)


def test_optimizer_state_of_the_wrong_shape_names_the_parameter(worker_and_weights):
    worker, weights, shapes = worker_and_weights
    name = "transformer.h.0.mlp.c_fc.weight"
    wrong = dict(shapes, **{name: (3, 3)})

    with pytest.raises(ValueError, match=rf"{name}.*\(3, 3\).*\(16, 64\)"):
        worker.sketch_batches([weights, _state(wrong)], _batches(), [0, 1])


def test_optimizer_state_missing_a_parameter_names_it(worker_and_weights):
    worker, weights, shapes = worker_and_weights
    partial = {n: s for n, s in shapes.items() if n != "transformer.wte.weight"}

    with pytest.raises(ValueError, match=r"lacks 1 parameter.*transformer\.wte\.weight"):
        worker.lookahead_matrix([weights, _state(partial)], _batches(), [0, 1])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"lr": 0.0}, "lr"),
        ({"betas": (0.9, 1.0)}, "betas"),
        ({"eps": 0.0}, "eps"),
        ({"step": -1}, "step"),
        ({"exp_avg_sq": {"w": np.zeros(3)}}, r"exp_avg \(2,\) but exp_avg_sq \(3,\)"),
        ({"exp_avg_sq": {"v": np.zeros(2)}}, "name different parameters"),
    ],
)
def test_adamw_state_bad_value_raises_naming_it(kwargs, match):
    fields = {"lr": 1e-3, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.0, "step": 1,
              "exp_avg": {"w": np.zeros(2)}, "exp_avg_sq": {"w": np.zeros(2)}}
    with pytest.raises(ValueError, match=match):
        AdamWState(**{**fields, **kwargs})


def _bf16_state(**overrides) -> AdamWState:
    """A state as a 16-bit snapshot ships it: m and v bfloat16 torch tensors (d3ray.train.scheduling.snapshot)."""
    rng = np.random.default_rng(4)
    m = torch.tensor(rng.normal(size=(3, 4)) * 1e-2).bfloat16()
    v = torch.tensor(rng.random(size=(3, 4)) * 1e-6).bfloat16()  # E[g²]: far below float16's range
    fields = {"lr": 1e-3, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1, "step": 7,
              "exp_avg": {"w": m}, "exp_avg_sq": {"w": v}}
    return AdamWState(**{**fields, **overrides})


def test_adamw_state_with_bf16_tensors_widens_to_the_compute_dtype_and_steps_like_float32():
    state = _bf16_state()
    wide = AdamWState(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, step=7,
                      exp_avg={"w": state.exp_avg["w"].double().numpy()},
                      exp_avg_sq={"w": state.exp_avg_sq["w"].double().numpy()})
    m, v = state.tensors(["w"], torch.device("cpu"), torch.float64)

    assert m["w"].dtype == v["w"].dtype == torch.float64 and bool((v["w"] > 0).all())
    assert torch.equal(v["w"], torch.from_numpy(wide.exp_avg_sq["w"]))  # widening is exact
    v["w"].zero_()  # a copy: the shipped state is reused for every batch of the chunk
    assert bool((state.exp_avg_sq["w"] > 0).all())
    theta, grad = torch.ones(3, 4, dtype=torch.float64), torch.full((3, 4), 1e-3, dtype=torch.float64)
    moments = state.tensors(["w"], torch.device("cpu"), torch.float64)
    u16 = adamw_direction({"w": theta}, {"w": grad}, state, moments)
    u32 = adamw_direction({"w": theta}, {"w": grad}, wide, wide.tensors(["w"], torch.device("cpu"), torch.float64))
    assert torch.equal(u16["w"], u32["w"])
    state.check_covers({"w": (3, 4)})


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"exp_avg_sq": {"w": torch.zeros(3, 5, dtype=torch.bfloat16)}}, r"exp_avg \(3, 4\) but exp_avg_sq \(3, 5\)"),
        ({"exp_avg": {"w": torch.zeros(3, 4, dtype=torch.int16)}}, "exp_avg of 'w' must be a floating-point"),
        ({"exp_avg_sq": {"w": np.zeros((3, 4), dtype=np.int64)}}, "exp_avg_sq of 'w' must be a floating-point"),
    ],
)
def test_adamw_state_with_bf16_tensors_still_validates(overrides, match):
    with pytest.raises(ValueError, match=match):
        _bf16_state(**overrides)
