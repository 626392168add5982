"""The recipe (dflash_lab/workflows/recipe.py) end to end on the tiny target with tiny sizes: target-written prompts, the
chitchat answers, the mix of both (counts asserted against the files), training, and real tau on the three named
evaluation sets with intervals; the chitchat-only path (n_self=0); the defaults and bad values of RecipeConfig; the
notebook's parameters mapping 1:1 onto its fields."""

import dataclasses
import json
from collections import Counter
from pathlib import Path

import pytest
import torch

from dflash_lab.config import ConfigError
from dflash_lab.config.notebook_params import parameter_defaults
from dflash_lab.workflows.recipe import Recipe, RecipeConfig
from dflash_lab.workflows.recipe_config import PRESETS

pytest.importorskip("chitchat_dataset", reason="the recipe's human prompts come from the chitchat-dataset wheel")

TINY_SIZES = dict(model="tiny", draft_vocab_size=None, n_train=8, heldout=4, regen_batch_size=16, regen_max_new_tokens=16, steps=4,
                  seq_len=96, batch_size=2, num_anchors=2, block_size=8, num_draft_layers=1, real_tau_every=0,
                  eval_prompts=2, eval_max_new_tokens=8, threads=1)
PHASES = ["get_model", "self_prompts", "build_data", "regenerate", "mix_data", "train", "evaluate", "export"]


def _lines(path) -> list[dict]:
    return [json.loads(ln) for ln in Path(path).read_text(encoding="utf-8").split("\n") if ln.strip()]


def _run(config: RecipeConfig) -> Recipe:
    rec = Recipe(config, log=lambda *a: None)
    for phase in PHASES:
        getattr(rec, phase)()
    return rec


