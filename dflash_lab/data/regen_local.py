"""Regeneration with a local Hugging Face target: batched, left-padded generation on one device per replica, the
check that batched greedy matches single-sequence greedy, and loading one generator per device.

A back end maps a list of histories to a list of (text, finish_reason, new_tokens); the server back end is
regen_server.py, the resumable driver around both is regenerate.py.
"""

from __future__ import annotations

import copy
import time

import torch

from dflash_lab.target.sampling import MIN_SAMPLING_TEMPERATURE

from .chat_formats import DataError


class HFGenerator:
    """Batched generation with a Hugging Face causal LM on one device (left padding, stop at end-of-turn/eos)."""

    def __init__(self, model, tokenizer, sampling):
        """`sampling`: target/sampling.py's GenerationSettings (temperature, top_p, top_k, max_new_tokens,
        enable_thinking)."""
        self.model, self.tokenizer, self.sampling = model, tokenizer, sampling
        self.device = next(model.parameters()).device
        stop = getattr(model.generation_config, "eos_token_id", None)
        stop = set(stop if isinstance(stop, (list, tuple)) else [stop] if stop is not None else [])
        if tokenizer.eos_token_id is not None:
            stop.add(tokenizer.eos_token_id)
        from .tokenize import ChatTemplate

        eot = ChatTemplate(tokenizer).end_of_turn
        if eot is not None:
            stop.add(tokenizer.convert_tokens_to_ids(eot))
        if not stop:
            raise DataError(f"tokenizer {tokenizer.name_or_path} has no eos token and the template no end-of-turn "
                            "token: generation would never stop. Fix: set generation_config.eos_token_id.")
        self.stop_ids = sorted(stop)
        if tokenizer.pad_token is None:
            # Llama-family tokenizers (SmolLM2 from its GGUF, Llama 3) ship no pad token and batched encoding refuses
            # to pad ("Asking to pad but the tokenizer does not have a padding token"). Left padding is masked out
            # by the attention mask, so the pad id's value never reaches an answer: the first stop token serves.
            tokenizer.pad_token = tokenizer.convert_ids_to_tokens(self.stop_ids[0])
        self.pad_id = tokenizer.pad_token_id
        self.kwargs = {} if sampling.enable_thinking is None else {"enable_thinking": sampling.enable_thinking}

    def prompt(self, history: list[dict]) -> str:
        return self.tokenizer.apply_chat_template(history, tokenize=False, add_generation_prompt=True, **self.kwargs)

    # Attention scores one generate() call may hold: rows x (padded prompt + new tokens)^2, per head. The math SDPA
    # path (fp32 with a padding mask) materialises them: 128 rows around one 4,800-token chitchat prompt asked for
    # 107 GiB on an H200. Batches over the budget are split into consecutive sub-batches.
    ATTENTION_BUDGET = 1_200_000_000

    def __call__(self, histories: list[list[dict]], seed: int) -> list[tuple[str, str, int]]:
        prompts = [self.prompt(h) for h in histories]
        longest = max(len(self.tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts)
        rows = max(1, self.ATTENTION_BUDGET // (longest + self.sampling.max_new_tokens) ** 2)
        out = []
        for i in range(0, len(prompts), rows):  # same seed per sub-batch: a split never changes greedy answers
            out += self._generate(prompts[i:i + rows], seed + i)
        return out

    @torch.no_grad()
    def _generate(self, prompts: list[str], seed: int) -> list[tuple[str, str, int]]:
        s = self.sampling
        enc = self.tokenizer(prompts, return_tensors="pt", padding=True,
                             padding_side="left", add_special_tokens=False).to(self.device)
        # Every sampling knob explicitly: unset values would be filled from the model's generation_config (e.g.
        # Qwen3 ships top_k=20, temperature=0.6), so the recorded settings would not be what was used.
        kw = dict(max_new_tokens=s.max_new_tokens, eos_token_id=self.stop_ids, pad_token_id=self.pad_id,
                  do_sample=s.temperature > 0, repetition_penalty=1.0, no_repeat_ngram_size=0)
        if s.temperature > 0:  # the warpers act only when sampling (greedy ignores them)
            # floored as the engine floors it: Hugging Face divides the logits by T before any softmax, and at
            # T = 1e-40 they overflow to inf and the draw fails on NaN probabilities
            kw.update(temperature=max(s.temperature, MIN_SAMPLING_TEMPERATURE), top_p=s.top_p, top_k=s.top_k,
                      min_p=0.0)
            if self.device.type == "cuda":
                with torch.cuda.device(self.device):
                    torch.cuda.manual_seed(seed)
            else:
                torch.manual_seed(seed)
        out = self.model.generate(**enc, **kw)
        new = out[:, enc["input_ids"].shape[1]:].tolist()  # .tolist() syncs
        stops = set(self.stop_ids)
        results = []
        for row in new:
            end = next((i for i, t in enumerate(row) if t in stops), None)
            toks = row if end is None else row[:end]
            text = self.tokenizer.decode(toks, skip_special_tokens=False)
            results.append((text, "length" if end is None else "stop", len(row) if end is None else end + 1))
        return results


def greedy_match_check(gen: HFGenerator, histories: list[list[dict]], batch_size: int) -> dict:
    """Does batched, left-padded greedy reproduce what the target says ALONE (batch 1, as served)? Generates each
    history both ways with the same model and dtype and compares token ids. In bf16, batching changes reduction
    orders and flips near-tied argmaxes (11 of 24 SmolLM2 prompts diverged on CPU; 0 of 24 in fp32), so
    the training text would not be the served text: record the rate and regenerate in the dtype that matches."""
    t0 = time.perf_counter()
    batched = []
    for b0 in range(0, len(histories), batch_size):
        batched += gen(histories[b0:b0 + batch_size], seed=0)
    single = [gen([h], seed=0)[0] for h in histories]
    diverged = []
    for i, ((tb, _, nb), (ts, _, ns)) in enumerate(zip(batched, single)):
        if tb != ts:
            a, b = gen.tokenizer.encode(tb, add_special_tokens=False), gen.tokenizer.encode(ts, add_special_tokens=False)
            first = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            diverged.append({"index": i, "first_differing_token": first, "batched_tokens": nb, "single_tokens": ns})
    n = len(histories)
    return {"checked": n, "identical": n - len(diverged), "match_rate": round((n - len(diverged)) / max(n, 1), 4),
            "dtype": str(next(gen.model.parameters()).dtype).replace("torch.", ""), "device": str(gen.device),
            "batch_size": min(batch_size, n), "diverged": diverged, "seconds": round(time.perf_counter() - t0, 2),
            "summary": f"{n - len(diverged)}/{n} identical to single-sequence greedy"}


class PromptFit:
    """Does a prompt plus its longest answer fit the target's positions (max_position_embeddings)? Past them a model
    answers with garbage (positions it never saw), which would be written as training data: such a conversation is
    skipped and counted instead. Independent of the back end that generates."""

    def __init__(self, tokenizer, max_positions: int | None, sampling):
        self.tokenizer, self.max_positions, self.max_new = tokenizer, max_positions, sampling.max_new_tokens
        self.kwargs = {} if sampling.enable_thinking is None else {"enable_thinking": sampling.enable_thinking}

    @classmethod
    def of(cls, target: str, sampling, models: dict | None) -> "PromptFit":
        from dflash_lab.target.load import load_target_config, load_tokenizer

        configs = [m.config for m in (models or {}).values()] or [load_target_config(target)]
        limits = [c.max_position_embeddings for c in configs if getattr(c, "max_position_embeddings", None)]
        return cls(load_tokenizer(target), min(limits) if limits else None, sampling)

    def prompt_tokens(self, history: list[dict]) -> int:
        """Tokens of `history` rendered as the prompt of its next answer."""
        text = self.tokenizer.apply_chat_template(history, tokenize=False, add_generation_prompt=True, **self.kwargs)
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def problem(self, history: list[dict]) -> str | None:
        """Why `history` cannot be answered within the context, or None when it fits."""
        if self.max_positions is None:
            return None
        n = self.prompt_tokens(history)
        if n + self.max_new <= self.max_positions:
            return None
        return (f"its prompt has {n:,} tokens; with max_new_tokens={self.max_new} that exceeds the target's "
                f"{self.max_positions:,} positions (counted under skipped 'too_long_for_context')")


DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """"auto" = bf16 on CUDA, fp32 on CPU; otherwise the named dtype."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[name]


def check_devices(devices) -> list[torch.device]:
    """The devices regeneration will load replicas on; DataError naming a bad or absent one and the fix."""
    if isinstance(devices, str) or not devices:
        raise DataError(f"devices={devices!r} is invalid: need a non-empty list. Fix: e.g. --devices cpu, or "
                        "--devices cuda:0 cuda:1.")
    out = []
    for name in devices:
        try:
            dev = torch.device(name)
        except (RuntimeError, TypeError):
            raise DataError(f"device {name!r} is not a device name. Fix: cpu or cuda:N.") from None
        if dev.type == "cuda":
            count = torch.cuda.device_count() if torch.cuda.is_available() else 0
            if (dev.index or 0) >= count:
                raise DataError(f"device {name!r}: this machine sees {count} CUDA GPU(s). Fix: --devices cpu"
                                + (f", or cuda:0..cuda:{count - 1}" if count else "") + ".")
        elif dev.type != "cpu":
            raise DataError(f"device {name!r}: regeneration runs on cpu or cuda:N. Fix: --devices cpu or cuda:0.")
        out.append(dev)
    return out


def generation_dtype(devices, dtype: str, models: dict | None) -> str:
    """The one dtype every replica answers in ("float32", "bfloat16", ...): answers of two precisions differ, so a
    mix (e.g. cpu + cuda under "auto") is refused rather than written into one file."""
    if dtype != "auto" and dtype not in DTYPES:
        raise DataError(f"dtype={dtype!r} is invalid. Fix: one of auto, {', '.join(DTYPES)}.")
    found = {}
    for name, dev in zip(devices, check_devices(devices)):
        model = (models or {}).get(name)
        found[name] = next(model.parameters()).dtype if model is not None else resolve_dtype(dtype, dev)
    shown = {name: str(d).replace("torch.", "") for name, d in found.items()}
    if len(set(shown.values())) > 1:
        raise DataError(f"the replicas would answer in different dtypes {shown}: one file must hold answers of one "
                        "precision. Fix: pass --dtype float32 (or bfloat16) explicitly, or use devices of one kind.")
    return next(iter(shown.values()))


def load_generators(target, devices, sampling, dtype, models, log) -> list[HFGenerator]:
    """One HFGenerator per device: the target loaded there (or taken from `models`), each with its own tokenizer."""
    from dflash_lab.target.load import load_target, load_tokenizer

    tokenizer = load_tokenizer(target)
    gens = []
    for name in devices:
        dev = torch.device(name)
        if models and name in models:
            model = models[name]
        else:
            t0 = time.perf_counter()
            model = load_target(target, device=dev, dtype=resolve_dtype(dtype, dev))
            log(f"regenerate: loaded {target} on {dev} in {time.perf_counter() - t0:.1f}s")
        # one tokenizer per device thread: a fast tokenizer's padding state is per object
        gens.append(HFGenerator(model, tokenizer if not gens else copy.deepcopy(tokenizer), sampling))
    return gens
