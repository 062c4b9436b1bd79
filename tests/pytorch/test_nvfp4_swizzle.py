"""GEMM-swizzled block scales (TE's optimize_for_gemm / _with_gemm_swizzled_scales) for NVFP4 and
MXFP8: the byte permutation against an index-formula oracle (cuBLAS's 128x4 tile layout), the
quantizers' swizzled output (same data and amaxes, scales = the swizzle of the compact ones,
padding zero), TE's make_empty shape gate, tex.swizzle_scales_for_gemm_ / the multi-tensor
variant, dequantize / GEMM / update_usage / pickling of swizzled tensors."""

import io
import pickle

import pytest
import torch

import transformer_engine_lite.pytorch.tex as tex
from transformer_engine_lite.pytorch import MXFP8Quantizer, NVFP4Quantizer
from transformer_engine_lite.pytorch.cpp_extensions import general_gemm
from transformer_engine_lite.pytorch.tensor._gemm_swizzle import (
    swizzle_grid,
    unswizzle_grid,
)

E4M3 = torch.float8_e4m3fn


def oracle_swizzle(grid, rows, blocks):
    """cuBLAS's block-scale layout by its index formula: the padded [Rp, Bp] grid in 128x4 tiles,
    tiles row-major; the byte (r, c) of a tile at (r % 32) * 16 + (r // 32) * 4 + c; bytes
    outside [rows, blocks] zero."""
    rp, bp = -(-rows // 128) * 128, -(-blocks // 4) * 4
    out = torch.zeros(rp * bp, dtype=torch.uint8)
    r = torch.arange(rows).unsqueeze(1).expand(rows, blocks)
    c = torch.arange(blocks).unsqueeze(0).expand(rows, blocks)
    tile = (r // 128) * (bp // 4) + c // 4
    pos = tile * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4
    out[pos.reshape(-1)] = grid[:rows, :blocks].reshape(-1)
    return out.reshape(rp, bp)


@pytest.mark.parametrize("rows, blocks", [(128, 4), (256, 32), (100, 7), (1, 1), (384, 12)])
def test_swizzle_grid_matches_oracle_and_inverts(rows, blocks):
    g = torch.randint(1, 255, (rows, blocks), dtype=torch.uint8)
    sw = swizzle_grid(g, rows, blocks)
    assert torch.equal(sw, oracle_swizzle(g, rows, blocks))
    back = unswizzle_grid(sw, rows, blocks)
    assert torch.equal(back[:rows, :blocks], g)
    assert int(back.sum()) == int(g.to(torch.int64).sum())  # the padding is zero


def test_swizzle_grid_ignores_padding_and_checks_arguments():
    g = torch.randint(1, 255, (128, 8), dtype=torch.uint8)
    sw = swizzle_grid(g, 100, 6)  # entries past 100 rows / 6 blocks: TE zeroes them
    assert torch.equal(sw, oracle_swizzle(g, 100, 6))
    with pytest.raises(ValueError, match="expected at least \\[200, 8\\]"):
        swizzle_grid(g, 200, 8)
    with pytest.raises(ValueError, match="one-byte scales"):
        swizzle_grid(g.float(), 128, 8)
    with pytest.raises(ValueError, match="expected 1024 bytes"):
        unswizzle_grid(g[:64], 128, 8)


NVFP4_KINDS = {
    "1d": dict(),
    "2d": dict(with_2d_quantization=True),
    "rht": dict(with_rht=True, with_post_rht_amax=True),
}


@pytest.mark.parametrize("kind", list(NVFP4_KINDS))
@pytest.mark.parametrize("shape", [(256, 512), (64, 144), (48, 128), (2, 96, 64)])
@pytest.mark.parametrize("usage", [(True, True), (True, False), (False, True)])
def test_nvfp4_optimize_for_gemm_swizzles_scales_only(kind, shape, usage):
    torch.manual_seed(0)
    x = torch.randn(shape, dtype=torch.bfloat16)
    q = NVFP4Quantizer(rowwise=usage[0], columnwise=usage[1], **NVFP4_KINDS[kind])
    qs = q.copy()
    qs.optimize_for_gemm = True
    ref, sut = q(x), qs(x)
    assert not ref._with_gemm_swizzled_scales and sut._with_gemm_swizzled_scales
    rows, cols = x.numel() // shape[-1], shape[-1]
    for col, data, scale, amax in ((False, "_rowwise_data", "_rowwise_scale_inv", "_amax_rowwise"),
                                   (True, "_columnwise_data", "_columnwise_scale_inv",
                                    "_amax_columnwise")):
        if getattr(ref, data) is None:
            assert getattr(sut, data) is None
            continue
        assert torch.equal(getattr(sut, data), getattr(ref, data))
        assert torch.equal(getattr(sut, amax), getattr(ref, amax))
        r, b = (cols, rows // 16) if col else (rows, cols // 16)
        assert getattr(sut, scale).shape == getattr(ref, scale).shape
        assert torch.equal(getattr(sut, scale), oracle_swizzle(getattr(ref, scale), r, b))
    assert torch.equal(sut.dequantize(), ref.dequantize())


@pytest.mark.parametrize("kind, shape, expected", [
    ("rht", (64, 128), True), ("rht", (128, 256), True), ("rht", (64, 144), False),
    ("rht", (48, 128), False), ("2d", (128, 128), True), ("2d", (256, 512), True),
    ("2d", (128, 192), False), ("2d", (64, 128), False), ("1d", (128, 128), False)])
def test_nvfp4_make_empty_reports_tes_in_kernel_gate(kind, shape, expected):
    q = NVFP4Quantizer(**NVFP4_KINDS[kind])
    q.optimize_for_gemm = True
    assert q.make_empty(shape, dtype=torch.bfloat16)._with_gemm_swizzled_scales is expected
    assert q(torch.randn(shape))._with_gemm_swizzled_scales  # end to end: always swizzled
    q.optimize_for_gemm = False
    assert not q.make_empty(shape)._with_gemm_swizzled_scales


def test_nvfp4_update_quantized_and_update_usage_keep_the_layout():
    torch.manual_seed(1)
    x, x2 = torch.randn(256, 256), torch.randn(256, 256)
    q = NVFP4Quantizer(with_2d_quantization=True)
    qs = q.copy()
    qs.optimize_for_gemm = True
    dst = qs.make_empty((256, 256))
    qs.update_quantized(x2, dst)
    assert dst._with_gemm_swizzled_scales and torch.equal(dst.dequantize(), q(x2).dequantize())
    # 2D: the column-wise copy is rebuilt from the row-wise one, in the same (swizzled) layout.
    rq = q.copy()
    rq.set_usage(columnwise=False)
    rqs = rq.copy()
    rqs.optimize_for_gemm = True
    t = rqs(x)
    t.update_usage(columnwise_usage=True)
    full = q(x)
    assert torch.equal(t._columnwise_data, full._columnwise_data)
    assert torch.equal(t._columnwise_scale_inv, oracle_swizzle(full._columnwise_scale_inv, 256, 16))


def test_nvfp4_swizzled_gemm_view_and_pickle():
    torch.manual_seed(2)
    x, w = torch.randn(128, 256, dtype=torch.bfloat16), torch.randn(64, 256, dtype=torch.bfloat16)
    q = NVFP4Quantizer(with_rht=True, with_post_rht_amax=True)
    qs = q.copy()
    qs.optimize_for_gemm = True
    ref = general_gemm(q(w), q(x), out_dtype=torch.float32)[0]
    sut = general_gemm(qs(w), qs(x), out_dtype=torch.float32)[0]
    assert torch.equal(sut, ref)
    t = qs(x.reshape(2, 64, 256))
    v = t.view(128, 256)
    assert v._with_gemm_swizzled_scales and torch.equal(v.dequantize(), q(x).dequantize())
    buf = io.BytesIO()
    torch.save(t, buf)
    buf.seek(0)
    back = torch.load(buf, weights_only=False)
    assert back._with_gemm_swizzled_scales and torch.equal(back.dequantize(), t.dequantize())
    assert pickle.loads(pickle.dumps(t))._with_gemm_swizzled_scales


def test_tex_swizzle_scales_for_gemm_in_place():
    torch.manual_seed(3)
    x = torch.randn(256, 128)
    q = NVFP4Quantizer()
    qs = q.copy()
    qs.optimize_for_gemm = True
    t = q(x)
    tex.swizzle_scales_for_gemm_(t)
    want = qs(x)
    assert t._with_gemm_swizzled_scales
    assert torch.equal(t._rowwise_scale_inv, want._rowwise_scale_inv)
    assert torch.equal(t._columnwise_scale_inv, want._columnwise_scale_inv)
    before = t._rowwise_scale_inv
    tex.swizzle_scales_for_gemm_(t)  # already swizzled: untouched
    assert t._rowwise_scale_inv is before
    plain = torch.randn(4, 4)
    tex.swizzle_scales_for_gemm_(plain)  # not block-scaled: nothing to do (TE's)
    # Multi-tensor: one usage per call, the flag left to the caller (TE's).
    ts = [q(x), q(x)]
    tex.multi_tensor_swizzle_scales_for_gemm_(ts, True, False)
    assert torch.equal(ts[0]._rowwise_scale_inv, want._rowwise_scale_inv)
    assert torch.equal(ts[1]._columnwise_scale_inv, q(x)._columnwise_scale_inv)
    assert not ts[0]._with_gemm_swizzled_scales
    tex.multi_tensor_swizzle_scales_for_gemm_unchecked_(ts, False, True)
    assert torch.equal(ts[1]._columnwise_scale_inv, want._columnwise_scale_inv)
    with pytest.raises(ValueError, match="exactly one of rowwise / columnwise"):
        tex.multi_tensor_swizzle_scales_for_gemm_(ts, True, True)


@pytest.mark.parametrize("shape", [(256, 512), (64, 96), (2, 48, 64)])
@pytest.mark.parametrize("usage", [(True, True), (True, False), (False, True)])
def test_mxfp8_optimize_for_gemm(shape, usage):
    torch.manual_seed(4)
    x = torch.randn(shape, dtype=torch.bfloat16)
    q = MXFP8Quantizer(E4M3, rowwise=usage[0], columnwise=usage[1])
    qs = q.copy()
    qs.optimize_for_gemm = True
    ref, sut = q(x), qs(x)
    assert sut._with_gemm_swizzled_scales
    rows, cols = x.numel() // shape[-1], shape[-1]
    if usage[0]:
        assert torch.equal(sut._rowwise_data, ref._rowwise_data)
        assert torch.equal(sut._rowwise_scale_inv,
                           oracle_swizzle(ref._rowwise_scale_inv, rows, -(-cols // 32)))
    if usage[1]:
        # Column-wise grids [row blocks, cols] swizzle transposed, in TE's buffer shape
        # [roundup(row blocks, 4), roundup(cols, 128)].
        rb = -(-rows // 32)
        want = oracle_swizzle(ref._columnwise_scale_inv.t(), cols, rb)
        assert sut._columnwise_scale_inv.shape == (-(-rb // 4) * 4, -(-cols // 128) * 128)
        assert torch.equal(sut._columnwise_scale_inv.reshape(-1), want.reshape(-1))
    assert torch.equal(sut.dequantize(), ref.dequantize())
    specs = qs.inner_tensor_specs(tuple(shape))
    for name, (s, _) in specs.items():
        assert tuple(getattr(sut, name).shape) == tuple(s), name


def test_mxfp8_swizzled_gemm_split_and_state():
    torch.manual_seed(5)
    x, w = torch.randn(128, 256, dtype=torch.bfloat16), torch.randn(64, 256, dtype=torch.bfloat16)
    q = MXFP8Quantizer(E4M3)
    qs = q.copy()
    qs.optimize_for_gemm = True
    for layout in ("TN",):
        assert torch.equal(general_gemm(qs(w), qs(x), layout=layout)[0],
                           general_gemm(q(w), q(x), layout=layout)[0])
    t = qs(x)
    parts = torch.split(t, 64)  # swizzled tiles span 128 rows: split runs on the values
    assert torch.equal(torch.cat([p.float() for p in parts]), q(x).dequantize().float())
    back = pickle.loads(pickle.dumps(t))
    assert back._with_gemm_swizzled_scales and torch.equal(back.dequantize(), t.dequantize())
    with pytest.raises(NotImplementedError, match="GEMM-swizzled scales"):
        t.fsdp_extract_buffers()
