"""The one check every held-out set goes through (data/heldout_overlap.py): prompts compared with the trained
contexts by normalised text, evaluation prompts vs held-out conversations, and the data report's count."""

from dflash_lab.data.heldout_overlap import (TrainingPrompts, context_keys, conversations_in_training, prompt_key,
                                             split_overlap)
from dflash_lab.data.prompt_report import PromptReport


def _conv(*texts):
    roles = ("user", "assistant")
    return [{"role": roles[i % 2], "content": t} for i, t in enumerate(texts)]


def test_a_prompt_is_trained_on_when_a_training_conversation_continues_the_same_context():
    train = TrainingPrompts.of([_conv("Hello!", "Hi, how can I help?", "Tell me a joke.", "Why did..."),
                                [{"role": "user", "content": "What is 2+2?"}]], "train.jsonl")  # a prompt-only record
    assert train.conversations == 2 and len(train.keys) == 3  # [Hello!], [Hello!, answer, joke], [2+2]
    assert train.has_prompt(_conv("  hello!\n"))  # case and whitespace do not make a new prompt
    assert train.has_prompt(_conv("WHAT IS 2+2?"))
    assert not train.has_prompt(_conv("Hello?"))  # punctuation does
    assert not train.has_prompt(_conv("Tell me a joke."))  # a later turn alone is another context
    assert train.has_prompt(_conv("Hello!", "Hi, how can I help?", "tell me a joke."))
    assert not train.has_prompt(_conv("Hello!", "Another answer", "Tell me a joke."))
    # a held-out conversation is trained on when the prompt of any of its answers is
    assert train.has_conversation(_conv("Hello!", "Some other answer"))
    assert not train.has_conversation(_conv("Good morning", "Morning!"))
    assert prompt_key([{"role": "system", "content": "x"}]) != prompt_key([{"role": "user", "content": "x"}])
    assert len(context_keys(_conv("a", "b", "c", "d"))) == 2
    clean, found = split_overlap([_conv("hello!"), _conv("Hey"), _conv("HELLO!")], train)
    assert (clean, len(found)) == ([_conv("Hey")], 2)
    assert split_overlap([_conv("hello!")], None) == ([_conv("hello!")], [])  # no training side: nothing found


def test_the_data_report_says_how_many_held_out_conversations_share_a_training_prompt():
    train = [_conv("Write a poem.", "Roses..."), _conv("Hello!", "Hi!")]
    held = [_conv("hello!", "Hey there!"), _conv("Plan a trip.", "Day 1...")]
    assert conversations_in_training(held, train) == 1
    report = PromptReport.build(settings={}, sampled=4, filtered={}, filter_examples={}, exact=0, near=0,
                                first_turns=["Write a poem.", "Hello!", "hello!", "Plan a trip."], user_turns=[],
                                first_turn_tokens=[3, 2, 2, 3], train=2, heldout=2, heldout_unused=0,
                                heldout_fraction=0.5, out="o.jsonl", heldout_out="o.heldout.jsonl", seconds=1.0,
                                sample_seconds=1.0, first_turn_new_tokens=10, turns={},
                                heldout_in_training=conversations_in_training(held, train))
    assert report["heldout_in_training"] == 1
    assert "held-out conversations that share a prompt with the training file: 1 (by normalised text)" in str(report)
    assert "held out and also in training" in report._repr_html_()
