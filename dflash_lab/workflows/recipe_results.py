"""A recipe's results.json: each phase's figures, an earlier run's phases kept until replaced, and the HTML table.

recipe.py rewrites `<work_dir>/results.json` after every phase (write_results: a temp file renamed into place, so a
run cut short leaves the previous complete file). A rerun into the same work_dir starts from the phases the earlier
run recorded (earlier_phases), each marked with that run's start and the settings that differed, until its own
phase of that name replaces them; recipe_reuse.py decides which of them a rerun may keep as its own. The train
phase's figures are read back from the run folder (train_figures), for a run trained, resumed or reused alike.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

from dflash_lab.runs.gpu_time import best_tau, tau_points
from dflash_lab.runs.generalisation import checks_table, held_out_stopped_at
from dflash_lab.runs.listing import run_metrics
from dflash_lab.runs.run_files import RunFileError, read_json

RESULTS = "results.json"


class PhaseFigures(dict):
    """One phase's figures (a plain dict, saved in results.json); a notebook shows it as a compact table in which
    long lists (curves, per-row evaluations) are summarised by their length."""

    def _repr_html_(self) -> str:
        def cell(v):
            if isinstance(v, list) and len(v) > 4:
                return f"{len(v)} entries (see results.json)"
            return html.escape(json.dumps(v, default=str) if isinstance(v, (dict, list)) else str(v))

        rows = "".join(f"<tr><td>{html.escape(k)}</td><td style='text-align:left'>{cell(v)}</td></tr>"
                       for k, v in self.items())
        return f"<table>{rows}</table>"


def earlier_phases(work_dir: Path, config: dict, log) -> dict:
    """The phases an earlier run recorded in this work_dir, each marked with that run's start and the settings
    (of `config`, this run's) that differed; a results.json that cannot be read is moved aside (named in the log),
    not overwritten."""
    path = Path(work_dir) / RESULTS
    try:
        earlier = read_json(path, missing={})
    except RunFileError as e:
        aside = path.with_name(RESULTS + ".unreadable")
        path.replace(aside)
        log(f"[recipe] {e} Kept as {aside}; this run starts a new {RESULTS}.")
        return {}
    before = earlier.get("config") or {}
    differ = sorted(k for k in config if json.dumps(before.get(k), default=str) != json.dumps(config[k], default=str))
    mark = {"earlier_run": earlier.get("started", "unknown"), **({"earlier_settings_differ": differ}
                                                                if differ else {})}
    phases = {name: PhaseFigures({**figures, **mark}) for name, figures in (earlier.get("phases") or {}).items()
              if isinstance(figures, dict)}
    if phases:
        log(f"[recipe] kept {len(phases)} phase(s) of the run of {mark['earlier_run']} in {path} until this run "
            "replaces them" + (f" (its settings differ: {', '.join(differ)})" if differ else ""))
    return phases


def write_results(work_dir: Path, results: dict) -> None:
    tmp = Path(work_dir) / (RESULTS + ".tmp")
    tmp.write_text(json.dumps(results, indent=1, default=str) + "\n")
    tmp.replace(Path(work_dir) / RESULTS)


def results_html(results: dict) -> str:
    """The phases with their seconds (earlier-run and reused ones marked), then one row per evaluated decoder."""
    ph = results["phases"]
    e = html.escape
    head = (f"<p><b>{e(results['model'])}</b> on {e(results['device_name'])}: "
            f"{e(results['weights_note'])}.</p>")
    times = "".join(f"<tr><td>{e(k)}{e(' (earlier run ' + v['earlier_run'] + ')') if 'earlier_run' in v else ''}"
                    f"{' (reused)' if v.get('reused') else ''}</td><td>{v['seconds']}</td></tr>"
                    for k, v in ph.items())
    rows = "".join(
        f"<tr><td>{e(str(r['prompt_set']))}</td><td>{r['prompts']}</td><td>{e(r['decoder'])}</td>"
        f"<td>{r['eval_block_size']}</td><td>{r['temperature']}</td><td>{_drafts(r)}</td><td>{_fmt_tau(r)}</td>"
        f"<td>{r['tokens_per_s']:.1f}</td><td>{_fmt_speedup(r['speedup'])}</td>"
        f"<td>{_identical(r)}</td></tr>" for r in ph.get("evaluate", {}).get("rows", []))
    return (head + f"<table><tr><th>phase</th><th>seconds</th></tr>{times}</table>"
            + (f"<table><tr><th>prompt set</th><th>prompts</th><th>decoder</th><th>B</th><th>T</th><th>drafts</th>"
               f"<th>tau [95% interval]</th><th>tok/s</th><th>speedup</th><th>identical</th></tr>{rows}</table>"
               + IDENTICAL_NOTE if rows else ""))


# Under the table: a bare "21" read as "two thirds were not lossless" (long preset, bf16, 64 prompts per set).
IDENTICAL_NOTE = ("<p><small>identical: prompts whose speculative output equals the target alone's, token for token, "
                  "of the prompts decoded. All of them at T=0 in fp32; fewer in bf16 without a fault: verifying a "
                  "block in one pass rounds differently from decoding token by token, so where the target's two best "
                  "tokens are within bf16's rounding (a near-tie) the argmax can flip and the outputs part. "
                  "eval.json counts near-ties apart from real mismatches. At T&gt;0 outputs are samples: "
                  "-.</small></p>")


def _identical(row: dict) -> str:
    """`n / prompts`: a count without its denominator reads as a share of nothing."""
    n = row.get("identical_to_target")
    if n is None or row["temperature"] > 0:
        return "-"
    return f"{n} / {row['prompts']}"


def _drafts(row: dict) -> str:
    """How the drafter drafted: only a drafter at T > 0 has a choice (results written before it existed: argmax);
    the target alone drafts nothing."""
    if row["temperature"] <= 0 or row["decoder"] == "target only":
        return ""
    return row.get("draft_sampling", "argmax")


def _fmt_tau(row: dict) -> str:
    if row.get("tau_low") is None:
        return f"{row['tau']:.2f}"
    return f"{row['tau']:.2f} [{row['tau_low']:.2f}, {row['tau_high']:.2f}]"


def _fmt_speedup(x) -> str:
    return "" if x is None else f"{x:.2f}x"


def train_figures(run_dir: Path, summary: dict, log) -> dict:
    """The train phase's figures from the run dir (the same for a run trained, resumed or reused)."""
    report = read_json(run_dir / "data_report.json")
    # first turns are often greetings with short answers: conversations under 2 * block_size supervised tokens
    # are dropped, so say how much data actually trained
    data = {k: report.get(k) for k in ("records", "kept", "dropped_short", "truncated", "supervised_tokens")}
    rows = run_metrics(run_dir)
    curve = [{k: r.get(k) for k in ("step", "loss", "acc", "sim_tau", "val_acc", "val_sim_tau", "val_chain_tau",
                                    "real_tau", "gpu_seconds") if r.get(k) is not None}
             for r in rows if "loss" in r]
    dc = read_json(run_dir / "drafter_config.json")
    # past some epochs training accuracy keeps rising while held-out accuracy stops: more steps on these data
    # then buy nothing, more data (n_self) or fewer steps do
    stopped = held_out_stopped_at(checks_table(rows))
    if stopped is not None:
        log(f"[recipe] train: held-out accuracy stopped rising at step {stopped} while training accuracy "
            "kept rising: the run is data-limited from there (raise n_self rather than steps)")
    return dict(run_dir=str(run_dir), status=summary["status"], steps=summary["steps"],
                held_out_stopped_at=stopped,
                target_steps=summary.get("target_steps"), data=data, loss_first=summary.get("loss_first"),
                loss_last=summary.get("loss_last"), sim_tau_last=summary.get("sim_tau_last"),
                # this job's steady rate: a job resumed while the feature store refills reads the target's rate,
                # so the fastest steady rate any job of the run logged goes beside it
                tokens_per_s=summary.get("steady_tokens_per_s"),
                tokens_per_s_fastest_job=max((r["steady_tokens_per_s"] for r in rows
                                              if r.get("steady_tokens_per_s")), default=None), curve=curve,
                # GPU-minutes (devices x wall time of training) when each real tau was measured, and to the best
                time_to_tau=tau_points(rows), best_tau=best_tau(rows),
                drafter={k: dc.get(k) for k in ("hidden_size", "num_attention_heads", "num_key_value_heads",
                                                "head_dim", "target_layer_ids", "mask_token_id",
                                                "tie_word_embeddings")})
