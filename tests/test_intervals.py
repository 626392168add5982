"""Bootstrap intervals of a pooled tau over prompts: exact on a two-prompt case, the binomial width on 64 prompts,
seeded, 1/sqrt(n) narrowing, and which measurements overlap."""

import math

import pytest

from dflash_lab.evaluation.intervals import TauInterval, bootstrap_tau, not_separated, tau_interval


def test_two_prompts_give_the_exact_bootstrap_quantiles():
    """Prompt A accepts 0 drafts in 10 iterations (tau 1), B accepts 9 per iteration (tau 10). A resample is AA
    (tau 1, p 1/4), AB (5.5, p 1/2) or BB (10, p 1/4), so the 2.5% and 97.5% quantiles are exactly 1 and 10."""
    iv = bootstrap_tau([0, 90], [10, 10], seed=3, min_prompts=2)  # the arithmetic alone: 2 prompts decide nothing
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
    with pytest.raises(ValueError, match="level"):
        bootstrap_tau([1], [1], level=95)
    rows = [{"accepted": [1, 0, 2], "iterations": 3}, {"accepted": 4, "iterations": 2}] * 3
    iv = tau_interval(rows)
    assert iv.tau == pytest.approx(1 + 7 / 5) and iv.prompts == 6
    assert iv.text() == f"{iv.tau:.2f} [{iv.low:.2f}, {iv.high:.2f}]"


def test_not_separated_lists_overlapping_intervals():
    a, b = TauInterval(3.0, 2.8, 3.2, 64), TauInterval(2.9, 2.7, 3.05, 64)
    c = TauInterval(2.0, 1.8, 2.2, 64)
    got = not_separated({"a": a, "b": b, "c": c, "d": None})
    assert got == {"a": ["b"], "b": ["a"], "c": [], "d": []}


def test_fewer_than_five_prompts_have_no_interval_and_are_never_separated():
    """One prompt resampled is itself: the old zero-width interval made two one-prompt measurements 0.01 apart
    "separated". Below MIN_PROMPTS the interval is undefined (n/a) and overlaps everything."""
    from dflash_lab.evaluation.intervals import MIN_PROMPTS, stored_interval

    assert MIN_PROMPTS == 5
    one, other = bootstrap_tau([6], [3]), bootstrap_tau([603], [300])
    assert (one.tau, one.low, one.high, one.prompts) == (3.0, None, None, 1) and other.tau == pytest.approx(3.01)
    assert one.text() == "3.00 [n/a]" and "no interval below 5" in str(one)
    assert not_separated({"a": one, "b": other}) == {"a": ["b"], "b": ["a"]}
    four = bootstrap_tau([0, 0, 90, 90], [10] * 4, seed=0)
    five = bootstrap_tau([0, 0, 90, 90, 90], [10] * 5, seed=0)
    assert four.low is None and five.low < five.tau < five.high
    far = TauInterval(9.0, 8.9, 9.1, 64)  # a defined interval far away is still not told apart from n/a
    assert not_separated({"one": one, "far": far}) == {"one": ["far"], "far": ["one"]}
    # figures read back from files: an old zero-width one-prompt interval is undefined too
    assert stored_interval(2.0, 2.0, 2.0, 1).low is None
    assert stored_interval(2.0, 1.8, 2.2, 32) == TauInterval(2.0, 1.8, 2.2, 32)
    assert stored_interval(2.0, None, None, 32) is None and stored_interval(None, 1.0, 2.0, 32) is None