def test_recipe_with_target_written_prompts_mixes_all_of_both_and_evaluates_three_sets(tmp_path):
    cfg = RecipeConfig(**TINY_SIZES, work_dir=str(tmp_path / "r"), n_self=24, self_heldout=3,
                       self_heldout_fraction=0.3, eval_block_sizes=(8, 4), eval_sampled_block_size=8,
                       eval_draft_sampling=("argmax", "sample"))
    rec = _run(cfg)
    res = json.loads((tmp_path / "r" / "results.json").read_text())
    assert list(res["phases"]) == PHASES and res["config"]["n_self"] == 24
    ph = res["phases"]

    sp = ph["self_prompts"]
    assert sp["sampled"] == 24
    removed = sum(sp["filtered"].values()) + sp["exact_duplicates"] + sp["near_duplicates"]
    assert sp["kept"] == 24 - removed and sp["train"] + sp["heldout"] <= sp["kept"]
    assert sp["train"] == len(_lines(sp["out"])) >= 10
    assert 1 <= sp["heldout"] == len(_lines(sp["heldout_out"])) <= 3  # capped at self_heldout
    assert (sp["max_answer_tokens"], sp["max_prompt_tokens"], sp["temperature"], sp["top_p"]) == (16, 80, 1.0, 0.95)
    assert sp["dtype"] == "float32"  # regen_dtype "auto" on the CPU
    assert ph["regenerate"]["conversations"] == 8 and ph["regenerate"]["heldout_conversations"] == 4
    assert ph["regenerate"]["backend"].startswith("hf") and ph["regenerate"]["dtype"] == "float32"

    mx = ph["mix_data"]
    assert mx["counts"] == {"chitchat": 8, "self": sp["train"]}
    assert mx["n"] == 8 + sp["train"] == len(_lines(mx["out"]))
    assert mx["proportions"]["chitchat"] == pytest.approx(8 / mx["n"], abs=1e-6)
    assert sum(mx["proportions"].values()) == pytest.approx(1.0)
    by_source = Counter(r["mix_source"] for r in _lines(mx["out"]))
    assert sorted(by_source.values()) == sorted([8, sp["train"]])  # every record of both, none twice
    assert len({r["id"] for r in _lines(mx["out"])}) == mx["n"]
    assert ph["train"]["data"]["records"] == mx["n"]  # the mix is what trained

    rows = ph["evaluate"]["rows"]
    assert {r["prompt_set"] for r in rows} == {"chitchat-heldout", "self-heldout", "general"}
    assert ph["evaluate"]["sets"]["self-heldout"] == sp["heldout_out"] and ph["evaluate"]["sets_left_out"] == {}
    from dflash_lab.evaluation.prompt_sets import is_heldout_file

    # both held-out files are recognised as such: prompts the run trains on are left out of them, not just counted
    assert is_heldout_file(ph["evaluate"]["sets"]["chitchat-heldout"]) and is_heldout_file(sp["heldout_out"])
    # T=0 at every block size, T=1 at the sampled block size only
    assert sorted({(r["eval_block_size"], r["temperature"]) for r in rows}) == [(4, 0.0), (8, 0.0), (8, 1.0)]
    trained = [r for r in rows if r["decoder"] == "trained"]
    # T=0 on the three sets at both block sizes (argmax drafts), T=1 on eval_sampled_sets (held-out chitchat) only,
    # once with argmax drafts and once with drafts sampled from the drafter (eval_draft_sampling)
    assert sorted((r["eval_block_size"], r["temperature"], r["prompt_set"], r["draft_sampling"]) for r in trained) \
        == sorted([(B, 0.0, s, "argmax") for B in (4, 8) for s in ("chitchat-heldout", "self-heldout", "general")]
                  + [(8, 1.0, "chitchat-heldout", "argmax"), (8, 1.0, "chitchat-heldout", "sample")])
    assert all(r["prompts"] == 2 for r in trained)
    assert not any(r["decoder"] == "untrained" for r in rows)  # the floor is off by default (eval_untrained)
    assert all(r["tau_low"] is None is r["tau_high"] for r in trained)  # 2 prompts: no interval (MIN_PROMPTS 5)
    assert all(len(r["prompt_set_sha256"]) == 64 for r in trained)
    page = rec._repr_html_()
    assert "tau [95% interval]" in page and "self-heldout" in page
    r0 = trained[0]
    assert f"{r0['tau']:.2f}" in page and "<td>sample</td>" in page  # the T=1 rows say how they drafted


def test_chitchat_only_recipe_still_runs_with_n_self_zero(tmp_path):
    # a pruned draft vocabulary, as both presets train (draft_vocab_size=16384 there): the export carries its head
    sizes = {**TINY_SIZES, "draft_vocab_size": 64}
    cfg = RecipeConfig(**sizes, work_dir=str(tmp_path / "r"), n_self=0, eval_block_sizes=(8,),
                       eval_temperatures=(0.0,), eval_untrained=False)
    rec = _run(cfg)
    ph = rec.results["phases"]
    from safetensors.torch import load_file

    from dflash_lab.data.draft_vocab import target_ids_of
    from dflash_lab.target.load import read_head_weight

    ex = ph["export"]
    tensors = load_file(str(Path(ex["out"]) / "model.safetensors"))
    assert tensors["lm_head.weight"].shape == (64, 128)
    assert torch.equal(tensors["lm_head.weight"], read_head_weight("tiny")[target_ids_of(tensors["d2t"])].bfloat16())
    assert list(ex["serving"]) == ["vllm"] and '"num_speculative_tokens": 7' in ex["serving"]["vllm"]
    assert list(ex["cannot_serve"]) == ["sglang", "speculators"]
    assert list(ph) == PHASES and "n_self=0" in ph["self_prompts"]["skipped"]
    assert ph["mix_data"]["counts"] == {"chitchat": 8} and ph["mix_data"]["out"] == ph["regenerate"]["out"]
    assert ph["train"]["data"]["records"] == 8
    assert "n_self=0" in ph["evaluate"]["sets_left_out"]["self-heldout"]
    assert {r["prompt_set"] for r in ph["evaluate"]["rows"]} == {"chitchat-heldout", "general"}
    assert sorted({r["decoder"] for r in ph["evaluate"]["rows"]}) == ["target only", "trained"]  # no untrained floor
    assert not list((tmp_path / "r").glob("mix-*.jsonl")) and not (tmp_path / "r" / "self-heldout.jsonl").exists()


