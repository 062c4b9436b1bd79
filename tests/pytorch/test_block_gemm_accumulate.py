"""te_lite::block_gemm_accumulate_, one K block of the block-scaled GEMM's accumulation on the CPU:
bit for bit the torch expression it replaces (fp32(fp64(y) + fp64(fp32(p * first)) * fp64(second)),
cpp_extensions/block_gemm.py's GPU path), for per-row and per-column scales, ties and extremes
included; bad shapes are refused naming the argument."""

import pytest
import torch

import transformer_engine_lite.pytorch  # noqa: F401  (loads the extension)

OPS = torch.ops.te_lite


def _expression(y, p, first, second):
    return (y.double() + (p * first).double() * second.double()).float()


@pytest.mark.parametrize("shape", [(1, 1), (33, 70), (130, 257)])
@pytest.mark.parametrize("rows_first", [True, False])
def test_equals_the_torch_expression(shape, rows_first):
    m, n = shape
    g = torch.Generator().manual_seed(m * 1000 + n)
    y = torch.randn(m, n, generator=g) * 10
    p = torch.randn(m, n, generator=g) * 1e3
    rows = torch.exp2(torch.randint(-20, 20, (m, 1), generator=g).float())  # power-of-2 scales
    cols = torch.rand(1, n, generator=g) * 3
    first, second = (rows, cols) if rows_first else (cols, rows)
    # extremes: overflow to inf, a NaN, exact cancellation
    p[0, 0], y[-1, -1] = 3e38, float("nan")
    want = _expression(y, p, first, second)
    got = y.clone()
    OPS.block_gemm_accumulate_(got, p, first, second)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


def test_block_gemm_uses_it_and_matches_the_expression(monkeypatch):
    """general_gemm of two block-scaled tensors: the fused op gives the bytes the expression
    gives (the expression forced through a patched op)."""
    from transformer_engine_lite.pytorch.cpp_extensions import general_gemm
    from transformer_engine_lite.pytorch.tensor.float8_blockwise_tensor import Float8BlockQuantizer

    torch.manual_seed(3)
    # 72 rows: TE's block-scaled GEMM refuses a 1D-scaled B whose rows are not a multiple of 8
    x, w = torch.randn(72, 384), torch.randn(136, 384)
    qx = Float8BlockQuantizer(torch.float8_e4m3fn, rowwise=True, columnwise=False,
                              block_scaling_dim=1)(x)
    qw = Float8BlockQuantizer(torch.float8_e4m3fn, rowwise=True, columnwise=False,
                              block_scaling_dim=2)(w)
    fused = general_gemm(qw, qx, out_dtype=torch.float32)[0]

    import transformer_engine_lite.pytorch.cpp_extensions.block_gemm as bg

    class _Ops:
        def __getattr__(self, name):
            return getattr(OPS, name)

        @staticmethod
        def block_gemm_accumulate_(y, p, first, second):
            y.copy_(_expression(y, p, first, second))

    monkeypatch.setattr(bg, "ops", lambda: _Ops())
    plain = general_gemm(qw, qx, out_dtype=torch.float32)[0]
    assert torch.equal(fused.view(torch.int32), plain.view(torch.int32))


def test_refusals_name_the_argument():
    y = torch.zeros(2, 3)
    with pytest.raises(RuntimeError, match="argument 'first'"):
        OPS.block_gemm_accumulate_(y, torch.zeros(2, 3), torch.zeros(3, 1), torch.zeros(1, 3))
    with pytest.raises(RuntimeError, match="argument 'p'"):
        OPS.block_gemm_accumulate_(y, torch.zeros(3, 2), torch.zeros(2, 1), torch.zeros(1, 3))
    with pytest.raises(RuntimeError, match="argument 'y'"):
        OPS.block_gemm_accumulate_(torch.zeros(2, 3, dtype=torch.float64), torch.zeros(2, 3),
                                   torch.zeros(2, 1), torch.zeros(1, 3))
