"""CPU levels (NVTE_CPU_ISA, ONEDNN_MAX_CPU_ISA, NVTE_CPU_GEMM_COMPUTE): every GEMM dtype runs at
every x86-64 level, build_info() reports the level in use, and what truly cannot run says why.

The level is read once per process, so each case runs in a fresh interpreter. Levels up to AVX2 can be
forced on any x86-64 CI machine (a cap only lowers a CPU); ci/isa_matrix.sh runs the other suites at
every level the machine has.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest


def run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items()
         if k not in ("NVTE_CPU_ISA", "ONEDNN_MAX_CPU_ISA", "NVTE_CPU_GEMM_COMPUTE")}
    e.update(env)
    e.setdefault("OMP_NUM_THREADS", "1")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=e, capture_output=True,
                          text=True, timeout=600, check=False)


INFO = """
import json, transformer_engine_lite as te
i = te.build_info()
print(json.dumps({"cpu_isa": i["cpu_isa"], "onednn_isa": i["onednn_isa"]}))
"""


@pytest.mark.parametrize("level,clone,onednn", [("baseline", "baseline", "sse41"),
                                                ("avx2", "x86-64-v3", "avx2")])
def test_cap_reported_for_our_kernels_and_onednn(level, clone, onednn):
    r = run_python(INFO, NVTE_CPU_ISA=level)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout.strip().splitlines()[-1])
    assert info["cpu_isa"]["level"] == level
    assert info["cpu_isa"]["clone"] == clone
    assert info["onednn_isa"] == onednn


def _rule(level: str, amd: bool) -> str:
    """platform/cpu_isa.h matmul_path_for, restated."""
    order = ["baseline", "avx2", "avx512_core", "avx512_core_bf16", "avx512_core_fp16",
             "avx512_core_amx"]
    rank = order.index(level)
    if rank >= order.index("avx512_core_amx"):
        return "bf16_tiles"
    if rank >= order.index("avx512_core_bf16") and amd:
        return "bf16_dot"
    return "f32"


@pytest.mark.parametrize("level", ["native", "avx2", "avx512_core"])
def test_matmul_path_follows_the_level_and_vendor(level):
    """build_info reports the CPU's exact matmul path: the rule applied to the capped level."""
    r = run_python(INFO, **({} if level == "native" else {"NVTE_CPU_ISA": level}))
    assert r.returncode == 0, r.stderr
    isa = json.loads(r.stdout.strip().splitlines()[-1])["cpu_isa"]
    if level != "native" and isa["detected"] in ("baseline", "avx2") and level == "avx512_core":
        pytest.skip(f"this CPU is {isa['detected']}")
    assert isa["matmul_path"] == _rule(isa["level"], isa["vendor_amd"]), isa


ATTN_PATHS = """
import torch, transformer_engine_lite.pytorch as te
torch.manual_seed(0)
q, k, v = (torch.randn(1, 200, 2, 64, dtype=torch.bfloat16) for _ in range(3))
dpa = te.DotProductAttention(2, 64, attn_mask_type="causal", qkv_format="bshd")
o = dpa(q, k, v).float()
ref = torch.nn.functional.scaled_dot_product_attention(
    *(t.double().transpose(1, 2) for t in (q, k, v)), is_causal=True).transpose(1, 2).reshape(1, 200, 128)
print((o.double() - ref).abs().max().item(), o.double().sum().item())
"""


