"""The device-resident feature store: windows seen before are served from memory, exactly what the target gives."""

from __future__ import annotations

import pytest
import torch

from dflash_lab.config import ConfigError, TrainConfig
from dflash_lab.train.feature_store import FeatureStore, window_key


def _store(rows: int, S: int = 4, W: int = 3) -> FeatureStore:
    per_row = S * W * 4
    return FeatureStore(gib=rows * per_row / 2**30, seq_len=S, width=W, dtype=torch.float32, device=torch.device("cpu"))


def test_keys_tell_windows_and_packings_apart():
    ids = torch.arange(8)
    assert window_key(ids, None) == window_key(ids.clone(), None)
    assert window_key(ids, None) != window_key(ids.flip(0), None)
    docs_a, docs_b = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1]), torch.tensor([0, 0, 1, 1, 1, 1, 1, 1])
    assert window_key(ids, docs_a) != window_key(ids, docs_b)  # same tokens, other documents: other features


def test_a_batch_is_served_only_when_every_window_is_stored():
    store = _store(rows=3)
    keys = [b"a", b"b"]
    feats = torch.randn(2, 4, 3)
    assert store.lookup(keys) is None  # nothing stored yet: the target runs
    store.put(keys, feats)
    assert torch.equal(store.gather(store.lookup(keys)), feats)
    assert store.lookup([b"a", b"c"]) is None  # one new window: the whole batch is computed
    store.put([b"a", b"c"], torch.stack([feats[0], feats[1] * 2]))
    assert torch.equal(store.gather(store.lookup([b"c", b"a"])), torch.stack([feats[1] * 2, feats[0]]))
    store.put([b"d"], torch.zeros(1, 4, 3))  # full (3 rows): kept out, and computed each time it comes back
    assert store.stored == 3 and store.lookup([b"d"]) is None
    assert store.report()["feature_store_hit_rate"] == pytest.approx(4 / 9, abs=1e-4)  # 4 served of 9 asked for


def test_store_size_errors_name_the_fix():
    with pytest.raises(ValueError, match="feature_store_gib=1e-09 holds no window"):
        FeatureStore(gib=1e-9, seq_len=320, width=2880, dtype=torch.bfloat16, device=torch.device("cpu"))
    with pytest.raises(ConfigError, match="feature_store_gib"):
        TrainConfig(feature_store_gib=-1.0)
    with pytest.raises(ConfigError, match="feature_cache=None"):
        TrainConfig(feature_store_gib=1.0, feature_cache="cache/")
    with pytest.raises(ConfigError, match=r"feature_store_host_gib=-2\.0 .*must be a number of GiB >= 0"):
        TrainConfig(feature_store_gib=1.0, feature_store_host_gib=-2.0)
    with pytest.raises(ConfigError, match="holds the windows a GPU store has no room for.*set feature_store_gib > 0"):
        TrainConfig(feature_store_gib=0.0, feature_store_host_gib=8.0)


def _tiny_losses(tmp_path, variants: dict[str, dict], log=lambda *a: None) -> tuple[dict, dict, int]:
    """9 steps of batch 4 on 12 tiny conversations per variant (TrainConfig overrides): the losses, the last
    metrics, and the windows of the data (epoch 1 is windows // 4 steps and runs the target)."""
    from dflash_lab.tiny import tiny_data_path
    from dflash_lab.train.trainer import Trainer

    data = tmp_path / "slice.jsonl"
    data.write_text("".join(tiny_data_path().read_text().splitlines(keepends=True)[:12]))
    cfg = TrainConfig(target="tiny", data=str(data), seq_len=64, batch_size=4, block_size=8, num_anchors=4,
                      num_draft_layers=1, steps=9, seed=0, checkpoint_every=0, eval_every=0)
    curves, last = {}, {}
    for name, over in variants.items():
        trainer = Trainer(cfg.replace(**over), write_run_dir=False, log=log)
        try:
            curves[name] = [trainer.step(1)["loss"] for _ in range(cfg.steps)]
            last[name] = trainer.last_metrics
        finally:
            trainer.close()
    return curves, last, len(trainer.data)


