"""torch.ops.te_lite: bad inputs raise a RuntimeError naming the argument, and a
torch.compile(fullgraph=True) smoke test over the core ops (the opcheck of every op: test_ops.py)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip(
    "transformer_engine_lite.pytorch.te_lite_ops",
    reason="PyTorch extension not built",
    exc_type=ImportError,
)
from op_helpers import f32, ops, randn
from op_helpers import fp8_operand as _fp8
from op_helpers import mxfp8_operand as _mx


# ===================================================================================== errors
ERROR_CASES = [
    (
        "quantize x dtype",
        lambda: ops.quantize(torch.ones(4, dtype=torch.int32), f32(1.0), torch.float8_e4m3fn),
        r"quantize: argument 'x'.*\{float32, float16, bfloat16\}, got int32",
    ),
    (
        "quantize fp8_dtype",
        lambda: ops.quantize(randn(4), f32(1.0), torch.float16),
        r"'fp8_dtype'.*float8_e4m3fn.*got float16",
    ),
    (
        "quantize scale shape",
        lambda: ops.quantize(randn(4), torch.ones(2), torch.float8_e4m3fn),
        r"'scale'.*one element.*\[2\]",
    ),
    (
        "mxfp8 none requested",
        lambda: ops.quantize_mxfp8(randn(4, 32), torch.float8_e4m3fn, False, False),
        r"'rowwise' and 'columnwise'",
    ),
    (
        "dequantize data dtype",
        lambda: ops.dequantize(randn(4), f32(1.0), torch.float32),
        r"dequantize.*'data'.*float8_e4m3fn.*got float32",
    ),
    (
        "dequantize_mxfp8 scale shape",
        lambda: ops.dequantize_mxfp8(
            _mx((40, 70), False)[0], torch.zeros(40, 2, dtype=torch.uint8), False, torch.float32
        ),
        r"'scale_inv'.*\[40, 3\]",
    ),
    (
        "recipe algo",
        lambda: ops.delayed_scaling_update(
            torch.ones(2, 3), torch.ones(3), "mean", torch.float8_e4m3fn, 0.0
        ),
        r"delayed_scaling_update.*amax_compute_algo.*mean",
    ),
    (
        "recipe scale shape",
        lambda: ops.delayed_scaling_update(
            torch.ones(2, 3), torch.ones(4), "max", torch.float8_e4m3fn, 0.0
        ),
        r"'scale'.*\[3\]",
    ),
    ("transpose ndim", lambda: ops.transpose(randn(2, 3, 4)), r"transpose.*'x'.*2-D"),
    (
        "layernorm gamma shape",
        lambda: ops.layernorm_fwd(randn(4, 8), torch.ones(9), torch.zeros(8), 1e-5, False),
        r"'gamma'.*\[8\].*\[9\]",
    ),
    (
        "layernorm fp8 without scale",
        lambda: ops.layernorm_fwd(
            randn(4, 8), torch.ones(8), torch.zeros(8), 1e-5, False, torch.float8_e4m3fn
        ),
        r"'scale'.*None",
    ),
    (
        "layernorm scale without fp8",
        lambda: ops.layernorm_fwd(
            randn(4, 8), torch.ones(8), torch.zeros(8), 1e-5, False, None, f32(1.0)
        ),
        r"'scale'.*expected None",
    ),
    (
        "layernorm negative eps",
        lambda: ops.layernorm_fwd(randn(4, 8), torch.ones(8), torch.zeros(8), -1.0, False),
        r"layernorm_fwd.*epsilon",
    ),
    (
        "rmsnorm_bwd dz shape",
        lambda: ops.rmsnorm_bwd(randn(4, 9), randn(4, 8), torch.ones(4), torch.ones(8), False),
        r"'dz'.*\[4, 8\]",
    ),
    (
        "activation name",
        lambda: ops.activation_fwd(randn(4, 8), "tanh"),
        r"'activation'.*gelu.*'tanh'",
    ),
    ("gated odd dim", lambda: ops.activation_fwd(randn(4, 7), "swiglu"), r"'x'.*even"),
    (
        "activation_bwd grad dtype",
        lambda: ops.activation_bwd(randn(4, 8).half(), randn(4, 8), "gelu"),
        r"'grad'.*float32.*got float16",
    ),
    (
        "gemm inner dim",
        lambda: ops.gemm(randn(16, 8), None, True, randn(4, 9), None, False, torch.float32),
        r"gemm.*'B'.*k = 8",
    ),
    (
        "gemm fp8 without scale_inv",
        lambda: ops.gemm(_fp8((16, 8))[0], None, True, randn(4, 8), None, False, torch.float32),
        r"'A_scale_inv'.*None",
    ),
    (
        "gemm mixed precision",
        lambda: ops.gemm(randn(16, 8), None, True, randn(4, 8).half(), None, False, torch.float32),
        r"gemm.*'A' and 'B'",
    ),
    (
        "gemm bias shape",
        lambda: ops.gemm(
            randn(16, 8), None, True, randn(4, 8), None, False, torch.float32, torch.ones(5)
        ),
        r"'bias'.*\[16\]",
    ),
    (
        "gemm_accumulate_ D shape",
        lambda: ops.gemm_accumulate_(
            randn(4, 15), randn(16, 8), None, True, randn(4, 8), None, False
        ),
        r"'D'.*\[4, 16\]",
    ),
    ("softmax ndim", lambda: ops.scaled_softmax_fwd(randn(3, 4, 5), 1.0), r"'x'.*4-D"),
    (
        "softmax mask shape",
        lambda: ops.scaled_masked_softmax_fwd(
            randn(2, 3, 4, 5), torch.zeros(2, 3, 4, 5, dtype=torch.bool), 1.0
        ),
        r"'mask'.*\[2 or 1",
    ),
    (
        "softmax_bwd dy dtype",
        lambda: ops.scaled_softmax_bwd(randn(1, 1, 2, 2).half(), randn(1, 1, 2, 2), 1.0),
        r"'dy'",
    ),
]


@pytest.mark.parametrize(
    "call,pattern", [(c[1], c[2]) for c in ERROR_CASES], ids=[c[0] for c in ERROR_CASES]
)
def test_bad_inputs_raise_runtime_error_naming_the_argument(call, pattern):
    with pytest.raises(RuntimeError, match=pattern):
        call()


# ===================================================================================== compile
def test_torch_compile_fullgraph_smoke():
    def block(x, gamma, beta, w, bias):
        z = ops.layernorm_fwd(x, gamma, beta, 1e-5, False)[0]
        h = ops.gemm(w, None, True, z, None, False, torch.float32, bias, False)[0]
        h = ops.activation_fwd(h, "swiglu")[0]
        q, amax, scale_inv = ops.quantize(h, f32(4.0), torch.float8_e4m3fn)
        p = ops.scaled_softmax_fwd(h.reshape(2, 1, 6, -1), 0.5)
        return ops.dequantize(q, scale_inv, torch.float32), amax, p

    args = (
        randn(12, 32),
        torch.ones(32),
        torch.zeros(32),
        randn(64, 32, seed=1),
        randn(64, seed=2),
    )
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    for got, want in zip(compiled(*args), block(*args)):
        assert torch.equal(got, want)
