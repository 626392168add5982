"""Config validation: every bad value raises at construction, naming the field, the value and the fix."""

import pytest

from dflash_lab.config import ConfigError, DrafterConfig, TrainConfig
from dflash_lab.train.placement import devices_for
from dflash_lab.config.target_defaults import default_target_layer_ids
from tests.conftest import make_tiny_qwen3


def test_layer_id_rule_qwen3_8b():
    assert default_target_layer_ids(36, 5) == (1, 9, 17, 25, 33)
    assert default_target_layer_ids(8, 5) == (1, 2, 3, 4, 5)
    assert default_target_layer_ids(36, 1) == (18,)
    assert default_target_layer_ids(64, 5) == (1, 16, 31, 46, 61)


@pytest.mark.parametrize("field,value,needle", [
    ("block_size", 1, "block_size >= 2"),
    ("num_anchors", 0, "num_anchors >= 1"),
    ("steps", 0, "steps >= 1"),
    ("layer_types", ("full_attention", "banana"), "unknown layer type 'banana'"),
    ("lr", -1.0, "positive"),
    ("devices", (), "non-empty"),
    ("time_budget_s", 0, "positive number of seconds"),
    ("time_budget_s", -60.0, "use e.g. 540"),
])
def test_train_config_rejects(field, value, needle):
    kw = {field: value}
    if field == "layer_types":
        kw["num_draft_layers"] = 2
    with pytest.raises(ConfigError) as e:
        TrainConfig(**kw)
    msg = str(e.value)
    assert f"TrainConfig.{field}" in msg and needle in msg and "Fix:" in msg


def _dc(**over):
    cfg = make_tiny_qwen3().config
    kw = dict(num_draft_layers=2, block_size=8, mask_token_id=255)
    kw.update(over)
    return DrafterConfig.from_target(cfg, **kw)


@pytest.mark.parametrize("over,needle", [
    ({"block_size": 1}, "DrafterConfig.block_size=1"),
    ({"mask_token_id": 256}, "outside the target vocabulary [0, 256)"),
    ({"target_layer_ids": (1, 8)}, "out of range for a target with 8 layers"),
    # the last layer's output: raw in vLLM, after the final norm in z-lab's code, refused by SGLang
    ({"target_layer_ids": (1, 7)}, "id 7 is the target's last layer (L - 1 with L = 8)"),
    ({"target_layer_ids": (1, 7)}, "use ids up to 6"),
    ({"num_target_features": 1, "target_layer_ids": None}, None),
    ({"layer_types": ("full_attention", "global")}, "unknown layer type 'global'"),
    ({"layer_types": ("sliding_attention", "full_attention")}, "need a window"),
])
def test_drafter_config_rejects(over, needle):
    if needle is None:  # the default layer rule never picks the last layer (L = 8, one feature: layer 4)
        assert _dc(**over).target_layer_ids == (4,)
        return
    with pytest.raises(ConfigError, match="Fix:") as e:
        _dc(**over)
    assert needle in str(e.value)


def test_default_layer_rule_never_picks_the_last_layer():
    from dflash_lab.config.target_defaults import default_target_layer_ids

    for L in range(4, 80):
        for n in range(1, 8):
            assert max(default_target_layer_ids(L, n)) <= L - 2, (L, n)


def test_plain_rope_is_rope_scaling_none():
    assert _dc().rope_scaling is None
    plain = DrafterConfig(**{**_dc().to_dict(), "rope_scaling": {"rope_type": "default", "rope_theta": 1e4}})
    assert plain.rope_scaling is None
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}
    assert DrafterConfig(**{**_dc().to_dict(), "rope_scaling": yarn}).rope_scaling == yarn


def test_drafter_hidden_size_must_match_target():
    good = _dc()
    with pytest.raises(ConfigError) as e:
        DrafterConfig(**{**good.to_dict(), "hidden_size": 32})
    assert "hidden_size=32" in str(e.value) and "(64)" in str(e.value)


def test_from_target_copies_shape_and_override():
    dc = _dc(target_layer_ids=(0, 3, 6))
    assert dc.target_layer_ids == (0, 3, 6) and dc.hidden_size == 64 and dc.num_key_value_heads == 2
    assert dc.tie_word_embeddings is True and dc.vocab_size == 256 and dc.layer_types == ("full_attention",) * 2


def test_round_trip_json(tmp_path):
    cfg = TrainConfig(steps=7, devices=("cpu",), layer_types=("full_attention",) * 5)
    cfg.to_json(tmp_path / "c.json")
    assert TrainConfig.from_json(tmp_path / "c.json") == cfg
    with pytest.raises(ConfigError, match="unknown fields"):
        TrainConfig.from_dict({"stepz": 3})


