"""The generation engine (target/generate.py): greedy == the evaluator's greedy on the tiny target and on tiny random
Llamas, continuous batching == one prompt at a time, sampling deterministic under a seed and independent of batching
and refill order, the sampler draws the filtered distribution, stop tokens and length limits, several engines on one
queue, and the serving-match check (evaluation/serving_match.py) that reports differences."""

import functools

import pytest
import torch

from dflash_lab.evaluation.serving_match import first_difference, serving_match
from dflash_lab.evaluation.static_decode import speculative_generate
from dflash_lab.target.gen_devices import generate_on_devices
from dflash_lab.target.gen_kernels import GROUPED_DECODE, engine_kernels, grouped_decode_attention
from dflash_lab.target.gen_queue import GenProgress, PromptItem, PromptQueue
from dflash_lab.target.generate import Generated, GenerationSettings, Generator
from dflash_lab.target.sampling import counter_uniform, filtered_probs, next_tokens
from dflash_lab.target.static_cache import BATCH_FLOOR, MIN_SPAN, bucket, doubling_ladder, length_ladder

NEW = 40
GREEDY = GenerationSettings(max_new_tokens=NEW)
SAMPLED = GenerationSettings(max_new_tokens=NEW, temperature=1.0, top_p=0.9, top_k=40, seed=7)


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest.py: batch-1 decoding of tiny models


@functools.lru_cache(maxsize=1)
def tiny():
    """(tiny target, its stop ids, 8 held-out prompts of 20-94 tokens)."""
    from dflash_lab.evaluation.prompts import load_prompts
    from dflash_lab.target.load import load_target, load_tokenizer
    from dflash_lab.tiny import tiny_heldout_path

    tok = load_tokenizer("tiny")
    return load_target("tiny"), [tok.eos_token_id], load_prompts(tiny_heldout_path(), tok, n_prompts=8)


def tiny_llama(attn: str = "sdpa"):
    """A random 3-layer Llama with grouped-query attention and an untied head (SmolLM2's family, 0.1M parameters)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=False, attn_implementation=attn)
    return LlamaForCausalLM(cfg).eval()


def random_prompts(n: int, seed: int = 1, vocab: int = 300) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (int(torch.randint(3, 30, (), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def evaluator_greedy(model, prompts, stop, *, fast="auto", new=NEW):
    run = speculative_generate(model, None, prompts, block_size=1, max_new_tokens=new, eos_token_id=stop, fast=fast)
    return [r.output_ids for r in run.results]


# ---------------------------------------------------------------------------------------------------------------
# Greedy == the evaluator's greedy
# ---------------------------------------------------------------------------------------------------------------

def test_greedy_equals_the_evaluators_greedy_on_the_tiny_target():
    """4 rows for 8 prompts: rows are refilled while the others decode; every answer equals the evaluator's."""
    model, stop, prompts = tiny()
    settings = GenerationSettings(max_new_tokens=64)  # tiny answers are 40-150 tokens: some stop, some are cut
    out = Generator(model, stop_ids=stop, max_batch=4, max_len=256).generate(prompts, settings)
    ref = evaluator_greedy(model, prompts, stop, new=64)
    assert [o.token_ids for o in out] == ref
    assert {o.finish_reason for o in out} == {"stop", "length"}  # both endings are exercised
    for o in out:
        assert (o.finish_reason == "stop") == (o.token_ids[-1] in stop) and len(o.token_ids) <= 64


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_greedy_equals_the_evaluators_greedy_on_a_tiny_llama(attn):
    """Both evaluator paths (dynamic loop and static caches, eager) and both attention implementations (bool mask /
    additive mask); stop token 7 ends some answers early."""
    model, prompts = tiny_llama(attn), random_prompts(5)
    out = Generator(model, stop_ids=[7], max_batch=2, max_len=128).generate(prompts, GREEDY)
    assert [o.token_ids for o in out] == evaluator_greedy(model, prompts, [7])
    assert [o.token_ids for o in out] == evaluator_greedy(model, prompts, [7], fast=True)


