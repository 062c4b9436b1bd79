"""tex.grouped_mlp_experimental.swizzle_scales_and_pack_ptrs_for_discrete_weights (TE's helper
feeding discrete expert weights to a grouped GEMM): the data pointers, one buffer of the experts'
scale grids in the GEMM-swizzled layout, and pointers into it. Checked against an oracle written
here from the layout's definition (128x4 tiles, row-tile major; inside a tile the byte of row
32 * r4 + r32, column c at r32 * 16 + r4 * 4 + c; zeros outside the grid), against the
quantizers' own optimize_for_gemm scales, and with the compact grids' padding poisoned."""

from __future__ import annotations

import pytest
import torch

import transformer_engine_lite.pytorch.tex as tex
from transformer_engine_lite.pytorch import MXFP8Quantizer, NVFP4Quantizer

SWZ = tex.grouped_mlp_experimental.swizzle_scales_and_pack_ptrs_for_discrete_weights


def _oracle(grid: torch.Tensor, rows: int, blocks: int) -> torch.Tensor:
    """Swizzled bytes of grid[:rows, :blocks] (uint8), one byte at a time."""
    rp, bp = -(-rows // 128) * 128, -(-blocks // 4) * 4
    out = torch.zeros(rp * bp, dtype=torch.uint8)
    g = grid.view(torch.uint8)
    for r in range(rows):
        for b in range(blocks):
            tile = (r // 128) * (bp // 4) + b // 4
            rr, c = r % 128, b % 4
            out[tile * 512 + (rr % 32) * 16 + (rr // 32) * 4 + c] = g[r, b]
    return out


def _quantizer(kind):
    if kind == "nvfp4":
        return NVFP4Quantizer(columnwise=False)
    return MXFP8Quantizer(tex.DType.kFloat8E4M3, rowwise=kind == "mxfp8_rowwise",
                          columnwise=kind == "mxfp8_columnwise")


def _copy(t, kind, field):
    return getattr(t, f"_{'columnwise' if kind == 'mxfp8_columnwise' else 'rowwise'}_{field}")


@pytest.mark.parametrize("kind", ["nvfp4", "mxfp8_rowwise", "mxfp8_columnwise"])
@pytest.mark.parametrize("shape", [(160, 96), (256, 128), (32, 64)], ids=str)
def test_swizzled_buffer_and_pointers(kind, shape):
    torch.manual_seed(0)
    xs = [torch.randn(shape, dtype=torch.bfloat16) for _ in range(3)]
    q = _quantizer(kind)
    compact = [q(x) for x in xs]
    q.optimize_for_gemm = True
    swizzled_ref = [_copy(q(x), kind, "scale_inv") for x in xs]
    data = [_copy(t, kind, "data") for t in compact]
    scales = [_copy(t, kind, "scale_inv") for t in compact]
    data_ptrs, scale_ptrs, buf = SWZ(data, scales, kind, torch.device("cpu"))
    assert data_ptrs.dtype == torch.int64 and buf.dtype == torch.uint8
    assert data_ptrs.tolist() == [d.data_ptr() for d in data]
    stride = (scale_ptrs[1] - scale_ptrs[0]).item()
    assert stride % 16 == 0 and stride >= scales[0].numel()
    assert scale_ptrs.tolist() == [buf.data_ptr() + i * stride for i in range(3)]
    rows, cols = shape
    for i, (sc, ref) in enumerate(zip(scales, swizzled_ref)):
        got = buf[i * stride:i * stride + ref.numel()]
        if kind == "mxfp8_columnwise":  # the [row blocks, cols] grid is swizzled transposed
            want = _oracle(sc[: -(-rows // 32), :cols].t().contiguous(), cols, -(-rows // 32))
        else:
            blocks = -(-cols // (16 if kind == "nvfp4" else 32))
            want = _oracle(sc, rows, blocks)
        assert torch.equal(got, want)
        assert torch.equal(got, ref.reshape(-1).view(torch.uint8))
        assert not buf[i * stride + ref.numel():(i + 1) * stride].any()


def test_poisoned_padding_is_dropped():
    """Bytes of the compact grid past the tensor's rows and blocks are not copied (TE's test
    poisons them): the swizzled padding is zeros."""
    q = NVFP4Quantizer(columnwise=False)
    ts = [q(torch.randn(160, 96)) for _ in range(2)]
    data = [t._rowwise_data for t in ts]
    scales = [t._rowwise_scale_inv.clone() for t in ts]
    _, _, clean = SWZ(data, scales, "nvfp4", "cpu")
    for s in scales:
        s[160:, :].view(torch.uint8).fill_(255)
        s[:, 6:].view(torch.uint8).fill_(255)
    _, _, again = SWZ(data, scales, "nvfp4", "cpu")
    assert torch.equal(again, clean)


def test_no_experts_and_refusals():
    data_ptrs, scale_ptrs, buf = SWZ([], [], "nvfp4", "cpu")
    assert data_ptrs.shape == scale_ptrs.shape == buf.shape == (0,)
    with pytest.raises(ValueError, match="swizzle_type: expected 'mxfp8_rowwise'"):
        SWZ([], [], "fp8", "cpu")
    with pytest.raises(ValueError, match=r"2-D scales, got \(4, 32\) and \(4,\)"):
        SWZ([torch.zeros(4, 32, dtype=torch.uint8)], [torch.zeros(4, dtype=torch.uint8)],
            "mxfp8_rowwise", "cpu")
