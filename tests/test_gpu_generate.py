"""GPU checks of the generation engine (marker `gpu`; skipped with a reason on CPU): CUDA-graph replay == eager, token
for token, greedy and sampled, bf16 and fp32; the evaluator's greedy (static caches + CUDA graphs) == the engine's
in fp32 on the tiny target; two GPUs == one; drafters of two block sizes in one evaluation, each with its graphs."""

import pytest
import torch

from dflash_lab.evaluation.serving_match import serving_match
from dflash_lab.target.gen_devices import generate_on_devices
from dflash_lab.target.generate import GenerationSettings, Generator
from tests.test_generate import random_prompts, tiny_llama

pytestmark = pytest.mark.gpu
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
SETTINGS = [GenerationSettings(max_new_tokens=64),
            GenerationSettings(max_new_tokens=64, temperature=1.0, top_p=0.9, top_k=50, seed=1)]


def tiny_on(device, dtype):
    from dflash_lab.evaluation.prompts import load_prompts
    from dflash_lab.target.load import load_target, load_tokenizer
    from dflash_lab.tiny import tiny_heldout_path

    tok = load_tokenizer("tiny")
    return load_target("tiny", device=device, dtype=dtype), [tok.eos_token_id], \
        load_prompts(tiny_heldout_path(), tok, n_prompts=24)


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("settings", SETTINGS, ids=["greedy", "sampled"])
def test_graph_replay_equals_eager(dtype, settings):
    """12 rows for 24 prompts (refills, several length buckets, the tail at smaller batch buckets)."""
    model, stop, prompts = tiny_on("cuda:0", DTYPES[dtype])
    eager = Generator(model, stop_ids=stop, max_batch=12, max_len=512, cuda_graphs=False).generate(prompts, settings)
    g = Generator(model, stop_ids=stop, max_batch=12, max_len=512)
    graph = g.generate(prompts, settings)
    assert g.graphs and g.graph_status.startswith("graphs:") and len(g._graphs) >= 2
    assert graph == eager
    llama = tiny_llama().to("cuda:0", DTYPES[dtype])
    lp = random_prompts(10, seed=9)
    assert Generator(llama, stop_ids=[7], max_batch=4, max_len=128).generate(lp, settings) == \
        Generator(llama, stop_ids=[7], max_batch=4, max_len=128, cuda_graphs=False).generate(lp, settings)


def test_engine_greedy_equals_the_evaluators_static_greedy_in_fp32():
    model, stop, prompts = tiny_on("cuda:0", torch.float32)
    report = serving_match(model, prompts[:12], stop_ids=stop, max_new_tokens=64, max_batch=8)
    assert report["evaluator"] == "static caches + CUDA graphs" and report["engine"].startswith("graphs:")
    assert report["match_rate"] == 1.0, report["differences"]


def test_bf16_serving_match_is_reported_with_margins():
    model, stop, prompts = tiny_on("cuda:0", torch.bfloat16)
    report = serving_match(model, prompts[:12], stop_ids=stop, max_new_tokens=64, max_batch=8)
    assert report["checked"] == 12 and 0.0 <= report["match_rate"] <= 1.0
    assert all(d["evaluator_margin"] is not None or d["first_difference"] >= d["evaluator_tokens"]
               for d in report["differences"])


@two_gpus
def test_two_gpus_give_the_answers_of_one():
    settings = SETTINGS[1]
    m0, stop, prompts = tiny_on("cuda:0", torch.float32)
    m1, _, _ = tiny_on("cuda:1", torch.float32)
    one = Generator(m0, stop_ids=stop, max_batch=8, max_len=512).generate(prompts, settings)
    pair = [Generator(m, stop_ids=stop, max_batch=4, max_len=512) for m in (m0, m1)]
    assert generate_on_devices(pair, prompts, settings) == one
    assert all(g._graphs for g in pair)  # each engine captured its own graphs, in its own thread


def test_compared_drafters_of_two_block_sizes_decode_with_their_own_graphs_on_cuda(tmp_path):
    """One evaluation on the GPU (static caches + CUDA graphs, fp32): the block-8 drafter and the same weights drafting
    blocks of 4 each capture their own graphs; the block-4 rows equal evaluating at block 4 alone, and every output
    equals the target's own greedy one."""
    import json
    import shutil

    from dflash_lab.evaluation import evaluate as ev
    from tests.test_speculative import tiny_trained_run

    run8 = tiny_trained_run()
    run4 = shutil.copytree(run8, tmp_path / "b4")
    for name in ("drafter_config.json", "config.json"):
        cfg = json.loads((run4 / name).read_text())
        (run4 / name).write_text(json.dumps({**cfg, "block_size": 4}))
    kw = dict(prompts={"tiny-heldout": "tiny-heldout"}, n_prompts=8, max_new_tokens=64, device="cuda:0",
              dtype="float32", decoding="static", untrained=False, log=lambda *a: None)
    rep = ev.evaluate(run8, compare={"b4": run4}, **kw)
    rows = {r["decoder"]: r for r in rep.rows()}
    assert rep.decoding.startswith("StaticSpeculativeDecoder")
    assert (rows["trained"]["block_size"], rows["b4"]["block_size"]) == (8, 4)
    assert rows["trained"]["identical_to_target"] == rows["b4"]["identical_to_target"] == 8
    alone = {r["decoder"]: r for r in ev.evaluate(run8, block_size=4, **kw).rows()}
    assert rows["b4"]["tau"] == alone["trained"]["tau"] > 1.0