def test_serving_match_reports_the_rate_and_where_answers_differ():
    model, prompts = tiny_llama(), random_prompts(4, seed=2)
    same = serving_match(model, prompts, stop_ids=[7], max_new_tokens=24, max_batch=4)
    assert same["match_rate"] == 1.0 and same["identical"] == 4 and same["differences"] == []
    # An engine that stops on another token writes other answers: the check must see it and say where.
    other = Generator(model, stop_ids=[7, *range(50, 120)], max_batch=4, max_len=64)
    diff = serving_match(model, prompts, stop_ids=[7], max_new_tokens=24, generator=other)
    assert diff["match_rate"] < 1.0 and diff["differences"]
    ref = evaluator_greedy(model, prompts, [7], new=24)
    for d in diff["differences"]:
        ours = other.generate([prompts[d["index"]]], GenerationSettings(max_new_tokens=24))[0].token_ids
        assert d["first_difference"] == first_difference(ours, ref[d["index"]])
    assert first_difference([1, 2], [1, 2]) is None and first_difference([1, 2], [1, 3]) == 1
    assert first_difference([1], [1, 2]) == 1


# ---------------------------------------------------------------------------------------------------------------
# Continuous batching, sampling
# ---------------------------------------------------------------------------------------------------------------

def test_refill_and_chunking_give_the_same_answers_as_one_prompt_at_a_time():
    """12 stop tokens end answers after 1-40 tokens, so rows free up one by one and are refilled while the next
    chunk is already in flight (its outputs for a refilled row belong to the previous occupant and must be dropped);
    with 16 rows for 12 prompts the tail moves its live rows (and their caches) into the first 8."""
    model, prompts, stop = tiny_llama(), random_prompts(12, seed=3), list(range(40, 52))
    alone = [Generator(model, stop_ids=stop, max_batch=1, max_len=96).generate([p], GREEDY)[0] for p in prompts]
    assert {a.finish_reason for a in alone} == {"stop", "length"} and len({len(a.token_ids) for a in alone}) >= 5
    for kw in (dict(max_batch=3), dict(max_batch=8), dict(max_batch=4, steps_per_sync=5, refill_fraction=0.5),
               dict(max_batch=2, steps_per_sync=3), dict(max_batch=16)):  # 16: the tail packs into 8 rows
        batched = Generator(model, stop_ids=stop, max_len=96, **kw).generate(prompts, GREEDY)
        assert batched == alone, kw


def test_the_engine_counts_its_prefill_and_decode_work():
    """Generator.work: every prompt token prefilled once (padding counted apart), every answer token past the first
    (which the prefill gives) decoded by a step, and no step without a live row."""
    model, prompts, stop = tiny_llama(), random_prompts(12, seed=3), list(range(40, 52))
    gen = Generator(model, stop_ids=stop, max_batch=4, max_len=96, steps_per_sync=2)
    out = gen.generate(prompts, GREEDY)
    w = gen.work
    assert w["prefill_prompt_tokens"] == sum(map(len, prompts)) <= w["prefill_padded_tokens"]
    assert 3 <= w["prefill_forwards"] <= 12 and w["prefill_s"] > 0  # 12 prompts into 4 rows: at least 3 waves
    decoded = sum(len(o.token_ids) - 1 for o in out)
    assert w["decode_steps"] <= w["decode_row_steps"] <= 4 * w["decode_steps"] and w["decode_row_steps"] >= decoded
    assert w["decode_chunks"] * 2 >= w["decode_steps"] >= max(len(o.token_ids) for o in out) - 1
    gen.generate(prompts[:1], GREEDY)  # counts are per run
    assert gen.work["prefill_prompt_tokens"] == len(prompts[0]) and gen.work["prefill_forwards"] == 1


