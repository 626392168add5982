"""Bootstrap intervals of a pooled tau over prompts: exact on a two-prompt case, the binomial width on 64 prompts,
seeded, 1/sqrt(n) narrowing, and which measurements overlap."""

import math

import pytest

from dflash_lab.evaluation.intervals import TauInterval, bootstrap_tau, not_separated, tau_interval


def test_two_prompts_give_the_exact_bootstrap_quantiles():
    """Prompt A accepts 0 drafts in 10 iterations (tau 1), B accepts 9 per iteration (tau 10). A resample is AA
    (tau 1, p 1/4), AB (5.5, p 1/2) or BB (10, p 1/4), so the 2.5% and 97.5% quantiles are exactly 1 and 10."""
    iv = bootstrap_tau([0, 90], [10, 10], seed=3)
    assert iv.tau == 5.5 and iv.prompts == 2
    assert iv.low == 1.0 and iv.high == 10.0


def test_64_prompts_give_the_binomial_interval():
    """32 prompts accept 1 draft per iteration, 32 accept 3 (10 iterations each): the pooled tau of a resample is
    2 + k/32 with k ~ Binomial(64, 1/2) prompts of the second kind, so its 95% interval is 3 -+ 1.96 * 4/32."""
    acc, its = [10] * 32 + [30] * 32, [10] * 64
    iv = bootstrap_tau(acc, its, seed=0)
    assert iv.tau == pytest.approx(3.0)
    half = 1.96 * math.sqrt(64 * 0.25) / 32  # 0.245
    assert iv.low == pytest.approx(3.0 - half, abs=0.04) and iv.high == pytest.approx(3.0 + half, abs=0.04)
    # pooled: a long prompt weighs more. 32 short prompts at tau 4 (2 iterations) and 32 long ones at tau 1 (20)
    pooled = bootstrap_tau([6] * 32 + [0] * 32, [2] * 32 + [20] * 32, seed=0)
    assert pooled.tau == pytest.approx(1 + 192 / 704)
    assert pooled.low < pooled.tau < pooled.high


def test_interval_is_seeded_and_narrows_with_more_prompts():
    acc = [3, 0, 12, 5, 7, 1, 0, 9]
    its = [4, 5, 6, 4, 5, 5, 6, 4]
    a, b = bootstrap_tau(acc, its, seed=7), bootstrap_tau(acc, its, seed=7)
    assert a == b and bootstrap_tau(acc, its, seed=8) != a
    wide = bootstrap_tau(acc, its, seed=0)
    narrow = bootstrap_tau(acc * 8, its * 8, seed=0)  # the same mix, 64 prompts
    assert narrow.tau == pytest.approx(wide.tau)
    ratio = (wide.high - wide.low) / (narrow.high - narrow.low)
    assert 2.3 < ratio < 3.7  # sqrt(8) = 2.83


def test_degenerate_inputs_and_results_of_either_kind():
    assert bootstrap_tau([], []) is None
    one = bootstrap_tau([6], [3])
    assert (one.tau, one.low, one.high) == (3.0, 3.0, 3.0)
    with pytest.raises(ValueError, match="level"):
        bootstrap_tau([1], [1], level=95)
    rows = [{"accepted": [1, 0, 2], "iterations": 3}, {"accepted": 4, "iterations": 2}]
    iv = tau_interval(rows)
    assert iv.tau == pytest.approx(1 + 7 / 5)
    assert iv.text() == f"{iv.tau:.2f} [{iv.low:.2f}, {iv.high:.2f}]"


def test_not_separated_lists_overlapping_intervals():
    a, b = TauInterval(3.0, 2.8, 3.2, 64), TauInterval(2.9, 2.7, 3.05, 64)
    c = TauInterval(2.0, 1.8, 2.2, 64)
    got = not_separated({"a": a, "b": b, "c": c, "d": None})
    assert got == {"a": ["b"], "b": ["a"], "c": [], "d": []}
