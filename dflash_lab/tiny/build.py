"""Build the tiny default target: synthetic chats -> byte-level BPE + chat template -> 8-layer Qwen3 trained on CPU.

`python -m dflash_lab.tiny.build [--out DIR] [--force]` writes DIR/data/{train,heldout}.jsonl and DIR/tiny-qwen3/
(config, float32 safetensors, tokenizer, chat template, build_info.json). DIR defaults to the committed assets.
Trade-off, with numbers: the model is 1.1M parameters (4.4 MB float32) so that the committed assets stay under
~6 MB and the build takes ~4 minutes on 2 idle CPU cores (760 steps of 4096 tokens). The committed build reaches
train loss 0.096 and 97.5% teacher-forced next-token accuracy on held-out answers: its outputs are structured and
predictable, which is the point. Greedy answers match the reference exactly for only ~7% of held-out prompts: the
1.1M-parameter model often miscopies a prompt's first number, then keeps the structure (counts on from there).
The build is deterministic (fixed seeds, 2 threads, fixed step count; no wall-clock-dependent decisions).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import shutil
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from dflash_lab.tiny import tasks

ASSETS_DIR = Path(__file__).resolve().parent / "assets"
MODEL_SUBDIR = "tiny-qwen3"
DATA_SUBDIR = "data"

SEED = 0
N_TRAIN = 4000
N_HELDOUT = 100
BPE_VOCAB = 950              # tokenizer size incl. the 256 byte symbols and the special tokens
MIN_ASSISTANT_TOKENS = 40    # every conversation has at least this many assistant content tokens
TRAIN_STEPS = 760
BATCH_TOKENS = 4096          # padded tokens per step (length-bucketed batches, so padding is small)
LR, MIN_LR, WARMUP = 3e-3, 3e-4, 40
PROMPT_LOSS_WEIGHT = 0.1     # a little loss on the non-assistant tokens too
EVAL_MAX_NEW_TOKENS = 200

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"]
THINK_TOKENS = ["<think>", "</think>"]   # added tokens, but not "special": decoding keeps them (as in Qwen3)

# ChatML in the Qwen3 style. Assistant turns after the last user message carry a <think> block (empty when there is
# no reasoning); earlier assistant turns drop their reasoning. The generation prompt of enable_thinking=False
# pre-fills the empty block. {% generation %} marks what the assistant writes, for return_assistant_tokens_mask.
CHAT_TEMPLATE = r"""{%- set ns = namespace(last_user=-1) -%}
{%- for message in messages -%}
{%- if message.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}
{%- endfor -%}
{%- for message in messages -%}
{%- if message.role == 'assistant' -%}
{%- set content = message.content if message.content is string else '' -%}
{%- set reasoning = '' -%}
{%- if message.reasoning_content is string -%}
{%- set reasoning = message.reasoning_content -%}
{%- elif '</think>' in content -%}
{%- set reasoning = content.split('</think>')[0].split('<think>')[-1] -%}
{%- set content = content.split('</think>')[-1] -%}
{%- endif -%}
{{- '<|im_start|>assistant\n' -}}
{%- generation -%}
{%- if loop.index0 > ns.last_user -%}
{{- '<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' -}}
{%- endif -%}
{{- content.lstrip('\n') + '<|im_end|>' -}}
{%- endgeneration -%}
{{- '\n' -}}
{%- else -%}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\n' -}}
{%- if enable_thinking is defined and enable_thinking is false -%}
{{- '<think>\n\n</think>\n\n' -}}
{%- endif -%}
{%- endif -%}"""


# ---- data ---------------------------------------------------------------------------------------------------------

def write_jsonl(path: Path, convs: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for c in convs:
            f.write(json.dumps(c, ensure_ascii=False) + "\n")


def read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


# ---- tokenizer ----------------------------------------------------------------------------------------------------

def train_tokenizer(convs: list[dict]) -> PreTrainedTokenizerFast:
    """Byte-level BPE on the message texts; deterministic for a given corpus."""
    tok = Tokenizer(models.BPE())
    # Every "\n" is its own token: otherwise "</think>\n\n" at the end of a generation prompt tokenizes as one
    # "\n\n" token while the same text followed by an answer tokenizes as "\n", "\n" (train/serve mismatch).
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split("\n", behavior="isolated"), pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=BPE_VOCAB, special_tokens=SPECIAL_TOKENS + THINK_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), min_frequency=2,
                                  show_progress=False)
    texts = [m["content"].replace("<think>", "").replace("</think>", "") for c in convs for m in c["messages"]]
    texts += ["user", "assistant", "system"]
    tok.train_from_iterator(texts, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", mask_token="<|mask|>",
        extra_special_tokens=["<|im_start|>", "<|im_end|>"], clean_up_tokenization_spaces=False,
        model_max_length=1024)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def encode_conversation(tokenizer, conv: dict) -> tuple[list[int], list[int]]:
    """(input_ids, assistant mask) of the rendered chat."""
    enc = tokenizer.apply_chat_template(conv["messages"], tokenize=True, return_dict=True,
                                        return_assistant_tokens_mask=True)
    return list(enc["input_ids"]), list(enc["assistant_masks"])


def assistant_content_tokens(tokenizer, conv: dict) -> int:
    """Assistant answer tokens (content only, without think block / <|im_end|>): the >= 40 rule counts these."""
    return sum(len(tokenizer.encode(tasks.split_thinking(m["content"])[1], add_special_tokens=False))
               for m in conv["messages"] if m["role"] == "assistant")


# ---- model --------------------------------------------------------------------------------------------------------

def model_config(tokenizer) -> Qwen3Config:
    vocab = 64 * math.ceil(len(tokenizer) / 64)   # spare rows past the tokenizer, like real Qwen3 checkpoints
    eot, im_end = tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>"])
    return Qwen3Config(
        vocab_size=vocab, hidden_size=128, intermediate_size=192, num_hidden_layers=8, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, max_position_embeddings=1024, rope_theta=10000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=True, bos_token_id=eot, eos_token_id=im_end, pad_token_id=eot, dtype="float32")


# ---- training -----------------------------------------------------------------------------------------------------

def make_batches(examples: list[tuple[list[int], list[float]]], rng: random.Random, pad_id: int):
    """One epoch of length-bucketed batches of <= BATCH_TOKENS padded tokens, in random order.
    Right padding and no attention mask: with causal attention real tokens never see the pads after them."""
    order = sorted(range(len(examples)), key=lambda i: (len(examples[i][0]), rng.random()))
    batches, cur = [], []
    for i in order:
        if cur and (len(cur) + 1) * len(examples[i][0]) > BATCH_TOKENS:
            batches.append(cur)
            cur = []
        cur.append(i)
    batches.append(cur)
    rng.shuffle(batches)
    for idx in batches:
        T = max(len(examples[i][0]) for i in idx)
        ids = torch.full((len(idx), T), pad_id, dtype=torch.long)
        w = torch.zeros((len(idx), T))
        for r, i in enumerate(idx):
            x, m = examples[i]
            ids[r, :len(x)] = torch.tensor(x)
            w[r, :len(m)] = torch.tensor(m)
        yield ids, w  # (b, T), (b, T): w[t] weighs the prediction OF token t


def lr_at(step: int) -> float:
    if step < WARMUP:
        return LR * (step + 1) / WARMUP
    p = (step - WARMUP) / max(1, TRAIN_STEPS - WARMUP)
    return MIN_LR + 0.5 * (LR - MIN_LR) * (1 + math.cos(math.pi * p))


def train(model, examples, pad_id: int, log=print) -> float:
    rng = random.Random(SEED)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.95), weight_decay=0.01)
    model.train()
    t0 = last_print = time.time()
    step, recent, batches = 0, [], iter(())
    while step < TRAIN_STEPS:
        batch = next(batches, None)
        if batch is None:
            batches = make_batches(examples, rng, pad_id)
            continue
        ids, w = batch
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        logits = model(input_ids=ids[:, :-1]).logits            # (b, T-1, V)
        ce = F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten(), reduction="none")
        wt = w[:, 1:].flatten()
        loss = (ce * wt).sum() / wt.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        asst = w[:, 1:].flatten() == 1.0
        recent.append((ce.detach()[asst].mean().item()))   # assistant-token loss, the one that matters
        recent = recent[-20:]
        step += 1
        if time.time() - last_print > 5 or step == TRAIN_STEPS:
            last_print = time.time()
            log(f"  step {step:4d}/{TRAIN_STEPS}  loss {sum(recent) / len(recent):.4f}  "
                f"lr {lr_at(step - 1):.2e}  {time.time() - t0:5.1f}s")
    return sum(recent) / len(recent)


# ---- evaluation ---------------------------------------------------------------------------------------------------

@torch.no_grad()
def greedy_answers(model, tokenizer, convs: list[dict], batch_size: int = 25,
                   max_new_tokens: int = EVAL_MAX_NEW_TOKENS) -> list[str]:
    """Greedy answers (thinking off) to each conversation's last user turn; left-padded batches."""
    model.eval()
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    prompts = [tokenizer.apply_chat_template(c["messages"][:-1], tokenize=False, add_generation_prompt=True,
                                             enable_thinking=False) for c in convs]
    out = []
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    try:
        for i in range(0, len(prompts), batch_size):
            enc = tokenizer(prompts[i:i + batch_size], return_tensors="pt", padding=True, add_special_tokens=False)
            gen = model.generate(**enc, do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=im_end,
                                 pad_token_id=tokenizer.pad_token_id)
            new = gen[:, enc["input_ids"].shape[1]:]
            out += tokenizer.batch_decode(new, skip_special_tokens=True)
    finally:
        tokenizer.padding_side = side
    return out


