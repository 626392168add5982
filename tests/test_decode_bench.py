"""decode_bench: one static iteration split into ingest / draft / verify / accept (parts add up to the iteration,
each launches kernels), the target-only step beside it, and on the GPU the whole bench's JSON lines."""

import json

import pytest
import torch

from dflash_lab.config import DrafterConfig
from dflash_lab.drafter.model import DFlashDrafter
from dflash_lab.evaluation import decode_bench as db
from dflash_lab.evaluation.static_decode import STAGES, StaticSpeculativeDecoder
from tests.test_speculative import _tiny_llama

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest.py: batch-1 decoding of tiny models


def test_parts_of_an_iteration_add_up_and_each_launches_kernels():
    target = _tiny_llama()
    dc = DrafterConfig.from_target(target.config, num_draft_layers=2, block_size=8, mask_token_id=255,
                                   num_target_features=2)
    drafter = DFlashDrafter(dc)
    drafter.init_weights(torch.Generator().manual_seed(0))
    prompt = list(range(5, 40))
    spec = db.time_stages(StaticSpeculativeDecoder(target, drafter.eval(), block_size=8, graphs=False), prompt,
                          iters=2)
    base = db.time_stages(StaticSpeculativeDecoder(target, None, block_size=1, graphs=False), prompt, iters=2)
    assert list(spec["ms"]) == list(STAGES) and list(base["ms"]) == ["verify", "accept"]
    row = db.parts_line(spec, base)
    parts = [row[f"{s}_ms"] for s in STAGES]
    assert sum(parts) == pytest.approx(row["iteration_ms"], abs=1e-3)
    ops = row["ops"]
    assert all(ops[s] > 0 for s in STAGES) and sum(ops[s] for s in STAGES) == ops["iteration"]
    # the verify is the target's forward: as many kernels as the target-only step's, give or take its bookkeeping
    assert abs(ops["verify"] + ops["accept"] - ops["target_step"]) < 0.1 * ops["target_step"]
    assert db.count_ops(lambda: torch.ones(3).add(1).view(3, 1)) == 2  # ones, add; the view launches nothing


@pytest.mark.gpu
def test_decode_bench_on_the_gpu_prints_decoders_parts_and_summary(capsys):
    assert db.main(["--layers", "4", "--draft-layers", "1", "--max-new-tokens", "32", "--repeats", "1",
                    "--part-iters", "20", "--skip-dynamic"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    kinds = {(x["decoder"], x["block_size"]) for x in lines if "decoder" in x and "summary" not in x}
    assert kinds == {("static_graphs", 16), ("static_eager", 16), ("static_graphs", 1), ("static_eager", 1)}
    assert next(x for x in lines if x.get("decoder") == "static_graphs")["status"].startswith("graphs: captured")
    parts = next(x for x in lines if x.get("parts"))
    assert parts["timed"] == "CUDA graphs per prefix" and parts["iteration_ms"] > 0 and parts["target_step_ms"] > 0
    summary = next(x for x in lines if x.get("summary"))
    assert summary["iteration_vs_target_step"] > 0 and summary["aim"] == 1.3


def test_decode_bench_times_speculative_sampling_on_the_cpu(capsys):
    """--temperature 1 --draft-sampling sample on a 4-layer random SmolLM2-shaped pair (49,152 ids): the sampled
    decoder and the target sampling alone are timed, each line says how it sampled, and tau stays within a block."""
    assert db.main(["--layers", "4", "--draft-layers", "1", "--block-size", "8", "--max-new-tokens", "16",
                    "--prompt-len", "24", "--repeats", "1", "--part-iters", "1", "--skip-dynamic", "--device", "cpu",
                    "--dtype", "float32", "--temperature", "1", "--draft-sampling", "sample"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    rows = {x["block_size"]: x for x in lines if x.get("decoder") == "static_eager" and "summary" not in x}
    assert set(rows) == {8, 1}
    assert all(r["temperature"] == 1.0 and r["draft_sampling"] == "sample" for r in rows.values())
    assert 1.0 <= rows[8]["tau"] <= 8.0 and rows[1]["tau"] == 1.0 and rows[8]["tokens_per_s"] > 0
    assert next(x for x in lines if x.get("summary"))["speedup"] > 0