def test_sampling_is_deterministic_under_a_seed_and_independent_of_batching():
    model, stop, prompts = tiny()
    a = Generator(model, stop_ids=stop, max_batch=2, max_len=256).generate(prompts, SAMPLED)
    # other rows, other refill order (reversed, same keys), other chunking: the same samples
    rev = Generator(model, stop_ids=stop, max_batch=8, max_len=256, steps_per_sync=3).generate(
        prompts[::-1], SAMPLED, keys=list(range(len(prompts)))[::-1])[::-1]
    assert rev == a
    greedy = Generator(model, stop_ids=stop, max_batch=8, max_len=256).generate(prompts, GREEDY)
    other_seed = Generator(model, stop_ids=stop, max_batch=8, max_len=256).generate(
        prompts, GenerationSettings(**{**SAMPLED.to_dict(), "seed": 8}))
    assert sum(x.token_ids != y.token_ids for x, y in zip(a, greedy)) >= 4
    assert sum(x.token_ids != y.token_ids for x, y in zip(a, other_seed)) >= 4


def test_the_sampler_draws_the_filtered_distribution():
    """20,000 keyed draws from fixed logits: frequencies within 4 sigma of the filtered probabilities, nothing drawn
    outside the kept set (temperature 0.7, top-k 6, top-p 0.8), and a tie with the k-th logit kept."""
    logits = torch.tensor([[2.0, 1.5, 1.5, 0.3, 0.2, -1.0, -1.0, 0.9, 0.0, -3.0]])
    mode, t, p = ("sample", 6, True), torch.tensor(0.7), torch.tensor(0.8)
    probs = filtered_probs(logits, mode, t, p)[0]
    probs = probs / probs.sum()
    order = logits[0].argsort(descending=True, stable=True)[:6]  # top-k first: softmax over the 6 best
    z = torch.softmax(logits[0, order] / 0.7, -1)
    kept = order[:(z.cumsum(0) - z < 0.8).sum()]  # then the smallest head whose mass reaches 0.8
    assert set(probs.nonzero().flatten().tolist()) == set(kept.tolist()) and len(kept) == 3
    assert torch.allclose(probs[kept], z[:len(kept)] / z[:len(kept)].sum(), atol=1e-6)
    n = 20_000
    keys = torch.arange(n)
    draws = next_tokens(logits.expand(n, -1), mode, temperature=t, top_p=p,
                        uniforms=counter_uniform(torch.tensor(3), keys, torch.full((n,), 11)))
    freq = torch.bincount(draws, minlength=10).double() / n
    sigma = (probs.double() * (1 - probs.double()) / n).sqrt()
    assert ((freq - probs.double()).abs() <= 4 * sigma + 1e-9).all(), (freq, probs)
    tie = filtered_probs(torch.tensor([[3.0, 1.0, 1.0, 0.0]]), ("sample", 2, False), torch.tensor(1.0), p)
    assert (tie[0, :3] > 0).all() and tie[0, 3] == 0


def test_counter_uniforms_are_uniform_and_depend_on_every_input():
    keys = torch.arange(50_000)
    u = counter_uniform(torch.tensor(0), keys, torch.zeros_like(keys))
    assert 0 <= u.min() and u.max() < 1 and abs(u.mean().item() - 0.5) < 0.005
    assert torch.histc(u, bins=10, min=0, max=1).sub(5000).abs().max() < 5000 * 0.05
    assert u.unique().numel() > 49_900
    base = counter_uniform(torch.tensor(5), keys[:100], keys[:100])
    for other in (counter_uniform(torch.tensor(6), keys[:100], keys[:100]),
                  counter_uniform(torch.tensor(5), keys[:100] + 1, keys[:100]),
                  counter_uniform(torch.tensor(5), keys[:100], keys[:100] + 1)):
        assert (other != base).float().mean() > 0.95
    big = torch.tensor([2 ** 62 + 5, -3])  # any int64 key (a hash of a conversation id) is accepted
    assert counter_uniform(torch.tensor(2 ** 40), big, big).unique().numel() == 2


# ---------------------------------------------------------------------------------------------------------------
# Limits, settings, queue, devices
# ---------------------------------------------------------------------------------------------------------------