def test_trainer_with_a_store_trains_exactly_as_without(tmp_path):
    """12 conversations, batch 4: epoch 1 (3 steps) runs the target, later epochs read the store; same losses."""
    curves, last, windows = _tiny_losses(tmp_path, {"none": {}, "store": dict(feature_store_gib=0.01)})
    assert curves["store"] == pytest.approx(curves["none"], rel=1e-6, abs=1e-6)
    assert last["store"]["feature_store_stored"] == windows == last["store"]["feature_store_rows"]  # sized to the data
    steps_per_epoch = windows // 4
    assert last["store"]["feature_store_hit_rate"] == pytest.approx((9 - steps_per_epoch) / 9, abs=1e-4)
    assert "feature_store_hit_rate" not in last["none"]


def test_a_store_with_a_host_tier_serves_every_mix_of_device_and_host_rows_exactly():
    """3 rows on the device, 4 in host memory: windows fill the device rows first, then the host's; any batch of
    stored windows comes back exactly as put (bf16 and float8 storage, with the distillation columns), and the
    report counts the share of served windows that came from the host."""
    g = torch.Generator().manual_seed(0)
    feats = torch.randn(7, 5, 6, generator=g).to(torch.bfloat16)
    ids, logp = torch.randint(0, 50, (7, 5, 2), generator=g, dtype=torch.int32), torch.randn(7, 5, 2, generator=g)
    keys = [bytes([i]) * 16 for i in range(7)]
    for storage in ("auto", "float8"):
        row = 5 * (6 * 2 + 8 * 2) if storage == "auto" else 5 * (6 + 4 * 2 + 8 * 2)
        store = FeatureStore(gib=3 * row / 2**30, seq_len=5, width=6, dtype=torch.bfloat16, device="cpu",
                             soft_top_k=2, storage=storage, groups=2, host_rows=4)
        assert (store.rows, store.host_rows) == (3, 4)
        store.put(keys[:4], (feats[:4], ids[:4], logp[:4]))  # 3 device rows and the first host row
        store.put(keys[2:7] + [bytes([9]) * 16], (torch.cat([feats[2:7], feats[:1]]), torch.cat([ids[2:7], ids[:1]]),
                                                  torch.cat([logp[2:7], logp[:1]])))  # full: the 8th is not kept
        assert store.stored == 7 and store.lookup([bytes([9]) * 16]) is None
        for order in ([6, 0, 4, 1], [0, 1, 2, 0], [5, 6, 3, 4]):  # mixed, device only, host only
            slots = store.lookup([keys[i] for i in order])
            assert slots == order  # windows take slots in the order they came
            got_f, got_ids, got_logp = store.gather(slots)
            want = feats[order]
            if storage == "auto":
                assert torch.equal(got_f, want)
            else:  # E4M3: within 1/16 of each element (and of 2^-6 of its row's maximum near zero)
                assert (got_f.float() - want.float()).abs().max() <= want.float().abs().max() / 16
            assert torch.equal(got_ids, ids[order]) and torch.equal(got_logp, logp[order])
        report = store.report()
        assert report["feature_store_host_rows"] == 4 and report["feature_store_stored"] == 7
        assert report["feature_store_host_share"] == pytest.approx(6 / 12)  # 2 + 0 + 4 of the 12 windows served


