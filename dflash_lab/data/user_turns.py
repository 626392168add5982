"""Where a user turn starts and ends in any chat template, so the target can be asked to write one.

A chat model has learned what follows its user header: a user's request. Rendering a conversation whose last
message is a user turn holding a sentinel, and cutting the text at the sentinel, gives exactly what the template
puts before a user's words: for a first turn the system turn the template renders when given none (SmolLM2's "You
are a helpful AI assistant named SmolLM...", Llama 3's knowledge-date block, Qwen2.5's "You are Qwen...") and the
user header (`<|im_start|>user\\n`, `<|start_header_id|>user<|end_header_id|>\\n\\n`); for a later turn the
conversation so far as the template renders it. No template is special-cased. The user turn ends where the template
closes it: the first special token after the sentinel (`<|im_end|>`, `<|eot_id|>`), which becomes a stop token.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .chat_formats import DataError

SENTINEL = "dflash user probe 4817"


def _render(tokenizer, messages: list[dict], add_generation_prompt: bool, kwargs: dict) -> str:
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                             **kwargs)
    except Exception as e:  # jinja raises TemplateError, ValueError, ... for conversations it refuses
        raise DataError(f"the chat template of {getattr(tokenizer, 'name_or_path', '?')} refused to render "
                        f"{[m['role'] for m in messages]} ({type(e).__name__}: {e}). Fix: use a chat template that "
                        "renders a conversation ending in a user turn.") from None


def special_tokens(tokenizer) -> list[str]:
    """Every special token of the tokenizer (named ones and added special tokens), longest first."""
    added = {t.content for t in getattr(tokenizer, "added_tokens_decoder", {}).values() if getattr(t, "special", 0)}
    named = set(getattr(tokenizer, "all_special_tokens", []))
    return sorted((added | named) - {"", None}, key=lambda s: (-len(s), s))


@dataclass(frozen=True)
class UserTurnFormat:
    """What the template puts around a user's words, derived once from the tokenizer."""

    first_prefix: str
    """Text before the first user turn's words: the default system turn (if any) and the user header."""
    end_of_turn: str
    """The special token that closes a user turn (generation stops there)."""
    stop_ids: tuple[int, ...]
    """Token ids that end a generated turn: the user's and assistant's end-of-turn tokens and the eos token."""
    markers: tuple[str, ...]
    """Strings a user turn must not contain: special tokens and the assistant header (leaked template markup)."""
    enable_thinking: bool | None = None

    @classmethod
    def of(cls, tokenizer, *, enable_thinking: bool | None = None) -> "UserTurnFormat":
        kw = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
        name = getattr(tokenizer, "name_or_path", "?")
        if not getattr(tokenizer, "chat_template", None):
            raise DataError(f"tokenizer {name} has no chat template, so there is no user header to sample from. "
                            "Fix: use the chat/instruct model's tokenizer.")
        user = [{"role": "user", "content": SENTINEL}]
        text = _render(tokenizer, user, False, kw)
        first_prefix = cut_at_sentinel(text, name)
        specials = special_tokens(tokenizer)
        after = text[text.find(SENTINEL) + len(SENTINEL):]
        found = re.search("|".join(map(re.escape, specials)), after) if specials else None
        if found is None or after[:found.start()].strip():
            raise DataError(f"the chat template of {name} does not close a user turn with a special token (after "
                            f"the user's words it renders {after[:60]!r}), so generation would not know where a "
                            "user turn ends. Fix: use a chat model whose template ends turns with a special token "
                            "(<|im_end|>, <|eot_id|>, ...).")
        eot = found.group(0)
        answer_eot = _assistant_end_of_turn(tokenizer, kw, specials)
        stops = {tokenizer.convert_tokens_to_ids(t) for t in (eot, answer_eot) if t}
        eos = tokenizer.eos_token_id
        stops |= set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        header = _render(tokenizer, user, True, kw)[len(text):].strip()  # the assistant header
        markers = tuple(specials) + ((header,) if header and not any(s in header for s in specials) else ())
        return cls(first_prefix=first_prefix, end_of_turn=eot, stop_ids=tuple(sorted(stops)), markers=markers,
                   enable_thinking=enable_thinking)

    @property
    def template_kwargs(self) -> dict:
        return {} if self.enable_thinking is None else {"enable_thinking": self.enable_thinking}

    def user_prefix(self, tokenizer, history: list[dict]) -> str:
        """The text the target continues to write the next user turn after `history` (user/assistant messages)."""
        if not history:
            return self.first_prefix
        text = _render(tokenizer, history + [{"role": "user", "content": SENTINEL}], False, self.template_kwargs)
        return cut_at_sentinel(text, getattr(tokenizer, "name_or_path", "?"))

    def answer_prompt(self, tokenizer, history: list[dict]) -> str:
        """The serving prompt for the assistant's answer to the last user turn of `history`."""
        return _render(tokenizer, history, True, self.template_kwargs)


def cut_at_sentinel(text: str, name: str = "?") -> str:
    if text.count(SENTINEL) != 1:
        raise DataError(f"the chat template of {name} rendered the user's words {text.count(SENTINEL)} times "
                        f"(expected once) in {text[:200]!r}. Fix: use a template that renders message content "
                        "verbatim.")
    return text[:text.find(SENTINEL)]


def _assistant_end_of_turn(tokenizer, kw: dict, specials: list[str]) -> str | None:
    probe = SENTINEL + " answer"
    text = _render(tokenizer, [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": probe}],
                   False, kw)
    at = text.find(probe)
    if at < 0 or not specials:
        return None
    after = text[at + len(probe):]
    m = re.search("|".join(map(re.escape, specials)), after)
    return m.group(0) if m and not after[:m.start()].strip() else None
