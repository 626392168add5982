"""Training against held-out checks (runs/generalisation.py): the table's means, where held-out stopped, the plot."""

import pytest

from dflash_lab.runs import generalisation as g


def _rows(val_accs, train_slope=0.02):
    """Logged batches every 10 steps whose accuracy rises `train_slope` per 100 steps, a held-out check every 100."""
    rows = []
    for step in range(10, 10 * 10 * len(val_accs) + 1, 10):
        row = {"step": step, "acc": step / 100 * train_slope, "sim_tau": 1.0 + step / 1000, "epoch": step // 250}
        if step % 100 == 0:
            k = step // 100 - 1
            row.update(val_acc=val_accs[k], val_sim_tau=2.0 + val_accs[k], real_tau=2.5 + k / 10,
                       real_tau_low=2.3 + k / 10, real_tau_high=2.8 + k / 10, real_tau_prompts=32)
        rows.append(row)
    return rows


def test_table_averages_the_last_batches_up_to_each_check():
    table = g.checks_table(_rows([0.1, 0.2, 0.3]), window=5)
    assert [r["step"] for r in table] == [100, 200, 300]
    # steps 60..100 -> acc 0.012..0.020, mean 0.016
    assert table[0]["train_acc"] == pytest.approx(0.016)
    assert table[0]["train_sim_tau"] == pytest.approx(1.08)
    assert table[2]["gap"] == pytest.approx(0.056 - 0.3)
    assert table[1]["real_tau"] == pytest.approx(2.6) and table[1]["real_tau_high"] == pytest.approx(2.9)
    assert table[2]["epoch"] == 1


def test_held_out_stopped_where_it_stops_rising_while_training_still_rises():
    assert g.held_out_stopped_at(g.checks_table(_rows([0.1, 0.2, 0.3, 0.4]))) is None
    assert g.held_out_stopped_at(g.checks_table(_rows([0.1, 0.30, 0.305, 0.29, 0.30]))) == 200
    # held out flat but training flat too: not data-limited, just done learning
    assert g.held_out_stopped_at(g.checks_table(_rows([0.1, 0.30, 0.30, 0.30], train_slope=0.0))) is None
    assert g.held_out_stopped_at(g.checks_table(_rows([0.1, 0.3]))) is None  # too few checks to say


def test_markdown_and_plot(tmp_path):
    table = g.checks_table(_rows([0.1, 0.2]))
    md = g.checks_markdown(table)
    assert md.count("\n") == 3 and "| 200 | 0 | 0.031 | 0.200 | -0.169 |" in md and "2.60 [2.40, 2.90]" in md
    img = g.plot_generalisation({"a": _rows([0.1, 0.2]), "b": _rows([0.2, 0.25])}, out=tmp_path / "g.png")
    assert img.data[:8] == b"\x89PNG\r\n\x1a\n" and (tmp_path / "g.png").stat().st_size == len(img.data)


def test_bad_window_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="window=0.*>= 1"):
        g.checks_table([], window=0)
