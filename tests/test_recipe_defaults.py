"""The settings a run trains with when the user leaves them unset (config/recipe_defaults.py): the tiny target's demo
settings, the paper's recipe scaled to SmolLM2- and Qwen3-8B-shaped targets and their data, a value the user set never
touched, and every way to start a run (prepare_run, the notebook's parameters, the CLI) choosing through it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from transformers import AutoConfig

from dflash_lab import TrainConfig
from dflash_lab.config import notebook_params
from dflash_lab.config.recipe_defaults import (RESOLVED_FIELDS, TINY, TargetFacts, lr_for_batch, resolve_defaults,
                                               seq_len_cap)

CONFIGS = Path(__file__).resolve().parents[1] / "dflash_lab" / "bench_configs"


def target_facts(name: str) -> TargetFacts:
    return TargetFacts.of(name, AutoConfig.for_model(**json.loads((CONFIGS / f"{name}.json").read_text())))


@dataclass
class Facts:
    """The data and machine as numbers (prepare.RunFacts measures them in a run)."""

    longest: int
    samples: int
    cuda: bool = True
    max_batch: int = 64  # the largest batch the GPU has room for
    gib_per_window: float = 0.01
    room: tuple | None = None  # (GPU GiB, host GiB) beside the run; None = not read
    asked: list = None

    def longest_sample(self, config, cap):
        self.asked = (self.asked or []) + [("longest", cap)]
        return min(self.longest, cap)

    def windows(self, config):
        return self.samples

    def batch_fits(self, config):
        assert config.feature_store_gib == 0  # the batch is sized before the store takes the room left
        return config.batch_size <= self.max_batch

    def store_gib(self, config):
        return self.samples * self.gib_per_window

    def store_room_gib(self, config):
        return self.room


def test_the_tiny_target_gets_its_demo_settings_and_nothing_is_measured():
    r = resolve_defaults(TrainConfig(target="tiny", steps=400), target=TargetFacts("tiny", True, 4096), facts=None)
    assert {f: getattr(r.config, f) for f in RESOLVED_FIELDS} == TINY
    assert TINY == {"block_size": 8, "num_draft_layers": 2, "loss_weighting": "decay", "seq_len": 192,
                    "num_anchors": 24, "batch_size": 8, "lr": 3e-3, "compile_drafter": False,
                    "feature_store_gib": 0.0, "feature_store_host_gib": 0.0}
    assert r.line().startswith("settings: block 8, layers 2, loss decay, seq_len 192, anchors 24, batch 8, lr 0.003")


def test_smollm2_shaped_target_gets_the_paper_recipe_scaled_to_its_data_and_gpu():
    t = target_facts("smollm2-135m")
    assert t.context == 8192 and not t.tiny
    facts = Facts(longest=1930, samples=29_677, max_batch=64, gib_per_window=0.002)
    r = resolve_defaults(TrainConfig(target="smollm2-135m", data="x.jsonl", steps=10_000, devices=("cuda:0",)),
                         target=t, facts=facts)
    c = r.config
    assert (c.block_size, c.num_draft_layers, c.loss_weighting, c.resolved_gamma) == (16, 5, "dpace", 7.0)
    assert (c.seq_len, c.num_anchors) == (1984, 330)  # 1,930 rounded up to 64; / 6
    assert (c.batch_size, c.lr) == (64, 8.5e-4)
    assert c.compile_drafter == "auto"
    assert c.feature_store_gib == c.feature_store_host_gib == pytest.approx(59.4)  # every window asked for
    line = r.line()
    assert "block 16 (paper default for real targets)" in line and "seq_len 1984 (longest sample 1,930 tokens" in line
    assert "on: 21.6 epochs over 29,677 windows" in line


def test_the_store_holds_every_window_on_the_gpu_then_in_host_memory_or_is_off():
    def store(room):
        c = resolve_defaults(TrainConfig(target="t", steps=1000, devices=("cuda:0",)),
                             target=TargetFacts("t", False, None),
                             facts=Facts(longest=300, samples=1000, gib_per_window=0.05, room=room)).config
        return c.feature_store_gib, c.feature_store_host_gib

    assert store((60.0, 100.0)) == (50.0, 0.0)  # 64 x 1000 / 1000 = 64 epochs; 50 GiB fit on the GPU
    assert store((30.0, 100.0)) == (50.0, 20.0)  # the GPU part fitted at run time, the other 20 GiB in host memory
    assert store((30.0, 10.0)) == (0.0, 0.0)  # 40 of 50 GiB: a batch of 64 would almost never be whole in it
    user = resolve_defaults(TrainConfig(target="t", steps=1000, feature_store_gib=8.0, devices=("cuda:0",)),
                            target=TargetFacts("t", False, None), facts=Facts(longest=300, samples=1000)).config
    assert (user.feature_store_gib, user.feature_store_host_gib) == (8.0, 0.0)


def test_qwen3_8b_shaped_target_caps_the_window_at_3072_and_takes_the_batch_memory_allows():
    t = target_facts("qwen3-8b")
    assert t.context == 40960
    facts = Facts(longest=9000, samples=800, max_batch=2)
    r = resolve_defaults(TrainConfig(target="qwen3-8b", steps=300, devices=("cuda:0",)), target=t, facts=facts)
    c = r.config
    assert facts.asked == [("longest", 3072)]
    assert "seq_len 3072 (longest sample at least 3,072 tokens (longer ones truncated)" in r.line()
    assert (c.seq_len, c.num_anchors, c.block_size, c.num_draft_layers) == (3072, 512, 16, 5)  # the paper's shape
    assert (c.batch_size, c.lr) == (2, 6e-4)
    assert c.feature_store_gib == c.feature_store_host_gib == 0.0  # 300 x 2 < 800 windows: each seen once at most


def test_a_value_the_user_set_is_never_replaced_and_later_choices_follow_it():
    facts = Facts(longest=700, samples=100)
    r = resolve_defaults(TrainConfig(target="qwen3-8b", seq_len=512, block_size=8, batch_size=128, lr=1e-3,
                                     feature_store_gib=0.0, compile_drafter=False, devices=("cuda:0",)),
                         target=target_facts("qwen3-8b"), facts=facts)
    c = r.config
    assert (c.seq_len, c.block_size, c.batch_size, c.lr, c.feature_store_gib, c.compile_drafter) == (
        512, 8, 128, 1e-3, 0.0, False)
    assert c.num_anchors == 85 and c.feature_store_host_gib == 0.0  # from the user's seq_len; no store to extend
    assert facts.asked is None  # the data was not read for a window the user chose
    assert {ch.field for ch in r.choices} == {"num_draft_layers", "loss_weighting", "num_anchors",
                                              "feature_store_host_gib"}
    assert resolve_defaults(c, target=target_facts("qwen3-8b"), facts=None).choices == ()  # whole: nothing to do


def test_short_context_cpu_and_lr_rules():
    assert seq_len_cap(TargetFacts("t", False, 1000)) == 960 and seq_len_cap(TargetFacts("t", False, None)) == 3072
    c = resolve_defaults(TrainConfig(target="t", steps=10_000), target=TargetFacts("t", False, 1000),
                         facts=Facts(longest=5000, samples=10, cuda=False)).config
    assert (c.seq_len, c.batch_size, c.lr, c.feature_store_gib, c.compile_drafter) == (960, 32, 6e-4, 0.0, "auto")
    assert [lr_for_batch(b) for b in (1, 32, 64, 128)] == [6e-4, 6e-4, 8.5e-4, 1.2e-3]  # 1.2e-3: the knob study's


def test_prepare_run_resolves_a_real_architecture_from_its_data_and_cuts_the_tokenized_data(tmp_path):
    from dflash_lab.data.tokenize import load_dataset
    from dflash_lab.train.prepare import prepare_run

    lines = []
    prep = prepare_run(TrainConfig(target="bench:smollm2-135m", steps=5, runs_dir=str(tmp_path)), log=lines.append)
    c = prep.config
    longest = int(prep.data.lengths.max())
    assert c.seq_len == -(-longest // 64) * 64 and c.num_anchors == c.seq_len // 6
    assert (c.block_size, c.num_draft_layers, c.batch_size, c.lr, c.loss_weighting) == (16, 5, 32, 6e-4, "dpace")
    assert (c.feature_store_gib, c.compile_drafter) == (0.0, "auto")  # CPU: no store; auto stays eager there
    again = load_dataset(prep.tokenizer, "tiny", seq_len=c.seq_len, block_size=16)
    assert prep.data.input_ids.equal(again.input_ids) and prep.data.loss_mask.equal(again.loss_mask)
    assert prep.data.report["seq_len"] == c.seq_len and len(prep.data) == len(again)
    (settings,) = [m for m in lines if m.startswith("settings:")]  # after the tokenized data's cache line
    assert settings.startswith("settings: block 16 (paper default for real targets)")
    assert f"seq_len {c.seq_len} (longest sample {longest} tokens" in settings


def test_the_tiny_demo_trains_exactly_as_before():
    """The notebook's shape parameters are None (chosen for the target) and the tiny target gets what they were."""
    from dflash_lab.train.prepare import prepare_run

    defaults = notebook_params.parameter_defaults("train.ipynb")
    for name in ("block_size", "num_anchors", "seq_len", "batch_size", "num_draft_layers", "lr", "loss_weighting",
                 "compile_drafter", "feature_store_gib", "feature_store_host_gib"):
        assert defaults[name] is None, name
    assert defaults["draft_vocab_size"] == 0  # the pruned head stays opt-in
    c = prepare_run(TrainConfig(target="tiny", steps=400), log=None).config
    assert (c.block_size, c.num_anchors, c.seq_len, c.batch_size, c.num_draft_layers, c.lr) == (8, 24, 192, 8, 2, 3e-3)
    assert (c.loss_weighting, c.compile_drafter, c.feature_store_gib, c.resolved_gamma) == ("decay", False, 0.0, 4.0)