def exact_match(model, tokenizer, convs: list[dict], **kw) -> float:
    answers = greedy_answers(model, tokenizer, convs, **kw)
    return sum(a == c["messages"][-1]["content"] for a, c in zip(answers, convs)) / len(convs)


# ---- the build ----------------------------------------------------------------------------------------------------

def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def is_built(out: Path) -> bool:
    m = out / MODEL_SUBDIR
    return all(p.exists() for p in [m / "config.json", m / "model.safetensors", m / "tokenizer.json",
                                     m / "build_info.json", out / DATA_SUBDIR / "train.jsonl",
                                     out / DATA_SUBDIR / "heldout.jsonl"])


def build(out: Path = ASSETS_DIR, force: bool = False, log=print) -> Path:
    """Build everything into `out` (model dir `out/tiny-qwen3`, data `out/data`); returns the model dir."""
    out = Path(out)
    model_dir = out / MODEL_SUBDIR
    if is_built(out) and not force:
        log(f"tiny target already built at {model_dir} (pass --force to rebuild)")
        return model_dir
    t_start = time.time()
    torch.set_num_threads(2)
    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)

    log(f"[1/5] generating {N_TRAIN} train + {N_HELDOUT} held-out conversations (seed {SEED})")
    train_convs, heldout = tasks.make_datasets(SEED, N_TRAIN, N_HELDOUT + 50)  # spares for the length filter

    log(f"[2/5] training a byte-level BPE tokenizer (vocab {BPE_VOCAB})")
    tokenizer = train_tokenizer(train_convs)
    # A few short draws (e.g. 8 numbered lines) fall under MIN_ASSISTANT_TOKENS: drop them, counted, and keep
    # exactly N_HELDOUT held-out conversations from the spares.
    def long_enough(convs: list[dict]) -> list[dict]:
        return [c for c in convs if assistant_content_tokens(tokenizer, c) >= MIN_ASSISTANT_TOKENS]

    n_train, n_heldout = len(train_convs), len(heldout)
    train_convs, heldout = long_enough(train_convs), long_enough(heldout)[:N_HELDOUT]
    log(f"      dropped {n_train - len(train_convs)} train conversations with < {MIN_ASSISTANT_TOKENS} assistant "
        f"tokens; held-out: {len(heldout)} of {n_heldout} drawn")
    if len(heldout) < N_HELDOUT:
        raise RuntimeError(f"only {len(heldout)} held-out conversations have >= {MIN_ASSISTANT_TOKENS} assistant "
                           "tokens; lengthen the short tasks in dflash_lab/tiny/tasks.py")
    for convs in (train_convs, heldout):
        if any("<|mask|>" in m["content"] for c in convs for m in c["messages"]):
            raise RuntimeError("the DFlash mask token <|mask|> occurs in the data; it must stay unused")

    log("[3/5] tokenizing with the chat template")
    examples = []
    for c in train_convs:
        ids, mask = encode_conversation(tokenizer, c)
        examples.append((ids, [1.0 if m else PROMPT_LOSS_WEIGHT for m in mask]))
    n_tok = sum(len(x) for x, _ in examples)
    log(f"      {n_tok} tokens, {n_tok / len(examples):.0f} per conversation, longest {max(len(x) for x, _ in examples)}")

    config = model_config(tokenizer)
    model = Qwen3ForCausalLM(config)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"[4/5] training Qwen3 {config.num_hidden_layers}x{config.hidden_size} ({n_params / 1e6:.2f}M params, "
        f"vocab {config.vocab_size}) for {TRAIN_STEPS} steps of <= {BATCH_TOKENS} tokens")
    t_train = time.time()
    final_loss = train(model, examples, tokenizer.pad_token_id, log=log)
    train_s = time.time() - t_train

    log(f"[5/5] greedy generation on {len(heldout)} held-out prompts")
    t_eval = time.time()
    em = exact_match(model, tokenizer, heldout)
    log(f"      held-out exact match {em:.1%} ({time.time() - t_eval:.0f}s)")

    if model_dir.exists():
        shutil.rmtree(model_dir)
    model_dir.mkdir(parents=True)
    model.generation_config.eos_token_id = [config.eos_token_id, config.bos_token_id]  # <|im_end|>, <|endoftext|>
    model.generation_config.pad_token_id = config.pad_token_id
    model.generation_config.bos_token_id = config.bos_token_id
    model.save_pretrained(model_dir, safe_serialization=True)
    tokenizer.save_pretrained(model_dir)
    write_jsonl(out / DATA_SUBDIR / "train.jsonl", train_convs)
    write_jsonl(out / DATA_SUBDIR / "heldout.jsonl", heldout)
    info = {
        "seed": SEED, "steps": TRAIN_STEPS, "batch_tokens": BATCH_TOKENS, "lr": LR,
        "final_train_loss": round(final_loss, 5), "heldout_exact_match": em, "n_params": n_params,
        "vocab_size": config.vocab_size, "tokenizer_size": len(tokenizer),
        "mask_token_id": tokenizer.mask_token_id, "n_train": len(train_convs), "n_heldout": len(heldout),
        "train_tokens": n_tok, "train_seconds": round(train_s, 1), "wall_seconds": round(time.time() - t_start, 1),
        "model_safetensors_sha256": sha256_file(model_dir / "model.safetensors"),
        "torch": torch.__version__, "transformers": __import__("transformers").__version__,
    }
    (model_dir / "build_info.json").write_text(json.dumps(info, indent=2) + "\n")
    log(f"saved {model_dir} in {info['wall_seconds']:.0f}s: loss {final_loss:.4f}, held-out exact match {em:.1%}")
    return model_dir


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ASSETS_DIR, help="assets root (default: the committed assets)")
    p.add_argument("--force", action="store_true", help="rebuild even if the artefacts exist")
    args = p.parse_args(argv)
    build(args.out, force=args.force, log=lambda s: print(s, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
