"""benchmarks/entry_points on CPU: the tiny shape through the notebook Trainer, profiled steps left out of the
timed median, and the kernel families of the profile's summary."""

import json

import pytest

from dflash_lab.benchmarks import entry_points
from dflash_lab.benchmarks.entry_points import kernel_family


def test_profiled_steps_are_left_out_of_the_timed_median(tmp_path, capsys):
    out = tmp_path / "rows.jsonl"
    rc = entry_points.main(["--shapes", "tiny", "--device", "cpu", "--entry-points", "notebook", "--steps", "7",
                            "--warmup", "2", "--profile-steps", "2", "--out", str(out)])
    assert rc == 0
    [row] = [json.loads(line) for line in out.read_text().splitlines()]
    assert "error" not in row, row.get("error")
    assert row["steps_timed"] == 3  # steps 3..5: after the warm-up, before the 2 profiled ones
    assert row["profile"]["steps"] == 2
    # no CUDA kernels on the CPU: the device summary is empty rather than made up
    assert row["profile"]["device_busy_ms_per_step"] == 0 and row["profile"]["top_kernels"] == []
    assert row["step_ms"] > 0 and row["tokens_per_s"] == pytest.approx(4 * 128 / (row["step_ms"] / 1e3), rel=1e-3)


def test_profile_steps_that_leave_nothing_timed_are_refused():
    with pytest.raises(SystemExit):
        entry_points.parse_args(["--steps", "10", "--warmup", "8", "--profile-steps", "2"])


@pytest.mark.parametrize("name,family", [
    ("triton_tem_fused_flex_attention_0", "flex attention forward"),
    ("triton_tem_fused_flex_attention_backward_zeros_1", "flex attention backward"),
    ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_TNN", "matmul"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "matmul"),
    ("triton_per_fused__to_copy_add_mul_rsqrt_0", "fused elementwise (triton)"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float>", "norms"),
    ("void at::native::elementwise_kernel<128, 2>", "elementwise (eager)"),
    ("Memcpy HtoD (Pinned -> Device)", "copies and gathers"),
    ("something_new", "other"),
])
def test_kernel_families(name, family):
    assert kernel_family(name) == family


def test_entry_points_pin_what_the_step_benchmark_pins(tmp_path):
    """Both step benchmarks pin the fields a run would choose for the target (benchmarks/pinned.py); entry_points'
    own feature-store axis overrides the pinned store."""
    import argparse

    from dflash_lab.benchmarks.pinned import PINNED
    from dflash_lab.config.recipe_defaults import PAPER_LR

    args = argparse.Namespace(steps=3, compile_drafter=False)
    fields = entry_points.config_fields("recipe", args, 0, 4.0, tmp_path)
    assert {k: fields[k] for k in PINNED} == {**PINNED, "feature_store_gib": 4.0}
    assert PINNED["lr"] == PAPER_LR and PINNED["loss_weighting"] == "decay"
