"""bench/fp8_features.py on the tiny target: the float8 store's round trip of real features, measured as the
H200-free figure of docs/performance-profile.md is (there on SmolLM2)."""

import importlib.util
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("one_torch_thread")
ROOT = Path(__file__).resolve().parents[1]


def test_float8_round_trip_errors_sit_between_bf16_and_e4m3_half_ulp(tmp_path):
    spec = importlib.util.spec_from_file_location("fp8_features", ROOT / "bench" / "fp8_features.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "r.json"
    assert mod.main(["--target", "tiny", "--sets", "tiny-heldout", "--n", "4", "--num-features", "2",
                     "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["positions"] > 20 and len(r["target_layer_ids"]) == 2
    bf16, fp8, vs = r["bf16"]["all"], r["float8"]["all"], r["float8_vs_bf16"]["all"]
    assert bf16["rel_l2"]["median"] < 0.005 < fp8["rel_l2"]["median"] < 0.04  # bf16: 8 bits; E4M3: 4 bits
    assert vs["element_rel"]["worst"] <= 1 / 16 + 1e-6  # half an E4M3 ulp of the bf16 value stored
    assert fp8["one_minus_cos"]["worst"] < 1e-3
    assert set(r["float8"]) == {"all", "layer0", "layer1"}
