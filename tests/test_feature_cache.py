"""Offline feature cache: disk estimate shown before writing, shards hold exactly the live target's features, a
training step from the cache equals one with the live target, resume at shard granularity, clear errors."""

import json
import shutil

import pytest
import torch

from dflash_lab.data.chat_formats import DataError
from dflash_lab.data.feature_cache import (GIB, CachedFeatureExtractor, FeatureCache, cache_size_bytes,
                                      write_feature_cache)

LAYERS = (1, 3, 5)


@pytest.fixture(scope="module")
def setup():
    from dflash_lab.data.chat_formats import ChatData
    from dflash_lab.data.tokenize import read_conversations, resolve_data_path, tokenize_dataset
    from dflash_lab.target.load import load_target, load_tokenizer

    tok, model = load_tokenizer("tiny"), load_target("tiny")
    chat = read_conversations(resolve_data_path("tiny"))
    data = tokenize_dataset(tok, ChatData(chat.conversations[:12]), seq_len=160, block_size=8)
    return tok, model, data


@pytest.fixture(scope="module")
def live(setup):
    from dflash_lab.target.features import FeatureExtractor

    _, model, data = setup
    return FeatureExtractor(model, LAYERS)(data.input_ids.long())  # (12, 160, 3*H) over the full padded rows


@pytest.fixture(scope="module")
def cache_dir(setup, tmp_path_factory):
    _, model, data = setup
    out = tmp_path_factory.mktemp("cache")
    per_sample = cache_size_bytes(data, num_features=3, hidden_size=128, dtype=torch.float32) / len(data)
    logs = []
    cache = write_feature_cache(out, data, target=model, layer_ids=LAYERS, batch_size=5,
                                shard_gib=2.5 * per_sample / GIB, log=logs.append, progress_every_s=0.0)
    return out, cache, logs


def test_disk_estimate_is_shown_first_and_matches_what_is_written(setup, cache_dir):
    _, _, data = setup
    out, cache, logs = cache_dir
    est = cache_size_bytes(data, num_features=3, hidden_size=128, dtype=torch.float32)
    assert est == int(data.lengths.sum()) * 3 * 128 * 4 + 12 * 40
    assert logs[0].startswith(f"feature cache: 12 samples, {int(data.lengths.sum()):,} tokens x 3 layers x 128 "
                              f"(float32) -> ~{est / GIB:.3f} GiB")
    assert any(line.startswith("feature cache: 10/12 samples") for line in logs)  # progress while writing
    shards = sorted(out.glob("features-*.safetensors"))
    index = json.loads((out / "index.json").read_text())
    # a shard closes after the batch that passes shard_gib (2.5 samples): batches of 5 -> shards of 5, 5, 2
    assert [len(s["samples"]) for s in index["shards"]] == [5, 5, 2] and len(shards) == 3
    stored = sum(p.stat().st_size for p in shards)
    assert 0.95 * est < stored < 1.05 * est + len(shards) * 4096


def test_cached_features_equal_the_live_target(setup, live, cache_dir):
    _, _, data = setup
    cache = FeatureCache(cache_dir[0])
    assert len(cache) == 12 and cache.layer_ids == LAYERS and cache.missing(data) == 0
    for i in range(12):
        L = int(data.lengths[i])
        torch.testing.assert_close(cache.get(i), live[i, :L], rtol=1e-5, atol=1e-5)
    rows = torch.tensor([7, 2, 11, 0])
    ext = CachedFeatureExtractor(cache, layer_ids=LAYERS)
    got = ext(data.input_ids[rows].long())  # looked up by row content, like FeatureExtractor is called
    real = torch.arange(160)[None] < data.lengths[rows][:, None]
    torch.testing.assert_close(got[real], live[rows][real], rtol=1e-5, atol=1e-5)
    assert not got[~real].any()  # beyond a row's length: zeros (never attended: context is strictly before p)


def test_a_training_step_from_the_cache_equals_one_with_the_live_target(setup, cache_dir):
    from dflash_lab.config import DrafterConfig
    from dflash_lab.drafter.batches import BatchSampler
    from dflash_lab.drafter.model import DFlashDrafter
    from dflash_lab.train.optim import MasterAdamW
    from dflash_lab.drafter.step import DraftInputs, build_masks, train_step
    from dflash_lab.target.features import FeatureExtractor, embedding_of, lm_head_weight

    tok, model, data = setup
    dc = DrafterConfig.from_target(model.config, num_draft_layers=1, target_layer_ids=LAYERS, block_size=8,
                                   mask_token_id=tok.mask_token_id)
    sampler = BatchSampler(data, batch_size=4, num_anchors=6, block_size=8, mask_token_id=tok.mask_token_id,
                           gamma=4.0, seed=0)
    results = []
    for extractor in (FeatureExtractor(model, LAYERS), CachedFeatureExtractor(cache_dir[0], layer_ids=LAYERS)):
        drafter = DFlashDrafter(dc)
        drafter.init_weights(torch.Generator().manual_seed(0))
        opt = MasterAdamW(drafter.parameters(), lr=1e-3)
        losses = []
        for step in range(3):
            batch = sampler.batch(step)
            masks = build_masks(batch, seq_len=160, backend="sdpa", layer_types=dc.layer_types, sliding_window=None)
            inputs = DraftInputs(batch, masks, torch.arange(160)[None].expand(4, -1))
            out = train_step(drafter, opt, embedding_of(model), lm_head_weight(model), extractor(batch.input_ids),
                             inputs, lr=1e-3, grad_clip=1.0, chunk_size=4096)
            losses.append(out["loss"].item())
        results.append((losses, drafter.state_dict()))
    assert results[0][0] == pytest.approx(results[1][0], rel=1e-5, abs=1e-6)
    for k, v in results[0][1].items():
        torch.testing.assert_close(results[1][1][k], v, rtol=1e-4, atol=1e-5)