def test_rows_put_for_the_host_tier_are_a_snapshot_written_before_anything_reads_them():
    """1 device row, 3 host rows: a put stages its host rows (the host tier is written at the store's next call,
    not by the put), a later change to the put's tensor (the target graph's static output is overwritten by the
    next batch) does not reach them, the next put writes the previous rows before staging its own, and a gather
    returns every row exactly."""
    g = torch.Generator().manual_seed(1)
    feats = torch.randn(4, 5, 6, generator=g).to(torch.bfloat16)
    keys = [bytes([i]) * 16 for i in range(4)]
    store = FeatureStore(gib=5 * 6 * 2 / 2**30, seq_len=5, width=6, dtype=torch.bfloat16, device="cpu",
                         host_rows=3)
    assert (store.rows, store.host_rows) == (1, 3)
    store.host_columns[0].zero_()
    out = feats[:3].clone()  # the target's output buffer: rewritten by the next batch
    store.put(keys[:3], out)  # window 0 on the device, windows 1 and 2 staged for host rows 0 and 1
    assert store.stored == 3 and not store.host_columns[0][:2].any()  # staged, not written yet
    out.fill_(7.0)
    store.put(keys[3:4], feats[3:4])  # writes the staged rows first, then stages host row 2
    assert torch.equal(store.host_columns[0][:2], feats[1:3]) and not store.host_columns[0][2].any()
    assert torch.equal(store.gather(store.lookup(keys[::-1])), feats.flip(0))  # host row 2 written by the gather
    assert store._pending is None and torch.equal(store.host_columns[0], feats[1:4])


def test_a_store_with_fewer_rows_than_windows_says_how_few_batches_it_serves(tmp_path, monkeypatch):
    """The placement check found room for 5 of the 12 windows on the GPU (on a GPU it reads free memory; here its
    answer is given): without a host tier the run says that about (5/12)^4 of its batches of 4 can be served; with
    one the other 7 windows live in host memory, every batch after the first epoch is served, and the losses are
    those of a run without a store."""
    import dflash_lab.train.prepare as prepare

    said = []
    monkeypatch.setattr(prepare, "check_placement", lambda placement, **kw: {"cpu": {"feature_store_rows": 5}})
    monkeypatch.setattr(prepare, "host_room_bytes", lambda: 2**30)
    curves, last, windows = _tiny_losses(tmp_path, {"none": {}, "gpu": dict(feature_store_gib=0.01),
                                                    "host": dict(feature_store_gib=0.01, feature_store_host_gib=0.01)},
                                         log=said.append)
    assert windows == 12 and curves["gpu"] == pytest.approx(curves["none"], rel=1e-6, abs=1e-6)
    assert curves["host"] == pytest.approx(curves["none"], rel=1e-6, abs=1e-6)
    notes = [m for m in said if m.startswith("WARNING: feature store:")]
    assert len(notes) == 1 and "5 windows on cpu" in notes[0] and "all the room the GPU has beside the run" in notes[0]
    assert f"of the data's 12: a batch is served from the store only when it holds all 4 of its windows, about " \
           f"{(5 / 12) ** 4:.1%} of batches here" in notes[0] and "feature_store_host_gib=1 keeps the other 7" in notes[0]
    assert last["gpu"]["feature_store_rows"] == last["gpu"]["feature_store_stored"] == 5
    host = last["host"]
    assert host["feature_store_rows"] == 5 and host["feature_store_host_rows"] == 7 and host["feature_store_stored"] == 12
    assert host["feature_store_hit_rate"] == pytest.approx((9 - 3) / 9, abs=1e-4)  # every batch after epoch 1
    assert 0 < host["feature_store_host_share"] < 1


def test_the_note_for_the_long_preset_on_an_80_gb_card_names_what_would_hold_every_window():
    from dflash_lab.train.feature_store import row_bytes
    from dflash_lab.train.prepare import store_note

    row = row_bytes(seq_len=320, width=5 * 576, dtype=torch.bfloat16)
    fp8 = row_bytes(seq_len=320, width=5 * 576, dtype=torch.bfloat16, storage="float8", groups=5)
    note = store_note(windows=55_809, rows=38_566, host_rows=0, per_row=row, devices=("cuda:0",), batch=64,
                      gpu_full=True, fp8_row=fp8)
    assert note == ("WARNING: feature store: 38,566 windows on cuda:0 (66.2 GiB, all the room the GPU has beside the "
                    "run) of the data's 55,809: a batch is served from the store only when it holds all 64 of its "
                    "windows, about 0.0% of batches here; the target computes the others. Fix: "
                    "feature_store_host_gib=30 keeps the other 17,243 in host memory (if the machine has it); or "
                    "feature_store_dtype=\"float8\" holds 55,809 in the same GPU memory.")
    asked_little = store_note(windows=100, rows=90, host_rows=5, per_row=row, devices=("cuda:0", "cuda:0"),
                              batch=8, gpu_full=False, fp8_row=0)
    assert "90 windows on cuda:0 (0.2 GiB) + 5 in host memory (0.0 GiB) of the data's 100" in asked_little
    assert f"about {0.95 ** 8:.1%} of batches" in asked_little
    assert "Fix: feature_store_gib=1 holds every window on the GPU; or feature_store_host_gib=1 keeps" in asked_little