def test_stop_tokens_and_length_limits():
    model, prompts = tiny_llama(), random_prompts(4, seed=4)
    free = Generator(model, stop_ids=[299], max_batch=4, max_len=128).generate(prompts, GREEDY)
    first = free[0].token_ids[3]  # a token the first answer writes: stopping on it cuts that answer right there
    stopped = Generator(model, stop_ids=[first], max_batch=4, max_len=128).generate(prompts, GREEDY)
    cut = free[0].token_ids.index(first) + 1
    assert stopped[0] == Generated(free[0].token_ids[:cut], "stop")
    short = Generator(model, stop_ids=[299], max_batch=4, max_len=128).generate(
        prompts, GenerationSettings(max_new_tokens=5))
    assert all(s.finish_reason == "length" and s.token_ids == f.token_ids[:5] for s, f in zip(short, free))
    # a row whose positions run out ends at the cache: prompt of 30 tokens in 40 positions -> 11 new tokens
    p30 = random_prompts(1, seed=5)[0] * 2
    p30 = p30[:30] + [5] * (30 - len(p30[:30]))
    at_end = Generator(model, stop_ids=[299], max_batch=2, max_len=40).generate([p30], GREEDY)[0]
    assert at_end.finish_reason == "length" and len(at_end.token_ids) == 11
    long = Generator(model, stop_ids=[299], max_batch=2, max_len=128).generate([p30], GREEDY)[0]
    assert at_end.token_ids == long.token_ids[:11]
    with pytest.raises(ValueError, match=r"max_len=40.*Fix"):
        Generator(model, stop_ids=[299], max_len=40).generate([[4] * 40], GREEDY)
    with pytest.raises(ValueError, match="stop_ids is empty"):
        Generator(model, stop_ids=[])


@pytest.mark.parametrize("field,value", [("max_new_tokens", 0), ("temperature", -1.0), ("top_p", 0.0),
                                         ("top_p", 1.5), ("top_k", -2), ("seed", -1), ("max_new_tokens", 2.5)])
def test_settings_are_validated_naming_field_value_and_fix(field, value):
    kw = {"max_new_tokens": 8, field: value}
    with pytest.raises(ValueError, match=rf"GenerationSettings\.{field}={value!r} is invalid: .*Fix: "):
        GenerationSettings(**kw)


def test_follow_up_prompts_re_enter_the_queue_and_progress_is_reported():
    """Every-turn: each answer asks a follow-up (the answer appended plus a fixed user turn) until 3 turns; the
    follow-ups equal what a second call on the extended prompts writes."""
    model, prompts = tiny_llama(), random_prompts(3, seed=6)
    g = Generator(model, stop_ids=[7], max_batch=2, max_len=200)
    g.allocate(2, 200)
    history = {i: list(p) for i, p in enumerate(prompts)}

    def on_finish(key, gen):
        conv, turn = divmod(key, 10)
        history[conv] += gen.token_ids + [11, 12]
        return PromptItem(key + 1, list(history[conv])) if turn < 2 else None

    reports, lines = [], []
    queue = PromptQueue([PromptItem(10 * i, p) for i, p in enumerate(prompts)], total=9, on_finish=on_finish,
                        progress=reports.append, log=lines.append, log_every_s=0.0)
    g.run(queue, GenerationSettings(max_new_tokens=12))
    queue.close()
    queue.flush()
    assert sorted(queue.results) == [0, 1, 2, 10, 11, 12, 20, 21, 22]
    # turn 2 of each conversation == a fresh call on its turn-2 prompt
    for conv in range(3):
        turn2 = history[conv][:len(history[conv]) - len(queue.results[10 * conv + 2].token_ids) - 2]
        fresh = Generator(model, stop_ids=[7], max_batch=1, max_len=200).generate(
            [turn2], GenerationSettings(max_new_tokens=12))[0]
        assert fresh == queue.results[10 * conv + 2]
    last = reports[-1]
    assert isinstance(last, GenProgress) and last.prompts_done == 9 and last.prompts_total == 9
    assert last.new_tokens == sum(len(r.token_ids) for r in queue.results.values()) and last.eta_s == 0
    assert "9/9 prompts" in lines[-1] and "new tok/s" in lines[-1] and "ETA" in lines[-1]


