"""GPU against CPU, the PyTorch front end (ci/gpu_check.sh, steps pytorch and aotriton): each module
built on the CPU and on the device with the same parameters, run forward + backward on the same
inputs, in bf16 and under each FP8 recipe; output, input gradient and every parameter gradient
compared with utils.TOLERANCES: the dtype's entry in bf16, the "fp8" / "fp8_2gemm" entries (TE's
module tolerances, normwise) under a recipe, as the CPU suites use them against fp64. The CPU is the
reference here because the CPU suites pin it against fp64 and the gtests pin the GPU kernels
against it byte for byte where the math is exact.

Without a usable device (CUDA torch, a CUDA build of the library, the extension's CUDA ops) every
test skips, so the CPU suites stay green; GPU_CHECK_STRICT=1 (set by ci/gpu_check.sh) makes that a
failure. GPU_PARITY_DEVICE=cpu runs the "device" side on the CPU: a check of this file's own logic
on a machine without a GPU (CPU against CPU must agree)."""

from __future__ import annotations

import os

import pytest
import torch
from utils import TOLERANCES, assert_close, copy_params

import transformer_engine_lite.pytorch as te
from transformer_engine_lite.common import build_info
from transformer_engine_lite.common.recipe import (
    DelayedScaling,
    Float8BlockScaling,
    Float8CurrentScaling,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
)
from transformer_engine_lite.pytorch.attention import backends

