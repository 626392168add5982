"""Why is simulated tau above real tau? Measure every candidate cause on one trained drafter (docs/tau-gap.md).

    python bench/tau_gap.py [--steps 600] [--n 20] [--max-new-tokens 128] [--target tiny] [--device cpu]
                            [--drafter saved.pt] [--out tau_gap.json]

Trains the demo shape (or loads --drafter), then per prompt set (train / held-out conversations) reports:
  sim_tau_mean   the old training metric: arithmetic mean over anchors of 1 + leading correct slots
  sim_tau        the training metric now (step.block_stats)
  chain_tau_data replay of speculative decoding on the DATA answer (jump by the acceptance length)
  chain_tau_gen  the same replay on the target's own greedy answer (what serving verifies against)
  real_tau       SpeculativeDecoder at T=0 on the same prompts (pooled over iterations)
  greedy_match   fraction of answers whose first max_new_tokens data tokens equal the target's greedy output
Teacher-forced numbers use every valid anchor of the final assistant turn.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from dflash_lab.config import TrainConfig
from dflash_lab.data.tokenize import ChatTemplate, read_conversations, resolve_data_path, tokenize_conversation
from dflash_lab.evaluation.speculative import SpeculativeDecoder
from dflash_lab.drafter.step import block_stats
from dflash_lab.target.features import FeatureExtractor, embedding_of, lm_head_weight
from dflash_lab.train.trainer import Trainer
from dflash_lab.train.validation import acceptance_lengths, chain_tau, heldout_source, teacher_forced

DEMO = dict(target="tiny", data="tiny", block_size=8, num_anchors=24, seq_len=192, batch_size=8,
            num_draft_layers=2, lr=3e-3, seed=0, log_every=50)


def last_turn_only(loss_mask: torch.Tensor) -> torch.Tensor:
    """Keep the loss mask of the final assistant span only (what a prompt without its last answer generates)."""
    m = loss_mask.clone()
    idx = m.nonzero().flatten().tolist()
    if not idx:
        return m
    start = idx[-1]
    while start - 1 >= 0 and m[start - 1]:
        start -= 1
    m[:start] = False
    return m


def measure(trainer, conversations, n: int, max_new_tokens: int, log) -> dict:
    tok, target, drafter = trainer.tokenizer, trainer.target, trainer.drafter
    cfg, dcfg = trainer.config, trainer.drafter_config
    B = dcfg.block_size
    ext = FeatureExtractor(target, dcfg.target_layer_ids, fused_norms=False)
    embed, head = embedding_of(target), lm_head_weight(target)
    tmpl = ChatTemplate(tok, enable_thinking=cfg.enable_thinking)
    dec = SpeculativeDecoder(target, drafter, block_size=B, eos_token_id=tok.eos_token_id)
    rows = {"data": [], "gen": []}
    accepted, match, diverge = [], 0, []
    drafter.eval()
    for conv in conversations[:n]:
        msgs = conv.messages
        ids, mask = tokenize_conversation(tok, msgs, enable_thinking=cfg.enable_thinking, template=tmpl)
        ids, mask = torch.tensor(ids)[None], last_turn_only(torch.tensor(mask, dtype=torch.bool))[None]
        start = int(mask[0].nonzero()[0])
        prompt = ids[0, :start].tolist()
        g = dec.generate(prompt, max_new_tokens=max_new_tokens, temperature=0.0)
        accepted += g.accepted
        data_answer = ids[0, start:start + len(g.output_ids)].tolist()
        match += data_answer == g.output_ids
        diverge.append(next((i for i, (a, b) in enumerate(zip(data_answer, g.output_ids)) if a != b),
                            min(len(data_answer), len(g.output_ids))))
        # cut the data answer to the same number of tokens the real decoder produced
        end = start + len(g.output_ids)
        for kind, seq in (("data", ids[:, :end]), ("gen", torch.tensor([prompt + g.output_ids]))):
            m = torch.zeros_like(seq, dtype=torch.bool)
            m[0, start:] = True
            tf = teacher_forced(drafter, ext, embed, head, seq, m, block_size=B, mask_token_id=dcfg.mask_token_id,
                                gamma=cfg.resolved_gamma)
            rows[kind].append(tf)
    out = {"prompts": len(rows["data"]), "real_tau": sum(accepted) / len(accepted) + 1, "greedy_match": match / n,
           "first_divergence": diverge}
    for kind, tfs in rows.items():
        correct = torch.cat([t["correct"].flatten(0, 1) for t in tfs])[None]
        has = torch.cat([t["has_loss"].flatten(0, 1) for t in tfs])[None]
        st = block_stats(correct, has)
        lengths = acceptance_lengths(correct, has)[0]
        scored = has[0, :, 0]
        tok_, it_ = 0, 0
        for t in tfs:
            _, a, b = chain_tau(acceptance_lengths(t["correct"], t["has_loss"]), t["anchors"], t["valid"])
            tok_, it_ = tok_ + a, it_ + b
        out[kind] = {"acc": float(st["acc"]), "sim_tau": float(st["sim_tau"]),
                     "sim_tau_mean": float(lengths[scored].float().mean()),
                     "sim_tau_harmonic": float(1 / (1 / lengths[scored].float()).mean()),
                     # the method doc's formula read with per-slot accuracies averaged BEFORE the product
                     "sim_tau_slot_product": float(1 + torch.cumprod(st["slot_acc"], 0).sum()),
                     "chain_tau": tok_ / it_}
    log(json.dumps(out))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--drafter", default=None, help="load drafter weights saved by an earlier run (skip training)")
    ap.add_argument("--save", default=None, help="save the trained drafter's state_dict here")
    ap.add_argument("--config", default="{}", help="JSON overrides of the demo TrainConfig, e.g. a real target: "
                    '\'{"target": "...", "data": "train.jsonl", "devices": ["cuda:0"], "block_size": 16}\'')
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = TrainConfig(**{**DEMO, "steps": args.steps, **json.loads(args.config)})
    trainer = Trainer(cfg, write_run_dir=False, log=lambda *a: print(*a, flush=True))
    t0 = time.perf_counter()
    if args.drafter:
        trainer.drafter.load_state_dict(torch.load(args.drafter))
    else:
        trainer.train(progress_every_s=30)
        if args.save:
            torch.save(trainer.drafter.state_dict(), args.save)
    last = trainer.last_metrics or {}
    print(f"train {time.perf_counter() - t0:.0f}s; last training sim tau {last.get('sim_tau')}", flush=True)
    sets = {"train": (resolve_data_path(cfg.data), None)}
    held = heldout_source(cfg.data, cfg.heldout_data)
    if held is not None:
        sets["heldout"] = held
    res = {}
    for name, (path, split) in sets.items():
        convs = read_conversations(path, split=split).conversations
        res[name] = measure(trainer, convs, args.n, args.max_new_tokens, lambda s: print(name, s, flush=True))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"config": cfg.to_dict(), "results": res}, f, indent=2)
    trainer.close()


if __name__ == "__main__":
    main()