def test_the_cli_writes_the_chosen_values_into_config_json(tmp_path):
    from dflash_lab.train.cli import new_run, parse_args

    run_dir = new_run(parse_args(["--data", "tiny", "--target", "bench:qwen3-8b", "--steps", "3", "--runs-dir",
                                  str(tmp_path), "--set", "block_size=8"]))
    saved = json.loads((run_dir / "config.json").read_text())
    assert saved["block_size"] == 8  # set on the command line
    assert (saved["num_draft_layers"], saved["loss_weighting"], saved["batch_size"]) == (5, "dpace", 32)
    assert all(saved[f] is not None for f in RESOLVED_FIELDS)  # every rank reads the same values


def test_the_memory_model_picks_the_batch_and_sizes_the_store_on_a_gpu_of_given_free_memory():
    """SmolLM2's architecture (random weights, the tiny tokenizer) on one "cuda:0" whose free memory is fed in: the
    batch is the largest the memory model fits, the store holds every window when the room beside the run does."""
    from dflash_lab.train.placement import Placement
    from dflash_lab.train.prepare import resolve_settings

    def chosen(free_gib: float, host_gib: float = 64.0, steps: int = 2000):
        cfg = TrainConfig(target="bench:smollm2-135m", steps=steps, devices=("cuda:0",))
        return resolve_settings(cfg, placement=Placement(("cuda:0",), ("cuda:0",)), log=None,
                                mem_get_info=lambda d: (int(free_gib * 2**30), int(80 * 2**30)),
                                host_room=int(host_gib * 2**30))[0].config

    big = chosen(75.0)
    assert (big.batch_size, big.lr, big.compile_drafter) == (64, 8.5e-4, "auto")
    assert big.feature_store_gib > 0 and big.feature_store_host_gib == 0.0  # the tiny data fits beside the run
    small = chosen(4.0, host_gib=0.0)
    assert small.batch_size < 64 and small.lr == 6e-4
    assert chosen(75.0, steps=1).feature_store_gib == 0.0  # seen once: no store