def test_devices_for():
    assert devices_for([]) == ("cpu",)
    assert devices_for([0, 1]) == ("cuda:0", "cuda:1")
    with pytest.raises(ConfigError):
        devices_for([1.5])


# --- every field validated by its annotation (type, finiteness) plus ranges ------------------------------------------
NAN = float("nan")


@pytest.mark.parametrize("field,value,needle", [
    ("lr", "abc", "must be float | None, got str"),  # papermill `-p lr abc`
    ("seed", "abc", "must be int, got str"),  # papermill `-p seed abc`
    ("steps", True, "must be int, got bool"),
    ("steps", 2.5, "must be int, got float"),
    ("run_name", 3, "must be str, got int"),
    ("enable_thinking", "yes", "got str"),
    ("devices", ("cpu", 0), "tuple[str, ...]"),
    ("lr", float("inf"), "finite"),
    ("weight_decay", NAN, "finite"),
    ("weight_decay", -0.1, "must be >= 0"),
    ("gamma", NAN, "finite"),
    ("grad_clip", NAN, "finite"),
    ("warmup_ratio", NAN, "finite"),
    ("seed", -1, "[0, 2**63)"),
    ("num_anchors", 100000, "at most seq_len - 1 = 255"),
])
def test_every_field_is_type_finiteness_and_range_checked(field, value, needle):
    with pytest.raises(ConfigError) as e:
        TrainConfig(**{"seq_len": 256, field: value})
    msg = str(e.value)
    assert msg.startswith(f"TrainConfig.{field}={value!r} is invalid") and needle in msg and "Fix:" in msg


def test_json_lists_become_tuples_and_ints_pass_as_floats():
    cfg = TrainConfig(devices=["cpu"], target_layer_ids=[1, 2], lr=1, num_anchors=255)
    assert cfg.devices == ("cpu",) and cfg.target_layer_ids == (1, 2) and cfg.lr == 1 and cfg.num_anchors == 255


def test_drafter_config_fields_are_type_checked():
    with pytest.raises(ConfigError, match=r"DrafterConfig.rms_norm_eps=nan is invalid: must be a finite number"):
        DrafterConfig(**{**_dc().to_dict(), "rms_norm_eps": NAN})
    with pytest.raises(ConfigError, match=r"DrafterConfig.rope_theta='1e6' is invalid: must be float"):
        DrafterConfig(**{**_dc().to_dict(), "rope_theta": "1e6"})


@pytest.mark.parametrize("field,hint", [("draft_vocab_size", "`-p draft_vocab_size 16`"), ("seed", "`-p seed 0`"),
                                        ("lr", "`-p lr 0.001`"), ("enable_thinking", "`-p enable_thinking True`")])
def test_the_papermill_hint_shows_a_value_of_the_fields_own_type(field, hint):
    with pytest.raises(ConfigError) as e:
        TrainConfig(**{field: "abc"})
    assert hint in str(e.value) and (field == "lr" or "0.001" not in str(e.value))


def test_gpus_given_as_text_says_to_pass_a_list():
    """`-p gpus "[0]"` hands the notebook the string "[0]": the error names gpus and the -y fix, not `devices`."""
    with pytest.raises(ConfigError, match=r"gpus='\[0\]' is text.*-y 'gpus: \[0\]'"):
        devices_for("[0]")


def test_no_gpu_error_names_each_device_once():
    import torch

    from dflash_lab.train.placement import PlacementError, make_placement

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the no-GPU error cannot happen")
    with pytest.raises(PlacementError) as err:
        make_placement(devices_for([0]))
    assert "('cuda:0',) ask for GPUs" in str(err.value) and str(err.value).count("cuda:0") == 1


def test_dspark_defaults_have_one_source():
    """markov_rank's default is DrafterConfig's field; the loss weights' are TrainConfig's fields: the other places
    that name them (TrainConfig, from_target, LossWeighting, the step benchmark's flag) read those."""
    from dflash_lab.config import DrafterConfig, TrainConfig
    from dflash_lab.config.field_types import field_default
    from dflash_lab.config.train_config import DSPARK_LOSS_TERMS
    from dflash_lab.drafter.loss_weights import LossWeighting

    rank = field_default(DrafterConfig, "markov_rank")
    assert field_default(TrainConfig, "markov_rank") == rank
    assert LossWeighting().head_terms == tuple((t, field_default(TrainConfig, f)) for t, f in DSPARK_LOSS_TERMS)
