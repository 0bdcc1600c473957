"""Unigram baselines: plug-in entropy and smoothed cross-entropy on hand-computed cases."""

from __future__ import annotations

import math

import numpy as np
import pytest

from d3ray.lab.compare.unigram import eval_set_figures, unigram_cross_entropy, unigram_entropy


def test_unigram_entropy_and_cross_entropy_known_values():
    assert unigram_entropy(np.array([[0, 0], [1, 1]])) == pytest.approx(math.log(2))
    assert unigram_entropy(np.array([3, 3, 3])) == pytest.approx(0.0)
    # counts [3, 1] + 1/2 → p = [3.5, 1.5] / 5
    assert unigram_cross_entropy(np.array([3, 1]), np.array([0, 1])) == pytest.approx(
        -(math.log(0.7) + math.log(0.3)) / 2)


def test_eval_set_figures_per_domain_mean_and_pooled():
    sets = {"a": np.array([[0, 0, 0, 0]]), "b": np.array([[1, 2, 1, 2]])}
    f = eval_set_figures(sets, train_counts=np.array([1, 1, 1, 1]))
    assert f["entropy/a"] == 0.0 and f["entropy/b"] == pytest.approx(math.log(2))
    assert f["entropy/mean"] == pytest.approx(math.log(2) / 2)
    assert f["entropy/pooled"] == pytest.approx(-(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25)))
    assert f["cross_entropy/mean"] == pytest.approx(math.log(4))  # uniform counts: ln V everywhere
