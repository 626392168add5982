"""An A/B of drafters trained on one recipe data preparation (bench/recipe_ab.py), read back from its committed folder:
final real tau per arm and prompt set with 95% intervals, training curves against steps and against wall time, and
the step-speed benchmark rows.

Reads only the folder's files (eval/ab.json, eval/results.json, eval/arm-metrics.tgz, bench/entry.jsonl), so a GPU
job's raw results re-render anywhere, CPU included, and nothing here writes into the folder. The arms' own
metrics.jsonl (in the tarball) are preferred to ab.json's copy of the curve: they carry every logged row (step 1 and
the last step too), the step times and wall clock, and the interval of each held-out real tau.
"""

from __future__ import annotations

import io
import tarfile
import tempfile
from pathlib import Path

from dflash_lab.config import ConfigError
from dflash_lab.evaluation.intervals import not_separated, stored_interval
from dflash_lab.evaluation.report import BASELINE  # results.json's decoder of the target alone
from dflash_lab.runs.plots import PngImage
from dflash_lab.runs.rundir import PROJECT_ROOT
from dflash_lab.runs.run_files import read_json, read_jsonl, read_metrics

AB_FILE, RESULTS_FILE, METRICS_TGZ, SPEED_FILE = ("eval/ab.json", "eval/results.json", "eval/arm-metrics.tgz",
                                                  "bench/entry.jsonl")
ENV_FILE = "eval/env.txt"  # nvidia-smi's GPU line, torch/transformers, the device copy's `git rev-parse HEAD`
SETTINGS = ("target", "drafter_variant", "steps", "time_budget_s", "seq_len", "batch_size", "num_anchors",
            "block_size", "num_draft_layers", "lr", "lr_schedule", "warmup_ratio", "min_lr_ratio", "draft_vocab_size",
            "feature_store_gib", "loss_weighting", "distill_weight", "distill_top_k", "distill_temperature",
            "val_every", "real_tau_every", "real_tau_prompts", "seed")
SET_MARKERS = ("o", "s", "^", "D", "v")
SMOOTH = 5  # logged rows (every 50 steps) in the rolling mean drawn over the raw per-batch loss and accuracy


def load_ab(folder: str | Path) -> dict:
    """The A/B folder as one dict: `ab` (ab.json), `results` (results.json), `metrics` / `configs` / `summaries`
    per arm (from arm-metrics.tgz), `speed` (entry.jsonl rows), `env` (env.txt lines) and `folder`. A relative
    path not found from here is read under the project root (a notebook's kernel runs in its own folder)."""
    p = Path(folder).expanduser()
    if not p.is_absolute() and not p.exists():
        p = PROJECT_ROOT / p
    missing = [f for f in (AB_FILE, RESULTS_FILE, METRICS_TGZ) if not (p / f).is_file()]
    if missing:
        raise ConfigError(f"{folder} is no A/B results folder ({', '.join(missing)} missing under {p}). Fix: pass "
                          "the folder bench/recipe_ab.py's run.sh filled, e.g. "
                          "bench/results/2026-12-02-h200-distill-ab.")
    ab = read_json(p / AB_FILE)
    out = {"folder": p, "ab": ab, "results": read_json(p / RESULTS_FILE), "metrics": {}, "configs": {},
           "summaries": {}, "speed": list(read_jsonl(p / SPEED_FILE)) if (p / SPEED_FILE).is_file() else [],
           "env": (p / ENV_FILE).read_text().splitlines() if (p / ENV_FILE).is_file() else []}
    with tempfile.TemporaryDirectory() as tmp, tarfile.open(p / METRICS_TGZ) as tgz:
        tgz.extractall(tmp, filter="data")
        for arm, state in ab["arms"].items():
            run = Path(tmp) / "runs" / Path(state["run_dir"]).name  # runs/<arm>-<stamp>-<id>, as on the GPU
            if not (run / "metrics.jsonl").is_file():
                raise ConfigError(f"{p / METRICS_TGZ} holds no runs/{run.name}/metrics.jsonl for arm {arm!r}. Fix: "
                                  "re-pack the arms' run folders (run.sh eval does it).")
            out["metrics"][arm] = list(read_metrics(run / "metrics.jsonl"))
            out["configs"][arm] = read_json(run / "config.json", missing={})
            out["summaries"][arm] = read_json(run / "summary.json", missing={})
    return out


