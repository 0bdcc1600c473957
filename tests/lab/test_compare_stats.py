"""The comparison's statistics on constructed tables: known means and differences give the expected
intervals, p-values and verdicts (worked out by hand below)."""

from __future__ import annotations

import math

import pytest

from d3ray.lab.compare.stats import (
    BETTER,
    FEW,
    TIE,
    WORSE,
    bootstrap_interval,
    holm_adjusted,
    holm_verdicts,
    lower_is_better,
    paired_comparison,
    summarize,
)

# random order: 5.0, 5.2, 5.4 over seeds 0-2; the arm is 0.1 lower in every seed, ± 0.01
BASELINE = {0: 5.0, 1: 5.2, 2: 5.4}
ARM = {0: 4.89, 1: 5.10, 2: 5.31}  # differences -0.11, -0.10, -0.09


def test_summarize_known_table_gives_mean_and_sample_std():
    s = summarize(BASELINE)
    assert s.n == 3 and s.mean == pytest.approx(5.2) and s.std == pytest.approx(0.2)  # sqrt((.04+0+.04)/2)
    assert summarize([1.0, float("nan"), None]).n == 1  # non-finite values are left out


def test_paired_comparison_constant_improvement_gives_t_interval_and_better():
    c = paired_comparison(ARM, BASELINE, lower_is_better=True, confidence=0.95)
    # d = [-0.11, -0.10, -0.09]: mean -0.1, sd 0.01, se 0.01/sqrt(3); t(0.975, 2) = 4.302653
    half = 4.302653 * 0.01 / math.sqrt(3)
    assert c.n == 3 and c.mean_diff == pytest.approx(-0.1) and c.std_diff == pytest.approx(0.01)
    assert (c.ci_low, c.ci_high) == (pytest.approx(-0.1 - half, abs=1e-6), pytest.approx(-0.1 + half, abs=1e-6))
    # t = -0.1 / (0.01/sqrt(3)) = -17.32 on 2 df: two-sided p = 0.00332
    assert c.p_value == pytest.approx(0.003317, abs=2e-5)
    assert c.rel_change == pytest.approx((5.1 - 5.2) / 5.2)
    assert c.wins == 3 and c.verdict == BETTER
    assert c.boot_low <= -0.1 <= c.boot_high and -0.11 - 1e-12 <= c.boot_low and c.boot_high <= -0.09 + 1e-12


def test_paired_comparison_same_table_higher_is_better_reads_worse():
    c = paired_comparison(ARM, BASELINE, lower_is_better=False)
    assert c.verdict == WORSE and c.wins == 0


def test_paired_comparison_noisy_difference_is_no_difference_beyond_seed_noise():
    # d = [-0.1, +0.1, 0.0]: mean 0, sd 0.1 → interval ±4.30·0.1/√3 = ±0.248
    arm = {0: 4.9, 1: 5.3, 2: 5.4}
    c = paired_comparison(arm, BASELINE)
    assert c.mean_diff == pytest.approx(0.0, abs=1e-12)
    assert c.ci_low == pytest.approx(-0.2484, abs=1e-4) and c.ci_high == pytest.approx(0.2484, abs=1e-4)
    assert c.p_value == pytest.approx(1.0) and c.verdict == TIE and c.wins == 1


def test_paired_comparison_pairs_only_common_finite_seeds():
    arm = {0: 4.9, 1: float("nan"), 2: 5.3, 7: 1.0}
    c = paired_comparison(arm, BASELINE)
    assert c.n == 2 and c.mean_diff == pytest.approx(-0.1)
    assert paired_comparison({0: 4.9}, BASELINE).verdict == FEW


def test_paired_comparison_identical_shift_has_zero_width_interval():
    c = paired_comparison({s: v - 0.05 for s, v in BASELINE.items()}, BASELINE)
    assert c.std_diff == pytest.approx(0.0, abs=1e-12) and c.p_value == 0.0 and c.verdict == BETTER


def test_bootstrap_interval_single_value_is_nan_and_constant_is_point():
    assert all(math.isnan(x) for x in bootstrap_interval([0.3]))
    assert bootstrap_interval([0.2, 0.2, 0.2]) == (pytest.approx(0.2), pytest.approx(0.2))


def test_metric_direction():
    assert lower_is_better("eval/mean_loss") and lower_is_better("eval/RedPajamaC4/ppl")
    assert not lower_is_better("eval/sft:test:add:d2/exact_match") and not lower_is_better("eval/cloze:x/acc")