def test_attention_tiles_take_either_path_and_agree():
    """NVTE_CPU_GEMM_COMPUTE moves the flash-attention tiles between bf16 operands (AMX tiles or
    dot products) and fp32 arithmetic; auto follows the GEMM's matmul path (bf16 on AMX and on AMD
    with AVX-512 BF16, fp32 on Intel without AMX, where vdpbf16ps runs at half the FMA rate). Both
    stay within bf16 rounding of the fp64 result, and they differ (two real paths) on a CPU that
    has both."""
    errs, sums = {}, {}
    for mode in ("fp32", "native", "auto"):
        r = run_python(ATTN_PATHS, NVTE_CPU_GEMM_COMPUTE=mode)
        assert r.returncode == 0, r.stderr[-3000:]
        err, total = r.stdout.strip().splitlines()[-1].split()
        errs[mode], sums[mode] = float(err), total
    assert all(e < 2e-2 for e in errs.values()), errs
    info = json.loads(run_python(INFO).stdout.strip().splitlines()[-1])["cpu_isa"]
    if info["level"] in ("avx512_core_bf16", "avx512_core_fp16", "avx512_core_amx"):
        assert sums["fp32"] != sums["native"], sums  # P in fp32 vs rounded to bf16
    else:
        assert sums["fp32"] == sums["native"], sums  # no bf16 dot products: one path
    # auto: bf16 where the matmul path is (AMX, AMD's dot products), fp32 where it widens
    want = "fp32" if info["matmul_path"] == "f32" else "native"
    assert sums["auto"] == sums[want], (sums, info)


def test_onednn_own_cap_wins_for_onednn():
    r = run_python(INFO, NVTE_CPU_ISA="avx2", ONEDNN_MAX_CPU_ISA="SSE41")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout.strip().splitlines()[-1])
    assert info["cpu_isa"]["level"] == "avx2" and info["onednn_isa"] == "sse41"


def test_unknown_level_is_an_error_naming_the_variable():
    r = run_python("import transformer_engine_lite", NVTE_CPU_ISA="avx9000")
    assert r.returncode != 0
    assert "NVTE_CPU_ISA" in r.stderr and "avx9000" in r.stderr and "avx512_core_bf16" in r.stderr


# Linear fwd+bwd in bf16 and fp16 and under each FP8 recipe vs an fp64 reference, at a capped level:
# oneDNN 3.2 has no bf16/fp16 matmul at AVX2, so the GEMMs run on operands widened to fp32.
LINEAR = """
import torch, transformer_engine_lite.pytorch as te
from transformer_engine_lite.common.recipe import (DelayedScaling, Float8CurrentScaling,
                                                    MXFP8BlockScaling)
torch.manual_seed(0)
for dtype in (torch.bfloat16, torch.float16, torch.float32):
    for recipe in (None, DelayedScaling(), Float8CurrentScaling(), MXFP8BlockScaling()):
        m = te.Linear(64, 96, params_dtype=dtype)
        x = torch.randn(32, 64, dtype=dtype, requires_grad=True)
        with te.fp8_autocast(enabled=recipe is not None, fp8_recipe=recipe):
            y = m(x)
        y.float().square().sum().backward()
        x64, w64 = x.detach().double(), m.weight.detach().double()
        y64 = x64 @ w64.t() + m.bias.detach().double()
        err = (y.double() - y64).abs().max().item() / y64.abs().max().item()
        tol = 0.02 if dtype == torch.float32 and recipe is None else 0.1
        assert err < tol, (dtype, recipe, err)
        assert torch.isfinite(x.grad).all() and torch.isfinite(m.weight.grad).all()
print("ok")
"""


@pytest.mark.parametrize("level", ["baseline", "avx2"])
@pytest.mark.parametrize("compute", ["auto", "fp32"])
def test_linear_every_dtype_and_recipe_at_capped_level(level, compute):
    r = run_python(LINEAR, NVTE_CPU_ISA=level, NVTE_CPU_GEMM_COMPUTE=compute)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().endswith("ok")


