"""Results of one evaluation: the table with intervals and prompt sets, verdicts per prompt, where they are saved.

Every tau comes with its 95% bootstrap interval over prompts (intervals.py) and with the prompt set it was measured
on: its name, how many prompts, and the sha256 of exactly those prompts (prompt_sets.py), so two figures are
compared only when they were measured on the same prompts. Lossless verdicts (identical / numerical near-tie /
real mismatch) are verdicts.py's.

Every evaluation gets its own folder, `<run>/evals/<UTC stamp>-b<B>-t<T>-<dtype>/` (eval.json, eval.ipynb,
plots/); `latest_eval(run)` finds the newest (a legacy `<run>/eval.json` counts when there is no folder).
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from pathlib import Path

from dflash_lab.runs.evals import EVAL_FILE, eval_dirs, latest_eval, new_eval_dir, pooled_tau  # noqa: F401 (re-exported)
from dflash_lab.runs.evals import draft_sampling_of
from .intervals import LEVEL, RESAMPLES, tau_interval
from .prompt_sets import overlap_text
from .verdicts import NEAR_TIE_MARGIN, lossless_verdict  # noqa: F401 (re-exported)

BASELINE = "target only"


@dataclass
class EvalReport:
    """Results of one evaluation: per decoder (trained / untrained / target only) and prompt set, per prompt."""

    baseline = BASELINE  # the decoder name of the target-only rows (eval_plots leaves them out)

    run_dir: str
    weights: str
    step: int | None
    target: str
    block_size: int
    temperature: float
    max_new_tokens: int
    results: dict = field(default_factory=dict)  # {decoder: {prompt set: [GenerationResult.to_dict() + ids, margins]}}
    dtype: str = "float32"
    decoding: str = ""  # how decoding ran (static caches + CUDA graphs, or the dynamic loop)
    near_tie_margin: float | None = None  # None = NEAR_TIE_MARGIN[dtype]
    out_dir: str = ""  # where save() writes by default ("" = a new folder under <run>/evals/)
    prompt_sets: dict = field(default_factory=dict)  # {set name: PromptSetInfo.to_dict()}: file, size, sha256
    seed: int = 0  # of the bootstrap resampling
    stopped: str = ""  # why fewer prompts were decoded than planned (a time budget), "" when every one was
    train_gpu_seconds: float | None = None  # what the evaluated weights cost to train (runs/gpu_time.py), if logged
    draft_sampling: str | None = None  # how the drafts were drawn (acceptance.DRAFT_SAMPLING; "argmax" at T=0)
    block_sizes: dict = field(default_factory=dict)  # {decoder: its block size} where it is not block_size's

    @classmethod
    def from_dict(cls, d: dict) -> "EvalReport":
        keys = ("run_dir", "weights", "step", "target", "block_size", "temperature", "max_new_tokens", "results")
        extra = {k: d[k] for k in ("dtype", "decoding", "near_tie_margin", "out_dir", "prompt_sets", "stopped",
                                   "train_gpu_seconds", "block_sizes") if k in d}
        extra["draft_sampling"] = draft_sampling_of(d)  # an eval.json older than the field: read off `decoding`
        if "interval" in d:
            extra["seed"] = d["interval"].get("seed", 0)
        return cls(**{k: d[k] for k in keys}, **extra)

    @property
    def tie_margin(self) -> float:
        return self.near_tie_margin if self.near_tie_margin is not None else NEAR_TIE_MARGIN.get(self.dtype, 1.0)

    def verdicts(self) -> list[dict]:
        """One row per (drafter, prompt set, prompt) at temperature 0: identical / near-tie / real mismatch."""
        if self.temperature != 0:
            return []
        rows = []
        for name, sets in self.results.items():
            if name == BASELINE:
                continue
            for sname, res in sets.items():
                base = self.results.get(BASELINE, {}).get(sname, [])
                for i, (a, b) in enumerate(zip(res, base)):
                    rows.append({"decoder": name, "prompt_set": sname, "prompt": i,
                                 **lossless_verdict(a, b, self.tie_margin)})
        return rows

    def rows(self) -> list[dict]:
        """One row per (decoder, prompt set): prompts, tau, tokens/s, speedup vs target only, lossless counts."""
        verdicts = self.verdicts()
        rows = []
        for name, sets in self.results.items():
            for sname, res in sets.items():
                its = sum(r["iterations"] for r in res)
                acc = sum(sum(r["accepted"]) for r in res)
                toks = sum(r["new_tokens"] for r in res)
                secs = sum(r["prefill_s"] + r["decode_s"] for r in res)
                base = self.results.get(BASELINE, {}).get(sname)
                speedup = None
                if base:
                    b_toks = sum(r["new_tokens"] for r in base)
                    b_secs = sum(r["prefill_s"] + r["decode_s"] for r in base)
                    speedup = (b_secs / b_toks) / (secs / toks) if toks and b_toks and secs else None
                mine = [v["verdict"] for v in verdicts if v["decoder"] == name and v["prompt_set"] == sname]
                checked = self.temperature == 0 and base and name != BASELINE
                iv = tau_interval(res, seed=self.seed)
                info = self.prompt_sets.get(sname, {})
                rows.append({"decoder": name, "prompt_set": sname, "block_size": self.block_of(name),
                             "prompts": len(res), "iterations": its, "accepted": acc,
                             "tau": (acc / its + 1) if its else 1.0, "tau_low": iv.low if iv else None,
                             "tau_high": iv.high if iv else None, "prompt_set_sha256": info.get("sha256"),
                             "tau_per_prompt_mean": sum(r["tau"] for r in res) / len(res),
                             "new_tokens": toks, "tokens_per_s": toks / secs if secs else 0.0, "speedup": speedup,
                             "identical_to_target": mine.count("identical") if checked else None,
                             "near_ties": sum(v.startswith("numerical") for v in mine) if checked else None,
                             "real_mismatches": sum(v.startswith("real") for v in mine) if checked else None})
        return rows

    def block_of(self, decoder: str) -> int:
        """The block size `decoder` drafted (1: the target alone)."""
        return 1 if decoder == BASELINE else self.block_sizes.get(decoder, self.block_size)

    def tau(self, decoder: str = "trained", prompt_set: str | None = None) -> float:
        """Pooled tau of a decoder over all its iterations (of one prompt set, or of all)."""
        rows = [r for r in self.rows()
                if r["decoder"] == decoder and (prompt_set is None or r["prompt_set"] == prompt_set)]
        if not rows:
            raise KeyError(f"no results for decoder {decoder!r} / prompt set {prompt_set!r}; have "
                           f"{sorted({(r['decoder'], r['prompt_set']) for r in self.rows()})}")
        return pooled_tau(rows)

    def table(self) -> str:
        """A compact text table: tau with its 95% interval over prompts; `lossless` = identical / prompts, then
        near-ties and real mismatches; then one line per prompt set (size, sha256)."""
        head = (f"{'decoder':<13}{'prompts':<18}{'B':>3}{'n':>5}{'tau [95% CI]':>20}{'tok/s':>9}{'speedup':>9}"
                f"{'lossless':>10}{'ties':>6}{'real':>6}")
        lines = [head, "-" * len(head)]
        for r in self.rows():
            sp = f"{r['speedup']:.2f}x" if r["speedup"] is not None else "-"
            checked = r["identical_to_target"] is not None
            same = f"{r['identical_to_target']}/{r['prompts']}" if checked else "-"
            ties, real = (str(r["near_ties"]), str(r["real_mismatches"])) if checked else ("-", "-")
            tau = f"{r['tau']:.2f} [{r['tau_low']:.2f}, {r['tau_high']:.2f}]" if r["tau_low"] is not None else \
                f"{r['tau']:.2f} [n/a]"  # fewer than MIN_PROMPTS prompts: no interval
            lines.append(f"{r['decoder']:<13}{r['prompt_set'][:17]:<18}{r['block_size']:>3}{r['prompts']:>5}"
                         f"{tau:>20}{r['tokens_per_s']:>9.1f}{sp:>9}{same:>10}{ties:>6}{real:>6}")
        lines += [f"prompt set {self._set_text(name)}" for name in self._set_names()]
        return "\n".join(lines + ([f"NOTE: {self.stopped}"] if self.stopped else []))

    def _set_names(self) -> list[str]:
        return list(dict.fromkeys(s for sets in self.results.values() for s in sets))

    def _set_text(self, name: str) -> str:
        info = self.prompt_sets.get(name)
        if not info:
            return f"{name}: (size and checksum not recorded)"
        return (f"{name}: {info['prompts']} of {info['file_prompts']} prompts, sha256 {info['sha256'][:12]}, "
                f"{info['path']}; {overlap_text(info)}")

    def verdict_lines(self) -> list[str]:
        """One line per prompt whose output differs from the target's (empty when all are identical)."""
        lines = []
        for v in self.verdicts():
            if v["verdict"] == "identical":
                continue
            line = (f"{v['decoder']} {v['prompt_set']} prompt {v['prompt']}: token {v['index']}: {v['verdict']} "
                    f"(speculative {v.get('spec_token')} vs target {v.get('target_token')}")
            if v.get("spec_topk"):
                top = lambda t: ", ".join(f"{i}:{x:.4g}" for i, x in t[:3])  # noqa: E731
                line += f"; top-3 speculative {top(v['spec_topk'])}, target-only {top(v['target_topk'])}"
            lines.append(line + ")")
        return lines

    def _repr_html_(self) -> str:
        cols = ["decoder", "prompt_set", "block_size", "prompts", "tau", "tau_low", "tau_high", "tokens_per_s",
                "speedup", "identical_to_target", "near_ties", "real_mismatches"]
        fmt = {"tau": "{:.2f}", "tau_low": "{:.2f}", "tau_high": "{:.2f}", "tokens_per_s": "{:.1f}",
               "speedup": "{:.2f}x"}
        cell = lambda r, c: fmt.get(c, "{}").format(r[c]) if r[c] is not None else "-"  # noqa: E731
        body = "".join("<tr>" + "".join(f"<td>{html.escape(cell(r, c))}</td>" for c in cols) + "</tr>"
                       for r in self.rows())
        diffs = "".join(f"<li>{html.escape(line)}</li>" for line in self.verdict_lines())
        sets = "".join(f"<li>{html.escape(self._set_text(n))}</li>" for n in self._set_names())
        return (f"<p>step {self.step} of {html.escape(self.run_dir)}, T={self.temperature}, {self.dtype}, "
                f"max_new_tokens={self.max_new_tokens}; {html.escape(self.decoding)}; tau_low / tau_high: "
                f"{LEVEL:.0%} bootstrap interval over prompts</p><table><tr>"
                + "".join(f"<th>{c}</th>" for c in cols) + f"</tr>{body}</table><p>prompt sets:</p><ul>{sets}</ul>"
                + (f"<p>outputs that differ from the target's:</p><ul>{diffs}</ul>" if diffs else "")
                + (f"<p><b>{html.escape(self.stopped)}</b></p>" if self.stopped else ""))

    def __repr__(self) -> str:
        return self.table()

    def acceptance(self, decoder: str = "trained") -> tuple[list[int], list[float]]:
        """(histogram of accepted drafts per iteration 0..B-1, acceptance rate per block slot 1..B-1), pooled."""
        B = self.block_of(decoder)
        hist = [0] * B
        for res in self.results.get(decoder, {}).values():
            for r in res:
                hist = [a + b for a, b in zip(hist, r["accept_histogram"])]
        n = max(1, sum(hist))
        rate = [sum(hist[k:]) / n for k in range(1, B)]
        return hist, rate

    def to_dict(self) -> dict:
        return {"run_dir": self.run_dir, "weights": self.weights, "step": self.step, "target": self.target,
                "block_size": self.block_size, "temperature": self.temperature,
                "max_new_tokens": self.max_new_tokens, "dtype": self.dtype, "decoding": self.decoding,
                "near_tie_margin": self.tie_margin, "out_dir": self.out_dir, "prompt_sets": self.prompt_sets,
                "stopped": self.stopped, "train_gpu_seconds": self.train_gpu_seconds,
                "draft_sampling": self.draft_sampling, "block_sizes": self.block_sizes,
                "interval": {"level": LEVEL, "resamples": RESAMPLES, "seed": self.seed,
                             "method": "bootstrap over prompts, pooled tau (accepted / iterations + 1) per resample"},
                "summary": self.rows(), "verdicts": self.verdicts(),
                "acceptance": {d: dict(zip(("histogram", "slot_rate"), self.acceptance(d)))
                               for d in self.results if d != BASELINE},
                "results": self.results}

    def save(self, out_dir: str | Path | None = None) -> dict[str, Path]:
        """Write eval.json and the PNG plots into out_dir (default: a new folder under <run>/evals/)."""
        from .plots import plot_eval
        from dflash_lab.runs.rundir import write_json

        d = Path(out_dir or self.out_dir or new_eval_dir(self.run_dir, self.block_size, self.temperature, self.dtype))
        d.mkdir(parents=True, exist_ok=True)
        write_json(d / EVAL_FILE, self.to_dict())
        paths = {"dir": d, "json": d / EVAL_FILE}
        paths.update(plot_eval(self, d / "plots"))
        return paths


