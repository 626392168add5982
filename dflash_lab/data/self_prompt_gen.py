"""Text in, turns out: the target continues many rendered prefixes through the batched generation engine.

`TurnGenerator.turns(prefixes, settings, keys)` tokenizes each prefix once (no special tokens added: the template
wrote them), generates with target/generate.py's engine (one replica per device, one shared queue, progress with
an ETA) until a stop token or `max_new_tokens`, and decodes the new tokens, stop token excluded, into the text of
one turn: (text, finish_reason, new tokens counted with the stop token); user turns are stripped of surrounding
whitespace, answers are kept exactly. The engine draws each token from a hash of
(seed, key, position), so a prompt's turn depends on its key and the seed only: not on the batch it fell into, the
device, or how many other prompts were asked for. Keys are sample indices, so the first N turns stay the same when
more are sampled.
"""

from __future__ import annotations

from dflash_lab.target.gen_devices import generate_on_devices, make_generators
from dflash_lab.target.sampling import GenerationSettings


class TurnGenerator:
    """Rendered prefixes -> decoded turns, on one engine per loaded target replica."""

    def __init__(self, models: list, tokenizer, *, stop_ids, max_batch: int = 256, max_len: int = 2048, log=print,
                 log_every_s: float = 10.0):
        self.tokenizer, self.stop_ids, self.log, self.log_every_s = tokenizer, set(stop_ids), log, log_every_s
        self.generators = make_generators(models, stop_ids=sorted(stop_ids), max_batch=max_batch, max_len=max_len)
        self.max_len = min(g.max_len for g in self.generators)
        """Positions per row (prompt + new tokens), capped by the target's context."""
        self.engine = f"target.generate on {', '.join(g.name for g in self.generators)}"

    def prompt_ids(self, prefixes: list[str]) -> list[list[int]]:
        return self.tokenizer(prefixes, add_special_tokens=False)["input_ids"] if prefixes else []

    def turns(self, prefixes: list[str], settings: GenerationSettings, keys: list[int], what: str = "turns", *,
              strip: bool = True) -> list[tuple[str, str, int]]:
        """strip: drop surrounding whitespace (user turns: the template renders them as given); answers keep the
        text exactly as generated, since the drafter is trained on those tokens."""
        if not prefixes:
            return []
        outs = generate_on_devices(self.generators, self.prompt_ids(prefixes), settings, keys=keys,
                                   log=lambda line: self.log(f"self-prompts ({what}): {line}"),
                                   log_every_s=self.log_every_s)
        result = []
        for g in outs:
            toks = g.token_ids
            if toks and toks[-1] in self.stop_ids:
                toks = toks[:-1]
            text = self.tokenizer.decode(toks, skip_special_tokens=False, clean_up_tokenization_spaces=False)
            result.append((text.strip() if strip else text, g.finish_reason, len(g.token_ids)))
        return result
