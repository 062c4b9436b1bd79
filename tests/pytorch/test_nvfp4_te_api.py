"""TE API edges of NVFP4 tensors that TE's tests/pytorch/nvfp4 files use: get_metadata (a storage
rebuilt from it, incl. the row-scaled / 4over6 fields), the FSDP2 all-gather hooks and the
as_strided / slice no-op handlers, tex.generic_gemm's TT layout, and the row-scaled grouped GEMM's
single_output return."""

import pytest
import torch

import transformer_engine_lite.pytorch.tex as tex
from transformer_engine_lite.pytorch import MXFP8Quantizer, NVFP4Quantizer, NVFP4Tensor
from transformer_engine_lite.pytorch.cpp_extensions import general_gemm, general_grouped_gemm
from transformer_engine_lite.pytorch.tensor.storage.mxfp8_tensor_storage import MXFP8TensorStorage
from transformer_engine_lite.pytorch.tensor.storage.nvfp4_tensor_storage import NVFP4TensorStorage


@pytest.mark.parametrize("kw", [dict(), dict(row_scaled_nvfp4=True, columnwise=False),
                                dict(nvfp4_use_4over6=True, nvfp4_e4m3_max=256)])
def test_nvfp4_metadata_rebuilds_the_tensor(kw):
    torch.manual_seed(0)
    x = torch.randn(64, 128)
    t = NVFP4Quantizer(**kw)(x)
    meta = t.get_metadata()
    assert meta["row_scaled_nvfp4"] == kw.get("row_scaled_nvfp4", False)
    assert meta["nvfp4_e4m3_max"] == kw.get("nvfp4_e4m3_max", 448)
    assert meta["fake_dtype"] == torch.float32 and meta["rowwise_data"] is t._rowwise_data
    # The fields, not the quantizer, say how the bytes decode.
    meta["quantizer"] = None
    st = NVFP4TensorStorage(**meta)
    assert torch.equal(st.dequantize(dtype=torch.float32), t.dequantize())
    with pytest.raises(ValueError, match="nvfp4_e4m3_max: expected 448 or 256, got 300"):
        NVFP4TensorStorage(**{**meta, "nvfp4_e4m3_max": 300})


def test_mxfp8_metadata_rebuilds_the_tensor():
    t = MXFP8Quantizer(torch.float8_e4m3fn)(torch.randn(64, 64))
    st = MXFP8TensorStorage(**t.get_metadata())
    assert torch.equal(st.dequantize(dtype=torch.float32), t.dequantize())


def _fsdp_quantizer(**kw):
    return NVFP4Quantizer(with_2d_quantization=True, **kw)


@pytest.mark.parametrize("world", [2, 4])
def test_nvfp4_fsdp2_hooks_round_trip(world):
    torch.manual_seed(1)
    shard = _fsdp_quantizer()(torch.randn(80, 64, dtype=torch.bfloat16))
    sharded, meta = shard.fsdp_pre_all_gather(None, None, None, None, None)
    assert sharded[0] is shard._rowwise_data and sharded[1].shape == (80, 4)  # padding cut
    gathered = tuple(torch.cat([t] * world) for t in sharded)
    full, _ = shard.fsdp_post_all_gather(gathered, meta, torch.bfloat16)
    assert isinstance(full, NVFP4Tensor) and tuple(full.shape) == (80 * world, 64)
    assert full._rowwise_scale_inv.shape == (-(-80 * world // 128) * 128, 4)
    want = torch.cat([shard.dequantize()] * world)
    assert torch.equal(full.dequantize(), want)
    # The column-wise copy is rebuilt locally (16x16 blocks): the shards' copies side by side.
    assert torch.equal(full._columnwise_data, torch.cat([shard._columnwise_data] * world, 1))
    assert torch.equal(full._dequantize_copy(True, torch.float32),
                       torch.cat([shard._dequantize_copy(True, torch.float32)] * world))
    again, _ = shard.fsdp_post_all_gather(gathered, meta, torch.bfloat16, out=full)
    assert again is full and torch.equal(again.dequantize(), want)


def test_nvfp4_fsdp2_hooks_refusals():
    q = NVFP4Quantizer()
    q.optimize_for_gemm = True
    with pytest.raises(NotImplementedError, match="GEMM-swizzled"):
        q(torch.randn(64, 64)).fsdp_pre_all_gather(None, None, None, None, None)
    with pytest.raises(ValueError, match="multiple of 16"):
        _fsdp_quantizer()(torch.randn(8, 64)).fsdp_pre_all_gather(None, None, None, None, None)
    with pytest.raises(ValueError, match="2D quantization"):
        NVFP4Quantizer()(torch.randn(64, 64)).fsdp_pre_all_gather(None, None, None, None, None)


def test_nvfp4_as_strided_and_slice_noops():
    t = NVFP4Quantizer()(torch.randn(64, 32))
    for out in (torch.ops.aten.as_strided.default(t, [64, 32], [32, 1], 0),
                torch.ops.aten.slice.Tensor(t, 0, 0, 64), torch.ops.aten.slice.Tensor(t, 1, 0)):
        assert isinstance(out, NVFP4Tensor) and torch.equal(out.dequantize(), t.dequantize())
    part = torch.ops.aten.slice.Tensor(t, 0, 0, 32)  # a real slice: the values
    assert not isinstance(part, NVFP4Tensor) and torch.equal(part, t.dequantize()[:32])


def test_generic_gemm_takes_tt_general_gemm_does_not():
    torch.manual_seed(2)
    q = NVFP4Quantizer()
    w = q(torch.randn(32, 64))  # [n, k]: transa uses its row-wise copy
    x = q(torch.randn(64, 48))  # [k, m]: transb uses its column-wise copy
    ws = torch.empty(4, dtype=torch.uint8)
    d = tex.generic_gemm(w, True, x, True, None, None, tex.DType.kFloat32, None,
                         tex.DType.kBFloat16, False, None, False, ws, 4, False, False)[0]
    wd = w._dequantize_copy(False, torch.float32).double()
    xd = x._dequantize_copy(True, torch.float32).double()
    torch.testing.assert_close(d.double(), xd.t() @ wd.t(), rtol=1e-6, atol=1e-5)
    with pytest.raises(ValueError, match="layout: expected 'TN', 'NN' or 'NT'"):
        general_gemm(w, x, layout="TT")


@pytest.mark.parametrize("row_scaled", [False, True])
def test_grouped_gemm_single_output_return(row_scaled):
    torch.manual_seed(3)
    xq = NVFP4Quantizer(row_scaled_nvfp4=row_scaled, columnwise=not row_scaled)
    wq = NVFP4Quantizer()
    splits = [32, 16]
    xs = [xq(torch.randn(m, 64)) for m in splits]
    ws = [wq(torch.randn(48, 64)) for _ in splits]
    out = [torch.empty(sum(splits), 48)]
    got, _, _ = general_grouped_gemm(ws, xs, out, [None, None], torch.float32,
                                     m_splits=splits, single_output=True)
    # TE: the row-scaled path hands back the tensor, the others the list it was given.
    assert (got is out[0]) if row_scaled else (got == out)
    want = torch.cat([general_gemm(w, x, out_dtype=torch.float32)[0] for w, x in zip(ws, xs)])
    assert torch.equal(out[0], want)