def tau_line(saved: dict) -> str:
    """Trained and untrained tau per prompt set with its interval, quoted from the table's rows."""
    rows = [r for r in saved["summary"] if r["decoder"] != BASELINE]
    ci = lambda r: (f" [{r['tau_low']:.2f}, {r['tau_high']:.2f}]"  # noqa: E731 (n/a: too few prompts)
                    if r.get("tau_low") is not None else " [n/a]")
    sha = lambda r: f", sha256 {r['prompt_set_sha256'][:12]}" if r.get("prompt_set_sha256") else ""  # noqa: E731
    return ("tau " + "; ".join(f"{r['decoder']} {r['prompt_set']} {r['tau']:.2f}{ci(r)} ({r['prompts']} prompts"
                               f"{sha(r)})" for r in rows)
            + f" (95% bootstrap intervals over prompts; block size {_blocks(saved)}, temperature "
              f"{saved['temperature']}, {saved.get('dtype', '?')}, {saved['max_new_tokens']} new tokens)")


def _blocks(saved: dict) -> str:
    """"16", or "16 (dspark8 8)" where a compared drafter drafted blocks of its own size."""
    own = saved.get("block_sizes") or {}
    return f"{saved['block_size']}" + (f" ({', '.join(f'{n} {b}' for n, b in own.items())})" if own else "")
