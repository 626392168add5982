"""The sampled-tau ceiling (evaluation/sampling_ceiling.py) on the tiny target: the oracle argmax drafter's blocks
against the expected length summed from the same probabilities, the T -> 0 limit, the CLI's JSON, bad input."""

import json
import math

import pytest
import torch

from dflash_lab.evaluation.prompts import load_prompts
from dflash_lab.evaluation.sampling_ceiling import ceiling, eos_ids_of, main, oracle_decode
from dflash_lab.target.load import load_target, load_tokenizer
from dflash_lab.tiny import tiny_heldout_path


@pytest.fixture(scope="module")
def tiny():
    tok = load_tokenizer("tiny")
    model = load_target("tiny").eval()
    return model, tok, load_prompts(tiny_heldout_path(), tok, n_prompts=12)


def test_realised_blocks_match_their_expected_length(tiny):
    """At T=1.6 the tiny target is far from peaked: every block's accepted count is a draw whose mean is 1 + the sum
    over k of the product of the first k drafts' probabilities; over ~300 blocks the two agree within 4 standard
    errors, and a formula off by one draft (the product one term short or long) would not."""
    model, _, prompts = tiny
    g = torch.Generator().manual_seed(1)
    realised, expected, shifted = [], [], []
    for ids in prompts:
        r = oracle_decode(model, ids, block_size=6, temperature=1.6, max_new_tokens=96, generator=g,
                          eos_ids=set(), full_chain=True)  # no eos: every prompt runs its whole budget
        full = r.result.accepted[:-1]  # the last block is cut by the budget
        realised += [a + 1 for a in full]
        expected += r.expected[: len(full)]
    n = len(realised)
    mean_r, mean_e = sum(realised) / n, sum(expected) / n
    var = sum((x - mean_r) ** 2 for x in realised) / (n - 1)
    assert n > 150 and 2.0 < mean_r < 5.0  # neither all-accept nor all-reject: the test has something to compare
    assert abs(mean_r - mean_e) < 4 * math.sqrt(var / n), (mean_r, mean_e)
    for ids in prompts[:4]:  # the same probabilities summed one draft short: 1 + sum_k prod_{j<=k-1}
        r = oracle_decode(model, ids, block_size=6, temperature=1.6, max_new_tokens=96,
                          generator=torch.Generator().manual_seed(2), eos_ids=set(), full_chain=True)
        shifted += [e - 1 for e in r.expected]  # the expected accepted drafts, without the bonus token
    assert sum(shifted) / len(shifted) < mean_r - 0.5


def test_drafting_only_what_may_be_accepted_gives_the_same_tokens(tiny):
    """The default computes a draft only once the previous one is accepted; with the random draws in
    speculative_accept's order the output equals the full-chain run's token for token."""
    model, _, prompts = tiny
    for ids in prompts[:4]:
        lazy, full = (oracle_decode(model, ids, block_size=6, temperature=1.6, max_new_tokens=64, eos_ids=set(),
                                    generator=torch.Generator().manual_seed(3), full_chain=f) for f in (False, True))
        assert lazy.result.output_ids == full.result.output_ids and lazy.result.accepted == full.result.accepted
        assert lazy.first_p == pytest.approx(full.first_p) and lazy.expected == [] and len(full.expected) > 0


def test_near_greedy_the_oracle_accepts_every_draft(tiny):
    model, _, prompts = tiny
    r = oracle_decode(model, prompts[0], block_size=8, temperature=1e-4, max_new_tokens=65,
                      generator=torch.Generator().manual_seed(0), eos_ids=set())
    assert r.result.accepted == [7] * 8  # 1 + 8 blocks x (7 drafts + the bonus) = 65 tokens
    assert r.result.tau == 8.0 and all(p > 0.999 for p in r.first_p)


def test_a_set_row_and_the_command(tiny, tmp_path, capsys):
    model, tok, _ = tiny
    row = ceiling(model, tok, "tiny-heldout", tiny_heldout_path(), n_prompts=6, temperature=1.0, block_size=8,
                  max_new_tokens=32, log=lambda *a: None)
    assert row.prompts == 6 and len(row.sha256) == 64 and 1.0 <= row.tau <= 8.0 and row.expected_tau is None
    assert row.tau_low <= row.tau <= row.tau_high and 0.0 < row.first_draft_p <= 1.0
    out = tmp_path / "c.json"
    assert main(["--target", "tiny", "--prompts", "tiny-heldout", "--n-prompts", "6", "--block-size", "8",
                 "--max-new-tokens", "32", "--out", str(out)]) == 0
    saved = json.loads(out.read_text())["rows"]
    assert len(saved) == 1 and saved[0]["tau"] == pytest.approx(row.tau)  # same prompts, same seed, same figure
    assert "ceiling tau" in capsys.readouterr().out


def test_bad_settings_name_the_value(tiny):
    model, _, prompts = tiny
    g = torch.Generator()
    with pytest.raises(ValueError, match="temperature=0"):
        oracle_decode(model, prompts[0], block_size=8, temperature=0.0, max_new_tokens=8, generator=g,
                      eos_ids=eos_ids_of(model))
    with pytest.raises(ValueError, match="block_size=1"):
        oracle_decode(model, prompts[0], block_size=1, temperature=1.0, max_new_tokens=8, generator=g, eos_ids=set())
    with pytest.raises(SystemExit):
        main(["--target", "tiny", "--temperature", "0"])
