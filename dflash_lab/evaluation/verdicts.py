"""Lossless verdicts: when a speculative output differs from the target-only output, is it a tie or a bug?

At temperature 0 both computations pick the target's argmax, so they can only differ at a token where the target
itself hesitates, or because decoding is wrong. At the FIRST differing token j, with x the speculative choice and
y the target-only choice, each computation's logits of BOTH candidates are known (the decoder records the logit
of the other output's token at every position: `generate(reference=...)`) together with its top-k there:

    gap_spec   = spec logit[x]   - spec logit[y]     (>= 0: the speculative computation chose x)
    gap_target = target logit[y] - target logit[x]   (>= 0: the target-only computation chose y)

Both gaps within the dtype's tolerance (`NEAR_TIE_MARGIN`: 1.0 logit in bf16/fp16, where a 16-token verify and a
1-token step round differently; 1e-3 in fp32) = "numerical near-tie": the two computations broke a (near-)tie
differently, whatever the other tokens in the tie are (three-way ties are common in bf16: logits one step apart,
or equal). Anything else = "real mismatch": at least one computation put its own choice clearly above the other's,
which rounding cannot do, so decoding is wrong. `--dtype float32` makes ties rare and the check exact.

Results saved before both logits were recorded (no `divergence` record) fall back to the top-2 rule: a near-tie
only when each computation's runner-up is the other's choice and both top-1/top-2 margins are within tolerance.
"""

from __future__ import annotations

NEAR_TIE_MARGIN = {"float32": 1e-3, "bfloat16": 1.0, "float16": 1.0}


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token (None when one output is a prefix of the other)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def _logit_of(result, j: int, token: int, from_reference: bool) -> tuple[float | None, bool]:
    """(the logit of `token` at output position j in this computation, exact?). From its reference logits when
    the reference was the other output, else from its top-k; outside the top-k only a bound is known: the logit
    is below the k-th, returned with exact=False."""
    refs = _get(result, "ref_logits")
    if from_reference and j < len(refs) and refs[j] is not None:
        return float(refs[j]), True
    ids, vals = _get(result, "topk_ids"), _get(result, "topk_logits")
    if j < len(ids) and token in ids[j]:
        return float(vals[j][ids[j].index(token)]), True
    return (float(vals[j][-1]) if j < len(vals) and vals[j] else None), False


def _get(result, key: str):
    return getattr(result, key) if hasattr(result, key) else result.get(key, [])


def divergence_record(spec, base, base_again=None) -> dict | None:
    """Both computations' logits at the first differing token of spec and base (GenerationResults or dicts with
    output_ids, topk_ids, topk_logits, ref_logits); None when they do not differ there.

    spec was decoded with reference = base's output (so its ref_logits hold its logit of base's token);
    base_again is the target-only computation repeated up to that token with reference = spec's output (so its
    ref_logits hold the target-only logit of spec's token). Without base_again, base's own top-k is used."""
    a, b = _get(spec, "output_ids"), _get(base, "output_ids")
    j = first_difference(a, b)
    if j is None:
        return None
    x, y = a[j], b[j]
    again = base_again if base_again is not None else base
    sx, _ = _logit_of(spec, j, x, False)
    sy, s_exact = _logit_of(spec, j, y, True)
    ty, _ = _logit_of(base, j, y, False)
    tx, t_exact = _logit_of(again, j, x, base_again is not None)
    rec = {"index": j, "spec_token": x, "target_token": y,
           "spec": {"logit_spec_token": sx, "logit_target_token": sy, "exact": s_exact,
                    "topk_ids": _get(spec, "topk_ids")[j], "topk_logits": _get(spec, "topk_logits")[j]},
           "target": {"logit_spec_token": tx, "logit_target_token": ty, "exact": t_exact,
                      "topk_ids": _get(base, "topk_ids")[j], "topk_logits": _get(base, "topk_logits")[j]}}
    if base_again is not None:
        rec["target_repeated"] = _get(base_again, "output_ids")[: j + 1] == b[: j + 1]
    return rec


def _gap(hi: float | None, lo: float | None) -> float | None:
    return None if hi is None or lo is None else round(max(0.0, hi - lo), 5)


def verdict_of(rec: dict, tolerance: float) -> dict:
    """The verdict of a divergence record: near-tie when both gaps are exact and within tolerance."""
    s, t = rec["spec"], rec["target"]
    gs, gt = _gap(s["logit_spec_token"], s["logit_target_token"]), _gap(t["logit_target_token"], t["logit_spec_token"])
    out = {"index": rec["index"], "spec_token": rec["spec_token"], "target_token": rec["target_token"],
           "gap_spec": gs, "gap_target": gt, "tolerance": tolerance,
           "spec_topk": list(zip(s["topk_ids"], s["topk_logits"])),
           "target_topk": list(zip(t["topk_ids"], t["topk_logits"]))}
    shown = " / ".join("?" if g is None else f"{'>=' if not exact else ''}{g:.3g}"
                       for g, exact in ((gs, s["exact"]), (gt, t["exact"])))
    if rec.get("target_repeated") is False:
        out["verdict"] = "real mismatch (the target-only decoding did not repeat itself: nondeterministic kernels)"
    elif gs is not None and gt is not None and s["exact"] and t["exact"] and max(gs, gt) <= tolerance:
        out["verdict"] = f"numerical near-tie (gaps {shown})"
    else:
        out["verdict"] = f"real mismatch (gaps {shown})"
    return out


def lossless_verdict(spec: dict, base: dict, near_tie_margin: float) -> dict:
    """Compare one prompt's speculative output with the target-only output. Returns at least {"verdict", "index"}
    (+ the tokens, both gaps and both top-k when they differ)."""
    a, b = spec["output_ids"], base["output_ids"]
    j = first_difference(a, b)
    if j is None:
        if len(a) == len(b):
            return {"verdict": "identical", "index": None}
        return {"verdict": "real mismatch (one output is a prefix of the other)", "index": min(len(a), len(b))}
    rec = spec.get("divergence")
    if rec is not None and rec.get("index") == j:
        return verdict_of(rec, near_tie_margin)
    return _top2_verdict(spec, base, j, near_tie_margin)


def _top2_verdict(spec: dict, base: dict, j: int, near_tie_margin: float) -> dict:
    """Results saved with top-2 margins and runner-up ids only."""
    a, b = spec["output_ids"], base["output_ids"]
    m_spec = spec.get("margins", [])[j] if j < len(spec.get("margins", [])) else None
    m_base = base.get("margins", [])[j] if j < len(base.get("margins", [])) else None
    swapped = (j < len(spec.get("runner_up", [])) and j < len(base.get("runner_up", []))
               and spec["runner_up"][j] == b[j] and base["runner_up"][j] == a[j])
    out = {"index": j, "spec_token": a[j], "target_token": b[j], "margin_spec": m_spec, "margin_target": m_base}
    if swapped and m_spec is not None and m_base is not None and max(m_spec, m_base) <= near_tie_margin:
        out["verdict"] = f"numerical near-tie (margin {max(m_spec, m_base):.3g})"
    else:
        shown = "?" if m_spec is None or m_base is None else f"{m_spec:.3g} / {m_base:.3g}"
        out["verdict"] = f"real mismatch (margin {shown})"
    return out
