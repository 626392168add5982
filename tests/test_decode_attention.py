"""Per-row-length decode attention (target/decode_attention.py) on the CPU: the torch reference == the engine's masked
sdpa grouped path on ragged rows, the Triton kernel == the reference under Triton's interpreter (when triton
imports), the engine with the reference forced writes the sdpa path's greedy answers, and the knob's errors."""

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dflash_lab.target import gen_kernels
from dflash_lab.target.decode_attention import reference_decode_attention, triton_available
from dflash_lab.target.gen_kernels import grouped_decode_attention
from dflash_lab.target.generate import Generator
from tests.test_generate import GREEDY, random_prompts, tiny, tiny_llama

ROOT = Path(__file__).resolve().parents[1]
TOL = {torch.float32: 2e-6, torch.bfloat16: 2e-2}  # bf16: a few output ulps (|out| < 2, ulp <= 2**-7)


def ragged_case(B, kvh, g, S, d, dtype, seed=0):
    """q in HF's layout (a transposed view), K/V as strided views of a bigger cache, lengths 1..S incl. block edges."""
    gen = torch.Generator().manual_seed(seed)
    cache_k = torch.randn(B + 2, kvh, S + 37, d, generator=gen).to(dtype)
    cache_v = torch.randn(B + 2, kvh, S + 37, d, generator=gen).to(dtype)
    q = torch.randn(B, 1, kvh * g, d, generator=gen).to(dtype).transpose(1, 2)  # (B, H, 1, d), not contiguous
    edges = torch.tensor([1, S, 64, 65, 63, 128, 2])[:B]
    lengths = torch.cat([edges, torch.randint(1, S + 1, (max(0, B - len(edges)),), generator=gen)])[:B]
    return q, cache_k[:B, :, :S], cache_v[:B, :, :S], lengths


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("g", [1, 3, 8])
def test_reference_is_the_masked_sdpa_grouped_path(dtype, g):
    """Row b sees keys < lengths[b]: the same as the engine's boolean mask over the whole span."""
    q, k, v, lengths = ragged_case(9, 2, g, 150, 32, dtype)
    mask = (torch.arange(150)[None] < lengths[:, None])[:, None, None]  # (B, 1, 1, S)
    attn = torch.nn.Module()
    attn.num_key_value_groups, attn.is_causal = g, True
    sdpa, _ = grouped_decode_attention(attn, q, k, v, mask, scaling=0.17)
    ref = reference_decode_attention(q, k, v, lengths, 0.17)
    assert ref.shape == sdpa.shape == (9, 1, 2 * g, 32) and ref.dtype == dtype and ref.is_contiguous()
    assert (ref.float() - sdpa.float()).abs().max() <= TOL[dtype]
    # the keys past a row's length change nothing: garbage there (a refilled row's old tokens) is not read
    k2, v2 = k.clone(), v.clone()
    for b, n in enumerate(lengths.tolist()):
        k2[b, :, n:], v2[b, :, n:] = 1e4, -1e4
    assert torch.equal(reference_decode_attention(q, k2, v2, lengths, 0.17), ref)
    # ... and the keys inside do: one row's last key moved changes that row only
    k2[3, :, lengths[3] - 1] += 3.0
    moved = reference_decode_attention(q, k2, v2, lengths, 0.17)
    assert not torch.equal(moved[3], ref[3]) and torch.equal(moved[4:], ref[4:])


def test_reference_refuses_shapes_outside_the_contract():
    q, k, v, lengths = ragged_case(4, 2, 3, 40, 16, torch.float32)
    with pytest.raises(ValueError, match="one query token per row.*Fix"):
        reference_decode_attention(q.expand(4, 6, 2, 16), k, v, lengths)
    with pytest.raises(ValueError, match=r"lengths has shape \(3,\), expected \(4,\).*Fix"):
        reference_decode_attention(q, k, v, lengths[:3])
    with pytest.raises(ValueError, match=r"K \(4, 2, 40, 8\).*Fix"):
        reference_decode_attention(q, k[..., :8], v[..., :8], lengths)


