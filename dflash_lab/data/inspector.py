"""Token-level HTML view of one training sample: the text, the supervised spans, the sampled anchors and blocks.

    render_sample_html(tokenizer, batch, 0)       # -> HTML string (batch: a BlockBatch, or TokenizedData for masks only)
    SampleView(tokenizer, batch, 0)               # displays itself in a notebook (_repr_html_); .text() for a terminal

Colours (alternating shades show token edges): grey = prompt / template tokens (no loss); green = supervised
(assistant) tokens; a red box = an anchor;
an underline = a token some block predicts (its label carries loss). Hover a token for its position, id, and the
blocks/slots that cover it. The table lists each block: anchor position and token, and the B-1 tokens it is trained
to predict (struck through where the slot carries no loss). Plain HTML + inline CSS: no JavaScript, renders on GitHub.
"""

from __future__ import annotations

import html

import torch

_CSS = ("<style>.dfi{font-family:ui-monospace,monospace;font-size:12px;line-height:1.9;white-space:pre-wrap;"
        "word-break:break-all}.dfi span{border-radius:2px}.dfi .p{color:#6b7280}.dfi .s{background:#dcfce7;"
        "color:#14532d}.dfi .p.o{background:#f3f4f6}.dfi .s.o{background:#bbf7d0}.dfi .a{outline:2px solid #dc2626}.dfi .c{text-decoration:underline #2563eb 2px}"
        ".dfi .pad{color:#d1d5db}.dft td,.dft th{font-family:ui-monospace,monospace;font-size:11px;padding:1px 6px;"
        "text-align:left}.dft .n{text-decoration:line-through;color:#9ca3af}</style>")


def _tok_text(tokenizer, tid: int) -> str:
    t = tokenizer.decode([tid], skip_special_tokens=False, clean_up_tokenization_spaces=False)
    return t if t else f"<{tid}>"


def _visible(t: str) -> str:
    return html.escape(t).replace("\n", "\u21b5\n").replace("\t", "\u2192")


