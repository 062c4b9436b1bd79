"""TE's tex activation functions (tex.gelu(input, quantizer), tex.dgelu(grad, fwd_input,
quantizer), ..., clamped_swiglu / clamped_dswiglu): values vs fp64 references through torch
(autograd for the backward ones), and for each quantizer kind the bytes TE's helpers produce:
fused (Float8Quantizer, MXFP8Quantizer: the fp32 values quantized directly), current scaling (the
input-dtype values scaled by the fp32 values' amax), unfused (others: the input-dtype values
quantized), against independent oracles (ml_dtypes encoding, MX emulation)."""

from __future__ import annotations

import pytest
import torch

import transformer_engine_lite.pytorch.tex as tex
from op_helpers import assert_bytes_equal, encode_oracle
from transformer_engine_lite.pytorch.tensor import (
    Float8BlockQuantizer,
    Float8CurrentScalingQuantizer,
    Float8Quantizer,
    MXFP8Quantizer,
    NVFP4Quantizer,
)
from utils import FP8_MAX, assert_close, emulate_mx, ref_activation

PLAIN = ("gelu", "qgelu", "relu", "srelu", "silu")
GATED = ("geglu", "qgeglu", "reglu", "sreglu", "swiglu", "glu")
NAMES = PLAIN + GATED + ("clamped_swiglu",)
E4 = torch.float8_e4m3fn
LIMIT, ALPHA = 2.5, 1.702  # a limit inside the inputs' range: both clamps are exercised


def _x(name: str, dtype: torch.dtype, rows: int = 32, cols: int = 128, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    width = 2 * cols if name in GATED or name == "clamped_swiglu" else cols
    return (torch.randn(rows, width, generator=g) * 3).to(dtype)


def _fwd(name: str, x: torch.Tensor, quantizer=None):
    if name == "clamped_swiglu":
        return tex.clamped_swiglu(x, quantizer, limit=LIMIT, alpha=ALPHA)
    return getattr(tex, name)(x, quantizer)


def _bwd(name: str, g: torch.Tensor, x: torch.Tensor, quantizer=None):
    if name == "clamped_swiglu":
        return tex.clamped_dswiglu(g, x, quantizer, limit=LIMIT, alpha=ALPHA)
    return getattr(tex, "d" + name)(g, x, quantizer)


def _ref(name: str, x64: torch.Tensor) -> torch.Tensor:
    return ref_activation(name, x64, LIMIT, ALPHA)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_high_precision_matches_fp64(name, dtype):
    x = _x(name, dtype)
    y = _fwd(name, x)
    assert type(y) is torch.Tensor and y.dtype == dtype
    x64 = x.double().requires_grad_(True)
    y64 = _ref(name, x64)
    assert_close(y, y64, dtype, f"tex.{name}")
    g = _x("gelu", dtype, 32, y.shape[-1], seed=1)
    dx = _bwd(name, g, x)
    assert dx.dtype == dtype and dx.shape == x.shape
    (dx64,) = torch.autograd.grad(y64, x64, g.double())
    assert_close(dx, dx64, dtype, f"tex.d{name}")


def _kernel_fp32(name, x, g=None):
    """The fp32 values TE's fused kernels quantize (no rounding to the input dtype)."""
    return _fwd(name, x.float()) if g is None else _bwd(name, g.float(), x.float())


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "bwd"])
def test_delayed_scaling_is_fused(name, backward):
    x = _x(name, torch.bfloat16)
    g = _x("gelu", torch.bfloat16, 32, 128, seed=1) if backward else None
    q = Float8Quantizer(torch.tensor([4.0]), torch.zeros(1), E4)
    out = _fwd(name, x, q) if not backward else _bwd(name, g, x, q)
    y32 = _kernel_fp32(name, x, g)
    assert out.dtype == torch.bfloat16 and tuple(out.shape) == tuple(y32.shape)
    assert_bytes_equal(out._data, encode_oracle((y32 * 4.0).numpy(), E4), f"{name} delayed")
    assert out._scale_inv.item() == 0.25
    assert q.amax.item() == y32.abs().max().item()  # the fp32 values' amax


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "bwd"])
def test_current_scaling_scales_by_the_fp32_amax(name, backward):
    x = _x(name, torch.bfloat16)
    g = _x("gelu", torch.bfloat16, 32, 128, seed=1) if backward else None
    q = Float8CurrentScalingQuantizer(E4)
    out = _fwd(name, x, q) if not backward else _bwd(name, g, x, q)
    y32 = _kernel_fp32(name, x, g)
    scale = torch.tensor(FP8_MAX[E4]) / y32.abs().max()  # one IEEE division, as the core
    y16 = y32.to(torch.bfloat16).float()  # the values TE's unquantized temporary holds
    assert out.dtype == torch.bfloat16
    assert_bytes_equal(out._data, encode_oracle((y16 * scale).numpy(), E4), f"{name} current")
    assert out._scale_inv.item() == (1.0 / scale).item()


@pytest.mark.parametrize("name", ["gelu", "swiglu", "clamped_swiglu", "srelu"])
@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "bwd"])
def test_mxfp8_is_fused(name, backward):
    x = _x(name, torch.bfloat16)
    g = _x("gelu", torch.bfloat16, 32, 128, seed=1) if backward else None
    q = MXFP8Quantizer(E4, rowwise=True, columnwise=False)
    out = _fwd(name, x, q) if not backward else _bwd(name, g, x, q)
    y32 = _kernel_fp32(name, x, g)
    assert out.dtype == torch.bfloat16
    want = emulate_mx(y32, E4)
    got = out.dequantize(dtype=torch.float32)
    assert torch.equal(got.double(), want), f"{name}: MXFP8 values differ from the emulation"


