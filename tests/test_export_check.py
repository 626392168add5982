"""The export check on the embedded tiny target's exports: speculators 0.9.0's own loader (on the CPU) drafts the same
ids as our decoder for the full and the pruned vocabulary and for a drafter with a sliding layer, and the check fails
on an export that an engine would serve differently (a head of the wrong rows, a full layer made causal)."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from dflash_lab.evaluation import export
from dflash_lab.evaluation.export_check import check_export, context_lengths, main, vllm_masks
from tests.test_export import D, _tiny_drafter, _write_run

B = 8  # block size: 7 draft ids per context and path
WINDOW = 20


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    root = tmp_path_factory.mktemp("exports")
    out = {}
    for name, kw in {"full": {}, "pruned": {"d": D},
                     "sliding": {"layer_types": ("sliding_attention", "full_attention"), "window": WINDOW},
                     "pruned-sliding": {"d": D, "layer_types": ("full_attention", "sliding_attention"),
                                        "window": WINDOW}}.items():
        dc, drafter = _tiny_drafter(block_size=B, **kw)
        _write_run(root / f"run-{name}", dc, drafter)
        out[name] = export.export_drafter(root / f"run-{name}", root / name, log=lambda *a: None)
    return out


@pytest.mark.parametrize("name", ["full", "pruned", "sliding", "pruned-sliding"])
def test_speculators_loader_drafts_what_our_decoder_drafts(exports, name):
    lines = []
    report = check_export(exports[name], contexts=3, log=lines.append)
    assert report["ok"], "\n".join(lines)
    loaded = report["speculators_loaded"]
    assert loaded["nan_parameters"] == [] and loaded["mask_token_id"] == 3 and loaded["block_size"] == B
    assert loaded["aux_hidden_state_layer_ids"] == [2, 4, 6]  # speculators counts layers from the embedding
    assert loaded["draft_vocab_size"] == (D if "pruned" in name else 960)
    drafts = [r for r in report["required"] if "ids" in r]
    assert {r["what"] for r in drafts} >= {"speculators layers, vLLM's masks"}
    assert sum(r["ids"] for r in drafts) >= 3 * (B - 1) and all(r["identical"] == r["ids"] for r in drafts)
    assert max(r["max_logit_diff"] for r in drafts) < 1e-4  # fp32, the same weights: summation order only
    if "pruned" in name:
        assert report["required"][0] == {"what": "lm_head.weight is the target head's rows arange(d) + d2t",
                                         "ok": True}
        assert "SGLang 0.5.23 cannot serve" in report["engines"]["sglang"]["cannot_serve"]
    else:
        assert report["engines"]["sglang"]["cannot_serve"] is None
    causal = report["engines"]["vllm"]["causal"]
    assert causal == [t == "sliding_attention" for t in json.loads((exports[name] / "config.json").read_text())
                      .get("layer_types")]
    if "sliding" in name:  # speculators' own masks agree only within window - block size; beyond, reported
        own = [r for r in report["required"] if r["what"].endswith("own masks")]
        assert own and all(r["context"] <= WINDOW - B for r in own)
        assert all(r["context"] > WINDOW - B for r in report["informative"])
        assert len(report["informative"]) == 2
    else:
        assert report["informative"] == []


def test_the_check_fails_on_what_an_engine_would_serve_differently(exports, tmp_path):
    import shutil

    # a full layer made causal (what vLLM makes of the speculators conversion): vLLM's masks are no longer ours
    causal = tmp_path / "causal"
    shutil.copytree(exports["full"], causal)
    cfg = json.loads((causal / "config.json").read_text())
    cfg["dflash_config"]["causal"] = True
    (causal / "config.json").write_text(json.dumps(cfg))
    report = check_export(causal, contexts=2, log=lambda *a: None)
    assert report["engines"]["vllm"]["causal"] == [True, True] and not report["ok"]
    bad = [r for r in report["required"] if not r["ok"]]
    assert bad and all(r["what"] == "speculators layers, vLLM's masks" for r in bad)

    # a pruned export whose head is the target's first d rows: not the rows vLLM must read
    rows = tmp_path / "rows"
    shutil.copytree(exports["pruned"], rows)
    tensors = load_file(str(rows / "model.safetensors"))
    from dflash_lab.target.load import read_head_weight

    tensors["lm_head.weight"] = read_head_weight("tiny")[:D].to(torch.bfloat16).contiguous()
    save_file(tensors, str(rows / "model.safetensors"))
    assert main([str(rows), "--json", str(tmp_path / "r.json")]) == 1
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["required"][0]["ok"] is False and not saved["ok"]
    assert main([str(tmp_path / "nothing")]) == 2


def test_vllm_masks_and_context_lengths():
    reading = {"causal": [True, False], "window": [3, None]}
    sliding, full = vllm_masks(reading, S=4, B=2)
    # the query at position 4 sees positions 2..4 (the window counts itself), at 5 sees 3..5
    assert sliding[0, 0].int().tolist() == [[0, 0, 1, 1, 1, 0], [0, 0, 0, 1, 1, 1]]
    assert full[0, 0].all()
    assert context_lengths({"block_size": 8}, 3) == [3, 21, 40]
    assert context_lengths({"block_size": 8, "layer_types": ["sliding_attention"], "sliding_window": 20}, 3) == \
        [3, 28, 35]


def test_speculators_converter_cannot_take_a_pruned_z_lab_export(exports, tmp_path):
    """Why the check writes speculators' own format for a pruned head: its converter forces the full vocabulary and
    refuses the reduced head (speculators 0.9.0, convert/dflash/converter.py)."""
    from speculators.convert.entrypoints import maybe_convert_external_checkpoint

    from dflash_lab.target.load import resolve_target_path

    with pytest.raises(RuntimeError, match=r"size mismatch for lm_head.weight.*\[100, 128\].*\[960, 128\]"):
        maybe_convert_external_checkpoint(str(exports["pruned"]), verifier=resolve_target_path("tiny"),
                                          output_path=str(tmp_path / "converted"))


def test_a_check_that_would_compare_nothing_is_refused(exports, capsys):
    """--contexts 0 drafted after no context and printed `OK: 0 draft ids`, exit 0; it is refused naming the fix."""
    assert main([str(exports["full"]), "--contexts", "0"]) == 2
    err = capsys.readouterr().err
    assert "contexts=0" in err and "Fix: --contexts 1" in err


def test_the_reference_code_loads_an_export_and_refuses_one_missing_a_tensor(exports, tmp_path):
    """The remote-code class SGLang / vLLM users load takes the export whole; a tensor removed is named, with the fix."""
    import shutil

    from dflash_lab.evaluation.export_check import ExportCheckError, reference_load

    assert reference_load(exports["full"], log=lambda *a: None) == "DFlashDraftModel"
    broken = tmp_path / "broken"
    shutil.copytree(exports["full"], broken)
    state = load_file(broken / "model.safetensors")
    gone = sorted(state)[0]
    save_file({k: v for k, v in state.items() if k != gone}, broken / "model.safetensors")
    with pytest.raises(ExportCheckError, match=rf"missing \[.*{gone}.*Fix: export again"):
        reference_load(broken, log=lambda *a: None)