def test_store_bytes_never_count_more_rows_than_the_data_has_windows():
    from dflash_lab.train.feature_store import GIB, row_bytes, store_bytes

    # SmolLM2-135M features (5 layers x 576) at seq 320 in bf16: 1,843,200 bytes a window
    shape = dict(seq_len=320, width=5 * 576, dtype=torch.bfloat16)
    assert row_bytes(**shape) == 1_843_200
    assert row_bytes(**shape, soft_top_k=16) == 1_843_200 + 320 * 16 * 8
    # the H200 run with 59,453 conversations (55,809 windows): 100 GiB and 115 GiB asked both take 95.8 GiB, so a
    # placement check must not count the 115
    for gib in (100, 115):
        assert store_bytes(gib=gib, windows=55_809, **shape) == 55_809 * 1_843_200
    assert round(store_bytes(gib=115, windows=55_809, **shape) / GIB, 2) == 95.80
    assert store_bytes(gib=60, windows=None, **shape) == int(60 * GIB // 1_843_200) * 1_843_200  # 34,952 rows
    assert store_bytes(gib=0, windows=100, **shape) == 0


def test_float8_storage_halves_a_window_and_rounds_each_element_to_3_mantissa_bits():
    from dflash_lab.train.feature_store import row_bytes

    shape = dict(seq_len=320, width=5 * 576, dtype=torch.bfloat16)
    assert row_bytes(**shape, storage="float8", groups=5) == 320 * (2880 + 5 * 4)  # 928,000: 0.503 of bf16's
    S, groups, H = 6, 3, 64
    g = torch.Generator().manual_seed(0)
    feats = torch.randn(2, S, groups * H, generator=g)
    feats[..., 5] *= 300.0  # a massive-activation channel in layer 0: its scale must not flatten layer 1 and 2
    feats[0, 1] = 0.0  # an all-zero position (padding): no division by zero
    per_row = S * (groups * H + 4 * groups)
    store = FeatureStore(gib=2 * per_row / 2**30, seq_len=S, width=groups * H, dtype=torch.float32,
                         device=torch.device("cpu"), storage="float8", groups=groups)
    assert store.rows == 2 and store.features.dtype == torch.uint8 and store.features.element_size() == 1
    store.put([b"a", b"b"], feats)
    back = store.gather(store.lookup([b"a", b"b"]))
    assert back.dtype == torch.float32 and back.shape == feats.shape
    scale = feats.view(2, S, groups, H).abs().amax(-1, keepdim=True) / 448.0
    bound = feats.abs() / 16 + (scale * 2**-10).expand(2, S, groups, H).reshape(feats.shape)
    err = (back - feats).abs()
    assert bool((err <= bound * (1 + 1e-6) + 1e-30).all())
    assert torch.equal(back[0, 1], torch.zeros(groups * H))
    rel = (err / feats.abs().clamp(min=1e-3)).median().item()
    assert 1e-3 < rel < 0.04  # rounded (not a bf16 copy), within E4M3's half-ulp of 1/16
    with pytest.raises(ValueError, match="width 10 is not 3 target layers"):
        FeatureStore(gib=1.0, seq_len=S, width=10, dtype=torch.float32, device=torch.device("cpu"),
                     storage="float8", groups=3)
    with pytest.raises(ConfigError, match="feature_store_dtype.*feature_store_gib > 0"):
        TrainConfig(feature_store_gib=0.0, feature_store_dtype="float8")  # None: chosen for the target, may be on
    with pytest.raises(ConfigError, match="feature_store_dtype"):
        TrainConfig(feature_store_gib=1.0, feature_store_dtype="fp4")


def test_trainer_with_a_float8_store_trains_closely_and_alike_whatever_the_store_holds(tmp_path, monkeypatch):
    """float8 storage: every step reads rounded features (computed or served), close to the run without a store;
    a store with room for 5 of the 12 windows (so most batches are computed) gives the very same losses."""
    import dflash_lab.train.prepare as prepare

    float8 = dict(feature_store_gib=0.01, feature_store_dtype="float8")
    curves, last, windows = _tiny_losses(tmp_path, {"none": {}, "float8": float8})
    monkeypatch.setattr(prepare, "check_placement", lambda placement, **kw: {"cpu": {"feature_store_rows": 5}})
    small, small_last, _ = _tiny_losses(tmp_path, {"float8": float8})
    pairs = list(zip(curves["float8"], curves["none"]))
    assert all(a != b for a, b in pairs)  # rounded features from step 1 on
    assert all(abs(a - b) <= 0.02 * abs(b) for a, b in pairs)
    assert small["float8"] == curves["float8"]  # bitwise: the store's size does not reach the numbers
    assert last["float8"]["feature_store_stored"] == windows and last["float8"]["feature_store_storage"] == "float8"
    assert small_last["float8"]["feature_store_stored"] == 5


@pytest.mark.gpu
def test_on_the_gpu_host_rows_are_copied_out_without_waiting_and_land_exactly():
    """On CUDA the put's host rows go to pinned staging with an asynchronous copy (an event marks it), the put's
    output buffer is overwritten right after on the same stream, and every row still comes back exactly."""
    g = torch.Generator().manual_seed(2)
    feats = torch.randn(8, 16, 32, generator=g).to(torch.bfloat16)
    keys = [bytes([i]) * 16 for i in range(8)]
    store = FeatureStore(gib=2 * 16 * 32 * 2 / 2**30, seq_len=16, width=32, dtype=torch.bfloat16, device="cuda",
                         host_rows=6)
    assert (store.rows, store.host_rows) == (2, 6) and store._put_staging == []
    out = feats[:4].cuda()
    store.put(keys[:4], out)
    assert store._put_staging[0].is_pinned() and store._pending is not None
    out.fill_(7.0)  # the next batch's target output, queued behind the copy out
    store.put(keys[4:8], feats[4:8].cuda())
    got = store.gather(store.lookup(keys))
    torch.cuda.synchronize()
    assert torch.equal(got.cpu(), feats) and store._pending is None


def test_a_batch_holding_one_window_twice_keeps_every_window_in_its_own_slot():
    """`data.mix --replacement` and small data sets at large batches repeat windows inside one batch: the repeat is
    one window (one slot), and the windows that come after it get slots of their own."""
    store = _store(rows=4)
    a, b, c = torch.full((4, 3), 1.0), torch.full((4, 3), 2.0), torch.full((4, 3), 3.0)
    store.put([b"a", b"a"], torch.stack([a, a]))
    assert store.stored == 1
    store.put([b"b", b"c", b"b"], torch.stack([b, c, b]))
    assert store.stored == 3 and sorted(store.lookup([b"a", b"b", b"c"])) == [0, 1, 2]
    assert torch.equal(store.gather(store.lookup([b"a", b"b", b"c", b"a"])), torch.stack([a, b, c, a]))
    # a full store keeps the first of a repeated new window, not two rows of it
    full = _store(rows=2)
    full.put([b"x", b"x", b"y", b"z"], torch.stack([a, a, b, c]))
    assert full.stored == 2 and torch.equal(full.gather(full.lookup([b"y", b"x"])), torch.stack([b, a]))


def test_trainer_with_a_store_trains_exactly_as_without_when_a_batch_repeats_a_window(tmp_path):
    """4 conversations, the first repeated as the last, batch 2: with the seed chosen so that epoch 1 begins with
    the repeated window twice, the next batch's windows must not land in its slot (that served one window another
    window's features from epoch 2 on)."""
    from dflash_lab.tiny import tiny_data_path
    from dflash_lab.train.trainer import Trainer

    lines = tiny_data_path().read_text().splitlines(keepends=True)[:3]
    data = tmp_path / "repeated.jsonl"
    data.write_text("".join(lines + lines[:1]))
    cfg = TrainConfig(target="tiny", data=str(data), seq_len=64, batch_size=2, block_size=8, num_anchors=4,
                      num_draft_layers=1, steps=6, checkpoint_every=0, eval_every=0)
    curves = {}
    for seed in range(20):  # the first seed whose epoch 1 starts with the repeated window twice
        trainer = Trainer(cfg.replace(seed=seed), write_run_dir=False, log=lambda *a: None)
        first = sorted(trainer.sampler.indices(0).tolist())
        trainer.close()
        if first == [0, 3]:
            break
    assert first == [0, 3] and torch.equal(trainer.data.input_ids[0], trainer.data.input_ids[3])
    for name, over in {"none": {}, "store": dict(feature_store_gib=0.01)}.items():
        trainer = Trainer(cfg.replace(seed=seed, **over), write_run_dir=False, log=lambda *a: None)
        try:
            curves[name] = [trainer.step(1)["loss"] for _ in range(cfg.steps)]
            last = trainer.last_metrics
        finally:
            trainer.close()
    assert curves["store"] == pytest.approx(curves["none"], rel=1e-6, abs=1e-6)
    assert last["feature_store_stored"] == 3 and last["feature_store_hit_rate"] == pytest.approx(4 / 6, abs=1e-4)


def test_a_float8_store_gives_the_step_the_same_features_on_a_hit_and_a_miss_so_resume_is_exact(tmp_path):
    """A resumed job's store starts empty: with float8 storage a window the straight run read back rounded would be
    computed exactly after the resume. Every step reads the float8-rounded features instead, stored or not, so the
    resumed run's losses equal the straight run's (and a store of 5 rows trains as one of every window)."""
    from dflash_lab.tiny import tiny_data_path
    from dflash_lab.train.trainer import Trainer

    data = tmp_path / "slice.jsonl"
    data.write_text("".join(tiny_data_path().read_text().splitlines(keepends=True)[:12]))
    cfg = TrainConfig(target="tiny", data=str(data), seq_len=64, batch_size=4, block_size=8, num_anchors=4,
                      num_draft_layers=1, steps=9, seed=0, checkpoint_every=0, eval_every=0, log_every=1,
                      feature_store_gib=0.01, feature_store_dtype="float8", runs_dir=str(tmp_path / "runs"))
    quiet = lambda *a: None  # noqa: E731

    def losses(trainer):
        return [r["loss"] for r in trainer.history]

    straight = Trainer(cfg.replace(run_name="straight"), log=quiet)
    straight.train()
    straight.close()
    first = Trainer(cfg.replace(run_name="resumed"), log=quiet)
    first.step(4)  # epoch 2 began: its first batch came from the store
    first.save_checkpoint()
    first.close()
    resumed = Trainer(cfg.replace(run_name="resumed", resume_from=str(first.run_dir)), log=quiet)
    assert resumed.step_count == 4
    resumed.train()
    resumed.close()
    from dflash_lab.runs import rundir

    got = {r["step"]: r["loss"] for r in rundir.read_jsonl(first.run_dir / rundir.METRICS_FILE)}
    want = {r["step"]: r["loss"] for r in rundir.read_jsonl(straight.run_dir / rundir.METRICS_FILE)}
    assert sorted(got) == sorted(want) == list(range(1, 10))
    assert max(abs(got[s] - want[s]) for s in want) == 0.0