def settings_markdown(data: dict) -> str:
    """The arms' training settings (their config.json) side by side, the ones that differ marked (differing_settings:
    the time budget is not), then the data mix, the evaluation asked and measured, and the machine (env.txt)."""
    cfgs, differ = data["configs"], differing_settings(data)
    rows = [[k, *(_f(c.get(k), "g") for c in cfgs.values()), "**differs**" if k in differ else ""] for k in SETTINGS]
    recipe, mix = data["ab"]["recipe"], data["ab"]["phases"]["mix_data"]
    asked = recipe.get("eval_temperatures", [])
    res = data["results"]["rows"]
    measured = sorted({r["temperature"] for r in res})
    counts = "/".join(str(n) for n in sorted({r["prompts"] for r in res})) or "no"  # as decoded, not as asked
    decoded = sorted({b for r in res if r["decoder"] != BASELINE and (b := _row_block(data, r))})
    lines = [_markdown(["setting", *cfgs, ""], rows), "",
             f"- training data: {mix['n']:,} conversations ("
             + ", ".join(f"{k} {v:,}" for k, v in mix["counts"].items()) + ")",
             f"- evaluation: block sizes {recipe.get('eval_block_sizes')} asked, {decoded} decoded (each arm at its "
             f"own), {counts} prompts per set, "
             f"{recipe.get('eval_max_new_tokens')} new tokens, sets {', '.join(data['results'].get('sets', {}))};"
             f" temperatures asked {asked}, measured {measured}"]
    lines += [f"- machine: {line}" for line in data["env"][:2]]
    return "\n".join(lines)


def differing_settings(data: dict) -> list[str]:
    """The SETTINGS whose value is not the same in every arm's config.json: what the A/B compares. The time budget
    is left out: it decides where a job stops, not the curve (a stopped arm resumes exactly)."""
    cfgs = list(data["configs"].values())
    return [k for k in SETTINGS if k != "time_budget_s" and len({repr(c.get(k)) for c in cfgs}) > 1]


def final_rows(data: dict) -> list[dict]:
    """One row per (drafter arm, prompt set, temperature) of the final evaluation: steps, prompts, tau and its
    interval, the block size it decoded at, tokens/s, the target alone's tokens/s on the same prompts at the same
    temperature (the row's own session's where it carries one: arms collected from several sessions, an adopted
    run), speedup, and the other arms whose interval on that set and temperature overlaps this one
    (`not_separated_from`; None when the evaluation has one arm: nothing to separate)."""
    rows = data["results"]["rows"]
    key = lambda r: (r["prompt_set"], r.get("temperature", 0.0))  # noqa: E731
    base = {key(r): r for r in rows if r["decoder"] == BASELINE}
    drafters = [r for r in rows if r["decoder"] != BASELINE]
    several = len({_label(r) for r in drafters}) > 1
    overlap = {}
    for k in dict.fromkeys(key(r) for r in drafters):
        overlap[k] = not_separated({_label(r): stored_interval(r["tau"], r.get("tau_low"), r.get("tau_high"),
                                                               r.get("prompts"))
                                    for r in drafters if key(r) == k})
    return [{"arm": _label(r), "temperature": r.get("temperature", 0.0), "steps": r["steps"],
             "prompt_set": r["prompt_set"], "prompts": r["prompts"], "tau": r["tau"], "tau_low": r.get("tau_low"),
             "tau_high": r.get("tau_high"), "block_size": _row_block(data, r), "tokens_per_s": r["tokens_per_s"],
             "target_tokens_per_s": r.get("target_tokens_per_s") or base.get(key(r), {}).get("tokens_per_s"),
             "speedup": r["speedup"],
             "not_separated_from": overlap[key(r)][_label(r)] if several else None}
            for r in drafters]


def _row_block(data: dict, row: dict) -> int | None:
    """The block size a drafter row decoded at: the row's own, or (rows written before they carried it) its arm's
    trained block, which bench/recipe_ab.py's evaluations decode at."""
    return row.get("block_size") or (data.get("configs", {}).get(row["arm"]) or {}).get("block_size")