def test_native_only_gemm_without_kernel_names_op_dtypes_and_level():
    code = """
    import torch, transformer_engine_lite.pytorch as te
    m = te.Linear(16, 8, params_dtype=torch.bfloat16)
    try:
        m(torch.randn(4, 16, dtype=torch.bfloat16))
    except NotImplementedError as e:
        print("ERR", e)
    """
    r = run_python(code, NVTE_CPU_ISA="avx2", NVTE_CPU_GEMM_COMPUTE="native")
    assert r.returncode == 0, r.stderr[-3000:]
    msg = r.stdout
    assert "ERR" in msg, "expected NotImplementedError: oneDNN 3.2 has no bf16 matmul at AVX2"
    for part in ("gemm", "bfloat16", "CPU level avx2", "oneDNN ISA avx2"):
        assert part in msg, (part, msg)


def test_bad_gemm_compute_value_is_an_error():
    code = """
    import torch, transformer_engine_lite.pytorch as te
    try:
        te.Linear(16, 8)(torch.randn(4, 16))
    except RuntimeError as e:
        print("ERR", e)
    """
    r = run_python(code, NVTE_CPU_GEMM_COMPUTE="fast")
    assert "ERR" in r.stdout and "NVTE_CPU_GEMM_COMPUTE" in r.stdout and "'fast'" in r.stdout, r


ATTN_BITS = """
import hashlib, json, torch, transformer_engine_lite as tel, transformer_engine_lite.pytorch as te
torch.manual_seed(0)
h, errs = hashlib.sha256(), {}
for dtype in (torch.float32, torch.float16):
    q, k, v = (torch.randn(2, 77, 2, 40, dtype=dtype, requires_grad=True) for _ in range(3))
    dpa = te.DotProductAttention(2, 40, attn_mask_type="causal", qkv_format="bshd")
    o = dpa(q, k, v)
    o.float().square().sum().backward()
    for t in (o, q.grad, k.grad, v.grad):
        h.update(t.detach().contiguous().view(torch.uint8).numpy().tobytes())
    # fp64 reference of the same loss: causal softmax(q k^T / sqrt(d)) v, bshd
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    s = torch.einsum("bqhd,bkhd->bhqk", q64, k64) / 40 ** 0.5
    s = s.masked_fill(torch.ones(77, 77, dtype=torch.bool).triu(1), float("-inf"))
    o64 = torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), v64).reshape(o.shape)
    o64.square().sum().backward()
    errs[str(dtype)] = max(((a.double() - r).abs().max() / r.abs().max()).item()
                           for a, r in ((o, o64), (q.grad, q64.grad), (k.grad, k64.grad),
                                        (v.grad, v64.grad)))
print(json.dumps({"clone": tel.build_info()["cpu_isa"]["clone"], "digest": h.hexdigest(),
                  "errs": errs}))
"""


def test_attention_fp32_tiles_bits_per_level():
    """The fp32 tile kernel (fp32 and fp16 attention, forward and backward) sums each output over k
    in one order in every clone, and the softmax's reductions are fixed trees. The x86-64-v4 and -v3
    clones multiply-add with FMA: they give the same bits. The baseline clone (no FMA hardware)
    multiplies and adds separately: it may differ in the last bits, and every level stays within
    the fp64-referenced tolerance (fp32: 1e-5 of the largest value; fp16: 2e-3, its rounding)."""
    runs = {}
    for level in ("baseline", "avx2", "avx512_core", "native"):
        r = run_python(ATTN_BITS, **({} if level == "native" else {"NVTE_CPU_ISA": level}))
        assert r.returncode == 0, r.stderr[-3000:]
        runs[level] = json.loads(r.stdout.strip().splitlines()[-1])
    tol = {"torch.float32": 1e-5, "torch.float16": 2e-3}
    for level, res in runs.items():
        for dtype, err in res["errs"].items():
            assert err < tol[dtype], (level, dtype, err)
    fma = {lv: res["digest"] for lv, res in runs.items() if res["clone"] != "baseline"}
    assert runs["baseline"]["clone"] == "baseline" and runs["avx2"]["clone"] == "x86-64-v3", runs
    assert len(set(fma.values())) == 1, fma  # v3 == v4 (avx512_core, native where the CPU has it)
