"""Lossless verdicts from both computations' logits of both tokens: three-way and exact ties are near-ties (the top-2
rule called them real mismatches), clear gaps are real; end to end, a verify whose logits are off by up to 0.5 (as
bf16's are) yields only near-ties at tolerance 1.0, and a corrupted verify (slot logits shifted by one) only real
mismatches."""

import pytest
import torch

from dflash_lab.evaluation.measure import run_decoders
from dflash_lab.evaluation.report import BASELINE, EvalReport
from dflash_lab.evaluation.speculative import SpeculativeDecoder
from dflash_lab.evaluation.verdicts import divergence_record, lossless_verdict
from tests.test_speculative import heldout_prompt_ids, tiny_models  # noqa: F401 (fixtures)

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest.py: batch-1 decoding of tiny models


def _result(out, topk, ref=None):
    """A result as the decoders record it: per output token the top-k (id, logit) and the reference's logit; plus
    the top-2 margins and runner-up ids that evaluations stored before (what the top-2 rule reads)."""
    ids = [[i for i, _ in row] for row in topk]
    vals = [[v for _, v in row] for row in topk]
    return {"output_ids": out, "topk_ids": ids, "topk_logits": vals, "ref_logits": ref or [None] * len(out),
            "margins": [v[0] - v[1] for v in vals], "runner_up": [i[1] for i in ids]}


def _verdict(spec, base, again, tol):
    return lossless_verdict({**spec, "divergence": divergence_record(spec, base, again)}, base, tol)


def test_a_three_way_tie_is_a_near_tie():
    """bf16 logits one step apart among tokens 7, 9, 5: the speculative computation chose 7 (runner-up 9), the
    target-only one chose 5 (runner-up 7). Each one's gap between 7 and 5 is 0.0625: a tie, not a bug."""
    spec = _result([3, 7], [[(3, 20.0), (4, 1.0)], [(7, 12.0), (9, 12.0), (5, 11.9375)]], ref=[20.0, 11.9375])
    base = _result([3, 5], [[(3, 20.0), (4, 1.0)], [(5, 12.0), (7, 11.9375), (9, 11.9375)]])
    again = _result([3, 5], [[(3, 20.0), (4, 1.0)], [(5, 12.0), (7, 11.9375)]], ref=[20.0, 11.9375])
    v = _verdict(spec, base, again, 1.0)
    assert v["verdict"] == "numerical near-tie (gaps 0.0625 / 0.0625)", v
    assert (v["index"], v["spec_token"], v["target_token"]) == (1, 7, 5)
    assert v["spec_topk"][:2] == [(7, 12.0), (9, 12.0)] and v["target_topk"][0] == (5, 12.0)
    # what the top-2 rule said (the runner-up of one computation is not the other's choice): a false alarm
    assert lossless_verdict(spec, base, 1.0)["verdict"].startswith("real mismatch")


def test_an_exact_tie_broken_differently_is_a_near_tie():
    """Three tokens with EQUAL logits in both computations, the tie broken to 7 and to 5: gaps 0 and 0."""
    tie = [(7, 15.5), (8, 15.5), (5, 15.5), (1, 3.0)]
    spec = _result([7], [tie], ref=[15.5])
    base = _result([5], [[(5, 15.5), (8, 15.5), (7, 15.5), (1, 3.0)]])
    again = _result([5], [[(5, 15.5), (8, 15.5)]], ref=[15.5])
    v = _verdict(spec, base, again, 1e-3)  # even at the fp32 tolerance
    assert v["verdict"] == "numerical near-tie (gaps 0 / 0)", v
    assert lossless_verdict(spec, base, 1e-3)["verdict"].startswith("real mismatch")  # the top-2 rule: runner-up 8


def test_clear_gaps_are_real_mismatches_and_unknown_logits_are_never_ties():
    spec = _result([7], [[(7, 14.0), (5, 11.0)]], ref=[11.0])
    base = _result([5], [[(5, 13.0), (7, 12.8)]])
    again = _result([5], [[(5, 13.0), (7, 12.8)]], ref=[12.8])
    assert _verdict(spec, base, again, 1.0)["verdict"] == "real mismatch (gaps 3 / 0.2)"
    # one computation's logit of the other's token is below its top-k and was not recorded: at least the k-th gap
    far = _result([7], [[(7, 14.0), (9, 13.9)]])
    v = _verdict(far, base, again, 1.0)
    assert v["verdict"] == "real mismatch (gaps >=0.1 / 0.2)" and v["gap_spec"] == 0.1
    # a target-only decoding that does not repeat itself is not something a tie explains
    moved = _result([6], [[(6, 13.0), (7, 12.8)]], ref=[12.8])
    assert _verdict(spec, base, moved, 10.0)["verdict"].startswith("real mismatch (the target-only decoding")


