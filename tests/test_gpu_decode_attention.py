"""GPU checks of the per-row decode kernel (marker `gpu`; skipped with a reason on CPU): Triton == the masked sdpa
grouped path at SmolLM2's shape in bf16 (tolerance) and fp32 (tight), inside a CUDA graph whose lengths change
between replays; the engine's greedy answers in fp32 with the Triton kernel == with sdpa, graphs and eager, and ==
the evaluator's (serving match)."""

import pytest
import torch

from dflash_lab.evaluation.serving_match import serving_match
from dflash_lab.target.decode_attention import triton_available, triton_decode_attention
from dflash_lab.target.gen_kernels import grouped_decode_attention
from dflash_lab.target.generate import GenerationSettings, Generator
from tests.test_gpu_generate import tiny_on

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not triton_available(), reason="triton is not importable")]
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def sdpa_grouped(q, k, v, lengths, scale):
    attn = torch.nn.Module()
    attn.num_key_value_groups, attn.is_causal = q.shape[1] // k.shape[1], True
    mask = (torch.arange(k.shape[2], device=k.device)[None] < lengths[:, None])[:, None, None]
    return grouped_decode_attention(attn, q, k, v, mask, scaling=scale)[0]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_triton_equals_sdpa_grouped_inside_a_cuda_graph(dtype):
    """SmolLM2's attention (3 KV heads x 3 query heads, d 64), 96 rows of 1..1,900 keys in a 2,048-position cache,
    span 1,920; the graph is captured once and replayed with other lengths written into the same tensor."""
    torch.manual_seed(0)
    dev, B, S, span = torch.device("cuda"), 96, 2048, 1920
    cache_k = torch.randn(128, 3, S, 64, device=dev, dtype=dtype)
    cache_v = torch.randn(128, 3, S, 64, device=dev, dtype=dtype)
    k, v = cache_k[:B, :, :span], cache_v[:B, :, :span]
    q = torch.randn(B, 1, 9, 64, device=dev, dtype=dtype).transpose(1, 2)
    lengths = torch.randint(1, 1901, (B,), device=dev)
    lengths[:4] = torch.tensor([1, 64, 65, span])
    for _ in range(2):  # compile + warm up outside the capture
        triton_decode_attention(q, k, v, lengths, 0.125)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = triton_decode_attention(q, k, v, lengths, 0.125)
    for seed in (1, 2):
        lengths.copy_(torch.randint(1, span + 1, (B,), generator=torch.Generator().manual_seed(seed)).to(dev))
        graph.replay()
        torch.cuda.synchronize()
        ref = sdpa_grouped(q, k, v, lengths, 0.125)
        assert out.shape == ref.shape == (B, 1, 9, 64) and out.dtype == dtype
        assert (out.float() - ref.float()).abs().max().item() <= TOL[dtype]


def test_engine_fp32_greedy_with_triton_equals_sdpa_and_the_evaluator():
    model, stop, prompts = tiny_on("cuda:0", torch.float32)
    settings = GenerationSettings(max_new_tokens=64)
    want = Generator(model, stop_ids=stop, max_batch=12, max_len=512, decode_attention="sdpa").generate(prompts,
                                                                                                       settings)
    for graphs in (True, False):
        g = Generator(model, stop_ids=stop, max_batch=12, max_len=512, decode_attention="triton", cuda_graphs=graphs)
        assert g.generate(prompts, settings) == want
        assert g.graph_status.endswith("decode attention triton") and (len(g._graphs) >= 2) == graphs
    auto = Generator(model, stop_ids=stop, max_batch=8, max_len=512)
    assert auto.decode_attention == "triton"
    report = serving_match(model, prompts[:12], stop_ids=stop, max_new_tokens=64, generator=auto)
    assert report["match_rate"] == 1.0, report["differences"]
