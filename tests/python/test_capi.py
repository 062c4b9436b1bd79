"""Python side of the core library: loading, build info, error mapping of the ctypes binding, and
numerics of the CPU kernels against independent oracles (ml_dtypes for FP8 bytes, torch fp64 for
normalization and GEMM)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
import torch
from conftest import assert_close, require_ops, workspace_for

import transformer_engine_lite as te
from transformer_engine_lite.common import build_info, capi, get_lib, lib_path

FLT_MAX = float(np.finfo(np.float32).max)


# (id, library dtype, torch dtype, ml_dtypes type, max finite, fnuz)
FP8_FORMATS = [
    ("e4m3", capi.DType.Float8E4M3, torch.float8_e4m3fn, ml_dtypes.float8_e4m3fn, 448.0, False),
    ("e5m2", capi.DType.Float8E5M2, torch.float8_e5m2, ml_dtypes.float8_e5m2, 57344.0, False),
    (
        "e4m3fnuz",
        capi.DType.Float8E4M3FNUZ,
        torch.float8_e4m3fnuz,
        ml_dtypes.float8_e4m3fnuz,
        240.0,
        True,
    ),
    (
        "e5m2fnuz",
        capi.DType.Float8E5M2FNUZ,
        torch.float8_e5m2fnuz,
        ml_dtypes.float8_e5m2fnuz,
        57344.0,
        True,
    ),
]
FP8_IDS = [f[0] for f in FP8_FORMATS]


def encode_oracle(v: np.ndarray, md_type, fmax: float, fnuz: bool) -> np.ndarray:
    """satfinite FP8 encode of fp32 `v` by ml_dtypes (which does not saturate: clamp first).
    NaN stays NaN (FNUZ: 0x80, its only NaN); -0 becomes +0 in FNUZ."""
    nan = np.isnan(v)
    with np.errstate(invalid="ignore"):  # NaN -> FP8 NaN is intended
        q = np.clip(v, -fmax, fmax).astype(md_type).view(np.uint8).copy()
    if fnuz:
        q[q == 0x80] = 0
        q[nan] = 0x80
    return q


def fp8_ordinal(codes: np.ndarray) -> np.ndarray:
    """Sign-magnitude FP8 codes as ordered integers: neighbours differ by 1, and -0 == +0."""
    c = codes.astype(np.int16)
    return np.where(c >= 128, 128 - c, c)


def decode(q: torch.Tensor, md_type) -> np.ndarray:
    return q.view(torch.uint8).numpy().view(md_type).astype(np.float32)


def report_byte_mismatch(x, got: np.ndarray, want: np.ndarray, what: str) -> None:
    bad = np.flatnonzero(got != want)
    if bad.size:
        i = bad[:6]
        pytest.fail(
            f"{what}: {bad.size}/{got.size} bytes differ; inputs {x[i].tolist()} -> got "
            f"{[hex(b) for b in got[i]]}, expected {[hex(b) for b in want[i]]}"
        )


def fp8_tensor(q, scale=None, amax=None, scale_inv=None) -> capi.Tensor:
    return capi.Tensor(q, scale=scale, amax=amax, scale_inv=scale_inv)


def scalar(v: float = 0.0) -> torch.Tensor:
    return torch.tensor([v], dtype=torch.float32)


# ------------------------------------------------------------------------------ loading, build info
def test_library_loads_and_reports_its_version():
    lib = get_lib()
    assert os.path.isfile(lib_path())
    assert lib.nvte_get_version().decode() == te.__version__ == build_info()["version"]


def test_build_info_fields():
    info = build_info()
    assert isinstance(info["version"], str) and info["version"].count(".") == 2
    assert "cpu" in info["device_backends"]
    assert set(info["cpu_fp8_formats"]) >= {"e4m3", "e5m2", "e4m3fnuz", "e5m2fnuz"}
    features = info["cpu_features"]
    assert isinstance(features, dict) and features
    for name in ("avx2", "avx512f"):
        assert isinstance(features[name], bool), f"cpu_features[{name!r}]: {features!r}"
    assert json.loads(get_lib().nvte_get_build_info().decode())["version"] == info["version"]


def _import_with_lib_path(path: str) -> subprocess.CompletedProcess:
    code = "import transformer_engine_lite"
    env = {**os.environ, "NVTE_LIB_PATH": path}
    return subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_bad_lib_path_missing_file_gives_clear_import_error(tmp_path):
    bad = str(tmp_path / "nowhere" / "libtransformer_engine_lite.so")
    r = _import_with_lib_path(bad)
    assert r.returncode != 0, "import succeeded although NVTE_LIB_PATH names a missing file"
    assert "ImportError" in r.stderr and "NVTE_LIB_PATH" in r.stderr and bad in r.stderr, r.stderr


def test_bad_lib_path_not_a_library_gives_clear_import_error(tmp_path):
    bad = tmp_path / "libtransformer_engine_lite.so"
    bad.write_text("not an ELF file")
    r = _import_with_lib_path(str(bad))
    assert r.returncode != 0, "import succeeded although NVTE_LIB_PATH names a non-library"
    assert "ImportError" in r.stderr and str(bad) in r.stderr, r.stderr


# ------------------------------------------------------------------------------------ error mapping
def test_bad_shape_raises_invalid_argument_naming_the_argument():
    require_ops("nvte_quantize")
    x = torch.randn(4, 8)
    q = torch.empty(4, 9, dtype=torch.float8_e4m3fn)
    with pytest.raises(capi.NVTEInvalidArgument, match=r"nvte_quantize.*'output'.*\[4, 9\]") as e:
        capi.call("nvte_quantize", capi.Tensor(x), fp8_tensor(q, scale=scalar(1)), None)
    assert isinstance(e.value, ValueError) and e.value.status == capi.Status.INVALID_ARGUMENT


def test_bad_gamma_shape_names_gamma():
    require_ops("nvte_layernorm_fwd")
    x, z = torch.randn(4, 8), torch.empty(4, 8)
    args = [
        capi.Tensor(x),
        capi.Tensor(torch.ones(9)),
        capi.Tensor(torch.zeros(8)),
        1e-5,
        capi.Tensor(z),
        capi.Tensor(torch.empty(4)),
        capi.Tensor(torch.empty(4)),
        capi.Tensor(),
        0,
        False,
        None,
    ]
    with pytest.raises(capi.NVTEInvalidArgument, match="'gamma'"):
        capi.call("nvte_layernorm_fwd", *args)


def test_gemm_inner_dim_mismatch_is_invalid_argument():
    require_ops("nvte_cublas_gemm")
    a, b, d = torch.randn(16, 8), torch.randn(4, 9), torch.empty(4, 16)
    with pytest.raises(capi.NVTEInvalidArgument, match=r"nvte_cublas_gemm.*'(A|B)'"):
        _gemm(a, b, d, transa=True, transb=False)


def test_gpu_tagged_tensors_are_unsupported_on_a_cpu_build():
    require_ops("nvte_quantize")
    if "cpu" not in build_info()["device_backends"] or len(build_info()["device_backends"]) > 1:
        pytest.skip("this build has a GPU backend")
    lib = get_lib()
    tx = capi.Tensor(torch.randn(4, 8))
    tq = fp8_tensor(torch.empty(4, 8, dtype=torch.float8_e4m3fn), scale=scalar(1))
    for t in (tx, tq):
        capi.check(lib.nvte_set_tensor_device(t.handle, 1))
    with pytest.raises(capi.NVTEUnsupported, match="GPU") as e:
        capi.call("nvte_quantize", tx, tq, None)
    assert isinstance(e.value, NotImplementedError)


def test_mixed_devices_are_invalid():
    require_ops("nvte_quantize")
    tx = capi.Tensor(torch.randn(4, 8))
    tq = fp8_tensor(torch.empty(4, 8, dtype=torch.float8_e4m3fn), scale=scalar(1))
    capi.check(get_lib().nvte_set_tensor_device(tq.handle, 1))
    with pytest.raises(capi.NVTEInvalidArgument, match="'output'.*device"):
        capi.call("nvte_quantize", tx, tq, None)


def test_python_side_rejects_unusable_arrays():
    with pytest.raises(ValueError, match="contiguous"):
        capi.Tensor(torch.randn(4, 8).t())
    with pytest.raises(ValueError, match="at most 8 dims"):
        capi.Tensor(torch.zeros([1] * 9))
    with pytest.raises(TypeError, match="complex"):
        capi.Tensor(torch.zeros(2, dtype=torch.complex64))


# --------------------------------------------------------------------------------- FP8 quantize
def _all_bit_patterns(dtype: torch.dtype) -> torch.Tensor:
    return torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(dtype)


@pytest.mark.parametrize("fmt", FP8_FORMATS, ids=FP8_IDS)
@pytest.mark.parametrize("in_dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_quantize_all_16bit_patterns_match_ml_dtypes(fmt, in_dtype):
    require_ops("nvte_quantize")
    _, _, tdt, md, fmax, fnuz = fmt
    x = _all_bit_patterns(in_dtype)
    xf = x.float().numpy()
    for s in (1.0, 0.1337, 1337.0):
        q = torch.empty(x.shape, dtype=tdt)
        scale_inv = scalar()
        capi.call("nvte_quantize", capi.Tensor(x), fp8_tensor(q, scalar(s), None, scale_inv), None)
        with np.errstate(over="ignore", invalid="ignore"):  # Inf, NaN inputs are part of the set
            v = xf * np.float32(s)  # the product in fp32, as the spec says
        want = encode_oracle(v, md, fmax, fnuz)
        got = q.view(torch.uint8).numpy()
        nan = np.isnan(v)
        assert np.isnan(decode(q, md)[nan]).all(), "NaN inputs must stay NaN"
        if fnuz:  # FNUZ has one NaN encoding; OCP NaN bytes may carry any sign/payload
            nan[:] = False
        report_byte_mismatch(xf[~nan], got[~nan], want[~nan], f"{fmt[0]} scale {s}")
        assert scale_inv.item() == np.float32(1) / np.float32(s)


@pytest.mark.parametrize("fmt", FP8_FORMATS, ids=FP8_IDS)
def test_quantize_fp32_random_bits_match_ml_dtypes(fmt):
    require_ops("nvte_quantize")
    _, _, tdt, md, fmax, fnuz = fmt
    rng = np.random.default_rng(7)
    # Exponents near the FP8 range (and a tail of any bits), so rounding and saturation are hit.
    mant = rng.integers(0, 1 << 23, 200_000, dtype=np.uint32)
    expo = rng.integers(127 - 30, 127 + 20, 200_000, dtype=np.uint32)
    sign = rng.integers(0, 2, 200_000, dtype=np.uint32) << 31
    bits = np.concatenate(
        [sign | (expo << 23) | mant, rng.integers(0, 1 << 32, 20_000, dtype=np.uint32)]
    )
    xf = bits.view(np.float32)
    q = torch.empty(xf.shape, dtype=tdt)
    capi.call("nvte_quantize", capi.Tensor(xf), fp8_tensor(q, scalar(1.0)), None)
    nan = np.isnan(xf) & (not fnuz)
    report_byte_mismatch(
        xf[~nan], q.view(torch.uint8).numpy()[~nan], encode_oracle(xf, md, fmax, fnuz)[~nan], fmt[0]
    )


def test_quantize_records_amax_before_scaling_and_scale_inv():
    require_ops("nvte_quantize")
    x = torch.randn(37, 129, dtype=torch.bfloat16) * 5
    amax, scale_inv = scalar(), scalar()
    q = torch.empty(x.shape, dtype=torch.float8_e4m3fn)
    capi.call("nvte_quantize", capi.Tensor(x), fp8_tensor(q, scalar(3.0), amax, scale_inv), None)
    assert amax.item() == x.abs().max().float().item()
    assert scale_inv.item() == np.float32(1) / np.float32(3)


def test_empty_input_quantize_gives_amax_zero_and_scale_inv():
    """Zero rows are valid input: nothing is written but the side outputs (amax 0, 1 / scale)."""
    require_ops("nvte_quantize", "nvte_compute_amax")
    x = torch.empty(0, 129, dtype=torch.bfloat16)
    amax, scale_inv = scalar(-1.0), scalar(-1.0)
    q = torch.empty(x.shape, dtype=torch.float8_e4m3fn)
    capi.call("nvte_quantize", capi.Tensor(x), fp8_tensor(q, scalar(4.0), amax, scale_inv), None)
    assert amax.item() == 0.0 and scale_inv.item() == 0.25
    amax2 = scalar(-1.0)
    capi.call("nvte_compute_amax", capi.Tensor(x), capi.Tensor(torch.empty(0), amax=amax2), None)
    assert amax2.item() == 0.0


@pytest.mark.parametrize("fmt", FP8_FORMATS, ids=FP8_IDS)
def test_dequantize_all_codes(fmt):
    require_ops("nvte_dequantize")
    _, _, tdt, md, _, _ = fmt
    q = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(tdt)
    out = torch.empty(256)
    capi.call("nvte_dequantize", fp8_tensor(q, scale_inv=scalar(0.375)), capi.Tensor(out), None)
    want = decode(q, md) * np.float32(0.375)
    np.testing.assert_array_equal(out.numpy(), want)  # NaN == NaN here


# ------------------------------------------------------------------------------- scaling recipes
def _scale_oracle(amax: float, fmax: float, eps: float, pow2: bool) -> float:
    a = np.float32(max(amax, eps)) if not math.isnan(amax) else np.float32(amax)
    if a == 0 or not np.isfinite(a):
        return 1.0
    with np.errstate(over="ignore"):
        s = np.float32(fmax) / a
    if np.isinf(s):
        s = np.float32(FLT_MAX)
    if pow2:
        s = np.float32(2.0 ** math.floor(math.log2(s)))
    return float(s)


@pytest.mark.parametrize("fmt", FP8_FORMATS, ids=FP8_IDS)
@pytest.mark.parametrize("pow2", [False, True])
@pytest.mark.parametrize("eps", [0.0, 1e-3])
def test_compute_scale_from_amax(fmt, pow2, eps):
    require_ops("nvte_compute_amax", "nvte_compute_scale_from_amax")
    _, _, tdt, _, fmax, _ = fmt
    cfg = capi.QuantizationConfig(force_pow_2_scales=pow2, amax_epsilon=eps)
    q = torch.empty(1, dtype=tdt)
    for amax_in in (0.0, 3.0, 0.1337, 448.0, 1e-30, 1e-44, math.inf):
        amax, scale, scale_inv = scalar(), scalar(-1), scalar()
        x = torch.tensor([-amax_in, amax_in / 2], dtype=torch.float32)
        t = fp8_tensor(q, scale, amax, scale_inv)
        capi.call("nvte_compute_amax", capi.Tensor(x), t, None)
        assert amax.item() == np.float32(amax_in)
        capi.call("nvte_compute_scale_from_amax", t, cfg, None)
        want = _scale_oracle(float(np.float32(amax_in)), fmax, eps, pow2)
        assert scale.item() == want, f"amax {amax_in}: scale {scale.item()} != {want}"
        assert scale_inv.item() == np.float32(1) / np.float32(want)


@pytest.mark.parametrize("algo", ["max", "most_recent"])
@pytest.mark.parametrize("margin", [0.0, 1.0])
def test_delayed_scaling_update(algo, margin):
    require_ops("nvte_delayed_scaling_recipe_amax_and_scale_update")
    rng = np.random.default_rng(3)
    hist = torch.from_numpy(rng.uniform(0.5, 50, (5, 6)).astype(np.float32))
    hist[:, 3] = 0.0  # amax 0: scale kept
    hist[1, 4] = math.inf  # infinite amax (max): scale kept
    hist[0, 5] = 1e-42  # tiny amax: scale overflows to FLT_MAX
    hist[1:, 5] = 0.0
    scale = torch.from_numpy(rng.uniform(1, 2, 6).astype(np.float32))
    h0, s0 = hist.clone(), scale.clone()
    th, ts = capi.Tensor(hist), capi.Tensor(scale)
    capi.call(
        "nvte_delayed_scaling_recipe_amax_and_scale_update",
        th,
        ts,
        th,
        ts,
        algo.encode(),
        int(capi.DType.Float8E4M3),
        margin,
        None,
    )
    amax = h0.max(0).values if algo == "max" else h0[0]
    for j in range(6):
        a = amax[j].item()
        if math.isfinite(a) and a > 0:
            with np.errstate(over="ignore"):
                want = np.float32(np.float32(448.0) / np.float32(a)) / np.float32(2.0**margin)
            want = FLT_MAX if np.isinf(want) else float(want)
        else:
            want = s0[j].item()
        assert scale[j].item() == pytest.approx(want, rel=2e-7), f"column {j}"
    # TE: roll by -1 (row i <- row i+1, the last row <- row 0), then zero row 0.
    torch.testing.assert_close(hist[1:-1], h0[2:], rtol=0, atol=0)
    torch.testing.assert_close(hist[-1], h0[0], rtol=0, atol=0)
    assert (hist[0] == 0).all()


def _e8m0_oracle(block_amax: np.ndarray, fmax: float) -> np.ndarray:
    """Biased E8M0 exponent of the smallest power of two p with block_amax / p <= fmax."""
    e = np.array([math.ceil(math.log2(a / fmax)) if a > 0 else -127 for a in block_amax.ravel()])
    return np.clip(e + 127, 0, 254).astype(np.uint8).reshape(block_amax.shape)


@pytest.mark.parametrize("shape", [(64, 96), (40, 70)])
def test_mxfp8_scales_and_data(shape):
    require_ops("nvte_quantize")
    rows, cols = shape
    torch.manual_seed(0)
    x = torch.randn(rows, cols) * torch.logspace(-4, 4, rows).unsqueeze(1)
    rb, cb = math.ceil(rows / 32), math.ceil(cols / 32)
    q_row = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    q_col = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    s_row = torch.empty(rows, cb, dtype=torch.uint8)
    s_col = torch.empty(rb, cols, dtype=torch.uint8)
    out = capi.Tensor(
        q_row,
        columnwise=q_col,
        scale_inv=s_row,
        columnwise_scale_inv=s_col,
        scaling_mode=capi.ScalingMode.MXFP8_1D_SCALING,
    )
    capi.call("nvte_quantize", capi.Tensor(x), out, None)
    xn = x.numpy()
    pad_c = np.pad(np.abs(xn), ((0, 0), (0, cb * 32 - cols))).reshape(rows, cb, 32).max(-1)
    pad_r = np.pad(np.abs(xn), ((0, rb * 32 - rows), (0, 0))).reshape(rb, 32, cols).max(1)
    want_row, want_col = _e8m0_oracle(pad_c, 448.0), _e8m0_oracle(pad_r, 448.0)
    np.testing.assert_array_equal(s_row.numpy(), want_row)
    np.testing.assert_array_equal(s_col.numpy(), want_col)
    inv_row = np.exp2(127.0 - np.repeat(want_row, 32, 1)[:, :cols]).astype(np.float32)
    inv_col = np.exp2(127.0 - np.repeat(want_col, 32, 0)[:rows]).astype(np.float32)
    md = ml_dtypes.float8_e4m3fn
    report_byte_mismatch(
        xn.ravel(),
        q_row.view(torch.uint8).numpy().ravel(),
        encode_oracle(xn * inv_row, md, 448.0, False).ravel(),
        "row-wise",
    )
    report_byte_mismatch(
        xn.ravel(),
        q_col.view(torch.uint8).numpy().ravel(),
        encode_oracle(xn * inv_col, md, 448.0, False).ravel(),
        "column-wise",
    )


# --------------------------------------------------------------------------------- normalization
NORM_DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _norm_ref(kind: str, x, gamma, beta, eps, zero_centered):
    x64 = x.double().reshape(-1, x.shape[-1])
    g = gamma.double() + (1 if zero_centered else 0)
    if kind == "layernorm":
        mu = x64.mean(-1)
        rs = torch.rsqrt(x64.var(-1, unbiased=False) + eps)
        z = (x64 - mu[:, None]) * rs[:, None] * g + beta.double()
    else:
        mu = None
        rs = torch.rsqrt((x64 * x64).mean(-1) + eps)
        z = x64 * rs[:, None] * g
    return z.reshape(x.shape), mu, rs


def _run_norm(kind, x, gamma, beta, z, eps, zero_centered, mu, rs):
    tx, tg, tz, trs = capi.Tensor(x), capi.Tensor(gamma), z, capi.Tensor(rs)
    if kind == "layernorm":
        tb, tmu = capi.Tensor(beta), capi.Tensor(mu)

        def call(ws):
            capi.call(
                "nvte_layernorm_fwd", tx, tg, tb, eps, tz, tmu, trs, ws, 0, zero_centered, None
            )
    else:

        def call(ws):
            capi.call("nvte_rmsnorm_fwd", tx, tg, eps, tz, trs, ws, 0, zero_centered, None)

    call(workspace_for(call))


def _norm_inputs(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = shape[-1]
    x = (torch.randn(shape, generator=g) * 3 + 1).to(dtype)
    gamma = (0.2 * torch.randn(hidden, generator=g) + (0 if seed % 2 else 1)).to(dtype)
    beta = (0.5 * torch.randn(hidden, generator=g)).to(dtype)
    rows = x.numel() // hidden
    return x, gamma, beta, torch.empty(rows), torch.empty(rows)


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("dtype", NORM_DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(5, 123), (3, 7, 257), (2, 1024)], ids=str)
@pytest.mark.parametrize("zero_centered", [False, True])
def test_norm_fwd_matches_fp64(kind, dtype, shape, zero_centered):
    require_ops(f"nvte_{kind}_fwd")
    eps = 1e-5
    x, gamma, beta, mu, rs = _norm_inputs(shape, dtype, seed=int(zero_centered))
    z = torch.empty_like(x)
    _run_norm(kind, x, gamma, beta, capi.Tensor(z), eps, zero_centered, mu, rs)
    z_ref, mu_ref, rs_ref = _norm_ref(kind, x, gamma, beta, eps, zero_centered)
    assert_close(z, z_ref, dtype, f"{kind} z")
    assert_close(rs, rs_ref, torch.float32, f"{kind} rsigma")
    if mu_ref is not None:
        assert_close(mu, mu_ref, torch.float32, f"{kind} mu")


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("fmt", FP8_FORMATS[:2], ids=FP8_IDS[:2])
def test_norm_fwd_fp8_output(kind, fmt):
    require_ops(f"nvte_{kind}_fwd")
    _, _, tdt, md, fmax, fnuz = fmt
    x, gamma, beta, mu, rs = _norm_inputs((33, 320), torch.bfloat16)
    z_ref, _, _ = _norm_ref(kind, x, gamma, beta, 1e-5, False)
    s = float(np.float32(fmax / 4 / z_ref.abs().max().item()))
    zq, amax, scale_inv = torch.empty(x.shape, dtype=tdt), scalar(), scalar()
    _run_norm(kind, x, gamma, beta, fp8_tensor(zq, scalar(s), amax, scale_inv), 1e-5, False, mu, rs)
    got = fp8_ordinal(zq.view(torch.uint8).numpy())
    want = fp8_ordinal(encode_oracle((z_ref.float() * s).numpy(), md, fmax, fnuz))
    # fp32 vs fp64 rounding may move a value across an FP8 rounding boundary: one code, rarely.
    off = np.abs(got - want)
    assert off.max() <= 1 and (off > 0).mean() < 0.01, (
        f"{(off > 0).sum()} codes off, max {off.max()}"
    )
    assert amax.item() == pytest.approx(z_ref.abs().max().item(), rel=1e-5)
    assert scale_inv.item() == np.float32(1) / np.float32(s)


# ------------------------------------------------------------------------------------------ GEMM
def _gemm(a, b, d, transa, transb, bias=None, pre_gelu=None, accumulate=False):
    capi.call(
        "nvte_cublas_gemm",
        a if isinstance(a, capi.Tensor) else capi.Tensor(a),
        b if isinstance(b, capi.Tensor) else capi.Tensor(b),
        capi.Tensor(d),
        capi.Tensor(bias) if bias is not None else capi.Tensor(),
        capi.Tensor(pre_gelu) if pre_gelu is not None else capi.Tensor(),
        transa,
        transb,
        False,
        capi.Tensor(),
        accumulate,
        False,
        0,
        None,
    )


def _gemm_operands(m, n, k, transa, transb, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn((m, k) if transa else (k, m), generator=g).to(dtype)
    b = torch.randn((k, n) if transb else (n, k), generator=g).to(dtype)
    op_a = a.double().t() if transa else a.double()  # [k, m]
    op_b = b.double().t() if transb else b.double()  # [n, k]
    return a, b, op_b @ op_a  # D = opB(B) @ opA(A): [n, m]


def _gelu64(x):
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


@pytest.mark.parametrize("dtype", NORM_DTYPES, ids=str)
@pytest.mark.parametrize(
    "layout", [(True, False), (False, False), (False, True)], ids=["TN", "NN", "NT"]
)
def test_gemm_matches_fp64(dtype, layout):
    require_ops("nvte_cublas_gemm")
    m, n, k = 47, 33, 65
    a, b, ref = _gemm_operands(m, n, k, *layout, dtype)
    d = torch.empty(n, m, dtype=dtype)
    _gemm(a, b, d, *layout)
    assert_close(d, ref, dtype, f"gemm {layout}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_gemm_bias_gelu_epilogue_and_accumulate(dtype):
    require_ops("nvte_cublas_gemm")
    m, n, k = 40, 24, 96
    a, b, ref = _gemm_operands(m, n, k, True, False, dtype, seed=1)
    bias = torch.randn(m).to(dtype)
    d, pre = torch.empty(n, m, dtype=dtype), torch.empty(n, m, dtype=dtype)
    _gemm(a, b, d, True, False, bias=bias, pre_gelu=pre)
    pre_ref = ref + bias.double()
    assert_close(pre, pre_ref, dtype, "pre_gelu_out")
    assert_close(d, _gelu64(pre_ref), dtype, "gelu(D)")
    c = torch.randn(n, m).to(dtype)
    d = c.clone()
    _gemm(a, b, d, True, False, accumulate=True)
    assert_close(d, ref + c.double(), dtype, "accumulate")


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("fmts", [(0, 0), (1, 0)], ids=["e4m3xe4m3", "e5m2xe4m3"])
def test_fp8_gemm_matches_fp64(out_dtype, fmts):
    require_ops("nvte_cublas_gemm")
    m, n, k = 48, 31, 160
    g = torch.Generator().manual_seed(5)
    ops = []
    for fi, shape in zip(fmts, [(m, k), (n, k)]):
        _, _, tdt, _, fmax, _ = FP8_FORMATS[fi]
        hp = torch.randn(shape, generator=g)
        s = fmax / 2 / hp.abs().max().item()
        q = (hp * s).clamp(-fmax, fmax).to(tdt)
        ops.append((q, float(np.float32(1 / s))))
    (qa, sia), (qb, sib) = ops
    d = torch.empty(n, m, dtype=out_dtype)
    _gemm(
        fp8_tensor(qa, scale_inv=scalar(sia)), fp8_tensor(qb, scale_inv=scalar(sib)), d, True, False
    )
    ref = (qb.double() * sib) @ (qa.double() * sia).t()
    assert_close(d, ref, out_dtype, "fp8 gemm")
