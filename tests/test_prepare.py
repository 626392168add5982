"""prepare.py: the notebook Trainer and a torchrun rank start from the same prepared inputs, every data setting
included (format, error policy, thinking mode, feature cache, target devices); dtype/attention decided per device."""

import json

import pytest
import torch

from dflash_lab import TrainConfig
from dflash_lab.train.distributed import DistConfig, DistContext
from dflash_lab.data.feature_cache import CachedFeatureExtractor, write_feature_cache
from dflash_lab.train.prepare import plan_device, prepare_run
from dflash_lab.train.rank_trainer import RankTrainer
from dflash_lab.train.trainer import Trainer

LAYERS = (1, 3, 5)


@pytest.fixture(scope="module")
def settings(tmp_path_factory):
    """Non-default data settings and an offline feature cache built for exactly them."""
    from dflash_lab.data.tokenize import load_dataset, read_conversations, resolve_data_path
    from dflash_lab.target.load import load_target, load_tokenizer

    tmp = tmp_path_factory.mktemp("prepare")
    convs = read_conversations(resolve_data_path("tiny")).conversations[:8]
    data_file = tmp / "small.jsonl"
    data_file.write_text("".join(json.dumps({"messages": c.messages}) + "\n" for c in convs))
    tok = load_tokenizer("tiny")
    data = load_dataset(tok, str(data_file), seq_len=128, block_size=8, enable_thinking=False, data_format="openai",
                        on_error="raise")
    write_feature_cache(tmp / "cache", data, target=load_target("tiny"), layer_ids=LAYERS, log=lambda *a: None)
    cfg = TrainConfig(target="tiny", data=str(data_file), data_format="openai", data_errors="raise",
                      enable_thinking=False, feature_cache=str(tmp / "cache"), target_devices=("cpu",), seq_len=128,
                      batch_size=2, block_size=8, num_anchors=4, num_draft_layers=1, target_layer_ids=LAYERS, steps=2,
                      runs_dir=str(tmp / "runs"))
    return cfg, tmp


def test_trainer_and_torchrun_rank_get_identical_prepared_inputs(settings):
    cfg, tmp = settings
    trainer = Trainer(cfg, write_run_dir=False, log=lambda *a: None)
    ctx = DistContext(DistConfig(), train_devices=cfg.devices, env=None)
    rank = RankTrainer(cfg, ctx, tmp / "rank_run", log=lambda *a: None)
    try:
        a, b = trainer.prepared.summary(), rank.prepared.summary()
        assert a.keys() == b.keys()
        for key in a:
            assert a[key] == b[key], key
        # every setting reached the reader, the tokenizer and the features on both paths
        assert a["config"]["enable_thinking"] is False and a["config"]["data_format"] == "openai"
        assert a["config"]["data_errors"] == "raise" and a["num_samples"] == 8
        assert type(trainer.engine.targets[0].extractor) is CachedFeatureExtractor
        assert type(rank.extractor) is CachedFeatureExtractor
        assert rank.dtype == trainer.prepared.dtype("cpu") == torch.float32
        assert rank.attention == trainer.workers[0].attention == "sdpa"
    finally:
        trainer.close()
        rank.close()


def test_format_and_error_policy_reach_the_reader(settings):
    """The comparison above is not vacuous: the format and the error policy it checks do act on the data."""
    from dflash_lab.data.chat_formats import DataError

    cfg, _ = settings
    with pytest.raises(DataError, match="small.jsonl:1"):  # raise: stops at the first record, naming it
        prepare_run(cfg.replace(feature_cache=None, data_format="sharegpt"), log=None)
    with pytest.raises(DataError, match="skipped 8"):  # skip: counts all 8 (then finds nothing usable)
        prepare_run(cfg.replace(feature_cache=None, data_format="sharegpt", data_errors="skip"), log=None)


def test_dtype_and_attention_are_decided_once_per_device():
    cfg = TrainConfig()
    assert (plan_device(cfg, "cpu").dtype, plan_device(cfg, "cpu").attention) == (torch.float32, "sdpa")
    assert (plan_device(cfg, "cuda:1").dtype, plan_device(cfg, "cuda:1").attention) == (torch.bfloat16, "flex")
    forced = cfg.replace(dtype="float32", attention="flex")
    assert (plan_device(forced, "cuda:0").dtype, plan_device(forced, "cuda:0").attention) == (torch.float32, "flex")


def test_torchrun_resume_overrides_only_the_command_line_fields(tmp_path):
    """`python -m dflash_lab.train --config <run>/config.json --resume <run> --steps 6`: the checkpoint's config with
    `steps` alone changed, printed; the run goes on to step 6 on the rank loop."""
    from dflash_lab.runs import rundir
    from dflash_lab.train.distributed import DIST_CONFIG_FILE
    from dflash_lab.train.cli import load_configs, parse_args
    from tests.golden import config as golden_config

    cfg = golden_config(tmp_path).replace(steps=4, checkpoint_every=2)
    first = Trainer(cfg, log=lambda *a: None)
    first.train()
    first.close()
    rundir.write_json(first.run_dir / DIST_CONFIG_FILE, DistConfig().to_dict())
    args = parse_args(["--config", str(first.run_dir / "config.json"), "--resume", str(first.run_dir),
                       "--steps", "6"])
    asked, dcfg, run_dir, explicit = load_configs(args)
    assert explicit == {"resume_from", "steps"}
    logs = []
    ctx = DistContext(dcfg, train_devices=asked.devices, env=None)
    rank = RankTrainer(asked, ctx, run_dir, log=logs.append, explicit=explicit)
    try:
        assert rank.step_count == 4 and rank.config.steps == 6 and rank.config.lr == cfg.lr
        assert "  steps: 4 -> 6 (set by you)" in logs
        rank.train(progress_every_s=1e9)
        assert rank.step_count == 6
    finally:
        rank.close()
        ctx.close()


def test_skipped_lines_are_counted_with_an_example_and_where_the_rest_are(tmp_path):
    """A data file with bad lines: the log line counts them per reason, quotes the first one with its file:line, and
    says which file holds the others; json's own "... at" message (here the line's newline inside a string) is
    completed by the column, never "at at"."""
    from dflash_lab.data.tokenize import read_conversations, resolve_data_path

    convs = read_conversations(resolve_data_path("tiny")).conversations[:6]
    path = tmp_path / "bad.jsonl"
    lines = [json.dumps({"messages": c.messages}) for c in convs]
    path.write_text("\n".join(lines[:3] + ['{"messages": "unterminated'] + lines[3:] + ["{oops"]) + "\n")
    logged = []
    cfg = TrainConfig(target="tiny", data=str(path), seq_len=128, batch_size=2, block_size=8, num_anchors=4,
                      num_draft_layers=1, steps=2, runs_dir=str(tmp_path / "runs"))
    prepared = prepare_run(cfg, log=logged.append)
    assert len(prepared.data) == 6 and prepared.data.report["skipped"] == {"malformed_json": 2}
    (line,) = [m for m in logged if m.startswith("data: kept")]
    assert line == (f"data: kept 6 of 8 records, skipped {{'malformed_json': 2}} (e.g. {path}:4: not valid JSON: "
                    f"the line ends before the record does (unterminated string starting at column 14): a cut-off (truncated) "
                    f"line); the run folder's data_report.json names the "
                    f"file:line of the first 5 of each reason")
    assert prepared.data.report["examples"]["malformed_json"][1].startswith(f"{path}:8: not valid JSON: Expecting")