def test_an_error_in_on_finish_stops_the_engines_and_comes_back_from_close():
    model, prompts = tiny_llama(), random_prompts(6, seed=7)
    g = Generator(model, stop_ids=[7], max_batch=2, max_len=96)
    g.allocate(2, 96)

    def on_finish(key, gen):
        raise ValueError(f"cannot render the next turn of {key}")

    queue = PromptQueue([PromptItem(i, p) for i, p in enumerate(prompts)], on_finish=on_finish)
    g.run(queue, GenerationSettings(max_new_tokens=8))
    assert queue.aborted and len(queue.results) < len(prompts)  # the engine stopped taking prompts
    with pytest.raises(ValueError, match="cannot render the next turn"):
        queue.close()


def test_two_engines_on_one_queue_give_the_answers_of_one():
    """Two CPU engines (one thread each, sharing the read-only model) split the prompts between them."""
    model, stop, prompts = tiny()
    one = Generator(model, stop_ids=stop, max_batch=4, max_len=256).generate(prompts, SAMPLED)
    pair = [Generator(model, stop_ids=stop, max_batch=2, max_len=256, name=f"cpu#{i}") for i in range(2)]
    seen = []
    two = generate_on_devices(pair, prompts, SAMPLED, progress=seen.append)
    assert two == one
    assert seen and seen[-1].prompts_done == len(prompts)
    assert {"cpu#0", "cpu#1"} <= set(seen[-1].rows_live)  # both engines took prompts


