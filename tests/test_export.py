"""Export: the DFlashDraftModel checkpoint format (config fields, exact tensor names, bf16, no embedding/head), the
remote-code model loaded by AutoModel, exported == re-imported outputs, and the run/checkpoint resolver."""

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from dflash_lab.evaluation import export
from dflash_lab.evaluation.export_serving import export_commands
from dflash_lab.config import DrafterConfig
from dflash_lab.drafter.model import DFlashDrafter
from tests.conftest import make_tiny_qwen3


def _drafter(layer_types=(), window=None, seed=0):
    target = make_tiny_qwen3()
    dc = DrafterConfig.from_target(target.config, num_draft_layers=2, num_target_features=3, block_size=8,
                                   mask_token_id=255, layer_types=layer_types, sliding_window=window)
    d = DFlashDrafter(dc)
    d.init_weights(torch.Generator().manual_seed(seed), std=0.1)
    return dc, d.eval()


def _write_run(root, dc, drafter, *, step=20, where="checkpoints/drafter.safetensors"):
    root.mkdir(parents=True, exist_ok=True)
    (root / "drafter_config.json").write_text(json.dumps(dc.to_dict()))
    (root / "config.json").write_text(json.dumps({"target": "tiny", "seed": 0}))
    path = root / where
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v for k, v in drafter.state_dict().items() if not k.startswith("rotary_emb.")}
    save_file(state, str(path), metadata={"step": str(step)})
    return path


def _inputs(dc, S=11, seed=1):
    g = torch.Generator().manual_seed(seed)
    B, H = dc.block_size, dc.hidden_size
    feats = torch.randn(1, S, dc.num_target_features * H, generator=g)
    emb = torch.randn(1, B, H, generator=g)
    pos = torch.arange(S + B)[None]
    return feats, emb, pos


def _ours(drafter, feats, emb, pos):
    """Our drafter at inference: the block sees all context and (full) the whole block / (sliding) window+causal."""
    from dflash_lab.drafter.blocks import dense_mask

    S, B = feats.shape[1], emb.shape[1]
    masks = {t: dense_mask(torch.tensor([[S]]), torch.tensor([[True]]), seq_len=S, block_size=B,
                           sliding_window=drafter.config.sliding_window if t == "sliding_attention" else None)
             for t in set(drafter.config.layer_types)}
    with torch.no_grad():
        return drafter(feats, emb, pos[:, S:], pos[:, :S], masks)