def test_defaults_are_the_data_at_scale_recipe():
    c = RecipeConfig()
    assert (c.n_self, c.self_heldout, c.regen_max_new_tokens, c.regen_dtype, c.regen_batch_size) == \
        (26000, 256, 192, "auto", 512)
    assert (c.steps, c.seq_len, c.batch_size, c.num_anchors, c.num_draft_layers, c.lr) == (6000, 320, 32, 64, 3, 6e-4)
    assert (c.draft_vocab_size, c.feature_store_gib, c.distill_weight, c.loss_weighting) == \
        (16384, 60.0, 1.0, "dpace")
    assert c.train_config(Path("d.jsonl")).distill_weight == 1.0 and c.eval_draft_sampling == ("sample",)
    assert c.train_config(Path("d.jsonl")).distill_top_k == 16
    assert dataclasses.replace(c, distill_top_k=64).train_config(Path("d.jsonl")).distill_top_k == 64
    assert c.train_config(Path("d.jsonl")).loss_weighting == "dpace"
    assert (c.real_tau_every, c.real_tau_prompts, c.eval_prompts, c.eval_max_new_tokens, c.eval_budget_s) == \
        (2000, 32, 64, 128, 180.0)
    assert c.eval_sets == ("chitchat-heldout", "self-heldout", "general")
    assert c.eval_pairs == [(16, 0.0), (16, 1.0)]
    assert (c.n_train, c.self_heldout_fraction) == (7000, 0.02)
    assert c.max_prompt_tokens == 288
    t = c.train_config(Path("d.jsonl"), Path("h.jsonl"))
    assert (t.steps, t.seq_len, t.real_tau_every, t.real_tau_prompts, t.draft_vocab_size) == (6000, 320, 2000, 32, 16384)
    both = dataclasses.replace(c, eval_block_sizes=(16, 8), eval_sampled_block_size=0)
    assert both.eval_pairs == [(16, 0.0), (8, 0.0), (16, 1.0), (8, 1.0)]


@pytest.mark.parametrize("field, value, says", [
    ("n_self", -1, "RecipeConfig.n_self=-1 is invalid: must be >= 0"),
    ("eval_sets", ("chitchat-heldout", "my-set"), "RecipeConfig.eval_sets=('chitchat-heldout', 'my-set') is invalid"),
    ("eval_sets", (), "RecipeConfig.eval_sets=() is invalid: names no prompt set"),
    ("steps", "4000", "RecipeConfig.steps='4000' is invalid: must be int"),
    ("regen_dtype", "fp8", "RecipeConfig.regen_dtype='fp8' is invalid"),
    ("self_heldout_fraction", 1.0, "RecipeConfig.self_heldout_fraction=1.0 is invalid"),
    ("seq_len", 32, "RecipeConfig.seq_len=32 is invalid"),
    ("model", "smollm3", "RecipeConfig.model='smollm3' is invalid"),
    ("eval_draft_sampling", ("argmax", "sampled"), "RecipeConfig.eval_draft_sampling=('argmax', 'sampled') is invalid"),
    ("eval_draft_sampling", (), "RecipeConfig.eval_draft_sampling=() is invalid: unknown or no draft sampling"),
])
def test_bad_values_name_the_field_the_value_and_the_fix(field, value, says):
    with pytest.raises(ConfigError) as e:
        RecipeConfig(**{field: value})
    assert says in str(e.value) and "Fix:" in str(e.value)