INTERPRETER_CASES = """
import json, torch
from dflash_lab.target.decode_attention import reference_decode_attention, triton_decode_attention
from tests.test_decode_attention import ragged_case
out = []
for dtype, g, d in ((torch.float32, 3, 64), (torch.bfloat16, 3, 64), (torch.float32, 1, 40), (torch.float32, 8, 16)):
    q, k, v, lengths = ragged_case(7, 2, g, 150, d, dtype)
    got = triton_decode_attention(q, k, v, lengths, 0.2)
    ref = reference_decode_attention(q, k, v, lengths, 0.2)
    k2 = k.clone()
    for b, n in enumerate(lengths.tolist()):
        k2[b, :, n:] = float("nan")  # past a row's length: never read, or the row would be NaN
    past = triton_decode_attention(q, k2, v, lengths, 0.2)
    out.append({"dtype": str(dtype), "g": g, "d": d, "shape": list(got.shape), "same_dtype": got.dtype == dtype,
                "err": (got.float() - ref.float()).abs().max().item(), "nan_past_end": bool(past.isnan().any()),
                "past_equal": bool(torch.equal(past, got))})
print(json.dumps(out))
"""


@pytest.mark.skipif(not triton_available(), reason="triton is not importable here (a CPU-only torch does not bring "
                                                   "it; `pip install triton` enables this test)")
def test_triton_kernel_equals_the_reference_under_the_interpreter():
    """TRITON_INTERPRET=1 must be set before triton decorates the kernel: a fresh process runs the cases. Block
    edges (lengths 63/64/65/128), g = 1, 3, 8 (query rows padded to 16), a head dim that is not a power of two."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", INTERPRETER_CASES], env=env, capture_output=True, text=True,
                          timeout=900, cwd=ROOT)  # a bound on a hang only: the interpreter's speed is the machine's
    assert proc.returncode == 0, proc.stderr[-3000:]
    cases = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(cases) == 4
    for c in cases:
        tol = 2e-6 if "float32" in c["dtype"] else 2e-2
        assert c["shape"] == [7, 1, 2 * c["g"], c["d"]] and c["same_dtype"], c
        assert c["err"] <= tol and not c["nan_past_end"] and c["past_equal"], c


def _triton_39() -> bool:
    try:
        import triton
    except ImportError:
        return False
    return tuple(int(x) for x in triton.__version__.split(".")[:2]) >= (3, 9) and \
        os.environ.get("TRITON_INTERPRET", "0") != "1"


@pytest.mark.skipif(not _triton_39(), reason="needs triton >= 3.9 (its ASTSource signature) and no TRITON_INTERPRET")
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_triton_kernel_compiles_for_the_h200(dtype):
    """Ahead-of-time compile for sm_90 with Triton's bundled ptxas, no GPU needed: what the interpreter does not
    check (types, layouts, tl.dot shapes). bf16 dots run on tensor cores (mma), fp32 ones as IEEE FMAs."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from dflash_lab.target.decode_attention import _decode_kernel

    consts = {"G": 3, "D": 64, "D_PAD": 64, "ROWS": 16, "BLOCK": 64, "FP32_DOTS": dtype == "fp32"}
    names = list(inspect.signature(_decode_kernel.fn).parameters)

    def kind(n: str) -> str:  # pointers, the fp32 scale, constexprs, int32 strides
        if n.endswith("_ptr"):
            return "*i64" if n == "len_ptr" else f"*{dtype}"
        return "fp32" if n == "qk_scale" else "constexpr" if n in consts else "i32"

    sig = {n: kind(n) for n in names}
    src = ASTSource(fn=_decode_kernel, signature=sig, constexprs={(names.index(k),): v for k, v in consts.items()})
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"]
    assert ("mma.sync" in ptx) == (dtype == "bf16")


def counting(monkeypatch, kernel: str) -> list:
    """Count the per-row kernel's calls (the real function runs), to show the engine took that path."""
    calls, real = [], gen_kernels.PER_ROW_KERNELS[kernel]

    def spy(q, k, v, lengths, scale):
        calls.append((q.shape[0], k.shape[2], int(lengths.max())))
        return real(q, k, v, lengths, scale)

    monkeypatch.setitem(gen_kernels.PER_ROW_KERNELS, kernel, spy)
    return calls