def test_holm_adjusted_hand_computed_table_steps_down_and_keeps_nan():
    # sorted: 0.005·4 = 0.02; 0.01·3 = 0.03; 0.03·2 = 0.06; 0.04·1 = 0.04 → max so far 0.06
    adjusted = holm_adjusted([0.01, 0.04, 0.03, 0.005, float("nan")])
    assert adjusted[:4] == pytest.approx([0.03, 0.06, 0.06, 0.02]) and math.isnan(adjusted[4])
    assert holm_adjusted([0.3, 0.9]) == pytest.approx([0.6, 0.9])  # capped at 1, never below an earlier one
    # at α = 0.05: reject 0.005 (≤ 0.05/4) and 0.01 (≤ 0.05/3), stop at 0.03 (> 0.05/2)
    assert [q <= 0.05 for q in adjusted[:4]] == [True, False, False, True]


def test_holm_verdicts_four_arms_keep_only_the_call_that_survives_the_adjustment():
    arms = [ARM,  # p 0.00332
            {0: 4.95, 1: 5.10, 2: 5.33},  # p 0.03709: better alone
            {0: 4.90, 1: 5.15, 2: 5.30},  # p 0.03775: better alone
            {0: 5.02, 1: 5.19, 2: 5.41}]  # p 0.52860
    alone = [paired_comparison(a, BASELINE) for a in arms]
    assert [c.verdict for c in alone] == [BETTER, BETTER, BETTER, TIE]
    adjusted = holm_verdicts([None, *alone], confidence=0.95)  # None: the baseline's own row
    assert adjusted[0] is None
    # 0.00332·4 = 0.01327; 0.03709·3 = 0.11126; 0.03775·2 = 0.0755 → 0.11126; 0.5286
    assert [c.p_holm for c in adjusted[1:]] == pytest.approx([0.01327, 0.11126, 0.11126, 0.52860], abs=2e-5)
    assert [c.verdict for c in adjusted[1:]] == [BETTER, TIE, TIE, TIE]
    assert {c.family for c in adjusted[1:]} == {4}
    one = holm_verdicts([alone[1]])[0]  # a single comparison is not adjusted
    assert one.verdict == BETTER and one.p_holm == pytest.approx(alone[1].p_value) and one.family == 1


def test_compare_metric_several_arms_reports_holm_verdicts():
    from d3ray.lab.compare.table import compare_metric

    values = {"random": BASELINE, "a": ARM, "b": {0: 4.95, 1: 5.10, 2: 5.33}, "c": {0: 5.02, 1: 5.19, 2: 5.41}}
    rows = compare_metric("eval/mean_loss", values, {}, ["random", "a", "b", "c"], {}, "random", 0.95)
    by = {r.arm: r.vs_baseline for r in rows}
    assert by["random"] is None
    # three comparisons: a 0.00332·3 = 0.00995 stays better; b 0.03709·2 = 0.0742 is no longer called
    assert (by["a"].verdict, by["b"].verdict, by["c"].verdict) == (BETTER, TIE, TIE)
    assert by["b"].p_holm == pytest.approx(0.07417, abs=2e-5) and by["b"].p_value == pytest.approx(0.03709, abs=2e-5)


def test_an_arms_control_is_paired_against_it_and_holm_adjusted_on_its_own():
    from d3ray.lab.compare.table import compare_metric

    # "wide" is the method at another window; "wide-random" its control: the method's Δ against the
    # baseline mixes the window's effect into it, against its control it does not
    values = {"random": {0: 5.00, 1: 5.10, 2: 5.20}, "wide-random": {0: 4.90, 1: 5.00, 2: 5.10},
              "wide": {0: 4.89, 1: 4.99, 2: 5.095}, "b": {0: 5.01, 1: 5.11, 2: 5.21}}
    rows = compare_metric("eval/mean_loss", values, {}, ["random", "wide-random", "wide", "b"], {"wide": True},
                          "random", 0.95, controls={"wide": "wide-random"})
    by = {r.arm: r for r in rows}
    assert by["wide"].control == "wide-random"
    assert by["wide"].vs_baseline.mean_diff == pytest.approx(-0.325 / 3, abs=1e-12)  # (-0.11 -0.11 -0.105)/3
    assert by["wide"].vs_control.mean_diff == pytest.approx(-0.025 / 3, abs=1e-12)  # (-0.01 -0.01 -0.005)/3
    assert by["wide"].vs_control.n == 3 and by["wide"].vs_control.family == 1  # one arm names a control
    assert by["b"].vs_control is None and by["b"].control is None
    assert by["wide"].vs_control.p_holm == pytest.approx(by["wide"].vs_control.p_value)
