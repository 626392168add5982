"""benchmarks/fused_ce.py on CPU: ours against a full-logits reference, the difference columns, and error rows for
backends that are missing or fail (the fused libraries need CUDA; on CPU they must give rows, never exceptions)."""

import json
import sys

import pytest
import torch
import torch.nn.functional as F

from dflash_lab.benchmarks import fused_ce
from dflash_lab.benchmarks.fused_ce import BACKENDS, Backend, compare_backends, decay_weights
from dflash_lab.benchmarks.vocab_head import head_inputs

SHAPE = dict(rows=60, hidden=32, vocab=500)


def _naive(W, h, y, w):
    """sum_i w_i * CE_i with the full (M, V) fp32 logits, and its hidden gradient by autograd."""
    hh = h.detach().clone().requires_grad_(True)
    loss = (F.cross_entropy(hh @ W.t(), y, reduction="none") * w).sum()
    loss.backward()
    return loss.detach(), hh.grad


def _rows(**kw):
    return list(compare_backends(**SHAPE, dtype=torch.float32, device="cpu", repeats=2, chunk_size=16, **kw))


def test_decay_weights_follow_the_slots_and_sum_to_one():
    w = decay_weights(30, slots=15, gamma=7.0)
    assert w.sum().item() == pytest.approx(1.0, abs=1e-6)
    assert torch.equal(w[:15], w[15:])
    assert (w[1] / w[0]).item() == pytest.approx(torch.exp(torch.tensor(-1 / 7)).item(), rel=1e-6)


def test_ours_matches_full_logits_and_every_backend_gives_a_row():
    rows = _rows()
    assert [r["backend"] for r in rows] == list(BACKENDS)
    ours = rows[0]
    W, h, y = head_inputs(vocab_size=500, hidden=32, rows=60, dtype=torch.float32, device="cpu")
    ref_loss, ref_grad = _naive(W, h, y, decay_weights(60))
    assert ours["loss"] == pytest.approx(ref_loss.item(), abs=1e-5)
    assert ours["loss_abs_err_fp32"] < 1e-5 and ours["grad_rel_err_fp32"] < 1e-5  # the fp32 column agrees
    assert ours["ms"] > 0 and ours["peak_mem_mib"] is None  # no CUDA: no memory column
    assert ours["loss_abs_diff"] == 0.0 and ours["grad_max_abs_diff"] == 0.0  # ours against itself
    assert ours["per_row_weights"] is True and ours["argmax"] is True
    for r in rows[1:]:  # the triton kernels need CUDA: numbers where they ran, an error string where not
        assert ("error" in r and ": " in r["error"]) or (r["ms"] > 0 and r["grad_rel_diff"] < 1e-2), r
    liger_sum = next(r for r in rows if r["backend"] == "liger-sum")
    assert liger_sum["per_row_weights"] is False


def test_differences_are_against_ours_with_the_same_weights(monkeypatch):
    def naive(h, W, y, w, chunk_size):
        return (F.cross_entropy(h @ W.t(), y, reduction="none") * w).sum()

    def doubled(h, W, y, w, chunk_size):
        return 2 * naive(h, W, y, w, chunk_size)

    monkeypatch.setitem(BACKENDS, "naive", Backend("naive", naive, per_row_weights=True, argmax=False))
    monkeypatch.setitem(BACKENDS, "naive-uniform", Backend("naive-uniform", naive, per_row_weights=False,
                                                           argmax=False))
    monkeypatch.setitem(BACKENDS, "doubled", Backend("doubled", doubled, per_row_weights=True, argmax=False))
    naive_row, uniform_row, doubled_row = _rows(backends=("naive", "naive-uniform", "doubled"))
    for r in (naive_row, uniform_row):  # uniform rows are compared with ours at uniform weights, so they agree too
        assert r["loss_rel_diff"] < 1e-6 and r["grad_rel_diff"] < 1e-5, r
    assert doubled_row["loss_rel_diff"] == pytest.approx(1.0, rel=1e-5)
    assert doubled_row["grad_rel_diff"] == pytest.approx(1.0, rel=1e-4)


def test_missing_or_failing_backends_give_error_rows(monkeypatch):
    monkeypatch.setitem(sys.modules, "cut_cross_entropy", None)  # import of it raises ModuleNotFoundError
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers.functional", None)

    def weight_grad(h, W, y, w, chunk_size):  # a backend that trains the frozen head is refused, not timed
        W.requires_grad_(True)
        return (h @ W.t()).sum()

    monkeypatch.setitem(BACKENDS, "bad", Backend("bad", weight_grad, per_row_weights=True, argmax=False))
    rows = {r["backend"]: r for r in _rows(backends=("cce", "cce-exact", "liger", "liger-sum", "bad"))}
    for name in ("cce", "cce-exact", "liger", "liger-sum"):
        assert rows[name]["error"].startswith("ModuleNotFoundError") and "HINT" in rows[name]["error"]
        assert "ms" not in rows[name]
    assert "frozen head a gradient" in rows["bad"]["error"]


def test_cli_writes_json_lines_and_a_table(tmp_path, capsys):
    out = tmp_path / "rows.jsonl"
    assert fused_ce.main(["--rows", "30", "--hidden", "16", "--vocab", "64", "128", "--backends", "ours", "cce",
                          "--device", "cpu", "--dtype", "float32", "--repeats", "1", "--chunk-size", "8",
                          "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["backend"], r["vocab"]) for r in rows] == [("ours", 64), ("cce", 64), ("ours", 128), ("cce", 128)]
    captured = capsys.readouterr()
    assert [json.loads(line) for line in captured.out.splitlines()] == rows
    assert [line.split()[0] for line in captured.err.splitlines()] == ["ours", "cce", "ours", "cce"]