def test_the_batch_on_a_gpu_count_that_divides_no_power_of_two_is_still_sized_by_memory():
    """Three GPUs: 64 / 32 / 16 do not divide by 3, and the choice fell to 3 (one sequence a GPU) without asking the
    memory model; it now tries the multiples of 3 below them, largest first."""
    t = target_facts("smollm2-135m")
    devices = ("cuda:0", "cuda:1", "cuda:2")
    for room, want in ((64, 63), (40, 30), (64 * 8, 63)):
        facts = Facts(longest=300, samples=20_000, max_batch=room)
        r = resolve_defaults(TrainConfig(target="smollm2-135m", data="x.jsonl", steps=1000, devices=devices),
                             target=t, facts=facts)
        assert r.config.batch_size == want
    assert "63/30/15/6/3" in r.line()


def test_a_dspark_run_gets_the_loss_weighting_its_variant_trains_with():
    """The variant's rule (TrainConfig.variant_loss_weighting) chooses the weighting: decay for dspark on a real
    target, where a dflash run gets D-PACE."""
    t = target_facts("smollm2-135m")
    facts = Facts(longest=1930, samples=29_677, max_batch=64, gib_per_window=0.002)
    common = dict(target="smollm2-135m", data="x.jsonl", steps=10_000, devices=("cuda:0",))
    spark = resolve_defaults(TrainConfig(**common, drafter_variant="dspark"), target=t, facts=facts)
    plain = resolve_defaults(TrainConfig(**common), target=t, facts=facts)
    assert (spark.config.loss_weighting, plain.config.loss_weighting) == ("decay", "dpace")
    assert "dspark trains with the decayed slot weights it is published with" in spark.line()
    assert TrainConfig.variant_loss_weighting("dflash") is None