class SampleView:
    """One row of a BlockBatch (or of TokenizedData) prepared for display."""

    def __init__(self, tokenizer, batch, index: int, *, max_blocks: int = 64):
        self.tokenizer, self.index, self.max_blocks = tokenizer, index, max_blocks
        n_rows = batch.input_ids.shape[0]
        if not 0 <= index < n_rows:
            raise IndexError(f"sample index {index} is out of range: the batch has {n_rows} rows (0..{n_rows - 1}).")
        self.ids = batch.input_ids[index].long().tolist()
        self.mask = batch.loss_mask[index].bool().tolist()
        S = len(self.ids)
        pad = tokenizer.pad_token_id
        length = S
        if getattr(batch, "lengths", None) is not None:
            length = int(batch.lengths[index])
        elif pad is not None:
            while length > 0 and self.ids[length - 1] == pad and not self.mask[length - 1]:
                length -= 1
        self.length = length
        self.blocks: list[dict] = []  # {block, anchor, slots: [(pos, label, weight)]}
        self.cover: dict[int, list[str]] = {}
        self.block_size = getattr(batch, "block_size", None)
        if hasattr(batch, "anchors"):
            B = batch.block_size
            anchors = batch.anchors[index].tolist()
            valid = batch.anchor_valid[index].tolist()
            labels = batch.labels[index].view(-1, B).tolist()
            weights = batch.loss_weights[index].view(-1, B).tolist()
            for b, (p, ok) in enumerate(zip(anchors, valid)):
                if not ok:
                    continue
                slots = [(p + k, labels[b][k], weights[b][k]) for k in range(1, B)]
                self.blocks.append({"block": b, "anchor": p, "slots": slots})
                self.cover.setdefault(p, []).append(f"anchor of block {b}")
                for k, (pos, _, w) in enumerate(slots, 1):
                    if w > 0:
                        self.cover.setdefault(pos, []).append(f"block {b} slot {k} (w={w:.2e})")
        self.anchor_set = {blk["anchor"] for blk in self.blocks}

    @property
    def supervised(self) -> int:
        return sum(self.mask)

    def summary(self) -> str:
        s = (f"sample {self.index}: {self.length} tokens ({len(self.ids) - self.length} padding), "
             f"{self.supervised} supervised")
        if self.block_size:
            s += f", {len(self.blocks)} valid blocks of {self.block_size}"
        return s

    def supervised_text(self) -> list[str]:
        """The supervised spans decoded, one string per contiguous span (useful in tests and terminals)."""
        spans, cur = [], []
        for t, m in zip(self.ids, self.mask):
            if m:
                cur.append(t)
            elif cur:
                spans.append(self.tokenizer.decode(cur, skip_special_tokens=False))
                cur = []
        if cur:
            spans.append(self.tokenizer.decode(cur, skip_special_tokens=False))
        return spans

    def text(self) -> str:
        """Plain-text form: supervised spans in [[...]], anchors marked with a leading ^."""
        out, inside = [self.summary(), ""], False
        for pos in range(self.length):
            m = self.mask[pos]
            if m and not inside:
                out.append("[[")
            if not m and inside:
                out.append("]]")
            inside = m
            out.append(("^" if pos in self.anchor_set else "") + _tok_text(self.tokenizer, self.ids[pos]))
        if inside:
            out.append("]]")
        return "".join(out[:2]) + "\n" + "".join(out[2:])

    def html(self) -> str:
        e = html.escape
        parts = []
        for pos in range(len(self.ids)):
            if pos >= self.length:
                parts.append(f"<span class='pad' title='padding from {pos}'>… {len(self.ids) - pos} padding "
                             "tokens</span>")
                break
            tid = self.ids[pos]
            cls = ["s" if self.mask[pos] else "p"] + (["o"] if pos % 2 else [])  # alternate shades: token edges
            notes = self.cover.get(pos, [])
            if pos in self.anchor_set:
                cls.append("a")
            if any(n.startswith("block") for n in notes):
                cls.append("c")
            tip = f"pos {pos} | id {tid} | {'supervised' if self.mask[pos] else 'no loss'}"
            if notes:
                tip += " | " + "; ".join(notes[:6]) + (f" (+{len(notes) - 6})" if len(notes) > 6 else "")
            parts.append(f"<span class='{' '.join(cls)}' title='{e(tip, quote=True)}'>"
                         f"{_visible(_tok_text(self.tokenizer, tid))}</span>")
        body = f"<div class='dfi'>{''.join(parts)}</div>"
        table = ""
        if self.blocks:
            rows = []
            for blk in self.blocks[:self.max_blocks]:
                p = blk["anchor"]
                preds = "".join(
                    f"<span class='{'' if w > 0 else 'n'}'>{_visible(_tok_text(self.tokenizer, lab))}</span>|"
                    for _, lab, w in blk["slots"])
                rows.append(f"<tr><td>{blk['block']}</td><td>{p}</td><td>{_visible(_tok_text(self.tokenizer, self.ids[p]))}"
                            f"</td><td>{sum(w > 0 for _, _, w in blk['slots'])}</td><td>{preds}</td></tr>")
            more = len(self.blocks) - self.max_blocks
            if more > 0:
                rows.append(f"<tr><td colspan=5>… {more} more blocks</td></tr>")
            table = ("<table class='dft'><tr><th>block</th><th>anchor pos</th><th>anchor</th><th>slots with loss</th>"
                     f"<th>predicts (slots 1..B-1)</th></tr>{''.join(rows)}</table>")
        legend = ("<small><span style='color:#6b7280'>grey: no loss</span> · <span style='background:#dcfce7'>green: "
                  "supervised</span> · <span style='outline:2px solid #dc2626'>anchor</span> · <span style='text-"
                  "decoration:underline #2563eb 2px'>predicted by a block</span></small>")
        return f"{_CSS}<div><b>{e(self.summary())}</b><br>{legend}{body}{table}</div>"

    def _repr_html_(self) -> str:
        return self.html()

    def __repr__(self) -> str:
        return f"SampleView({self.summary()})"


def render_sample_html(tokenizer, batch, index: int, *, max_blocks: int = 64) -> str:
    """HTML of sample `index` of a BlockBatch (text, supervised spans, anchors, blocks) or of TokenizedData."""
    return SampleView(tokenizer, batch, index, max_blocks=max_blocks).html()


def supervised_positions(batch, index: int) -> torch.Tensor:
    """Positions with loss_mask 1 in row `index` (helper for tests and notebooks)."""
    return batch.loss_mask[index].nonzero().flatten()