class NoisyVerify(SpeculativeDecoder):
    """A numerically different computation of the same target: every target logit off by up to `eps`."""

    def __init__(self, *args, eps: float, **kwargs):
        super().__init__(*args, **kwargs)
        self.eps, self.noise = eps, torch.Generator().manual_seed(0)

    def _target_forward(self, ids, cache):
        logits, feats = super()._target_forward(ids, cache)
        return logits + (torch.rand(logits.shape, generator=self.noise) * 2 - 1) * self.eps, feats


class ShiftedSlots(SpeculativeDecoder):
    """A decoding bug: the verify compares draft slot k with the target's prediction for slot k - 1."""

    def _target_forward(self, ids, cache):
        first = cache.get_seq_length() == 0
        logits, feats = super()._target_forward(ids, cache)
        return (logits if first else torch.cat([logits[:1], logits[:-1]])), feats


def _verdicts(decoder, tol: float, n: int = 4, tokens: int = 32) -> list[str]:
    target, tok, _ = tiny_models()
    base = SpeculativeDecoder(target, None, block_size=1, eos_token_id=tok.eos_token_id)
    results = run_decoders(target, {"trained": decoder, BASELINE: base}, {"heldout": heldout_prompt_ids(tok, n)},
                           max_new_tokens=tokens, temperature=0.0, log=lambda *a: None)
    report = EvalReport(run_dir="", weights="", step=0, target="tiny", block_size=8, temperature=0.0,
                        max_new_tokens=tokens, results=results, near_tie_margin=tol)
    return [v["verdict"] for v in report.verdicts()]


def test_logits_off_by_half_a_logit_give_near_ties_only():
    """Where the noisy computation's output differs, the target-only margin between the two tokens is below the
    noise's range (2 eps), and so is the noisy computation's own: every verdict is a near-tie at tolerance 2 eps."""
    target, tok, drafter = tiny_models()
    noisy = NoisyVerify(target, drafter, block_size=8, eos_token_id=tok.eos_token_id, eps=0.5)
    # 16 prompts spread over the held-out set (3 of them change under this noise) + the 1e-5 rounding of logits
    verdicts = _verdicts(noisy, tol=1.0 + 1e-4, n=16, tokens=24)
    differing = [v for v in verdicts if v != "identical"]
    assert differing, "the noise changed no output: raise eps or the prompts"
    assert all(v.startswith("numerical near-tie") for v in differing), verdicts


def test_a_corrupted_verify_is_a_real_mismatch():
    target, tok, drafter = tiny_models()
    buggy = ShiftedSlots(target, drafter, block_size=8, eos_token_id=tok.eos_token_id)
    verdicts = _verdicts(buggy, tol=1.0)  # even at the loose bf16 tolerance
    assert sum(v.startswith("real mismatch") for v in verdicts) >= 2, verdicts
    assert not any(v.startswith("numerical") for v in verdicts), verdicts


@pytest.mark.parametrize("static", [False, True])
def test_the_decoders_record_the_reference_logit_at_every_position(static):
    """generate(reference=...) records this computation's logit of the reference's token per output position: on
    its own output that is its top-1 logit, on another output the logit of that token (its top-k entry)."""
    from dflash_lab.evaluation.static_decode import StaticSpeculativeDecoder

    target, tok, drafter = tiny_models()
    cls = StaticSpeculativeDecoder if static else SpeculativeDecoder
    dec = cls(target, drafter, block_size=8, eos_token_id=tok.eos_token_id)
    ids = heldout_prompt_ids(tok, 1)[0]
    r = dec.generate(ids, max_new_tokens=24)
    again = dec.generate(ids, max_new_tokens=24, reference=r.output_ids)
    assert again.output_ids == r.output_ids and len(again.ref_logits) == len(r.output_ids)
    assert again.ref_logits == pytest.approx([v[0] for v in r.topk_logits], abs=1e-4)
    other = [row[1] for row in r.topk_ids]  # the runner-up at every position
    third = dec.generate(ids, max_new_tokens=24, reference=other)
    assert third.ref_logits == pytest.approx([v[1] for v in r.topk_logits], abs=1e-4)
    short = dec.generate(ids, max_new_tokens=24, reference=other[:5])
    assert short.ref_logits[5:] == [None] * (len(r.output_ids) - 5)