@pytest.mark.parametrize("layer_types,window", [((), None), (("sliding_attention", "full_attention"), 4)])
def test_export_format_round_trip_and_automodel(tmp_path, layer_types, window):
    dc, drafter = _drafter(layer_types, window)
    run = tmp_path / "run"
    _write_run(run, dc, drafter)
    out = export.export_drafter(run, tmp_path / "out", log=lambda *a: None)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "dflash.py", "model.safetensors"]

    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["model_type"] == "qwen3"
    assert cfg["auto_map"] == {"AutoModel": "dflash.DFlashDraftModel"}
    assert cfg["block_size"] == 8 and cfg["num_target_layers"] == 8 and cfg["num_hidden_layers"] == 2
    assert cfg["dflash_config"] == {"mask_token_id": 255, "target_layer_ids": list(dc.target_layer_ids)}
    assert cfg["layer_types"] == list(dc.layer_types) and len(cfg["layer_types"]) == 2
    assert cfg["use_sliding_window"] == bool(window) and cfg["sliding_window"] == window
    for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
              "rms_norm_eps", "rope_theta", "max_position_embeddings", "vocab_size", "tie_word_embeddings"):
        assert cfg[k] == getattr(dc, k), k
    assert cfg["hidden_act"] == "silu" and cfg["attention_bias"] is False

    with safe_open(str(out / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        dtypes = {f.get_tensor(k).dtype for k in names}
        fc_shape = tuple(f.get_tensor("fc.weight").shape)
    assert names == set(export.export_state_names(dc))
    assert len(names) == 2 * 11 + 3
    assert not any("embed" in n or "lm_head" in n or n.startswith("model.") for n in names)
    assert dtypes == {torch.bfloat16}
    assert fc_shape == (64, 3 * 64)

    # Re-import: identical to the original with bf16-rounded weights, bit for bit.
    cfg2, back = export.load_exported(out)
    assert cfg2 == dc
    rounded = DFlashDrafter(dc)
    rounded.load_state_dict({k: v.to(torch.bfloat16).float() for k, v in drafter.state_dict().items()})
    feats, emb, pos = _inputs(dc)
    ours = _ours(back, feats, emb, pos)
    assert torch.equal(ours, _ours(rounded.eval(), feats, emb, pos))
    assert not torch.equal(ours, _ours(drafter, feats, emb, pos))  # bf16 really rounded something

    # The remote-code model that SGLang / vLLM users load with trust_remote_code.
    from transformers import AutoModel

    model, info = AutoModel.from_pretrained(out, trust_remote_code=True, output_loading_info=True)
    assert type(model).__name__ == "DFlashDraftModel"
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    with torch.no_grad():
        theirs = model.float().eval()(feats, emb, pos)
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=1e-5)


def test_resolver_takes_the_newest_or_a_named_checkpoint_and_lists_what_it_looked_for(tmp_path):
    dc, d = _drafter()
    run = tmp_path / "run"
    _write_run(run, dc, d, step=15)  # final save_drafter at step 15
    _write_run(run, dc, d, step=10, where="checkpoints/step-0000010/drafter.safetensors")
    _write_run(run, dc, d, step=20, where="checkpoints/step-0000020/drafter.safetensors")
    src = export.resolve_drafter(run)
    assert src.kind == "run" and src.step == 20 and src.weights.parent.name == "step-0000020" and src.run_dir == run
    # a checkpoint dir and a weights file resolve to themselves, with the run dir found above them
    ck = export.resolve_drafter(run / "checkpoints" / "step-0000010")
    assert ck.step == 10 and ck.run_dir == run and ck.config == dc
    f = export.resolve_drafter(run / "checkpoints" / "drafter.safetensors")
    assert f.step == 15 and f.run_dir == run
    with pytest.raises(export.DrafterNotFoundError, match="has no best checkpoint"):
        export.resolve_drafter(run, "best")
    _write_run(run, dc, d, step=12, where="checkpoints/best/drafter.safetensors")
    assert export.resolve_drafter(run).step == 20  # best/ only by name: a run dir means its newest weights
    best = export.resolve_drafter(run, "best")
    assert best.weights.parent.name == "best" and best.step == 12 and best.run_dir == run
    assert export.resolve_drafter(run, "step-10").step == 10 and export.resolve_drafter(run, "latest").step == 20
    with pytest.raises(export.DrafterNotFoundError, match="needs a run directory"):
        export.resolve_drafter(run / "checkpoints" / "drafter.safetensors", "best")

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(export.DrafterNotFoundError) as e:
        export.resolve_drafter(empty)
    msg = str(e.value)
    assert "checkpoints/step-*/drafter.safetensors" in msg and "checkpoints/drafter.safetensors" in msg
    lone = tmp_path / "lone.safetensors"
    save_file({"x": torch.zeros(1)}, str(lone))
    with pytest.raises(export.DrafterNotFoundError, match="no drafter_config.json"):
        export.resolve_drafter(lone)


def test_weights_that_do_not_match_the_config_are_refused(tmp_path):
    dc, d = _drafter()
    run = tmp_path / "run"
    path = _write_run(run, dc, d)
    state = {k: v for k, v in d.state_dict().items() if not k.startswith("rotary_emb.")}
    state["fc.weight"] = torch.zeros(64, 5 * 64)
    save_file(state, str(path))
    with pytest.raises(ValueError, match=r"fc.weight has shape \(64, 320\) but the config expects \(64, 192\)"):
        export.load_drafter(run)


def test_export_cli(tmp_path, capsys):
    import shlex

    from dflash_lab.target.load import resolve_target_path

    dc, d = _drafter()
    run = tmp_path / "run"
    _write_run(run, dc, d)
    out = tmp_path / "exp"
    assert export.main([str(run), str(out)]) == 0
    printed = capsys.readouterr().out
    commands = {line.split(":", 1)[0]: line.split(": ", 1)[1] for line in printed.splitlines()
                if line.startswith("serve with ")}
    assert set(commands) == {"serve with vllm 0.34.0", "serve with sglang 0.5.23"}
    # the flags as vLLM 0.34.0 (engine/arg_utils.py, config/speculative.py) and SGLang 0.5.23
    # (srt/arg_groups/fields/spec.py) parse them; vLLM drafts num_speculative_tokens after the anchor
    vllm = shlex.split(commands["serve with vllm 0.34.0"])
    assert vllm[:3] == ["vllm", "serve", resolve_target_path("tiny")] and vllm[3] == "--speculative-config"
    assert json.loads(vllm[4]) == {"method": "dflash", "model": str(out.resolve()), "num_speculative_tokens": 7}
    assert shlex.split(commands["serve with sglang 0.5.23"]) == [
        "python", "-m", "sglang.launch_server", "--model-path", resolve_target_path("tiny"),
        "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", str(out.resolve()),
        "--speculative-num-draft-tokens", "8"]
    assert export_commands(out, "tiny") == {k.split()[2]: v for k, v in commands.items()}
    assert json.loads((out / "config.json").read_text())["rope_scaling"] is None  # plain RoPE
    assert export.is_exported(tmp_path / "exp")
    assert export.main([str(tmp_path / "nothing-here"), str(tmp_path / "x")]) == 2
    assert "does not exist" in capsys.readouterr().err


# --- a pruned draft vocabulary: the head rows the engines read --------------------------------------------------
D = 100


def _tiny_drafter(*, d=None, layer_types=(), window=None, block_size=8, seed=0):
    """A random drafter of the embedded tiny target (the export reads that target's head)."""
    from dflash_lab.target.load import load_target_config

    dc = DrafterConfig.from_target(load_target_config("tiny"), num_draft_layers=2, num_target_features=3,
                                   block_size=block_size, mask_token_id=3, layer_types=layer_types,
                                   sliding_window=window, draft_vocab_size=d)
    drafter = DFlashDrafter(dc)
    drafter.init_weights(torch.Generator().manual_seed(seed), std=0.1)
    if d is not None:  # d ids spread over the vocabulary, so target row i + d2t[i] is never row i
        ids = torch.sort(torch.randperm(dc.vocab_size, generator=torch.Generator().manual_seed(seed + 1))[:d]).values
        drafter.d2t.copy_(ids - torch.arange(d))
    return dc, drafter.eval()


def test_pruned_export_holds_the_head_rows_and_names_sglang_before_writing(tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModel

    from dflash_lab.data.draft_vocab import target_ids_of
    from dflash_lab.target.load import read_head_weight

    dc, drafter = _tiny_drafter(d=D)
    run = tmp_path / "run"
    _write_run(run, dc, drafter)
    lines = []
    out = tmp_path / "out"

    def log(msg):
        lines.append((msg, out.exists()))

    export.export_drafter(run, out, log=log)
    sglang = [(m, existed) for m, existed in lines if m.startswith("not for sglang")]
    assert len(sglang) == 1 and sglang[0][1] is False  # said once, before anything was written
    assert "SGLang 0.5.23 cannot serve a pruned draft vocabulary (100 of 960 ids)" in sglang[0][0]
    assert "draft_vocab_size=None" in sglang[0][0] and "\n" not in sglang[0][0]
    served = [m for m, _ in lines if m.startswith("serve with")]
    assert len(served) == 1 and served[0].startswith("serve with vllm 0.34.0: vllm serve ")

    cfg = json.loads((out / "config.json").read_text())
    assert cfg["draft_vocab_size"] == D and cfg["vocab_size"] == 960 and cfg["dflash_lab"]["target"] == "tiny"
    tensors = load_file(str(out / "model.safetensors"))
    assert set(tensors) == set(export.export_state_names(dc)) | {"lm_head.weight"}
    ids = target_ids_of(tensors["d2t"])
    assert torch.equal(ids, target_ids_of(drafter.d2t)) and not torch.equal(ids, torch.arange(D))
    assert torch.equal(tensors["lm_head.weight"], read_head_weight("tiny")[ids].to(torch.bfloat16))
    back_cfg, _ = export.load_exported(out)
    assert back_cfg == dc

    # the remote-code model holds the rows and scatters its logits to their target ids
    model, info = AutoModel.from_pretrained(out, trust_remote_code=True, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    hidden = torch.randn(5, dc.hidden_size, generator=torch.Generator().manual_seed(3))
    logits = model.float().draft_logits(hidden, read_head_weight("tiny"))
    assert torch.isinf(logits).sum() == 5 * (960 - D)
    assert torch.equal(logits[:, ids], hidden @ tensors["lm_head.weight"].float().T)


def test_pruned_export_needs_its_target(tmp_path):
    dc, drafter = _tiny_drafter(d=D)
    run = tmp_path / "run"
    _write_run(run, dc, drafter)
    (run / "config.json").write_text(json.dumps({"seed": 0}))  # a run that does not name its target
    with pytest.raises(ValueError, match="no target is known. Fix: pass --target"):
        export.export_drafter(run, tmp_path / "out", log=lambda *a: None)
    assert not (tmp_path / "out").exists()
    assert export.main([str(run), str(tmp_path / "out"), "--target", "tiny"]) == 0


def _vllm_logits(tensors: dict, cfg: dict, target_head: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """The logits vLLM 0.34.0 drafts from, by its rules: DFlashQwen3ForCausalLM builds a draft_vocab_size-row head;
    an lm_head in the checkpoint is its own (_should_share keeps a head that differs from the target's), else the
    target's head is shared; LogitsProcessor._get_logits keeps the first draft_vocab_size columns; compute_logits
    scatters column i to target id i + d2t[i], -inf elsewhere."""
    V = cfg["vocab_size"]
    d = cfg.get("draft_vocab_size") or V
    own = tensors.get("lm_head.weight")
    head = own if own is not None and not torch.equal(own.float(), target_head) else target_head
    logits = (hidden @ head.float().T)[:, :d]
    if d == V:
        return logits
    out = torch.full((hidden.shape[0], V), float("-inf"))
    out[:, torch.arange(d) + tensors["d2t"]] = logits
    return out


def _sglang_logits(target_head: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """SGLang 0.5.23: the DFlash worker drafts with the target's own head; d2t and lm_head are never loaded."""
    return hidden @ target_head.T


@pytest.mark.parametrize("d", [None, D])
def test_engine_heads_draft_what_our_decoder_drafts(tmp_path, d):
    """The logits each engine's head computes on the export equal our decoder's (the evaluator's draft head) to the
    export's bf16 rounding, and draft the same ids; an engine that cannot serve the drafter drafts other ids."""
    from safetensors.torch import load_file

    from dflash_lab.data.draft_vocab import draft_head, target_ids_of, to_target_ids
    from dflash_lab.target.load import read_head_weight

    dc, drafter = _tiny_drafter(d=d)
    run = tmp_path / "run"
    _write_run(run, dc, drafter)
    out = export.export_drafter(run, tmp_path / "out", log=lambda *a: None)
    cfg, tensors = json.loads((out / "config.json").read_text()), load_file(str(out / "model.safetensors"))
    target_head = read_head_weight("tiny").float()
    _, ours_drafter = export.load_exported(out)
    feats, emb, pos = _inputs(dc, S=17)
    hidden = torch.cat([_ours(ours_drafter, feats * (1 + k), emb, pos)[0] for k in range(8)])  # 64 rows
    rows, _ = draft_head(ours_drafter, target_head)  # what evaluation drafts with
    ours = hidden @ rows.T
    our_ids = to_target_ids(ours_drafter, ours.argmax(-1))

    vllm = _vllm_logits(tensors, cfg, target_head, hidden)
    ids = target_ids_of(tensors["d2t"]) if d else torch.arange(dc.vocab_size)
    bound = hidden.abs() @ (rows.abs() * 2.0 ** -8).T  # |h . (w_bf16 - w)| for a relative rounding <= 2^-8
    assert ((vllm[:, ids] - ours).abs() <= bound).all()
    assert torch.equal(vllm.argmax(-1), our_ids)
    sglang_ids = _sglang_logits(target_head, hidden).argmax(-1)
    if d is None:
        assert torch.equal(vllm, ours) and torch.equal(sglang_ids, our_ids)  # the target's own head, exactly
        return
    assert (vllm[:, ids] - ours).abs().max() > 0  # the export's rows are bf16: rounding is really there
    # the export of before (d2t, no head): vLLM reads the target's FIRST d rows; SGLang drafts over all V rows
    old = _vllm_logits({"d2t": tensors["d2t"]}, cfg, target_head, hidden)
    assert (old.argmax(-1) != our_ids).float().mean() > 0.9
    assert (sglang_ids != our_ids).float().mean() > 0.5
    from dflash_lab.evaluation.serving_engines import engine_readings

    readings = engine_readings(cfg, {"d2t"} | set(export.export_state_names(dc)))
    assert "target row i instead of row i + d2t[i]" in readings["vllm"]["cannot_serve"]
    assert engine_readings(cfg, tensors)["vllm"]["cannot_serve"] is None


# --- an export never destroys a folder, and writes ordinary (umask) permissions --------------------------------------
def _exported_run(tmp_path):
    dc, drafter = _drafter()
    run = tmp_path / "run"
    _write_run(run, dc, drafter)
    return run


def test_export_refuses_non_empty_folder_unless_force(tmp_path):
    run = _exported_run(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(export.ExportRefused, match=r"not empty \(notes.txt\).*--force"):
        export.export_drafter(run, out, log=lambda *a: None)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    assert export.main([str(run), str(out)]) == 2  # the CLI exits non-zero, folder untouched
    assert (out / "notes.txt").read_text() == "keep me"
    export.export_drafter(run, out, force=True, log=lambda *a: None)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "dflash.py", "model.safetensors"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp folder left behind


@pytest.mark.parametrize("content", [
    {"config.json": json.dumps({"architectures": ["Qwen3ForCausalLM"]}), "model.safetensors": "x"},  # a target model
    {"tokenizer.json": "{}"},
    {"config.json": json.dumps({"target": "tiny"}), "metrics.jsonl": ""},  # a run
    {"checkpoints/step-0000001/state.json": "{}"},
])
def test_export_never_replaces_a_model_or_a_run_even_with_force(tmp_path, content):
    run = _exported_run(tmp_path)
    out = tmp_path / "out"
    for name, text in content.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)
    before = {p: p.read_text() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(export.ExportRefused, match="even with --force"):
        export.export_drafter(run, out, force=True, log=lambda *a: None)
    assert {p: p.read_text() for p in out.rglob("*") if p.is_file()} == before


def test_export_refuses_folder_holding_the_source(tmp_path):
    run = _exported_run(tmp_path)
    with pytest.raises(export.ExportRefused):
        export.export_drafter(run, tmp_path, force=True, log=lambda *a: None)
    assert (run / "checkpoints" / "drafter.safetensors").is_file()


def test_export_files_follow_the_umask(tmp_path):
    import os
    import stat

    run = _exported_run(tmp_path)
    old = os.umask(0o022)
    try:
        out = export.export_drafter(run, tmp_path / "out", log=lambda *a: None)
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in [out, *out.iterdir()]}
    assert modes == {"out": 0o755, "config.json": 0o644, "dflash.py": 0o644, "model.safetensors": 0o644}
