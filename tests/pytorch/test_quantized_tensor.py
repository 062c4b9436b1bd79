"""TE's quantized-tensor API (transformer_engine.pytorch QuantizedTensor / Float8Tensor /
MXFP8Tensor / MXFP8TensorStorage): usages, noop_flag, subclass-preserving detach and views,
quantized chunks, autograd through quantize -> dequantize, the FSDP2 buffer hooks, and the
block-scaled classes that refuse to be made.

Values are compared bit for bit: every check here compares quantized bytes, or dequantized values
against another exact route to the same values (a slice, a transposed row-wise quantization, a
fresh quantization of the same input); the cast numerics themselves are tested in test_ops."""

from __future__ import annotations

import pytest
import torch

import transformer_engine_lite.pytorch as te
from transformer_engine_lite.pytorch.tensor import (
    Float8CurrentScalingQuantizer,
    Float8Quantizer,
    Float8Tensor,
    MXFP8Quantizer,
    MXFP8Tensor,
    MXFP8TensorStorage,
    QuantizedTensor,
)
from transformer_engine_lite.pytorch.utils import is_non_tn_fp8_gemm_supported

E4M3 = te.DType.kFloat8E4M3
KINDS = ("delayed", "current", "mxfp8")


def _quantizer(kind: str):
    if kind == "delayed":
        return Float8Quantizer(torch.full([1], 2.0), torch.zeros(1), E4M3)
    if kind == "current":
        return Float8CurrentScalingQuantizer(E4M3)
    return MXFP8Quantizer(E4M3)


def _buffers(q: QuantizedTensor) -> dict:
    return {n: getattr(q, n).clone() for n in q._inner_names() if getattr(q, n) is not None}


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_non_tn_gemm_means_no_fp8_transpose():
    # The lite's GEMM takes any layout: column-wise usage is served by the row-wise bytes.
    assert is_non_tn_fp8_gemm_supported() is True
    q = Float8CurrentScalingQuantizer(E4M3, rowwise=True, columnwise=True)
    x = q(torch.randn(8, 16))
    assert x._transpose is None
    assert x.get_usages() == {"rowwise": True, "columnwise": True}


@pytest.mark.parametrize("kind", KINDS)
def test_noop_flag_skips_the_update(kind):
    q = _quantizer(kind)
    first, second = torch.rand(64, 64), 3.0 * torch.rand(64, 64) + 1.0
    x = q(first)
    before = _buffers(x)
    amax = q.amax.clone() if kind == "delayed" else None
    x.quantize_(second, noop_flag=torch.ones(1))
    assert _same(_buffers(x), before)
    if kind == "delayed":
        assert torch.equal(q.amax, amax)  # a skipped cast does not fold its amax either
    x.quantize_(second, noop_flag=torch.zeros(1))
    assert _same(_buffers(x), _buffers(_quantizer(kind)(second)))
    assert not _same(_buffers(x), before)


def test_noop_flag_is_checked():
    x = _quantizer("current")(torch.rand(4, 4))
    with pytest.raises(ValueError, match="noop_flag: expected a 1-element float32 tensor"):
        x.quantize_(torch.rand(4, 4), noop_flag=torch.ones(2))
    with pytest.raises(ValueError, match="noop_flag.*got torch.int32"):
        x.quantize_(torch.rand(4, 4), noop_flag=torch.ones(1, dtype=torch.int32))


@pytest.mark.parametrize("shape", [(64, 96), (2, 64, 32)])
def test_mxfp8_columnwise_copy_after_dropping_rowwise(shape):
    x = torch.randn(shape, dtype=torch.float32)
    both = MXFP8Quantizer(E4M3)(x)
    both.update_usage(rowwise_usage=False)
    assert both._rowwise_data is None and both._rowwise_scale_inv is None
    assert both.get_usages() == {"rowwise": False, "columnwise": True}
    col = MXFP8Quantizer(E4M3, rowwise=False, columnwise=True)(x).dequantize()
    assert torch.equal(both.dequantize(), col)
    # 32x1 blocks down the rows of X are 1x32 blocks along the rows of X^T.
    x2 = x.reshape(-1, shape[-1])
    row_t = MXFP8Quantizer(E4M3, columnwise=False)(x2.t().contiguous()).dequantize()
    assert torch.equal(col.reshape(x2.shape), row_t.t())
    with pytest.raises(RuntimeError, match="rowwise_usage=True, but this tensor holds no rowwise"):
        both.update_usage(rowwise_usage=True)


