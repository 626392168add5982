"""Token-level view of one sequence of a BlockBatch: loss mask, anchors and the blocks drafted from them (HTML).

    batch_html(trainer.tokenizer, trainer.last_batch, 0)     # displays in Jupyter (an object with _repr_html_)

Tokens: green background = supervised (loss_mask 1, assistant tokens), grey = context only; a boxed token is an
anchor (the block's first slot, its label is the token itself); the small number under a token counts the blocks
whose MASK slots predict it (blocks overlap by design). The table lists each block: anchor position and token,
then the B-1 tokens its MASK slots must predict, each with its loss weight (0 = padding / outside the sequence).
"""

from __future__ import annotations

import html


class BatchHTML:
    """HTML wrapper Jupyter displays; `str(obj)` is the HTML too."""

    def __init__(self, text: str):
        self.text = text

    def _repr_html_(self) -> str:
        return self.text

    def __str__(self) -> str:
        return self.text


def _tok(tokenizer, i: int) -> str:
    t = tokenizer.decode([int(i)])
    return t.replace("\n", "\u21b5") if t.strip() or not t else t.replace(" ", "\u2423")


def batch_html(tokenizer, batch, index: int = 0, *, max_blocks: int = 64) -> BatchHTML:
    b = batch.input_ids.shape[0]
    if not 0 <= index < b:
        raise IndexError(f"batch_html(index={index}): the batch holds {b} sequences (0..{b - 1}).")
    ids = batch.input_ids[index].tolist()
    mask = batch.loss_mask[index].tolist()
    anchors = batch.anchors[index].tolist()
    valid = batch.anchor_valid[index].tolist()
    B = batch.block_size
    labels = batch.labels[index].view(-1, B).tolist()
    weights = batch.loss_weights[index].view(-1, B).float().tolist()
    pad = getattr(tokenizer, "pad_token_id", None)
    length = len(ids)
    while length > 0 and pad is not None and ids[length - 1] == pad and not mask[length - 1]:
        length -= 1
    anchor_set = {a for a, v in zip(anchors, valid) if v}
    covered = [0] * len(ids)
    for a, v in zip(anchors, valid):
        if v:
            for p in range(a + 1, min(a + B, len(ids))):
                covered[p] += 1
    spans = []
    for p in range(length):
        bg = "#dafbe1" if mask[p] else "#eaeef2"
        border = "2px solid #cf222e" if p in anchor_set else "1px solid transparent"
        sub = f'<sub style="color:#0969da;font-size:9px">{covered[p]}</sub>' if covered[p] else ""
        spans.append(f'<span title="pos {p} id {ids[p]} mask {mask[p]}" style="background:{bg};border:{border};'
                     f'margin:1px;padding:0 1px;border-radius:2px;white-space:pre">'
                     f'{html.escape(_tok(tokenizer, ids[p]))}</span>{sub}')
    n_valid = sum(1 for v in valid if v)
    rows = []
    for k, (a, v) in enumerate(zip(anchors, valid)):
        if not v or len(rows) >= max_blocks:
            continue
        cells = "".join(
            f'<td title="weight {w:.2e}" style="padding:0 3px;{"color:#8c959f" if w == 0 else ""}">'
            f'{html.escape(_tok(tokenizer, lab))}</td>' for lab, w in zip(labels[k][1:], weights[k][1:]))
        rows.append(f'<tr><td>{k}</td><td>{a}</td><td style="border:2px solid #cf222e">'
                    f'{html.escape(_tok(tokenizer, ids[a]))}</td>{cells}</tr>')
    more = f"<p>... {n_valid - len(rows)} more blocks</p>" if n_valid > len(rows) else ""
    head = "".join(f"<th>+{j}</th>" for j in range(1, B))
    sup = sum(mask[:length])
    text = (f'<div class="dfl-batch" style="font-family:monospace;font-size:12px">'
            f'<p style="font-family:sans-serif">sequence {index} of {b}: {length} tokens ({sup} supervised), '
            f'{n_valid} valid anchors of {len(anchors)}, block size {B}. '
            f'<span style="background:#dafbe1">supervised</span> <span style="background:#eaeef2">context</span> '
            f'<span style="border:2px solid #cf222e">anchor</span> '
            f'<sub style="color:#0969da">n</sub> = blocks predicting this token</p>'
            f'<div style="line-height:1.9">{"".join(spans)}</div>'
            f'<table style="font-size:11px;margin-top:8px"><tr><th>block</th><th>pos</th><th>anchor</th>{head}</tr>'
            f'{"".join(rows)}</table>{more}</div>')
    return BatchHTML(text)
