"""Token-level inspector: the HTML shows every real token once, supervised spans, each valid anchor and the tokens
blocks predict, escaped; the text form and the supervised spans agree with the data."""

import re

import pytest
import torch

from dflash_lab.drafter.batches import BatchSampler
from dflash_lab.data.tokenize import tokenize_dataset
from dflash_lab.data.inspector import SampleView, render_sample_html

CONV = [{"role": "user", "content": "Count from 1 to 20. <b>bold</b> & more"},
        {"role": "assistant", "content": "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20"},
        {"role": "user", "content": "Now 21 to 30."},
        {"role": "assistant", "content": "21 22 23 24 25 26 27 28 29 30"}]


@pytest.fixture(scope="module")
def setup():
    from dflash_lab.target.load import load_tokenizer

    tok = load_tokenizer("tiny")
    data = tokenize_dataset(tok, [CONV, CONV[:2]], seq_len=128, block_size=4)
    sampler = BatchSampler(data, batch_size=2, num_anchors=6, block_size=4, mask_token_id=tok.mask_token_id,
                           gamma=2.0, seed=3)
    return tok, data, sampler.batch(0)


def test_html_shows_tokens_supervision_anchors_and_blocks(setup):
    tok, data, batch = setup
    row = next(r for r in range(2) if torch.equal(batch.input_ids[r], data.input_ids[0].long()))  # holds CONV
    view = SampleView(tok, batch, row)
    length = int(data.lengths[0])
    assert view.length == length and view.supervised == int(data.loss_mask[0].sum())
    out = render_sample_html(tok, batch, row)
    titles = re.findall(r"title='pos (\d+) \| id (\d+)", out)
    assert [int(p) for p, _ in titles] == list(range(length))  # every real token once, in order
    assert [int(i) for _, i in titles] == batch.input_ids[row, :length].tolist()
    assert f"… {128 - length} padding tokens" in out
    classes = re.findall(r"<span class='([a-z ]+)' title='pos (\d+)", out)
    sup = {int(p) for c, p in classes if c.split()[0] == "s"}
    assert sup == set(batch.loss_mask[row].nonzero().flatten().tolist())
    anchors = {int(p) for c, p in classes if "a" in c.split()}
    valid = batch.anchors[row][batch.anchor_valid[row]].tolist()
    assert anchors == set(valid) and len(valid) == 6
    covered = {int(p) for c, p in classes if "c" in c.split()}
    w = batch.loss_weights[row].view(-1, 4)
    expect = {a + k for b, a in enumerate(batch.anchors[row].tolist()) for k in range(1, 4)
              if batch.anchor_valid[row, b] and w[b, k] > 0}
    assert covered == expect
    assert out.count("<tr><td>") == 6  # one table row per valid block
    # user text is escaped, never interpreted as HTML
    assert out.count("<b>") == 1 and out.count("</b>") == 1  # only the summary header is bold
    assert "&lt;" in out and "&amp;" in out and "&lt;|im_start|&gt;" in out


def test_text_form_and_spans_match_the_template(setup):
    tok, data, batch = setup
    view = SampleView(tok, data, 0)  # TokenizedData works too (masks only, no blocks)
    assert view.supervised_text() == ["1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20<|im_end|>",
                                      "<think>\n\n</think>\n\n21 22 23 24 25 26 27 28 29 30<|im_end|>"]
    text = view.text()
    assert text.startswith(f"sample 0: {int(data.lengths[0])} tokens") and text.count("[[") == 2
    assert "[[1 2 3" in text and "30<|im_end|>]]" in text and not view.blocks
    assert "valid blocks" not in view.summary() and "_repr_html_" in dir(view)
    assert view._repr_html_() == view.html()


def test_bad_index_names_the_range(setup):
    tok, _, batch = setup
    with pytest.raises(IndexError, match=r"sample index 5 is out of range: the batch has 2 rows \(0..1\)"):
        render_sample_html(tok, batch, 5)
