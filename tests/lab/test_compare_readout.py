"""Read-outs of an eval curve (last-k mean, AUC) and the seeds a paired t-test needs: hand-computed cases."""

from __future__ import annotations

import math

import pytest

from d3ray.lab.compare.readout import (
    PAPER_EFFECT_NATS,
    curve_auc,
    last_k_mean,
    paired_power,
    readout_key,
    seeds_for_power,
)

STEPS = [4, 8, 12, 16]
VALUES = [6.0, 4.0, 3.0, 2.0]


def test_last_k_mean_known_curve_averages_the_last_k():
    assert last_k_mean(STEPS, VALUES, 2) == pytest.approx(2.5)  # (3 + 2) / 2
    assert last_k_mean(STEPS, VALUES, 10) == pytest.approx(3.75)  # fewer than k: all four


def test_last_k_mean_after_trunk_ignores_the_trunks_evaluations():
    assert last_k_mean(STEPS, VALUES, 3, after_step=8) == pytest.approx(2.5)  # steps 12, 16 only
    assert math.isnan(last_k_mean(STEPS, VALUES, 3, after_step=16))


def test_curve_auc_known_curve_is_trapezoid_area_over_span():
    # trapezoids: 4·(6+4)/2 + 4·(4+3)/2 + 4·(3+2)/2 = 20 + 14 + 10 = 44 over the span 12
    assert curve_auc(STEPS, VALUES) == pytest.approx(44 / 12)
    # after step 4: 14 + 10 = 24 over 8
    assert curve_auc(STEPS, VALUES, after_step=4) == pytest.approx(3.0)
    assert curve_auc([16], [2.0]) == 2.0


def test_readout_key_names_the_readout_and_refuses_unknown():
    assert readout_key("eval/mean_loss", "final", 3) == "eval/mean_loss"
    assert readout_key("eval/mean_loss", "last_k_mean", 3) == "eval/mean_loss@last3"
    assert readout_key("eval/mean_loss", "auc", 3) == "eval/mean_loss@auc"
    with pytest.raises(ValueError, match="report.metric"):
        readout_key("eval/mean_loss", "median", 3)


def test_seeds_for_power_effect_size_one_needs_ten_pairs():
    # d/s = 1: the z guess (1.96 + 0.84)² = 7.85 is too few; the t test needs n = 10 (power 0.803; n = 9: 0.75),
    # as G*Power's paired t-test gives; d/s = 0.5: 34
    assert seeds_for_power(0.1, 0.1) == 10
    assert paired_power(0.1, 0.1, 10) == pytest.approx(0.8031, abs=1e-3)
    assert paired_power(0.1, 0.1, 9) < 0.8
    assert seeds_for_power(-0.05, 0.1) == 34


def test_seeds_for_power_paper_effect_and_degenerate_inputs():
    assert PAPER_EFFECT_NATS == pytest.approx(math.log(0.958))  # −4.2% perplexity ≈ −0.0429 nats
    assert seeds_for_power(PAPER_EFFECT_NATS, 0.11) > seeds_for_power(0.05, 0.11) > 30  # issue #28: ~45 at 0.05
    assert seeds_for_power(0.0, 0.1) == math.inf
    assert seeds_for_power(0.1, float("nan")) == math.inf


def test_power_line_known_comparison_names_sd_and_seeds_for_observed_and_paper_effects():
    from d3ray.lab.compare.report_markdown import power_line
    from d3ray.lab.compare.stats import TIE, PairedComparison

    # Δ −0.1 with paired sd 0.1: Δ/sd = 1 → 10 seeds; the paper's −0.0429 nats with sd 0.1: more than 10
    c = PairedComparison(n=3, mean_diff=-0.1, std_diff=0.1, ci_low=-0.35, ci_high=0.15, p_value=0.2,
                         rel_change=-0.02, wins=2, verdict=TIE)
    line = power_line(c, "eval/mean_loss@last3")
    assert line.startswith("paired sd 0.1000; 80% power needs 10 seeds for this Δ, ")
    paper = int(seeds_for_power(PAPER_EFFECT_NATS, 0.1))
    assert f"{paper} for the paper's −4.2% perplexity" in line
    assert "paper" not in power_line(c, "eval/sft:test/exact_match")  # not a loss: no perplexity claim


def test_order_noise_line_reports_the_aa_arms_paired_sd_against_the_baseline():
    from d3ray.lab.compare.report_markdown import _order_noise
    from d3ray.lab.compare.stats import paired_comparison, summarize
    from d3ray.lab.compare.table import ArmResult

    # A/A − random per seed: +0.02, −0.02, +0.06 → mean 0.02, sd 0.04
    base, aa = {0: 5.0, 1: 5.1, 2: 5.2}, {0: 5.02, 1: 5.08, 2: 5.26}
    rows = [ArmResult("eval/mean_loss", "random", False, summarize(base), math.nan, None),
            ArmResult("eval/mean_loss", "random-aa", False, summarize(aa), math.nan, paired_comparison(aa, base))]
    text = " ".join(_order_noise("random-aa", "random", {"eval/mean_loss": rows}, "eval/mean_loss", "eval/mean_loss"))
    assert "Order noise" in text and "paired sd 0.0400 on `eval/mean_loss` (mean Δ 0.0200, 3 seeds)" in text
    assert _order_noise(None, "random", {}, "eval/mean_loss", "eval/mean_loss") == []