def test_float8_update_usage_and_data_tensors():
    x = _quantizer("delayed")(torch.randn(4, 8))
    data, transpose = x.get_data_tensors()
    assert data is x._data and transpose is None
    assert x.get_data_tensors(columnwise_data=False) is x._data
    x.update_usage(rowwise_usage=True, columnwise_usage=True)  # both served by _data
    assert x._data is data and x._transpose is None
    x.update_usage(rowwise_usage=False, columnwise_usage=False)  # TE keeps it (see update_usage)
    assert x._data is data
    x._data = None  # what CPU offloading does; the wrapper still knows the shape
    assert x.shape == (4, 8) and x.get_usages() == {"rowwise": False, "columnwise": False}
    with pytest.raises(RuntimeError, match="no FP8 data"):
        x.dequantize()
    with pytest.raises(RuntimeError, match="cannot generate FP8 data"):
        x.update_usage(rowwise_usage=True)


@pytest.mark.parametrize("kind", KINDS)
def test_detach_and_parameter_keep_the_subclass(kind):
    q = _quantizer(kind)
    x = q(torch.randn(64, 64))
    derived = type(f"Derived{type(x).__name__}", (type(x),), {})
    x.__class__ = derived
    d = x.detach()
    assert type(d) is derived and not d.requires_grad
    assert all(a is b for a, b in zip(d.get_data_tensors(), x.get_data_tensors()))
    assert type(torch.nn.Parameter(x)) is derived
    q.update_quantized(torch.zeros(64, 64), x)
    assert type(x) is derived and torch.equal(x.dequantize(), torch.zeros(64, 64))


def test_views_share_the_quantized_bytes():
    f8 = _quantizer("current")(torch.randn(4, 6))
    v = f8.view(2, -1)
    assert type(v) is Float8Tensor and v.shape == (2, 12)
    assert v._data.data_ptr() == f8._data.data_ptr()
    assert torch.equal(v.dequantize(), f8.dequantize().view(2, 12))
    mx = _quantizer("mxfp8")(torch.randn(64, 64))
    mv = mx.view(2, 32, 64)
    assert type(mv) is MXFP8Tensor and mv._rowwise_data is mx._rowwise_data
    assert torch.equal(mv.dequantize(), mx.dequantize().view(2, 32, 64))
    with pytest.raises(ValueError, match="keeping the last dim 64, got \\(4096,\\)"):
        mx.view(-1)
    base = QuantizedTensor((8, 8), torch.bfloat16)
    with pytest.raises(NotImplementedError, match="QuantizedTensor class does not support tensor"):
        base.view(-1)


@pytest.mark.parametrize("dim", [0, 1])
def test_float8_chunks_stay_quantized(dim):
    x = _quantizer("delayed")(torch.randn(8, 6))
    ref = x.dequantize()
    for piece, want in zip(x.chunk(2, dim=dim), ref.chunk(2, dim=dim)):
        assert type(piece) is Float8Tensor and piece.shape == want.shape
        assert piece._scale_inv is x._scale_inv
        assert torch.equal(piece.dequantize(), want)


def test_mxfp8_chunks_of_whole_blocks_stay_quantized():
    raw = torch.randn(2, 64, 64)
    x = _quantizer("mxfp8")(raw)
    ref = x.dequantize()
    col_ref = MXFP8Quantizer(E4M3, rowwise=False)(raw).dequantize()
    for piece, want, col in zip(x.chunk(2), ref.chunk(2), col_ref.chunk(2)):
        assert type(piece) is MXFP8Tensor and piece.shape == (1, 64, 64)
        assert torch.equal(piece.dequantize(), want)
        piece.update_usage(rowwise_usage=False)  # the column-wise scales were sliced too
        assert torch.equal(piece.dequantize(), col)
    # 16-row pieces would cut the 32-row column-wise blocks: the pieces are dequantized values.
    y = _quantizer("mxfp8")(torch.randn(32, 64))
    pieces = y.chunk(2)
    assert all(type(p) is torch.Tensor for p in pieces)
    assert torch.equal(torch.cat(pieces), y.dequantize())


@pytest.mark.parametrize("kind", KINDS)
def test_autograd_through_quantize_and_dequantize(kind):
    x = torch.randn(64, 64, requires_grad=True)
    xq = _quantizer(kind)(x)
    assert xq.grad_fn is not None and xq.requires_grad
    deq = xq.dequantize()
    (deq**2).sum().backward()
    # Straight-through on both casts: d/dx sum(deq^2) = 2 * deq (exact in float32).
    assert torch.equal(x.grad, 2 * deq.detach())
    with torch.no_grad():
        assert _quantizer(kind)(x).grad_fn is None