def test_grouped_decode_attention_is_the_repeated_kv_attention():
    """A one-token query per row against 3 KV heads x 3 query heads each, masked per row: the same output as Hugging
    Face's sdpa with repeated K/V; other shapes are handed to Hugging Face's function itself."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    torch.manual_seed(0)
    attn = torch.nn.Module()
    attn.num_key_value_groups, attn.is_causal = 3, True
    q, k, v = torch.randn(5, 9, 1, 16), torch.randn(5, 3, 40, 16), torch.randn(5, 3, 40, 16)
    mask = (torch.arange(40)[None] <= torch.tensor([3, 39, 0, 17, 25])[:, None])[:, None, None]  # (5, 1, 1, 40)
    ours, _ = grouped_decode_attention(attn, q, k, v, mask, scaling=0.25)
    ref, _ = sdpa_attention_forward(attn, q, k, v, mask, scaling=0.25)
    assert ours.shape == ref.shape == (5, 1, 9, 16) and torch.allclose(ours, ref, atol=1e-6)
    q4 = torch.randn(5, 9, 4, 16)
    assert torch.equal(grouped_decode_attention(attn, q4, k, v, None, scaling=0.25)[0],
                       sdpa_attention_forward(attn, q4, k, v, None, scaling=0.25)[0])


def test_engine_kernels_leave_the_model_as_it_was_given():
    """Grouped decode attention and fused norms hold only while the engine runs; answers are the same either way."""
    model, prompts = tiny_llama(), random_prompts(3, seed=8)
    dec = model.model
    plain = Generator(model, stop_ids=[7], max_batch=4, max_len=96, grouped_decode=False).generate(prompts, GREEDY)
    fast = Generator(model, stop_ids=[7], max_batch=4, max_len=96, fused_norms=True).generate(prompts, GREEDY)
    assert fast == plain
    assert model.config._attn_implementation == "sdpa" and "forward" not in dec.norm.__dict__
    with engine_kernels(dec, grouped_decode=True, fused_norms=True):
        assert dec.layers[0].self_attn.config._attn_implementation == GROUPED_DECODE
        assert "forward" in dec.norm.__dict__ and "forward" in dec.layers[0].input_layernorm.__dict__
        with engine_kernels(dec, grouped_decode=False, fused_norms=False):  # a second engine on the same model
            pass
        assert dec.layers[0].self_attn.config._attn_implementation == GROUPED_DECODE  # the last one out restores
    assert model.config._attn_implementation == "sdpa" and "forward" not in dec.norm.__dict__


def test_buckets():
    assert length_ladder(300)[:9] == [64, 80, 96, 112, 128, 160, 192, 224, 256] and length_ladder(300)[-1] == 300
    assert doubling_ladder(48, BATCH_FLOOR) == [8, 16, 32, 48] and doubling_ladder(4, BATCH_FLOOR) == [4]
    assert doubling_ladder(1088, MIN_SPAN) == [256, 512, 1024, 1088]  # the evaluator's attention lengths
    assert bucket([8, 16, 32], 9) == 16 and bucket([8, 16, 32], 40) == 32


def test_one_cache_writes_the_same_keys_whichever_way_a_forward_says_where():
    """The evaluator's ways into the engine's cache: every row at the same positions (index copy, batch 1), one line
    of positions per row, and a subset of rows; each returns the live prefix of the rows it wrote."""
    from dflash_lab.target.static_cache import RowKVCache

    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(2, 3, 4, 5, generator=g), torch.randn(2, 3, 4, 5, generator=g)  # (R, kvh, T, d)
    same, per_row = (RowKVCache(1, 3, 2, 16, 5, torch.float32, "cpu") for _ in range(2))
    same.at(torch.arange(6, 10), 12)
    ks, vs = same.update(k, v, 0)
    per_row.at(torch.arange(6, 10).expand(2, 4), 12)
    kr, vr = per_row.update(k, v, 0)
    assert ks.shape == (2, 3, 12, 5) and torch.equal(ks, kr) and torch.equal(vs, vr)
    assert torch.equal(same.keys[0][:, :, 6:10], k) and same.keys[0][:, :, :6].abs().sum() == 0
    one = RowKVCache(1, 3, 2, 16, 5, torch.float32, "cpu")
    one.at(torch.tensor([[3, 4, 5, 6]]), 8, rows=torch.tensor([1]))
    k1, _ = one.update(k[1:], v[1:], 0)
    assert k1.shape == (1, 3, 8, 5) and torch.equal(k1[0, :, 3:7], k[1]) and one.keys[0][0].abs().sum() == 0
    with pytest.raises(RuntimeError, match="before prefill"):
        RowKVCache(1, 3, 2, 16, 5, torch.float32, "cpu").update(k, v, 0)


def test_gen_bench_prints_one_json_line_per_configuration(capsys, tmp_path):
    import json

    from dflash_lab.benchmarks.generation import main
    from dflash_lab.tiny import tiny_heldout_path

    main(["--target", "tiny", "--device", "cpu", "--dtype", "float32", "--prompts", str(tiny_heldout_path()),
          "--first", "6", "--eager-first", "6", "--all", "3", "--batch-sizes", "4", "--modes", "eager", "--match", "2",
          "--match-new-tokens", "8", "--max-new-tokens", "16", "--max-len", "256", "--out", str(tmp_path / "g.jsonl")])
    rows = [json.loads(ln) for ln in capsys.readouterr().out.splitlines()]
    assert [json.loads(ln) for ln in (tmp_path / "g.jsonl").read_text().splitlines()] == rows  # the file = stdout
    assert [(r["kind"], r.get("variant", r.get("mode")), r.get("temperature")) for r in rows] == [
        ("serving_match", "engine", None), ("serving_match", "plain", None), ("first_turns", "eager", None),
        ("first_turns", "eager", 1.0), ("every_turn", "eager", None)]
    assert rows[0]["match_rate"] == 1.0 and rows[2]["prompts"] == 6 and rows[2]["new_tokens"] == 6 * 16
    assert rows[4]["conversations"] == 3 and rows[4]["round_trip"]["answers"] == rows[4]["answers"] >= 3
    assert all(r["new_tokens_per_s"] > 0 for r in rows[2:])
