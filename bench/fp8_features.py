"""What the float8 feature store does to a real target's features (no drafter, no GPU needed).

    python bench/fp8_features.py [--target smollm2-135m-instruct] [--sets general chitchat-heldout] [--n 64]
                                 [--out fp8_features.json]

Runs the frozen target in fp32 over the prompts of each set (chat template, generation prompt), takes the features
the drafter reads (the default target layers, side by side), and measures two round trips against those fp32
features: bf16 (what the store keeps by default on a GPU, and what the GPU's target computes in) and the store's
float8 (train/feature_store.py: E4M3 of the bf16 features, one scale per position and target layer). Per
(position, layer) slice: relative L2 error ||x' - x|| / ||x|| and cosine similarity; per element: |x' - x| / |x|
over elements with |x| above 1e-3 of their slice's maximum. Median, 99th percentile and worst, per layer and over
all. One JSON object to --out and stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from dflash_lab.config.target_defaults import default_target_layer_ids
from dflash_lab.evaluation.prompt_sets import named_set_path
from dflash_lab.evaluation.prompts import load_prompts
from dflash_lab.target.features import FeatureExtractor
from dflash_lab.target.load import load_target, load_tokenizer
from dflash_lab.train.feature_store import FeatureStore


def _quantiles(v: torch.Tensor) -> dict:
    v = v.flatten().double()
    q = torch.quantile(v[: 2**24], torch.tensor([0.5, 0.99], dtype=torch.float64))  # quantile's size limit
    return {"median": float(q[0]), "p99": float(q[1]), "worst": float(v.max() if v.numel() else 0.0)}


def compare(x: torch.Tensor, y: torch.Tensor, groups: int) -> dict:
    """Errors of y against the reference x, both (S, groups * H), per target layer and over all."""
    S, W = x.shape
    xs, ys = x.view(S, groups, W // groups).double(), y.view(S, groups, W // groups).double()
    rel_l2 = (ys - xs).norm(dim=-1) / xs.norm(dim=-1).clamp(min=1e-30)
    cos = torch.nn.functional.cosine_similarity(xs, ys, dim=-1)
    big = xs.abs() > 1e-3 * xs.abs().amax(dim=-1, keepdim=True)
    elem = ((ys - xs).abs() / xs.abs().clamp(min=1e-30))
    out = {"all": {"rel_l2": _quantiles(rel_l2), "one_minus_cos": _quantiles(1 - cos),
                   "element_rel": _quantiles(elem[big])}}
    for g in range(groups):
        out[f"layer{g}"] = {"rel_l2": _quantiles(rel_l2[:, g]), "element_rel": _quantiles(elem[:, g][big[:, g]])}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python bench/fp8_features.py", description=__doc__.split("\n")[0])
    p.add_argument("--target", default="smollm2-135m-instruct")
    p.add_argument("--sets", nargs="+", default=["general", "chitchat-heldout"])
    p.add_argument("--n", type=int, default=64, help="prompts per set")
    p.add_argument("--num-features", type=int, default=5, help="target layers the drafter reads")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    tok = load_tokenizer(args.target)
    model = load_target(args.target, device="cpu", dtype=torch.float32)
    layers = default_target_layer_ids(model.config.num_hidden_layers, args.num_features)
    extract = FeatureExtractor(model, layers)
    H = model.config.hidden_size
    ref, positions = [], 0
    with torch.no_grad():
        for name in args.sets:
            for ids in load_prompts(named_set_path(name), tok, n_prompts=args.n):
                f = extract(torch.tensor([ids]))
                ref.append(f[0].float())
                positions += len(ids)
    x = torch.cat(ref)  # (positions, n * H) fp32: the reference
    bf16 = x.to(torch.bfloat16)
    store = FeatureStore(gib=x.numel() * 2 / 2**30 + 0.01, seq_len=x.shape[0], width=x.shape[1],
                         dtype=torch.bfloat16, device=torch.device("cpu"), storage="float8", groups=len(layers))
    store.put([b"all"], bf16[None])
    fp8 = store.gather(store.lookup([b"all"]))[0]
    result = {"target": args.target, "sets": args.sets, "prompts_per_set": args.n, "positions": positions,
              "target_layer_ids": list(layers), "hidden_size": H,
              "bf16": compare(x, bf16.float(), len(layers)), "float8": compare(x, fp8.float(), len(layers)),
              "float8_vs_bf16": compare(bf16.float(), fp8.float(), len(layers)),
              "seconds": round(time.perf_counter() - t0, 1)}
    text = json.dumps(result, indent=1)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