@pytest.mark.parametrize("name", ["gelu", "geglu", "clamped_swiglu"])
@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "bwd"])
def test_block_quantizer_quantizes_the_input_dtype_values(name, backward):
    x = _x(name, torch.bfloat16)
    g = _x("gelu", torch.bfloat16, 32, 128, seed=1) if backward else None
    q = Float8BlockQuantizer(E4, rowwise=True, columnwise=True, block_scaling_dim=1)
    out = _fwd(name, x, q) if not backward else _bwd(name, g, x, q)
    hp = _fwd(name, x) if not backward else _bwd(name, g, x)
    ref = q(hp)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out._rowwise_data, ref._rowwise_data)
    assert torch.equal(out._rowwise_scale_inv, ref._rowwise_scale_inv)
    assert torch.equal(out._columnwise_data, ref._columnwise_data)


@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "bwd"])
def test_nvfp4(backward):
    """fp32 input: TE's fused-amax path and quantizing the fp32 output agree exactly; a bf16 input
    needs an external amax the NVFP4 cast lacks: refused, naming the quantizer."""
    x = _x("swiglu", torch.float32)
    g = _x("gelu", torch.float32, 32, 128, seed=1) if backward else None
    q = NVFP4Quantizer(rowwise=True, columnwise=False)
    out = _fwd("swiglu", x, q) if not backward else _bwd("swiglu", g, x, q)
    ref = q(_kernel_fp32("swiglu", x, g))
    assert torch.equal(out._rowwise_data, ref._rowwise_data)
    assert torch.equal(out._rowwise_scale_inv, ref._rowwise_scale_inv)
    with pytest.raises(NotImplementedError, match="quantizer: an NVFP4Quantizer"):
        if backward:
            _bwd("swiglu", g.bfloat16(), x.bfloat16(), q)
        else:
            _fwd("swiglu", x.bfloat16(), q)


def test_names_defaults_and_refusals():
    assert {"gelu", "dgelu", "glu", "dglu", "clamped_swiglu", "clamped_dswiglu"} <= set(tex.__all__)
    x = _x("swiglu", torch.float32)
    # TE's defaults: limit 7.0, alpha 1.702
    assert torch.equal(tex.clamped_swiglu(x, None),
                       torch.ops.te_lite.clamped_swiglu_fwd(x, 7.0, 1.702)[0])
    with pytest.raises(ValueError, match="input: expected an even last dim"):
        tex.swiglu(torch.zeros(4, 3), None)
    with pytest.raises(ValueError, match="input: expected dtype"):
        tex.gelu(torch.zeros(4, 4, dtype=torch.int32), None)
    with pytest.raises(TypeError, match="input: expected a high-precision torch.Tensor"):
        tex.gelu(Float8CurrentScalingQuantizer(E4)(torch.ones(4, 4)), None)
    with pytest.raises(TypeError, match="quantizer: expected None or a Quantizer"):
        tex.gelu(torch.ones(4, 4), "fp8")
    # TE's kernels: "Types of both inputs must match." (a RuntimeError there, ValueError here)
    for cls in (ValueError, RuntimeError):
        with pytest.raises(cls, match="grad: Types of both inputs must match"):
            tex.dgelu(torch.ones(4, 4), torch.ones(4, 4, dtype=torch.bfloat16), None)
    with pytest.raises(ValueError, match="limit: expected > 0"):
        tex.clamped_swiglu(x, None, limit=0.0)


def _quantizers():
    return {
        "none": lambda: None,
        "delayed": lambda: Float8Quantizer(torch.tensor([4.0]), torch.zeros(1), E4),
        "current": lambda: Float8CurrentScalingQuantizer(E4),
        "mxfp8": lambda: MXFP8Quantizer(E4, rowwise=True, columnwise=False),
        "block": lambda: Float8BlockQuantizer(E4, rowwise=True, columnwise=False,
                                              block_scaling_dim=1),
    }


@pytest.mark.parametrize("name", ["gelu", "silu", "relu", "qgelu", "srelu"])
@pytest.mark.parametrize("kind", list(_quantizers()))
def test_dbias_dact(name, kind):
    """[bias gradient, dact]: dact is tex.d<name>'s (same bytes), the bias gradient its column
    sums: of the fp32 values on TE's fused paths, of the bf16 ones otherwise (fp64 reference)."""
    x = _x(name, torch.bfloat16)
    g = _x("gelu", torch.bfloat16, 32, 128, seed=1)
    make = _quantizers()[kind]
    dbias, dx = getattr(tex, "dbias_d" + name)(g, x, make())
    want = _bwd(name, g, x, make())
    if kind == "none":
        assert torch.equal(dx, want)
    else:
        assert dx.dtype == torch.bfloat16
        assert torch.equal(dx.dequantize(dtype=torch.float32), want.dequantize(dtype=torch.float32))
    assert dbias.dtype == torch.bfloat16 and dbias.shape == (128,)
    fused = kind in ("delayed", "mxfp8")
    d = _kernel_fp32(name, x, g) if fused else _bwd(name, g, x)
    assert_close(dbias, d.double().sum(0), torch.bfloat16, f"dbias_d{name} {kind}")
    x64 = x.double().requires_grad_(True)
    (dx64,) = torch.autograd.grad(_ref(name, x64), x64, g.double())
    assert_close(dbias, dx64.sum(0), torch.bfloat16, f"dbias_d{name} vs fp64")
