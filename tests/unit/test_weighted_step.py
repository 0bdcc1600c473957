"""The trainers' weighted step: ``micro_weights`` picks the right weights, and on a real tiny model a
zero weight removes a sample from training: the step of ``d3ray/train/loop.py`` (per-sequence losses →
``micro_weights`` → ``step_loss`` → backward → AdamW), its gradients and ``train_step`` itself, with
torch's AdamW behind the engine's three calls in place of DeepSpeed's."""

from __future__ import annotations

import math

import numpy as np
import torch

from d3ray.model import ModelConfig, build_model, model_config_dict
from d3ray.model.lm_loss import sequence_losses, step_loss
from d3ray.schedule.coordinator import DecidedChunk
from d3ray.schedule.scheduler import ChunkDecision, LossWeighting
from d3ray.train.loop import micro_weights

VOCAB, T = 64, 16


def decided(sample_weights=None, rule: LossWeighting | None = None) -> DecidedChunk:
    return DecidedChunk(chunk_id=0, epoch=0, batch_refs=(), sample_ids=(), domains=(), sample_weights=sample_weights,
                        loss_weighting=rule, skipped={}, decision=ChunkDecision(order=(0,)))


def test_micro_weights_take_the_positions_rows_or_the_rule_on_the_losses_else_none() -> None:
    losses = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float32)
    weights = ((1.0, 2.0, 3.0, 4.0, 5.0), (6.0, 7.0, 8.0, 9.0, 10.0))
    # position 1, rows 2..4 of the global batch (a rank's micro-batch)
    got = micro_weights(decided(sample_weights=weights), 1, slice(2, 5), losses)
    assert got.dtype == torch.float64 and got.device == losses.device
    np.testing.assert_array_equal(got.numpy(), [8.0, 9.0, 10.0])
    # the in-step rule on the micro-batch's losses 1, 2, 3: linupper, δ = 1 → w ∝ 1, e, e (mean 1)
    rule = LossWeighting("linupper", {"delta": 1.0, "temperature": 1.0})
    got = micro_weights(decided(rule=rule), 0, slice(0, 3), losses)
    np.testing.assert_allclose(got.numpy(), np.array([1.0, math.e, math.e]) * 3 / (1 + 2 * math.e), rtol=1e-12)
    assert micro_weights(decided(), 0, slice(0, 3), losses) is None


def _batch() -> tuple[torch.Tensor, list[str]]:
    """Four rows: two of domain a (token ids 0..31), two of domain b (ids 32..63)."""
    rng = np.random.default_rng(0)
    a = rng.integers(0, VOCAB // 2, (2, T))
    b = rng.integers(VOCAB // 2, VOCAB, (2, T))
    return torch.as_tensor(np.concatenate([a, b]), dtype=torch.int64), ["a", "a", "b", "b"]


def _model():
    torch.manual_seed(0)
    cfg = ModelConfig(preset="gpt2-tiny", attn_implementation="eager")
    return build_model(model_config_dict(cfg, VOCAB, T, 0), cfg)


def _loss_of(model, ids: torch.Tensor) -> float:
    with torch.no_grad():
        sums, counts = sequence_losses(model(input_ids=ids).logits, ids)
    return float(sums.sum() / counts.sum())


def test_weighted_step_zero_weighted_micro_batch_has_no_gradient_and_weights_scale_it() -> None:
    torch.set_num_threads(1)
    ids, _ = _batch()
    model = _model()

    def grads(rows: slice, weights: tuple[float, ...] | None) -> list[torch.Tensor]:
        chunk = decided(sample_weights=None if weights is None else (weights,))
        model.zero_grad(set_to_none=True)
        sums, counts = sequence_losses(model(input_ids=ids[rows]).logits, ids[rows])
        step_loss(sums, counts, micro_weights(chunk, 0, rows, (sums / counts).detach())).backward()
        return [p.grad.clone() for p in model.parameters()]

    # a micro-batch of domain b's rows (2, 3) under weights 0: every gradient is exactly zero
    assert all(torch.count_nonzero(g) == 0 for g in grads(slice(2, 4), (1.0, 1.0, 0.0, 0.0)))
    # weight 3 on row 0 (and 1 on row 1) is three times row 0's gradient plus row 1's, over 2
    g0, g1 = grads(slice(0, 1), None), grads(slice(1, 2), None)
    for g, a, b in zip(grads(slice(0, 2), (3.0, 1.0, 0.0, 0.0)), g0, g1, strict=True):
        torch.testing.assert_close(g, (3 * a + b) / 2, rtol=1e-4, atol=1e-7)


class TorchEngine:
    """What ``train_step`` asks of DeepSpeed's engine, on a plain torch model and AdamW (no weight decay,
    a step per micro-batch: DeepSpeed with gradient_accumulation_steps = 1)."""

    def __init__(self, model) -> None:
        self.module = model
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)

    def __call__(self, **inputs):
        return self.module(**inputs)

    def backward(self, loss) -> None:
        loss.backward()

    def step(self) -> None:
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def _global_batch(ids: torch.Tensor, domains: list[str]):
    from d3ray.data.chunker import GlobalBatch

    n = len(ids)
    return GlobalBatch(input_ids=ids.numpy().astype(np.int32), n_tokens=np.full(n, ids.shape[1]),
                       sample_ids=tuple(f"0/s:{i}:0" for i in range(n)), domains=tuple(domains))


def test_train_step_zero_weights_train_as_if_the_domain_were_not_in_the_batch() -> None:
    from functools import partial

    from d3ray.train.loop import train_step

    torch.set_num_threads(1)
    ids, domains = _batch()
    batch = _global_batch(ids, domains)
    zero_b = decided(sample_weights=((2.0, 2.0, 0.0, 0.0),))  # mean 1; domain b's rows weigh nothing

    def run(rows: slice, micro: int, chunk: DecidedChunk, on=batch, steps: int = 3):
        engine = TorchEngine(_model())
        stats = [train_step(engine, on, rows, micro, torch.device("cpu"), partial(micro_weights, chunk, 0))
                 for _ in range(steps)]
        return engine.module, stats

    weighted, _ = run(slice(0, 4), 4, zero_b)
    without_b, _ = run(slice(0, 2), 2, decided(), on=_global_batch(ids[:2], domains[:2]))
    unweighted, stats = run(slice(0, 4), 4, decided())
    for (name, p), q in zip(weighted.named_parameters(), without_b.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)
    b_rows = ids[2:]
    assert _loss_of(unweighted, b_rows) < _loss_of(weighted, b_rows) - 0.05
    assert stats[0].shape == (5,)  # the step loss, then each row's token-mean loss
    # rank 1 of 2 (rows 2..4 of the global batch): its weights are the global rows' (0, 0), so its step
    # changes nothing; rank 0's rows 0..2 (2, 2) do train
    start = dict(_model().named_parameters())
    rank1, stats1 = run(slice(2, 4), 2, zero_b, steps=1)
    assert float(stats1[0][0]) == 0.0
    assert all(torch.equal(p, start[n]) for n, p in rank1.named_parameters())
    rank0, _ = run(slice(0, 2), 2, zero_b, steps=1)
    assert not all(torch.equal(p, start[n]) for n, p in rank0.named_parameters())
