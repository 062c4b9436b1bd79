"""torch.ops.te_lite (transformer_engine_lite/pytorch/te_lite_ops.py): torch.library.opcheck for every op
(schema, fake kernel, autograd registration, AOT dispatch with dynamic shapes; the attention and
RoPE ops' cases live in test_ops_attention.py, the MoE router's in test_router.py, the MoE permutation's in
test_permutation.py, the cross entropy's in test_cross_entropy.py, and the check that every op has a
case covers them all). Errors that name the argument and a torch.compile smoke test: test_ops_errors.py;
numerics: test_ops_numerics.py."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

te_ops = pytest.importorskip(
    "transformer_engine_lite.pytorch.te_lite_ops",
    reason="PyTorch extension not built",
    exc_type=ImportError,
)
from op_helpers import HP_DTYPES, f32, ops, randn, run_opcheck
from op_helpers import fp8_operand as _fp8
from op_helpers import mxfp8_operand as _mx
from test_ops_attention import ATTENTION_OPCHECK_CASES
from test_cross_entropy import CROSS_ENTROPY_OPCHECK_CASES
from test_fused_optimizers import MULTI_TENSOR_OPCHECK_CASES
from test_permutation import PERMUTATION_OPCHECK_CASES
from test_router import ROUTER_OPCHECK_CASES


# ===================================================================================== opcheck
# One or more cases per op: (op name, id, args factory). Inputs that require grad also exercise
# the registered autograd under opcheck's aot_dispatch test.
def _blk(shape, dim, columnwise):
    row, row_s, col, col_s = ops.quantize_fp8_block(
        randn(*shape), torch.float8_e4m3fn, dim, not columnwise, columnwise, True, 0.0
    )
    return (col, col_s) if columnwise else (row, row_s)


def _nv(shape):
    row, row_s, row_a, _, _, _ = ops.quantize_nvfp4(
        randn(*shape), True, False, False, False, 0, False, 0, 0
    )
    return row, row_s, row_a


def _nv_k(rows, k, seed):
    """Random packed E2M1 codes [rows, k/2] and E4M3 scale bytes [rows, ceil(k/16)]."""
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(0, 256, (rows, k // 2), generator=g, dtype=torch.uint8)
    scales = torch.randint(0x28, 0x58, (rows, -(-k // 16)), generator=g, dtype=torch.uint8)
    return data, scales


def _ln_stats(x, g, b):
    _, mu, rs, _, _ = ops.layernorm_fwd(x, g, b, 1e-5, False)
    return mu, rs


OPCHECK_CASES: list[tuple[str, str, Callable[[], tuple]]] = [
    ("quantize", "fp32-e4m3", lambda: (randn(5, 96), f32(2.0), torch.float8_e4m3fn)),
    (
        "quantize",
        "bf16-e5m2fnuz",
        lambda: (randn(3, 7, 33, dtype=torch.bfloat16), f32(0.5), torch.float8_e5m2fnuz),
    ),
    ("quantize_mxfp8", "fp32-both", lambda: (randn(40, 70), torch.float8_e4m3fn, True, True)),
    (
        "quantize_mxfp8",
        "bf16-row",
        lambda: (randn(2, 33, 64, dtype=torch.bfloat16), torch.float8_e5m2, True, False),
    ),
    ("quantize_mxfp8", "fp32-col", lambda: (randn(33, 40), torch.float8_e4m3fn, False, True)),
    ("dequantize", "e4m3-bf16", lambda: (*_fp8((5, 96)), torch.bfloat16)),
    ("dequantize", "e5m2-fp32", lambda: (*_fp8((3, 4, 9), torch.float8_e5m2), torch.float32)),
    ("dequantize_mxfp8", "row", lambda: (*_mx((40, 70), False), False, torch.float32)),
    ("dequantize_mxfp8", "col", lambda: (*_mx((40, 70), True), True, torch.bfloat16)),
    (
        "quantize_fp8_block",
        "fp32-1d-both",
        lambda: (randn(3, 130, 200), torch.float8_e4m3fn, 1, True, True, True, 0.0),
    ),
    (
        "quantize_fp8_block",
        "bf16-2d-col",
        lambda: (randn(140, 260, dtype=torch.bfloat16), torch.float8_e5m2, 2, False, True, False,
                 1e-3),
    ),
    ("dequantize_fp8_block", "1d-row", lambda: (*_blk((130, 200), 1, False), 1, False,
                                                  torch.float32)),
    ("block_gemm_accumulate_", "row-first", lambda: (randn(33, 70), randn(33, 70), randn(33, 1),
                                                     randn(1, 70))),
    ("block_gemm_accumulate_", "col-first", lambda: (randn(33, 70), randn(33, 70), randn(1, 70),
                                                     randn(33, 1))),
    ("nvfp4_block_gemm", "tails", lambda: (*_nv_k(19, 40, 1), *_nv_k(70, 40, 2))),
    ("ordered_bmm", "nt", lambda: (randn(2, 3, 9, 11), randn(2, 3, 10, 11), False, True)),
    ("ordered_bmm", "tn", lambda: (randn(4, 11, 9), randn(4, 11, 10), True, False)),
    ("dequantize_fp8_block", "2d-col", lambda: (*_blk((3, 130, 200), 2, True), 2, True,
                                                  torch.bfloat16)),
    (
        "quantize_nvfp4",
        "bf16-1d-rht-both",
        lambda: (randn(32, 64, dtype=torch.bfloat16), True, True, False, True, 0xD7E8, False, 0, 0),
    ),
    (
        "quantize_nvfp4",
        "fp32-2d-sr-col",
        lambda: (randn(3, 16, 48), False, True, True, False, 0, True, 5, 7),
    ),
    ("dequantize_nvfp4", "row-bf16", lambda: (*_nv((40, 96)), torch.bfloat16)),
    ("compute_amax", "fp32", lambda: (randn(5, 96),)),
    ("compute_amax", "bf16", lambda: (randn(3, 7, 33, dtype=torch.bfloat16),)),
    ("compute_scale_from_amax", "e4m3", lambda: (f32(3.0), torch.float8_e4m3fn, 0.0, False)),
    ("compute_scale_from_amax", "e5m2-pow2", lambda: (f32(0.3), torch.float8_e5m2, 1e-3, True)),
    (
        "delayed_scaling_update",
        "max",
        lambda: (torch.rand(4, 3), torch.ones(3), "max", torch.float8_e4m3fn, 0.0),
    ),
    (
        "delayed_scaling_update",
        "most_recent",
        lambda: (torch.rand(2, 5), torch.ones(5), "most_recent", torch.float8_e5m2, 1.0),
    ),
    (
        "delayed_scaling_update_",
        "max",
        lambda: (torch.rand(4, 3), torch.ones(3), "max", torch.float8_e4m3fn, 0.0),
    ),
    ("transpose", "fp32", lambda: (randn(5, 96),)),
    ("transpose", "int32", lambda: (torch.arange(21, dtype=torch.int32).reshape(7, 3),)),
    ("transpose", "bf16-grad", lambda: (randn(5, 9, dtype=torch.bfloat16, requires_grad=True),)),
    ("cast_transpose", "fp32", lambda: (randn(5, 96), f32(2.0), torch.float8_e4m3fn)),
    (
        "cast_transpose",
        "bf16",
        lambda: (randn(33, 17, dtype=torch.bfloat16), f32(1.0), torch.float8_e5m2),
    ),
    (
        "layernorm_fwd",
        "fp32-grad",
        lambda: (
            randn(3, 7, 64, requires_grad=True),
            randn(64, seed=1, requires_grad=True),
            randn(64, seed=2, requires_grad=True),
            1e-5,
            False,
        ),
    ),
    (
        "layernorm_fwd",
        "bf16-zc-grad",
        lambda: (
            randn(5, 123, dtype=torch.bfloat16, requires_grad=True),
            randn(123, dtype=torch.bfloat16, requires_grad=True),
            randn(123, dtype=torch.bfloat16, seed=2),
            1e-5,
            True,
        ),
    ),
    (
        "layernorm_fwd",
        "fp8-out",
        lambda: (
            randn(5, 64),
            randn(64, seed=1),
            randn(64, seed=2),
            1e-5,
            False,
            torch.float8_e4m3fn,
            f32(8.0),
        ),
    ),
    (
        "layernorm_bwd",
        "fp32",
        lambda: (
            randn(6, 64, seed=3),
            randn(6, 64),
            *_ln_stats(randn(6, 64), randn(64, seed=1), randn(64, seed=2)),
            randn(64, seed=1),
            False,
        ),
    ),
    (
        "rmsnorm_fwd",
        "fp32-grad",
        lambda: (
            randn(3, 7, 64, requires_grad=True),
            randn(64, seed=1, requires_grad=True),
            1e-5,
            False,
        ),
    ),
    (
        "rmsnorm_fwd",
        "bf16-fp8-out",
        lambda: (
            randn(5, 96, dtype=torch.bfloat16),
            randn(96, dtype=torch.bfloat16),
            1e-6,
            True,
            torch.float8_e5m2,
            f32(2.0),
        ),
    ),
    (
        "rmsnorm_bwd",
        "bf16",
        lambda: (
            randn(6, 64, dtype=torch.bfloat16, seed=3),
            randn(6, 64, dtype=torch.bfloat16),
            ops.rmsnorm_fwd(
                randn(6, 64, dtype=torch.bfloat16), randn(64, dtype=torch.bfloat16), 1e-5, False
            )[1],
            randn(64, dtype=torch.bfloat16),
            False,
        ),
    ),
    (
        "rmsnorm_bwd_add",
        "bf16-add-fp32",
        lambda: (
            randn(6, 64, dtype=torch.bfloat16, seed=3),
            randn(6, 64, dtype=torch.bfloat16),
            randn(6, 64, seed=5),
            ops.rmsnorm_fwd(
                randn(6, 64, dtype=torch.bfloat16), randn(64, dtype=torch.bfloat16), 1e-5, False
            )[1],
            randn(64, dtype=torch.bfloat16),
            True,
        ),
    ),
    ("activation_fwd", "gelu-fp32-grad", lambda: (randn(4, 33, requires_grad=True), "gelu")),
    (
        "activation_fwd",
        "swiglu-bf16-grad",
        lambda: (randn(2, 3, 64, dtype=torch.bfloat16, requires_grad=True), "swiglu"),
    ),
    (
        "activation_fwd",
        "srelu-fp8-out",
        lambda: (randn(4, 33), "srelu", torch.float8_e4m3fn, f32(4.0)),
    ),
    (
        "activation_fwd",
        "qgeglu-to-bf16",
        lambda: (randn(4, 32, requires_grad=True), "qgeglu", torch.bfloat16),
    ),
    ("activation_bwd", "relu", lambda: (randn(4, 33, seed=1), randn(4, 33), "relu")),
    ("activation_bwd", "reglu", lambda: (randn(4, 16, seed=1), randn(4, 32), "reglu")),
    (
        "clamped_swiglu_fwd",
        "bf16-grad",
        lambda: (randn(3, 64, dtype=torch.bfloat16, scale=3.0, requires_grad=True), 2.5, 1.702),
    ),
    (
        "clamped_swiglu_fwd",
        "fp8-out",
        lambda: (randn(4, 32), 7.0, 1.702, torch.float8_e4m3fn, f32(4.0)),
    ),
    ("clamped_swiglu_bwd", "fp32", lambda: (randn(4, 16, seed=1), randn(4, 32), 2.0, 1.0)),
    (
        "gemm",
        "TN-fp32",
        lambda: (randn(16, 32), None, True, randn(8, 32, seed=1), None, False, torch.float32),
    ),
    (
        "gemm",
        "TN-bias-grad",
        lambda: (
            randn(16, 32, requires_grad=True),
            None,
            True,
            randn(2, 4, 32, seed=1, requires_grad=True),
            None,
            False,
            torch.float32,
            randn(16, seed=2, requires_grad=True),
        ),
    ),
    (
        "gemm",
        "NT-gelu-bf16-grad",
        lambda: (
            randn(32, 16, dtype=torch.bfloat16, requires_grad=True),
            None,
            False,
            randn(32, 8, dtype=torch.bfloat16, seed=1, requires_grad=True),
            None,
            True,
            torch.bfloat16,
            None,
            True,
        ),
    ),
    (
        "gemm",
        "NN-bf16-bias-gelu",
        lambda: (
            randn(32, 16, dtype=torch.bfloat16),
            None,
            False,
            randn(2, 4, 32, dtype=torch.bfloat16, seed=1),
            None,
            False,
            torch.bfloat16,
            randn(16, dtype=torch.bfloat16, seed=2),
            True,
        ),
    ),
    (
        "gemm",
        "NT-grad-bias",
        lambda: (
            randn(8, 16),
            None,
            False,
            randn(8, 12, seed=1),
            None,
            True,
            torch.float32,
            randn(12, seed=2),
            False,
            True,
        ),
    ),
    (
        "gemm",
        "grad-dgelu-bias",
        lambda: (
            randn(12, 16),
            None,
            False,
            randn(8, 12, seed=1),
            None,
            False,
            torch.float32,
            randn(16, seed=2),
            True,
            True,
            randn(8, 16, seed=3),
        ),
    ),
    (
        "gemm",
        "fp8-fp8out",
        lambda: (
            *_fp8((16, 32)),
            True,
            *_fp8((8, 32), torch.float8_e5m2, 1),
            False,
            torch.float8_e4m3fn,
            None,
            False,
            False,
            None,
            f32(2.0),
        ),
    ),
    (
        "gemm_accumulate_",
        "fp32-bf16",
        lambda: (
            randn(8, 16, seed=4),
            randn(16, 32, dtype=torch.bfloat16),
            None,
            True,
            randn(8, 32, dtype=torch.bfloat16, seed=1),
            None,
            False,
        ),
    ),
]
for _v, _shape in (
    ("scaled", (2, 3, 8, 16)),
    ("scaled_masked", (2, 3, 8, 16)),
    ("scaled_upper_triang_masked", (6, 8, 8)),
    ("scaled_aligned_causal_masked", (2, 3, 8, 16)),
):
    for _dt in HP_DTYPES:
        _mask = (
            (lambda: (torch.rand(2, 1, 8, 16, generator=torch.Generator().manual_seed(0)) > 0.7,))
            if _v == "scaled_masked"
            else (lambda: ())
        )
        OPCHECK_CASES.append(
            (
                f"{_v}_softmax_fwd",
                str(_dt)[6:],
                lambda s=_shape, d=_dt, m=_mask: (
                    randn(*s, dtype=d, requires_grad=True),
                    *m(),
                    0.7,
                ),
            )
        )
        OPCHECK_CASES.append(
            (
                f"{_v}_softmax_bwd",
                str(_dt)[6:],
                lambda s=_shape, d=_dt: (
                    randn(*s, dtype=d, seed=1),
                    torch.softmax(randn(*s), -1).to(d),
                    0.7,
                ),
            )
        )


@pytest.mark.parametrize(
    "name,factory",
    [(c[0], c[2]) for c in OPCHECK_CASES],
    ids=[f"{c[0]}-{c[1]}" for c in OPCHECK_CASES],
)
def test_opcheck(name, factory):
    run_opcheck(name, factory())


def test_every_op_has_an_opcheck_case():
    covered = {
        c[0]
        for c in OPCHECK_CASES
        + ATTENTION_OPCHECK_CASES
        + ROUTER_OPCHECK_CASES
        + PERMUTATION_OPCHECK_CASES
        + MULTI_TENSOR_OPCHECK_CASES
        + CROSS_ENTROPY_OPCHECK_CASES
    }
    assert set(te_ops.OPS) == covered, (
        f"no case for {sorted(set(te_ops.OPS) - covered)}; unknown {sorted(covered - set(te_ops.OPS))}"
    )
    assert len(te_ops.OPS) == 69