def test_resume_rewrites_only_missing_shards(setup, cache_dir, tmp_path):
    _, model, data = setup
    out = tmp_path / "c"
    shutil.copytree(cache_dir[0], out)
    index = json.loads((out / "index.json").read_text())
    last = index["shards"].pop()
    (out / last["file"]).unlink()
    (out / "index.json").write_text(json.dumps(index))
    logs = []
    cache = write_feature_cache(out, data, target=model, layer_ids=LAYERS, batch_size=5, log=logs.append)
    assert f"feature cache: resuming, {12 - len(last['samples'])} samples already" in "\n".join(logs)
    assert f"({len(last['samples'])} samples)" in logs[-1]
    assert cache.missing(data) == 0
    for i in last["samples"]:
        torch.testing.assert_close(cache.get(i), FeatureCache(cache_dir[0]).get(i))


def test_errors_name_the_problem_and_the_fix(setup, cache_dir, tmp_path, monkeypatch):
    _, model, data = setup
    with pytest.raises(DataError, match=r"holds layers \(1, 3, 5\), the drafter needs \(1, 2\). Fix: rebuild"):
        CachedFeatureExtractor(cache_dir[0], layer_ids=(1, 2))
    ext = CachedFeatureExtractor(cache_dir[0], layer_ids=LAYERS)
    other = data.input_ids[:2].long().clone()
    other[1, 0] += 1
    with pytest.raises(DataError, match="batch row 1 is not in the feature cache"):
        ext(other)
    with pytest.raises(DataError, match="built for seq_len=160, the batch has 80"):
        ext(data.input_ids[:2, :80].long())
    with pytest.raises(DataError, match="holds a feature cache built with other settings"):
        write_feature_cache(cache_dir[0], data, target=model, layer_ids=(1, 2), log=lambda s: None)
    with pytest.raises(DataError, match="is not a feature cache"):
        FeatureCache(tmp_path)
    import collections

    Usage = collections.namedtuple("Usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(10**9, 10**9 - 1000, 1000))
    logs = []
    with pytest.raises(DataError, match=r"needs ~0.00 GiB more but .* has 0.00 GiB free. Fix: free disk space"):
        write_feature_cache(tmp_path / "full", data, target=model, layer_ids=LAYERS, log=logs.append)
    assert "GiB in" in logs[0] and not list((tmp_path / "full").glob("*.safetensors"))  # estimate shown, nothing written


def test_trainer_trains_from_the_cache_like_from_the_live_target(setup, tmp_path):
    """TrainConfig.feature_cache: the Trainer reads features from the cache (no target layer runs) and logs the same
    losses as with online features."""
    from dflash_lab import TrainConfig, Trainer
    from dflash_lab.data.chat_formats import ChatData
    from dflash_lab.data.tokenize import read_conversations, resolve_data_path, tokenize_dataset

    tok, model, _ = setup
    convs = read_conversations(resolve_data_path("tiny")).conversations[:8]
    data_file = tmp_path / "small.jsonl"
    data_file.write_text("".join(json.dumps({"messages": c.messages}) + "\n" for c in convs))
    kw = dict(target="tiny", data=str(data_file), seq_len=128, batch_size=4, block_size=8, num_anchors=6,
              num_draft_layers=1, target_layer_ids=LAYERS, steps=3, lr=1e-3)
    data = tokenize_dataset(tok, ChatData(convs), seq_len=128, block_size=8)
    write_feature_cache(tmp_path / "cache", data, target=model, layer_ids=LAYERS, log=lambda *a: None)
    losses = []
    for cache in (None, str(tmp_path / "cache")):
        tr = Trainer(TrainConfig(**kw, feature_cache=cache), write_run_dir=False, log=lambda *a: None)
        if cache:
            assert type(tr.engine.targets[0].extractor).__name__ == "CachedFeatureExtractor"
        tr.step(3)
        losses.append([r["loss"] for r in tr.history])
        tr.close()
    assert losses[1] == pytest.approx(losses[0], rel=1e-5, abs=1e-6)