DEVICE = os.environ.get("GPU_PARITY_DEVICE", "cuda")
BF16 = torch.bfloat16
# None: bf16 without FP8. MXFP8 runs on sm_90 too: the block quantization is the library's own
# kernel and the GEMM takes the dequantized bf16 operands (quantization.py), though TE's
# is_mxfp8_available() says False below sm_100 (no native MX GEMM there).
RECIPES = {
    "bf16": None,
    "delayed": lambda: DelayedScaling(amax_history_len=4),
    "current": Float8CurrentScaling,
    "mxfp8": MXFP8BlockScaling,
    # Block-scaled recipes: GPU quantize / dequantize kernels with the CPU's bytes, the GEMMs on
    # exactly decoded values (any GPU: no FP8 / FP4 tensor cores involved). NVFP4's stochastic
    # rounding draws its seed from torch's global generator, reseeded alike before each side.
    "fp8_block": Float8BlockScaling,
    "nvfp4": NVFP4BlockScaling,
}
SWITCHES = ("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "NVTE_FUSED_ATTN_CK", "NVTE_FUSED_ATTN_AOTRITON")
# ci/_utils.sh configure_fused_attn_env's modes: the flash kernel on both devices, or AOTriton.
FLASH_MODE = {"NVTE_FUSED_ATTN": "0", "NVTE_FUSED_ATTN_CK": "0", "NVTE_FUSED_ATTN_AOTRITON": "0"}
AOTRITON_MODE = {"NVTE_FLASH_ATTN": "0", "NVTE_FUSED_ATTN_CK": "0"}


def _missing() -> str | None:
    """Why the device side cannot run here, or None."""
    if DEVICE == "cpu":
        return None
    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    if not {"cuda", "rocm"} & set(build_info()["device_backends"]):
        return f"the library has no GPU backend ({build_info()['device_backends']})"
    if not torch._C._dispatch_has_kernel_for_dispatch_key("te_lite::gemm", "CUDA"):
        return "the torch extension was built without CUDA ops (CPU-only torch at build time)"
    return None


@pytest.fixture(params=[DEVICE])
def device(request) -> torch.device:
    why = _missing()
    if why:
        if os.environ.get("GPU_CHECK_STRICT") == "1":
            pytest.fail(f"GPU_CHECK_STRICT=1 and the device side cannot run: {why}")
        pytest.skip(why)
    return torch.device(request.param)


def _attn_mode(monkeypatch, mode: dict[str, str] | None) -> None:
    for k in SWITCHES:
        monkeypatch.delenv(k, raising=False)
    for k, v in (mode or {}).items():
        monkeypatch.setenv(k, v)


def _init_unit(w: torch.Tensor) -> None:
    # Larger weights than TE's std 0.023 (as test_modules.py), so errors are not hidden under atol.
    torch.nn.init.normal_(w, 0.0, 1.0 / w.shape[-1] ** 0.5)


# name -> (factory(device), input shape, output features, GEMMs chained). Sizes are multiples of 32:
# FP8 GEMMs on the GPU need multiples of 16, MXFP8 blocks are 32 long along either dimension.
MODULES = {
    "Linear": (
        lambda d: te.Linear(128, 96, params_dtype=BF16, device=d, init_method=_init_unit),
        (2, 32, 128),
        96,
        False,
    ),
    "LayerNormMLP": (
        lambda d: te.LayerNormMLP(128, 256, params_dtype=BF16, device=d, init_method=_init_unit),
        (2, 32, 128),
        128,
        True,
    ),
    # [s, b, hidden]; causal self-attention by default, so the layer's attention runs the flash
    # kernel (FLASH_MODE) on both sides.
    "TransformerLayer": (
        lambda d: te.TransformerLayer(
            128,
            256,
            4,
            hidden_dropout=0.0,
            attention_dropout=0.0,
            params_dtype=BF16,
            device=d,
            init_method=_init_unit,
            output_layer_init_method=_init_unit,
        ),
        (32, 2, 128),
        128,
        True,
    ),
}


def _fwd_bwd(m, x, dy, recipe):
    x = x.detach().clone().requires_grad_(True)
    m.zero_grad(set_to_none=True)
    with te.fp8_autocast(enabled=recipe is not None, fp8_recipe=recipe):
        y = m(x)
    y.backward(dy)
    grads = {n: p.grad for n, p in m.named_parameters()}
    return y.detach(), x.grad, grads


def _compare(dev_res, cpu_res, kind, what: str) -> None:
    (y, dx, g), (y_ref, dx_ref, g_ref) = dev_res, cpu_res
    assert y.device.type == DEVICE, f"{what}: the output is on {y.device}, expected {DEVICE}"
    assert_close(y.cpu(), y_ref, kind, f"{what}: output")
    assert_close(dx.cpu(), dx_ref, kind, f"{what}: input grad")
    assert g.keys() == g_ref.keys()
    for n, grad in g.items():
        assert grad is not None and g_ref[n] is not None, f"{what}: no gradient for {n}"
        if n.endswith("key_bias"):
            _check_key_bias(grad.cpu(), g_ref[n], g_ref[n.replace("key_bias", "query_bias")],
                            kind, f"{what}: grad of {n}")
            continue
        assert_close(grad.cpu(), g_ref[n], kind, f"{what}: grad of {n}")


def _check_key_bias(grad, ref, query_ref, kind, what: str) -> None:
    """Adding b to every key adds q.b to a whole row of scores, which softmax ignores: the key
    bias's exact gradient is 0 and each device returns the rounding noise of its own summation
    order (on the CPU about 0.4% of the query bias's gradient), which no elementwise comparison
    of the two can bound (seen on an H200). Both must be noise: within rtol of that gradient."""
    bound = TOLERANCES[kind][1] * query_ref.abs().max().item()
    for name, t in (("device", grad), ("cpu", ref)):
        worst = t.double().abs().max().item()
        assert worst <= bound, f"{what} ({name}): max |grad| {worst:.4g} > {bound:.4g}, expected ~0"


@pytest.mark.parametrize("m, n, k", [(130, 257, 1024), (33, 70, 40)])
def test_nvfp4_block_gemm_bits_match_cpu(device, m, n, k):
    """The NVFP4 GEMM's GPU kernel (bf16 tensor-core block terms, fp32 adds in K order) gives the
    CPU kernel's bits through the torch op, aligned (K 1024) and unaligned rows (K 40)."""
    g = torch.Generator().manual_seed(m + n + k)
    bd, ad = (torch.randint(0, 256, (r, k // 2), generator=g, dtype=torch.uint8) for r in (m, n))
    bs, as_ = (torch.randint(0x10, 0x68, (r, -(-k // 16)), generator=g, dtype=torch.uint8)
               for r in (m, n))
    want = torch.ops.te_lite.nvfp4_block_gemm(bd, bs, ad, as_)
    got = torch.ops.te_lite.nvfp4_block_gemm(*(t.to(device) for t in (bd, bs, ad, as_)))
    assert got.device.type == DEVICE
    assert torch.equal(got.cpu(), want)


def test_nvfp4_linear_forward_bits_match_cpu(device):
    """A Linear's NVFP4 forward is exact arithmetic in a fixed order on both devices (quantize
    bytes, the block GEMM, the per-tensor factor and the cast): the same bf16 bits."""
    torch.manual_seed(5)
    ref = MODULES["Linear"][0]("cpu")
    mod = MODULES["Linear"][0](device)
    copy_params(mod, ref)
    x = torch.randn(64, 128, dtype=BF16)
    outs = []
    for m, xx in ((ref, x), (mod, x.to(device))):
        with torch.no_grad(), te.fp8_autocast(enabled=True, fp8_recipe=NVFP4BlockScaling()):
            outs.append(m(xx).cpu())
    assert torch.equal(outs[1], outs[0])


@pytest.mark.parametrize("transa, transb", [(False, True), (True, False), (False, False)])
def test_ordered_bmm_bits_match_cpu(device, transa, transb):
    """The canonical-order fp32 GEMM (te_lite::ordered_bmm, FP8 attention's GEMMs): the GPU's SIMT
    fmaf chains give the CPU's bits, tile and K tails included."""
    g = torch.Generator().manual_seed(int(transa) * 2 + int(transb))
    a = torch.randn(6, 70, 33, generator=g) if transa else torch.randn(6, 33, 70, generator=g)
    b = torch.randn(6, 130, 70, generator=g) if transb else torch.randn(6, 70, 130, generator=g)
    want = torch.ops.te_lite.ordered_bmm(a, b, transa, transb)
    got = torch.ops.te_lite.ordered_bmm(a.to(device), b.to(device), transa, transb)
    assert got.device.type == DEVICE
    assert torch.equal(got.cpu().view(torch.int32), want.view(torch.int32))


def _fp8_dpa_run(dev, mode, tensors, softmax_type="vanilla"):
    dpa = te.DotProductAttention(8, 64, num_gqa_groups=2, qkv_format="bshd",
                                 attn_mask_type="causal", softmax_type=softmax_type).to(dev)
    if softmax_type == "learnable":
        with torch.no_grad():
            dpa.softmax_offset.copy_(torch.linspace(-2.0, 2.0, 8))
    recipe = (DelayedScaling(fp8_dpa=True, amax_history_len=4) if mode == "delayed"
              else Float8CurrentScaling(fp8_dpa=True))
    outs = []
    for q, k, v, dy in tensors:  # two steps: the second with delayed scaling's updated scales
        q, k, v = (t.to(dev).requires_grad_(True) for t in (q, k, v))
        with te.fp8_autocast(fp8_recipe=recipe):
            out = dpa(q, k, v)
        out.backward(dy.to(dev))
        outs.append([t.detach().cpu() for t in (out, q.grad, k.grad, v.grad)])
        if softmax_type == "learnable":  # fp32: compared as int32 words below
            outs[-1].append(dpa.softmax_offset.grad.detach().cpu().view(torch.bfloat16))
            dpa.softmax_offset.grad = None
    return outs


@pytest.mark.parametrize("mode", ["delayed", "current"])
def test_fp8_dot_product_attention_bytes_match_cpu(device, mode, monkeypatch):
    """FP8 attention (fp8_dpa, GQA, causal) is exact arithmetic in one order on both devices: the
    FP8 casts, the six GEMMs in the canonical order (te_lite::ordered_bmm), the fused softmax ops
    and elementwise steps. Output and dq, dk, dv: the CPU's bytes, both steps."""
    _attn_mode(monkeypatch, FLASH_MODE)
    g = torch.Generator().manual_seed(17)
    tensors = [(torch.randn(2, 100, 8, 64, generator=g, dtype=BF16),
                torch.randn(2, 100, 2, 64, generator=g, dtype=BF16) * 1.5,
                torch.randn(2, 100, 2, 64, generator=g, dtype=BF16) * 2,
                torch.randn(2, 100, 512, generator=g, dtype=BF16)) for _ in range(2)]
    ref = _fp8_dpa_run("cpu", mode, tensors)
    got = _fp8_dpa_run(device, mode, tensors)
    for step, (gs, rs) in enumerate(zip(got, ref)):
        for name, a, b in zip(("output", "dq", "dk", "dv"), gs, rs):
            assert torch.equal(a.view(torch.int16), b.view(torch.int16)), (
                f"FP8 DotProductAttention ({mode}) step {step}: {name} differs from the CPU's bytes")


def test_canonical_exp_log_bits_match_cpu(device):
    """FP8 attention's own exp / log (attention/_canonical_math.py: IEEE fp32 op sequences) give
    the CPU's bits on the device: specials, subnormal results, the whole range."""
    from transformer_engine_lite.pytorch.attention import _canonical_math as cm

    g = torch.Generator().manual_seed(23)
    x = torch.cat([torch.linspace(-110, 90, 200_001), torch.randn(50_000, generator=g) * 20,
                   torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan")])])
    for name, fn, arg in (("exp", cm.exp, x), ("log", cm.log, x.abs() * 3 + 1e-40)):
        want = fn(arg)
        got = fn(arg.to(device))
        assert got.device.type == DEVICE
        assert torch.equal(got.cpu().view(torch.int32), want.view(torch.int32)), name


@pytest.mark.parametrize("softmax_type", ["off-by-one", "learnable"])
@pytest.mark.parametrize("mode", ["delayed", "current"])
def test_fp8_dpa_sinks_bytes_match_cpu(device, mode, softmax_type, monkeypatch):
    """FP8 attention with a sink (the canonical exp and ordered sums of _canonical_math.py):
    output, dq, dk, dv and the learnable softmax_offset's gradient are the CPU's bytes."""
    _attn_mode(monkeypatch, FLASH_MODE)
    g = torch.Generator().manual_seed(29)
    tensors = [(torch.randn(2, 60, 8, 64, generator=g, dtype=BF16),
                torch.randn(2, 60, 2, 64, generator=g, dtype=BF16) * 1.5,
                torch.randn(2, 60, 2, 64, generator=g, dtype=BF16) * 2,
                torch.randn(2, 60, 512, generator=g, dtype=BF16)) for _ in range(2)]
    ref = _fp8_dpa_run("cpu", mode, tensors, softmax_type)
    got = _fp8_dpa_run(device, mode, tensors, softmax_type)
    names = ("output", "dq", "dk", "dv", "d softmax_offset")
    for step, (gs, rs) in enumerate(zip(got, ref)):
        for name, a, b in zip(names, gs, rs):
            assert torch.equal(a.view(torch.int16), b.view(torch.int16)), (
                f"FP8 DPA {softmax_type} ({mode}) step {step}: {name} differs from the CPU's bytes")


@pytest.mark.parametrize("recipe", list(RECIPES))
@pytest.mark.parametrize("module", list(MODULES))
def test_module_matches_cpu(device, module, recipe, monkeypatch):
    _attn_mode(monkeypatch, FLASH_MODE)
    factory, shape, out_features, chained = MODULES[module]
    torch.manual_seed(5)
    ref = factory("cpu")
    m = factory(device)
    copy_params(m, ref)
    kind = BF16 if RECIPES[recipe] is None else ("fp8_2gemm" if chained else "fp8")
    g = torch.Generator().manual_seed(7)
    # Two steps: delayed scaling's second step quantizes with scales from the first one's amaxes.
    for step in range(2):
        x = torch.randn(shape, generator=g).to(BF16)
        dy = torch.randn(*shape[:-1], out_features, generator=g).to(BF16)
        make = RECIPES[recipe]
        torch.manual_seed(100 + step)  # the same stochastic-rounding seeds on both sides
        cpu = _fwd_bwd(ref, x, dy, make() if make else None)
        torch.manual_seed(100 + step)
        dev = _fwd_bwd(m, x.to(device), dy.to(device), make() if make else None)
        _compare(dev, cpu, kind, f"{module} {recipe} step {step}")


# ----------------------------------------------------------------------------- attention
DPA_CASES = {
    # format, mask, b, s, h, h_kv, d: an odd length, and GQA with the largest head dim
    "sbhd_causal": ("sbhd", "causal", 2, 97, 4, 4, 64),
    "bshd_gqa": ("bshd", "no_mask", 2, 128, 8, 2, 128),
}


def _dpa_inputs(case: str, g: torch.Generator):
    fmt, _, b, s, h, h_kv, d = DPA_CASES[case]
    lead = (s, b) if fmt == "sbhd" else (b, s)
    q = torch.randn(*lead, h, d, generator=g).to(BF16)
    k = torch.randn(*lead, h_kv, d, generator=g).to(BF16)
    v = torch.randn(*lead, h_kv, d, generator=g).to(BF16)
    dout = torch.randn(*lead, h * d, generator=g).to(BF16)
    return q, k, v, dout


def _run_dpa(case: str, tensors, dev):
    fmt, mask, _, _, h, h_kv, d = DPA_CASES[case]
    dpa = te.DotProductAttention(h, d, num_gqa_groups=h_kv, qkv_format=fmt, attn_mask_type=mask)
    # detach(): on the CPU, to() returns the tensor itself, and a second run must not build on it.
    q, k, v = (t.detach().to(dev).requires_grad_(True) for t in tensors[:3])
    out = dpa(q, k, v)
    out.backward(tensors[3].to(dev))
    return out.detach(), q.grad, k.grad, v.grad


def _check_dpa(case: str) -> None:
    tensors = _dpa_inputs(case, torch.Generator().manual_seed(11))
    ref = _run_dpa(case, tensors, "cpu")
    got = _run_dpa(case, tensors, DEVICE)
    for name, a, b in zip(("output", "dq", "dk", "dv"), got, ref):
        assert a.device.type == DEVICE
        assert_close(a.cpu(), b, BF16, f"DotProductAttention {case}: {name}")


@pytest.mark.parametrize("case", list(DPA_CASES))
def test_dot_product_attention_flash_matches_cpu(device, case, monkeypatch):
    _attn_mode(monkeypatch, FLASH_MODE)
    fmt, mask, b, s, h, h_kv, d = DPA_CASES[case]
    q = torch.empty(1, dtype=BF16, device=device)
    window = (-1, 0) if mask == "causal" else (-1, -1)
    layout = f"{fmt}_{fmt}_{fmt}"
    picked = backends.select_backend(object(), q, layout, "no_bias", mask, 0.0, h, h_kv, s, s, d,
                                     d, window)
    assert picked == "flash", f"expected the flash kernel on {DEVICE}, the selection says {picked}"
    _check_dpa(case)


def test_dot_product_attention_default_selection_runs(device, monkeypatch):
    """No switch set: whatever the selection picks on this device must run (on sm_90 with this
    build's AOTriton images that is aotriton for this case)."""
    _attn_mode(monkeypatch, None)
    _check_dpa("sbhd_causal")


# ----------------------------------------------------------------------------- AOTriton
def test_aotriton_kernels_match_flash_kernel(device, monkeypatch, capfd):
    """The AOTriton images of this device's arch, launched through the glue (nvte_fused_attn_*
    with the aotriton switches), against the CUDA flash kernel and the CPU, forward + backward."""
    if DEVICE == "cpu":
        pytest.skip("AOTriton images run on a GPU only (GPU_PARITY_DEVICE=cpu)")
    major, minor = torch.cuda.get_device_capability()
    arch = f"sm_{major}{minor}"
    built = build_info().get("aotriton_archs", [])
    if arch not in built:
        pytest.skip(f"no AOTriton images for {arch} in this build (built: {built})")
    ops = torch.ops.te_lite
    b, s, h, d = 2, 128, 4, 64
    g = torch.Generator().manual_seed(13)
    q, k, v, dout = (torch.randn(b, s, h, d, generator=g).to(BF16) for _ in range(4))
    scale = d**-0.5
    # layout, bias, cu_seqlens q/kv, max_seqlen q/kv, scale, dropout, rng_state, bias and mask
    # types, window: causal (-1, 0)
    common = ("bshd_bshd_bshd", None, None, None, s, s, scale, 0.0, None, "no_bias", "causal")
    common += (-1, 0)

    def run(mode, dev):
        _attn_mode(monkeypatch, mode)
        t = [x.to(dev) for x in (q, k, v, dout)]
        out, lse = ops.fused_attn_fwd(*t[:3], *common, True)
        dq, dk, dv, _, _ = ops.fused_attn_bwd(*t[:3], out, t[3], lse, *common, False)
        return [x.cpu() for x in (out, dq, dk, dv)]

    monkeypatch.setenv("NVTE_LOG_AOTRITON_CONFIG", "1")
    aot = run(AOTRITON_MODE, device)
    torch.cuda.synchronize()
    launches = [ln for ln in capfd.readouterr().err.splitlines() if "[aotriton] launch" in ln]
    print("\n".join(launches))
    for kernel in ("attn_fwd", "attn_bwd_dkdv", "attn_bwd_dq"):  # aotriton/kernels/variants.py
        assert any(f"launch {kernel} " in ln and f"on {arch}" in ln for ln in launches), (
            f"expected a launch of {kernel} on {arch}, got: {launches}"
        )
    monkeypatch.delenv("NVTE_LOG_AOTRITON_CONFIG")
    flash = run(FLASH_MODE, device)
    cpu = run(FLASH_MODE, "cpu")
    for name, a, f, c in zip(("output", "dq", "dk", "dv"), aot, flash, cpu):
        assert_close(a, f, BF16, f"aotriton vs the CUDA flash kernel: {name}")
        assert_close(a, c, BF16, f"aotriton vs the CPU flash kernel: {name}")


def test_tolerance_kinds_exist():
    # The kinds this file takes from the table: a renamed entry fails here, not on the GPU machine.
    assert {BF16, "fp8", "fp8_2gemm"} <= TOLERANCES.keys()