def _label(row: dict) -> str:
    """The arm, and how it drafted where that was not its argmax (sampled drafts at T > 0 are another decoder of
    the same drafter, compared on the same prompts)."""
    mode = row.get("draft_sampling", "argmax")
    return row["arm"] if mode == "argmax" else f"{row['arm']} ({mode} drafts)"


def _f(v, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec) if isinstance(v, float) else str(v)


def _markdown(head: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def final_markdown(data: dict) -> str:
    """final_rows as a markdown table: `tau [low, high]` (95% bootstrap over prompts), speedup over the target
    alone, and whether the arms' intervals on that set are apart."""
    def separated(r):
        if r["not_separated_from"] is None:
            return "-"
        return "yes" if not r["not_separated_from"] else f"no ({', '.join(r['not_separated_from'])})"

    rows = [[r["arm"], f"{r['steps']:,}", r["prompt_set"], f"{r['temperature']:g}", r["prompts"],
             f"{_f(r['tau'])} [{_f(r['tau_low'])}, {_f(r['tau_high'])}]", _f(r["tokens_per_s"], ".1f"),
             _f(r["target_tokens_per_s"], ".1f"), "-" if r["speedup"] is None else f"{_f(r['speedup'])}x", separated(r)]
            for r in final_rows(data)]
    return _markdown(["arm", "steps", "prompt set", "T", "prompts", "real tau [95%]", "tokens/s",
                      "target alone tokens/s", "speedup", "separated"], rows)


def curves(data: dict) -> dict[str, list[dict]]:
    """Per arm, its metrics rows with `minutes`: wall-clock minutes on the GPU since its first training step began
    (the row's `time` minus step 1's, plus step 1's own step time), held-out checks included; what ran before step
    1 (tokenizing, loading, the store's allocation) is not counted."""
    out = {}
    for arm, rows in data["metrics"].items():
        start = rows[0]["time"] - rows[0]["step_time_s"]
        out[arm] = [{**r, "minutes": (r["time"] - start) / 60.0} for r in rows]
    return out


def arms_markdown(data: dict) -> str:
    """One row per arm and held-out check: the settings that differ between the arms (none: no column), status,
    steps of the asked steps, GPU minutes (curves) at the last logged row of epoch 0 (the epoch that fills the
    feature store) and at the last step, wall_s of the arm's process, steady tokens/s, the last learning rate (0 at
    the cosine's end), last loss and accuracy, and the check's figures on the run's heldout_data (validation
    accuracy, chain tau, real tau with its interval and prompts; the recipe's held-out split may share prompts with
    the training data, so read them as a curve)."""
    rows, knobs = [], differing_settings(data)
    knob_head = [" / ".join(knobs)] if knobs else []
    for arm, cs in curves(data).items():
        state, cfg, last = data["ab"]["arms"][arm], data["configs"][arm], cs[-1]
        first_epoch = max((r["minutes"] for r in cs if r.get("epoch") == 0), default=None)
        # arms trained without a real-tau check (real_tau_every=0) get one row: their last validation check
        checks = ([r for r in cs if r.get("real_tau") is not None]
                  or [r for r in cs if r.get("val_chain_tau") is not None][-1:] or [last])
        for check in checks:
            tau = (f"{_f(check['real_tau'])} [{_f(check.get('real_tau_low'))}, {_f(check.get('real_tau_high'))}] "
                   f"n={check.get('real_tau_prompts')}" if check.get("real_tau") is not None else "-")
            values = [" / ".join(_f(cfg.get(k), "g") for k in knobs)] if knobs else []
            rows.append([arm, *values, state["status"],
                         f"{state['steps']:,} / {cfg.get('steps', 0):,}", _f(first_epoch), _f(last["minutes"]),
                         _f(state["wall_s"], ".1f"), _f(state["steady_tokens_per_s"], ",.0f"),
                         _f(last["lr"], ".2e"), _f(last["loss"], ".3f"), _f(last["acc"], ".3f"),
                         f"{check['step']:,}", _f(check.get("val_acc"), ".3f"), _f(check.get("val_chain_tau")), tau])
    return _markdown(["arm", *knob_head, "status", "steps", "GPU min, epoch 0 last row", "GPU min", "wall s",
                      "steady tokens/s", "last lr", "last loss", "last acc", "check at step", "val acc",
                      "val chain tau", "training-time real tau"], rows)


SPEED_COLUMNS = (("label", "label", ""), ("batch_size", "batch", ""), ("draft_vocab_size", "draft vocab", ""),
                 ("feature_store_gib", "store GiB", ".0f"), ("distill_weight", "distill_weight", ""),
                 ("compile_drafter", "compiled", ""), ("step_ms", "step ms", ".1f"),
                 ("tokens_per_s", "tokens/s", ",.0f"), ("target_ms", "target ms", ".2f"),
                 ("drafter_ms", "drafter ms", ".1f"), ("feature_store_hit_rate", "store hit rate", ".3f"),
                 ("first_step_s", "first step s", ".1f"))


def speed_rows(data: dict) -> list[dict]:
    """The step benchmark's rows (entry.jsonl) with the fields of SPEED_COLUMNS; `distill_weight` from `set`."""
    return [{k: ({**r, **r.get("set", {})}).get(k) for k, _, _ in SPEED_COLUMNS} for r in data["speed"]]


def speed_markdown(data: dict) -> str:
    rows = [[_f(r[k], spec) if spec and r[k] is not None else ("-" if r[k] is None else r[k])
             for k, _, spec in SPEED_COLUMNS] for r in speed_rows(data)]
    return _markdown([h for _, h, _ in SPEED_COLUMNS], rows)


def _smooth(ys: list[float], n: int = SMOOTH) -> list[float]:
    return [sum(ys[max(0, i - n + 1):i + 1]) / len(ys[max(0, i - n + 1):i + 1]) for i in range(len(ys))]


PANELS = (("loss", "training loss, one batch (distill: vs the mixed target)"),
          ("acc", "training accuracy on the data's tokens"),
          ("val_acc", "held-out accuracy (the run's validation sequences)"),
          ("real_tau", "real tau at T=0, {blocks} (95% bootstrap intervals)"))
XAXES = (("step", "optimizer step"), ("minutes", "GPU wall-clock minutes since step 1"))


def training_figure(data: dict):
    """Two rows of four panels: loss, training accuracy, held-out accuracy and real tau against optimizer steps
    (top) and against GPU wall-clock minutes (bottom, see curves); x shared along a row. Loss and accuracy: raw
    rows (faint) and a rolling mean of SMOOTH rows; the first row's loss (~47) is left off the scale. Held-out
    accuracy: one marker per validation check (a loss weighting other than the paper's changes the loss's scale,
    not this one's). Real tau: the check while training (a few prompts of the run's heldout_data, filled) and the
    final evaluation (one hollow marker per prompt set) at the arm's last step / minute. Colour = arm, marker =
    prompt set."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    fig = Figure(figsize=(20, 8), layout="constrained")
    axes = fig.subplots(2, 4, sharex="row")
    cs = curves(data)
    finals = [r for r in final_rows(data) if r["temperature"] == 0]  # the panel is T=0 real tau, as in training
    sets = list(dict.fromkeys(r["prompt_set"] for r in finals))
    for row, (xkey, xlabel) in zip(axes, XAXES):
        for i, (arm, rs) in enumerate(cs.items()):
            color = f"C{i}"
            for ax, (key, _) in zip(row[:2], PANELS):
                xs, ys = zip(*[(r[xkey], r[key]) for r in rs if r.get(key) is not None and r["step"] > 1])
                ax.plot(xs, ys, lw=0.7, alpha=0.35, color=color)
                ax.plot(xs, _smooth(list(ys)), lw=1.6, color=color, label=f"{arm} ({rs[-1]['step']:,} steps)")
            val = [r for r in rs if r.get("val_acc") is not None]
            row[2].plot([r[xkey] for r in val], [r["val_acc"] for r in val], "o--", ms=4, color=color, label=arm)
            checks = [r for r in rs if r.get("real_tau") is not None]
            row[3].errorbar([r[xkey] for r in checks], [r["real_tau"] for r in checks], color=color, fmt="o--",
                            yerr=_yerr(checks, "real_tau", "real_tau_low", "real_tau_high"), capsize=3)
            end = rs[-1][xkey]
            for k, s in enumerate(sets):
                mine = [r for r in finals if r["arm"] == arm and r["prompt_set"] == s]
                shift = (k - (len(sets) - 1) / 2) * 0.005 * end  # one arm's sets side by side at its last x
                row[3].errorbar([end + shift for _ in mine], [r["tau"] for r in mine], color=color, mfc="white",
                                yerr=_yerr(mine, "tau", "tau_low", "tau_high"), fmt=SET_MARKERS[k % len(SET_MARKERS)],
                                capsize=3)
        for ax, (_, title) in zip(row, PANELS):
            ax.set_title(title.format(blocks=_blocks_label(finals)), fontsize=10)
            ax.set_xlabel(xlabel)
            ax.grid(alpha=0.3)
        row[0].legend(fontsize=8)
        row[2].legend(fontsize=8)
        n_check = next((r.get("real_tau_prompts") for rs in cs.values() for r in rs if r.get("real_tau")), None)
        n_final = finals[0]["prompts"] if finals else None
        keys = [] if n_check is None else [  # no legend entry for checks no arm made
            Line2D([], [], color="grey", marker="o", ls="--", label=f"training-time check (n={n_check})")]
        keys += [Line2D([], [], color="grey", marker=SET_MARKERS[k % len(SET_MARKERS)], mfc="white", ls="",
                        label=f"final eval: {s} (n={n_final})") for k, s in enumerate(sets)]
        row[3].legend(handles=keys, fontsize=8, loc="lower left")
    return fig


def _blocks_label(rows: list[dict]) -> str:
    """The block sizes the final rows decoded at: "block 16", or each arm's own where they differ."""
    blocks = sorted({r["block_size"] for r in rows if r.get("block_size")})
    if len(blocks) == 1:
        return f"block {blocks[0]}"
    return f"each arm at its own block ({', '.join(map(str, blocks))})" if blocks else "each arm at its own block"


def _yerr(rows: list[dict], key: str, lo: str, hi: str) -> list[list[float]]:
    return [[r[key] - (r[lo] if r.get(lo) is not None else r[key]) for r in rows],
            [(r[hi] if r.get(hi) is not None else r[key]) - r[key] for r in rows]]


def figure_png(fig, dpi: int = 100) -> PngImage:
    """A matplotlib figure as a PngImage (a notebook shows it as a static PNG output, which GitHub renders)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return PngImage(buf.getvalue())


def training_png(data: dict) -> PngImage:
    return figure_png(training_figure(data))


def chain_tau_figure(data: dict, prompt_set: str = "chitchat-heldout"):
    """Tau against GPU-minutes, one line per arm: the held-out chain tau at each validation check (the tau the
    held-out windows' per-slot accuracies simulate, comparable between variants) and, hollow at the arm's last
    minute, the final real tau at T=0 on `prompt_set` with its 95% interval. Arms of different block sizes read
    on one axis: tau counts tokens per target forward whatever the block."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 4.5), layout="constrained")
    ax = fig.subplots()
    finals = [r for r in final_rows(data) if r["temperature"] == 0 and r["prompt_set"] == prompt_set]
    for i, (arm, rows) in enumerate(curves(data).items()):
        checks = [r for r in rows if r.get("val_chain_tau") is not None]
        block = (data["configs"].get(arm) or {}).get("block_size")
        ax.plot([r["minutes"] for r in checks], [r["val_chain_tau"] for r in checks], "o-", ms=3, color=f"C{i}",
                label=f"{arm} (block {block}): held-out chain tau")
        mine = [r for r in finals if r["arm"] == arm]
        ax.errorbar([rows[-1]["minutes"]] * len(mine), [r["tau"] for r in mine], fmt="D", mfc="white",
                    color=f"C{i}", yerr=_yerr(mine, "tau", "tau_low", "tau_high"), capsize=3,
                    label=f"{arm}: real tau, {prompt_set} (n={mine[0]['prompts']})" if mine else None)
    ax.set_xlabel("GPU-minutes (one GPU, wall clock since step 1)")
    ax.set_ylabel("tau (tokens per target forward)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return fig


def chain_tau_png(data: dict, prompt_set: str = "chitchat-heldout") -> PngImage:
    return figure_png(chain_tau_figure(data, prompt_set))