def test_mxfp8_storage_fsdp_buffers_drop_alignment_padding():
    rows, cols = 48, 64
    x = torch.randn(rows, cols)
    ref = MXFP8Quantizer(E4M3)(x)
    # TE's aligned scale buffers: rows padded to 128 (row-wise) and 4 (column-wise).
    rs = torch.zeros(128, 4, dtype=torch.uint8)
    rs[:rows, :2] = ref._rowwise_scale_inv
    cs = torch.zeros(4, 128, dtype=torch.uint8)
    cs[:2, :cols] = ref._columnwise_scale_inv
    st = MXFP8TensorStorage(
        rowwise_data=ref._rowwise_data,
        rowwise_scale_inv=rs,
        columnwise_data=ref._columnwise_data,
        columnwise_scale_inv=cs,
        fp8_dtype=E4M3,
        quantizer=None,
        fake_dtype=torch.bfloat16,
    )
    assert torch.equal(st.dequantize(), ref.dequantize(dtype=torch.bfloat16))
    bufs, meta = st.fsdp_extract_buffers()
    assert meta == {"field_names": st.fsdp_buffer_fields()}
    assert [tuple(b.shape) for b in bufs] == [(48, 64), (48, 4), (48, 64), (2, 128)]
    assert bufs[0] is st._rowwise_data
    st.update_usage(rowwise_usage=False)
    assert st.fsdp_buffer_fields() == ("_columnwise_data", "_columnwise_scale_inv")
    st.fsdp_assign_gathered(bufs[2:], {"field_names": st.fsdp_buffer_fields()})
    assert st._columnwise_scale_inv.shape == (2, 128)
    col_ref = MXFP8Quantizer(E4M3, rowwise=False)(x).dequantize()
    assert torch.equal(st.dequantize(dtype=torch.float32), col_ref)
    with pytest.raises(ValueError, match="expected 2 buffers"):
        st.fsdp_assign_gathered(bufs, {"field_names": st.fsdp_buffer_fields()})


def test_mxfp8_storage_arguments_are_checked():
    data, scale = torch.zeros(32, 32, dtype=torch.uint8), torch.zeros(32, 1, dtype=torch.uint8)
    kw = dict(fp8_dtype=E4M3, columnwise_data=None, columnwise_scale_inv=None)
    with pytest.raises(ValueError, match="expected rowwise_data or columnwise_data, got neither"):
        MXFP8TensorStorage(rowwise_data=None, rowwise_scale_inv=None, **kw)
    with pytest.raises(ValueError, match="rowwise_scale_inv: expected it exactly when"):
        MXFP8TensorStorage(rowwise_data=data, rowwise_scale_inv=None, **kw)
    # GEMM-swizzled scales (tests/pytorch/test_nvfp4_swizzle.py): a [roundup(rows, 128),
    # roundup(blocks, 4)] swizzled grid is read back in the compact layout.
    st = MXFP8TensorStorage(
        rowwise_data=data, rowwise_scale_inv=torch.zeros(128, 4, dtype=torch.uint8),
        with_gemm_swizzled_scales=True, **kw
    )
    assert st._with_gemm_swizzled_scales and st._scale_grid(False).shape == (32, 1)


def test_nvfp4_classes_are_made():
    # NVFP4 (issue #24 part 2): TE's classes quantize; an NVFP4Tensor needs a copy of data
    assert not isinstance(_quantizer("mxfp8"), te.NVFP4Quantizer)
    t = te.NVFP4Quantizer()(torch.randn(16, 32))
    assert isinstance(t, te.NVFP4Tensor) and isinstance(t, te.QuantizedTensor)
    with pytest.raises(ValueError, match="NVFP4Tensor: expected rowwise_data or columnwise_data"):
        te.NVFP4Tensor(shape=(16, 32), dtype=torch.float32, rowwise_data=None,
                       rowwise_scale_inv=None, columnwise_data=None, columnwise_scale_inv=None,
                       amax_rowwise=None, amax_columnwise=None)


@pytest.mark.parametrize("kind", KINDS)
def test_to_device_keeps_the_quantized_form(kind):
    x = _quantizer(kind)(torch.randn(64, 32))
    y = x.to("meta")  # another device: every buffer moves, the type and quantizer stay
    assert type(y) is type(x) and y.device.type == "meta" and y._quantizer is x._quantizer
    assert all(getattr(y, n).device.type == "meta" for n in y._inner_names())
    c = x.to("cpu", copy=True)  # _to_copy copies the bytes
    assert type(c) is type(x) and torch.equal(c.dequantize(), x.dequantize())
    assert all(
        getattr(c, n).data_ptr() != getattr(x, n).data_ptr()
        for n in x._inner_names()
        if getattr(x, n) is not None
    )
    d = x.to(torch.float64)  # a dtype change leaves the quantized form
    assert type(d) is torch.Tensor and torch.equal(d, x.dequantize().double())