@pytest.mark.usefixtures("one_torch_thread")
def test_engine_with_the_reference_kernel_writes_the_sdpa_paths_greedy_answers(monkeypatch):
    """The tiny target (Qwen3, 2 query heads per KV head), 4 rows for 8 prompts (refills: rows of different lengths
    decode together), and a tiny Llama without grouped-query attention (g = 1: no grouped path before)."""
    model, stop, prompts = tiny()
    sdpa = Generator(model, stop_ids=stop, max_batch=4, max_len=256, decode_attention="sdpa")
    assert sdpa.decode_attention == "sdpa" and sdpa.graph_status == "eager: graphs off"  # as before on the CPU
    want = sdpa.generate(prompts, GREEDY)
    calls = counting(monkeypatch, "reference")
    lines = []
    ref = Generator(model, stop_ids=stop, max_batch=4, max_len=256, decode_attention="reference", log=lines.append)
    assert ref.generate(prompts, GREEDY) == want
    assert ref.graph_status.endswith("decode attention reference") and "decode attention reference" in lines[0]
    assert calls and any(n < span for _, span, n in calls)  # rows read fewer keys than the span: ragged lengths
    assert model.config._attn_implementation == "sdpa"  # the model is given back as it was
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    mha = LlamaForCausalLM(LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=4,
                                       max_position_embeddings=256)).eval()
    lp = random_prompts(5, seed=3)
    n = len(calls)
    assert Generator(mha, stop_ids=[7], max_batch=2, max_len=96, decode_attention="reference").generate(lp, GREEDY) \
        == Generator(mha, stop_ids=[7], max_batch=2, max_len=96, decode_attention="sdpa").generate(lp, GREEDY)
    assert len(calls) > n


def test_the_decode_attention_knob_is_validated_naming_value_and_fix():
    model = tiny_llama()
    assert Generator(model, stop_ids=[7], max_batch=2, max_len=64).decode_attention == "sdpa"  # auto on the CPU
    with pytest.raises(ValueError, match=r"decode_attention='flash' is not one of auto, sdpa, triton, reference\. "
                                         r"Fix: use 'auto'"):
        Generator(model, stop_ids=[7], decode_attention="flash")
    with pytest.raises(ValueError, match=r"decode_attention='triton' cannot run here: the engine runs on cpu\. Fix"):
        Generator(model, stop_ids=[7], decode_attention="triton")
    with pytest.raises(ValueError, match=r"'reference' cannot run here: the target's attention .* not sdpa\. Fix"):
        Generator(tiny_llama("eager"), stop_ids=[7], decode_attention="reference")
    with pytest.raises(ValueError, match=r"grouped_decode=False runs Hugging Face's own attention\. Fix"):
        Generator(model, stop_ids=[7], decode_attention="reference", grouped_decode=False)
    assert Generator(model, stop_ids=[7], grouped_decode=False).decode_attention == "sdpa"


def test_gen_bench_runs_every_turn_once_per_decode_attention(capsys):
    """`--decode-attention sdpa reference --first 0 --match 0`: only every-turn rows, one per choice, the same
    conversations regenerated to the same answers (greedy, fp32) whichever kernel ran."""
    from dflash_lab.benchmarks.generation import main
    from dflash_lab.tiny import tiny_heldout_path

    main(["--target", "tiny", "--device", "cpu", "--dtype", "float32", "--prompts", str(tiny_heldout_path()),
          "--first", "0", "--match", "0", "--all", "2", "--batch-sizes", "4", "--modes", "eager",
          "--max-new-tokens", "8", "--max-len", "256", "--decode-attention", "sdpa", "reference"])
    rows = [json.loads(ln) for ln in capsys.readouterr().out.splitlines()]
    assert [(r["kind"], r["decode_attention"]) for r in rows] == [("every_turn", "sdpa"), ("every_turn", "reference")]
    assert rows[1]["graphs"].endswith("decode attention reference")
    assert rows[0]["answers"] == rows[1]["answers"] >= 2 and rows[0]["new_tokens"] == rows[1]["new_tokens"]