def test_unknown_eval_set_error_lists_the_known_names():
    with pytest.raises(ConfigError) as e:
        RecipeConfig(eval_sets=("chitchat", "general"))
    assert "'chitchat' is neither a prompt set name nor a .jsonl file" in str(e.value)
    assert "self-heldout" in str(e.value)


def test_the_notebook_parameters_map_one_to_one_onto_the_config_with_its_defaults():
    params = parameter_defaults("recipes/smollm2.ipynb")
    fields = {f.name: f.default for f in dataclasses.fields(RecipeConfig)}
    assert set(params) == set(fields) | {"preset"}  # the preset picks values of fields, it is none itself
    assert params["preset"] == "10min" and PRESETS["10min"] == {}  # the notebook's defaults are the 10-minute preset
    for name, default in fields.items():
        want = list(default) if isinstance(default, tuple) else (0 if default is None else default)
        assert params[name] == want, name


def test_a_phase_run_before_the_one_it_needs_names_that_phase(tmp_path):
    rec = Recipe(RecipeConfig(**TINY_SIZES, n_self=0, work_dir=str(tmp_path / "r")), log=lambda *a: None)
    with pytest.raises(RuntimeError, match=r"Recipe\.regenerate\(\) makes \(data\). Fix: run regenerate\(\) first"):
        rec.mix_data()
    with pytest.raises(RuntimeError, match=r"Fix: run train\(\) first"):
        rec.evaluate()
    assert list(json.loads((tmp_path / "r" / "results.json").read_text())["phases"]) == []


def test_full_size_settings_on_a_cpu_are_refused_before_anything_is_written(tmp_path):
    """The defaults are sized for a GPU (6.4M answer tokens, 61M training tokens): on device="cpu" they are refused
    naming allow_cpu_full_size, and nothing is written; asked for, or on a GPU, or at smoke size, they go."""
    with pytest.raises(ConfigError) as e:
        Recipe(RecipeConfig(model="tiny", work_dir=str(tmp_path / "r")), log=lambda *a: None)
    msg = str(e.value)
    assert "allow_cpu_full_size" in msg and "6,374,400 answer tokens" in msg and "61,440,000 train tokens" in msg
    assert not (tmp_path / "r").exists()
    assert RecipeConfig().cpu_work() == {"answer_tokens": (7000 + 200 + 26000) * 192, "train_tokens": 6000 * 32 * 320}
    RecipeConfig(allow_cpu_full_size=True).check_device()
    RecipeConfig(device="cuda:0").check_device()
    RecipeConfig(**TINY_SIZES, n_self=24).check_device()  # the tests' sizes: 576 answer tokens, 768 training tokens


def test_the_fast_step_knobs_reach_the_train_config():
    """The feature store is on by default on a GPU (lossless: the same features, computed once per window) and off
    on a CPU; the draft vocabulary and compile are the user's choice."""
    cfg = RecipeConfig(device="cuda:0", draft_vocab_size=16384, compile_drafter=True).train_config(Path("d.jsonl"))
    assert (cfg.feature_store_gib, cfg.draft_vocab_size, cfg.compile_drafter) == (60.0, 16384, True)
    assert RecipeConfig().train_config(Path("d.jsonl")).feature_store_gib == 0.0  # device "cpu"


def test_the_training_budget_reaches_the_train_config():
    assert RecipeConfig(train_time_budget_s=420.0).train_config(Path("d.jsonl")).time_budget_s == 420.0
    assert RecipeConfig().train_config(Path("d.jsonl")).time_budget_s is None
    with pytest.raises(ConfigError, match="train_time_budget_s=0.0 is invalid"):
        RecipeConfig(train_time_budget_s=0.0)


