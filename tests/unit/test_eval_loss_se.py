"""The eval's own standard error (``eval/<set>/loss_se``): sequences are the sampling unit."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from d3ray.train.evaluation import evaluate
from d3ray.train.trainer_rank import TrainerRank


def one_rank(model) -> TrainerRank:
    """A module scored as the one rank of one (every row of every set is its own)."""
    return TrainerRank(model, rank=0, world=1, zero_stage=0)


class BigramLM(torch.nn.Module):
    """Logits from the current token only: a deterministic stand-in for the engine."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.table = torch.nn.Embedding(vocab, vocab)

    def forward(self, input_ids):
        return SimpleNamespace(logits=self.table(input_ids))


def per_sequence(model, ids, mask=None):
    """(loss sums, target counts) per sequence, computed directly."""
    logits = model(torch.as_tensor(ids, dtype=torch.long)).logits[:, :-1]
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.as_tensor(ids[:, 1:], dtype=torch.long).reshape(-1),
                         reduction="none").view(len(ids), -1).double().detach().numpy()
    valid = np.ones_like(ce) if mask is None else mask[:, 1:].astype(np.float64)
    return (ce * valid).sum(1), valid.sum(1)


def test_loss_se_full_sequences_is_std_of_sequence_means_over_sqrt_n():
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 16, size=(10, 12)).astype(np.int32)
    model = BigramLM(16)
    out = evaluate(one_rank(model), {"a": ids, "b": ids[:5]}, micro_batch_size=3, device=torch.device("cpu"))
    sums, counts = per_sequence(model, ids)
    means = sums / counts  # every sequence has T - 1 targets: the ratio's se is the plain se of the means
    assert out["eval/a/loss"] == pytest.approx(means.mean(), rel=1e-6)
    assert out["eval/a/loss_se"] == pytest.approx(means.std(ddof=1) / math.sqrt(len(means)), rel=1e-5)
    se_b = per_sequence(model, ids[:5])
    se_b = (se_b[0] / se_b[1]).std(ddof=1) / math.sqrt(5)
    assert out["eval/mean_loss_se"] == pytest.approx(math.sqrt(out["eval/a/loss_se"] ** 2 + se_b ** 2) / 2, rel=1e-5)


def test_loss_se_masked_rows_use_the_ratio_estimator():
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 16, size=(7, 10)).astype(np.int32)
    mask = np.zeros((7, 10), dtype=bool)
    for i, start in enumerate([2, 3, 5, 6, 4, 8, 1]):  # response-only loss: different counts per row
        mask[i, start:] = True
    n_tokens = np.full(7, 10, dtype=np.int32)
    model = BigramLM(16)
    out = evaluate(one_rank(model), {"sft": {"input_ids": ids, "n_tokens": n_tokens, "loss_mask": mask}},
                   micro_batch_size=4, device=torch.device("cpu"))
    sums, counts = per_sequence(model, ids, mask)
    ratio = sums.sum() / counts.sum()
    z = (sums - ratio * counts) / counts.mean()  # linearised ratio: se² = var(z) / N
    assert out["eval/sft/loss"] == pytest.approx(ratio, rel=1e-6)
    assert out["eval/sft/loss_se"] == pytest.approx(math.sqrt((z ** 2).sum() / (7 * 6)), rel=1e-5)
    one = evaluate(one_rank(model), {"x": ids[:1]}, micro_batch_size=4, device=torch.device("cpu"))
    assert math.isnan(one["eval/x/loss_se"])
