"""Grouped NVFP4 (tex.group_quantize / GroupedTensor with an NVFP4Quantizer): each member's bytes,
scale grids and amaxes equal quantizing it alone (the oracle: NVFP4Quantizer, checked against
float64 in test_nvfp4.py), packed two values per byte in member order; empty members, members
covering fewer rows than the input (TE's paged stashing), GEMM-swizzled member grids."""

import pytest
import torch

import transformer_engine_lite.pytorch.tex as tex
from transformer_engine_lite.pytorch import NVFP4Quantizer
from transformer_engine_lite.pytorch.tensor._gemm_swizzle import swizzle_grid

KINDS = {"1d": dict(), "rht": dict(with_rht=True, with_post_rht_amax=True),
         "2d": dict(with_2d_quantization=True)}
FIELDS = ("_rowwise_data", "_rowwise_scale_inv", "_amax_rowwise", "_columnwise_data",
          "_columnwise_scale_inv", "_amax_columnwise")


def _group(x, splits, q, rows=None):
    first = torch.tensor(splits, dtype=torch.int64)
    return tex.group_quantize(x, q, len(splits), first)


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("splits", [[64, 128, 32, 32], [0, 128, 0, 128], [0, 0]])
@pytest.mark.parametrize("usage", [(True, True), (True, False), (False, True)])
def test_group_quantize_members_equal_per_tensor(kind, splits, usage):
    torch.manual_seed(0)
    x = torch.randn(sum(splits), 256, dtype=torch.bfloat16)
    q = NVFP4Quantizer(rowwise=usage[0], columnwise=usage[1], **KINDS[kind])
    grouped = _group(x, splits, q)
    members = grouped.split_into_quantized_tensors()
    for m, part in zip(members, torch.split(x, splits)):
        ref = q(part)
        for f in FIELDS:
            a, b = getattr(m, f), getattr(ref, f)
            assert (a is None) == (b is None), f
            if a is not None:
                assert a.shape == b.shape and a.dtype == b.dtype, f
                assert torch.equal(a, b), f
        if part.shape[0]:
            assert torch.equal(m.dequantize(), ref.dequantize())
    if usage[0]:
        # Packed in member order: the grouped row-wise bytes are the members' one after another.
        want = torch.cat([q(p)._rowwise_data.reshape(-1) for p in torch.split(x, splits)])
        assert torch.equal(grouped.rowwise_data[:want.numel()], want)


def test_group_quantize_paged_stashing_and_swizzled_members():
    torch.manual_seed(1)
    x = torch.randn(640, 256, dtype=torch.bfloat16)
    splits = [128, 256, 0, 128]  # 512 of the 640 rows: the rest is padding
    q = NVFP4Quantizer(**KINDS["rht"])
    qs = q.copy()
    qs.optimize_for_gemm = True
    grouped = _group(x, splits, qs)
    assert grouped._with_gemm_swizzled_scales
    for m, part in zip(grouped.split_into_quantized_tensors(), torch.split(x[:512], splits)):
        ref = q(part)
        assert m._with_gemm_swizzled_scales
        assert torch.equal(m._rowwise_data, ref._rowwise_data)
        rows = part.shape[0]
        assert torch.equal(m._rowwise_scale_inv, swizzle_grid(ref._rowwise_scale_inv, rows, 16))
        assert torch.equal(m._columnwise_scale_inv,
                           swizzle_grid(ref._columnwise_scale_inv, 256, rows // 16))
        if rows:
            assert torch.equal(m.dequantize(), ref.dequantize())
    with pytest.raises(ValueError, match="summing to at most 640 rows"):
        _group(x, [640, 64], q)


@pytest.mark.parametrize("swizzled", [False, True])
def test_grouped_gemm_on_nvfp4_grouped_input(swizzled):
    from transformer_engine_lite.pytorch.cpp_extensions import (
        general_gemm,
        general_grouped_gemm_for_grouped_tensor,
    )
    from transformer_engine_lite.pytorch.tensor.grouped_tensor import GroupedTensor

    torch.manual_seed(2)
    splits, k, n = [128, 0, 256], 128, 64
    x = torch.randn(sum(splits), k)
    q = NVFP4Quantizer()
    q.optimize_for_gemm = swizzled
    grouped_x = _group(x, splits, q)
    w = [NVFP4Quantizer()(torch.randn(n, k)) for _ in splits]
    out = GroupedTensor.make_grouped_tensor(3, torch.tensor(splits), None, sum(splits), n, None,
                                            "cpu", torch.float32)
    general_grouped_gemm_for_grouped_tensor(w, grouped_x, out, layout="TN")
    plain = NVFP4Quantizer()
    for o, wi, part in zip(out.split_into_quantized_tensors(), w, torch.split(x, splits)):
        if part.shape[0]:
            want = general_gemm(wi, plain(part), out_dtype=torch.float32)[0]
            assert torch.equal(o, want)