def test_a_rerun_keeps_the_earlier_figures_until_its_own_phase_replaces_them(tmp_path):
    import time

    cfg = RecipeConfig(**TINY_SIZES, n_self=0, work_dir=str(tmp_path / "r"))
    first = Recipe(cfg, log=lambda *a: None)
    first._record("build_data", time.perf_counter(), counts={"train": 8})
    first._record("train", time.perf_counter(), steps=4)
    results = tmp_path / "r" / "results.json"
    notes = []
    second = Recipe(dataclasses.replace(cfg, steps=6), log=notes.append)  # a rerun, cut short before any phase
    ph = json.loads(results.read_text())["phases"]
    assert ph["build_data"]["counts"] == {"train": 8} and ph["train"]["steps"] == 4  # nothing lost
    assert ph["train"]["earlier_run"] == first.results["started"]
    assert ph["train"]["earlier_settings_differ"] == ["steps"]
    assert "kept 2 phase(s)" in notes[0] and "steps" in notes[0]
    second._record("train", time.perf_counter(), steps=6)  # this run's own phase replaces the earlier one
    ph = json.loads(results.read_text())["phases"]
    assert ph["train"]["steps"] == 6 and "earlier_run" not in ph["train"] and "earlier_run" in ph["build_data"]
    assert "(earlier run " in second._repr_html_()
    cut = results.read_text()[:50]
    results.write_text(cut)  # cut off: moved aside, not overwritten
    Recipe(cfg, log=notes.append)
    assert (tmp_path / "r" / "results.json.unreadable").read_text() == cut
    assert "cannot be read" in notes[-1] and json.loads(results.read_text())["phases"] == {}


def test_evaluation_temperatures_are_finite_numbers_at_least_zero():
    """nan and inf were accepted (nan passes `t < 0`) and evaluated as a measurement; the config refuses them."""
    for bad in ((float("nan"),), (0.0, float("inf")), (-1.0,)):
        with pytest.raises(ConfigError, match=r"eval_temperatures.*needs finite temperatures >= 0"):
            RecipeConfig(model="tiny", eval_temperatures=bad)
    assert RecipeConfig(model="tiny", eval_temperatures=(0, 1e-40)).eval_temperatures == (0.0, 1e-40)


def test_the_recipe_trains_a_dspark_drafter_only_with_its_published_slot_weights():
    """drafter_variant reaches the TrainConfig; dspark with D-PACE (the preset's weighting) is refused naming the fix."""
    cfg = RecipeConfig(drafter_variant="dspark", loss_weighting="decay")
    tc = cfg.train_config(Path("d.jsonl"))
    assert (tc.drafter_variant, tc.loss_weighting) == ("dspark", "decay")
    assert RecipeConfig().train_config(Path("d.jsonl")).drafter_variant == "dflash"
    with pytest.raises(ConfigError, match='loss_weighting="decay"'):
        RecipeConfig(drafter_variant="dspark")
    with pytest.raises(ConfigError, match="unknown drafter variant"):
        RecipeConfig(drafter_variant="eagle")


def test_a_dspark_recipe_runs_through_its_export(tmp_path):
    """A DSpark drafter has no remote-code class (its export names Qwen3DSparkModel, served by the engines' own
    model files): the recipe's export loaded it with AutoModel as a plain Qwen3Model and raised. It now writes the
    export with the variant's heads and the engines' DSpark commands."""
    cfg = RecipeConfig(**{**TINY_SIZES, "num_draft_layers": 1}, work_dir=str(tmp_path / "r"), n_self=0,
                       eval_block_sizes=(8,), eval_temperatures=(0.0,), drafter_variant="dspark",
                       loss_weighting="decay")
    rec = _run(cfg)
    ex = rec.results["phases"]["export"]
    assert ex["reference_class"] is None and ex["config"]["architectures"] == ["Qwen3DSparkModel"]
    assert '"method": "dspark"' in ex["serving"]["vllm"] and "DSPARK" in ex["serving"]["sglang"]
    from safetensors.torch import load_file

    names = set(load_file(str(Path(ex["out"]) / "model.safetensors")))
    assert any(n.startswith("markov_head.") for n in names) and any(n.startswith("confidence_head.") for n in names)
