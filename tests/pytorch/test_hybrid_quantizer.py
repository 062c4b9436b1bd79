"""HybridQuantizer (TE's): each direction's bytes are exactly those its component quantizer makes
alone; usages, the tensor's torch ops, pickling, general_gemm's direction choice, and the modules
under CustomRecipes with hybrid slots (GEMM results against explicitly quantized operands, bit for
bit, and against fp64 products of the dequantized operands)."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch

import transformer_engine_lite.pytorch as te
from transformer_engine_lite.common.recipe import CustomRecipe
from transformer_engine_lite.pytorch.cpp_extensions.gemm import general_gemm
from transformer_engine_lite.pytorch.custom_recipes.quantizer_factory_zoo import (
    mxfp8_fwd_high_precision_bwd_factory,
    mxfp8_fwd_nvfp4_bwd_factory,
)
from transformer_engine_lite.pytorch.quantization import DelayedScalingRequest, QuantizerRole
from transformer_engine_lite.pytorch.tensor import (
    Float8BlockQuantizer,
    Float8CurrentScalingQuantizer,
    HybridQuantizedTensor,
    HybridQuantizedTensorStorage,
    HybridQuantizer,
    IdentityQuantizer,
    MXFP8Quantizer,
    NVFP4Quantizer,
    QuantizedTensor,
)

E4M3, E5M2 = te.DType.kFloat8E4M3, te.DType.kFloat8E5M2
BF16 = torch.bfloat16

# component quantizers by name (fresh instances: a HybridQuantizer owns and pins its children)
MAKERS = {
    "fp8": lambda: Float8CurrentScalingQuantizer(E4M3),
    "mxfp8": lambda: MXFP8Quantizer(E4M3),
    "block1d": lambda: Float8BlockQuantizer(E4M3, rowwise=True, columnwise=True,
                                            block_scaling_dim=1),
    "block2d": lambda: Float8BlockQuantizer(E4M3, rowwise=True, columnwise=True,
                                            block_scaling_dim=2),
    "nvfp4": lambda: NVFP4Quantizer(),
    "nvfp4_rht": lambda: NVFP4Quantizer(with_rht=True, with_post_rht_amax=True),
    "identity": lambda: IdentityQuantizer(),
}


def _alone(name: str, x: torch.Tensor, rowwise: bool, fp8_dtype=E4M3):
    """x quantized by the component quantizer alone, one direction."""
    q = Float8CurrentScalingQuantizer(fp8_dtype) if name == "fp8" else MAKERS[name]()
    q.set_usage(rowwise=rowwise, columnwise=not rowwise)
    return q(x)


def _assert_same_storage(got, want) -> None:
    assert type(got) is type(want)
    if not isinstance(want, QuantizedTensor):
        assert torch.equal(got, want)
        return
    names = want._inner_names()
    assert got._inner_names() == names
    for n in names:
        a, b = getattr(got, n), getattr(want, n)
        assert (a is None) == (b is None), n
        if a is not None:
            assert a.dtype == b.dtype and torch.equal(a.view(torch.uint8) if a.element_size() == 1
                                                      else a, b.view(torch.uint8)
                                                      if b.element_size() == 1 else b), n


def _x(shape=(128, 256), seed=0, dtype=BF16) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * 3).to(dtype)


# ----------------------------------------------------------------------------- exact bytes
@pytest.mark.parametrize("source", ["original", "rowwise_dequantized"])
@pytest.mark.parametrize("row,col", [
    ("mxfp8", "nvfp4"), ("fp8", "mxfp8"), ("mxfp8", "fp8"), ("nvfp4", "nvfp4_rht"),
    ("block1d", "block2d"), ("block2d", "mxfp8"), ("mxfp8", "identity"), ("identity", "mxfp8"),
    ("fp8", "identity"), ("nvfp4", "block1d"),
])
def test_directions_match_component_quantizers(row, col, source):
    x = _x()
    h = HybridQuantizer(rowwise_quantizer=MAKERS[row](), columnwise_quantizer=MAKERS[col](),
                        columnwise_source=source)(x)
    assert isinstance(h, HybridQuantizedTensor) and h.shape == x.shape and h.dtype == BF16
    want_row = _alone(row, x, True)
    _assert_same_storage(h.rowwise_sub_storage, want_row)
    src = x
    if source == "rowwise_dequantized":
        src = want_row.dequantize(dtype=BF16) if isinstance(want_row, QuantizedTensor) else x
    _assert_same_storage(h.columnwise_sub_storage, _alone(col, src, False))
    # values: the rowwise representation's (TE's dequantize order)
    assert torch.equal(h.dequantize(), h.rowwise_sub_storage.dequantize()
                       if isinstance(want_row, QuantizedTensor) else x)


def test_usage_gates_each_direction_and_update_usage_drops():
    x = _x()
    hq = HybridQuantizer(rowwise_quantizer=MAKERS["mxfp8"](), columnwise_quantizer=MAKERS["fp8"]())
    hq.set_usage(rowwise=False, columnwise=True)
    h = hq(x)
    assert h.rowwise_sub_storage is None and h.get_usages() == {"rowwise": False,
                                                                 "columnwise": True}
    assert torch.equal(h.dequantize(), _alone("fp8", x, False).dequantize())
    hq.set_usage(rowwise=True, columnwise=True)
    h = hq(x)
    h.update_usage(columnwise_usage=False)
    assert h.columnwise_sub_storage is None
    with pytest.raises(RuntimeError, match="no columnwise sub-storage"):
        h.update_usage(rowwise_usage=False, columnwise_usage=True)
    assert h.rowwise_sub_storage is not None  # the failed request changed nothing
    # the sub-quantizers stay pinned to their direction
    assert hq.rowwise_quantizer.rowwise_usage and not hq.rowwise_quantizer.columnwise_usage
    assert hq.columnwise_quantizer.columnwise_usage and not hq.columnwise_quantizer.rowwise_usage


def test_constructor_errors():
    q = MAKERS["mxfp8"]()
    with pytest.raises(ValueError, match="distinct"):
        HybridQuantizer(rowwise_quantizer=q, columnwise_quantizer=q)
    with pytest.raises(TypeError, match="concrete Quantizer"):
        HybridQuantizer(rowwise_quantizer=q, columnwise_quantizer="nvfp4")
    with pytest.raises(TypeError, match="QuantizerRequest"):
        HybridQuantizer(rowwise_quantizer=q, columnwise_quantizer=DelayedScalingRequest())
    with pytest.raises(ValueError, match="columnwise_source"):
        HybridQuantizer(rowwise_quantizer=q, columnwise_quantizer=MAKERS["fp8"](),
                        columnwise_source="transpose")
    with pytest.raises(TypeError, match="requires a parent HybridQuantizer"):
        HybridQuantizedTensorStorage(rowwise_storage=None, columnwise_storage=None, quantizer=q)
    with pytest.raises(TypeError, match="requires a parent HybridQuantizer"):
        HybridQuantizedTensor(shape=(2, 2), dtype=BF16, rowwise_storage=None,
                              columnwise_storage=None, quantizer=None)


def test_copy_is_deep_in_children_and_state():
    hq = HybridQuantizer(rowwise_quantizer=MAKERS["mxfp8"](),
                         columnwise_quantizer=MAKERS["nvfp4"](),
                         columnwise_source="rowwise_dequantized")
    hq.set_usage(columnwise=False)
    c = hq.copy()
    assert c.rowwise_quantizer is not hq.rowwise_quantizer
    assert (c.rowwise_usage, c.columnwise_usage, c.columnwise_source) == (True, False,
                                                                           "rowwise_dequantized")
    st = hq.state()
    assert st["kind"] == "hybrid" and st["rowwise_quantizer"]["kind"] == "mxfp8"


def test_update_quantized_in_place_and_noop():
    x, y = _x(seed=1), _x(seed=2)
    hq = HybridQuantizer(rowwise_quantizer=MAKERS["fp8"](), columnwise_quantizer=MAKERS["mxfp8"](),
                         columnwise_source="rowwise_dequantized")
    h = hq(x)
    row_obj = h.rowwise_sub_storage
    hq.update_quantized(y, h)
    assert h.rowwise_sub_storage is row_obj  # in place
    fresh = hq(y)
    _assert_same_storage(h.rowwise_sub_storage, fresh.rowwise_sub_storage)
    _assert_same_storage(h.columnwise_sub_storage, fresh.columnwise_sub_storage)
    hq.update_quantized(x, h, noop_flag=torch.ones(1))
    _assert_same_storage(h.rowwise_sub_storage, fresh.rowwise_sub_storage)
    with pytest.raises(ValueError, match="HybridQuantizedTensorStorage"):
        hq.update_quantized(x, MAKERS["fp8"]()(x))
    h.copy_(x)  # copy_ from a plain tensor re-quantizes with the tensor's quantizer
    _assert_same_storage(h.rowwise_sub_storage, hq(x).rowwise_sub_storage)


def test_internal_storage_and_saving_round_trip():
    x = _x()
    hq = HybridQuantizer(rowwise_quantizer=MAKERS["mxfp8"](),
                         columnwise_quantizer=MAKERS["identity"]())
    hq.internal = True
    s = hq(x)
    assert type(s) is HybridQuantizedTensorStorage and not isinstance(s, torch.Tensor)
    assert s.size() == x.shape and s.device == x.device
    bufs, obj = s.prepare_for_saving()
    assert obj is s and len(bufs) == len(s.rowwise_sub_storage._inner_names()) + 1
    assert s.restore_from_saved(bufs + [None]) == [None]
    assert torch.equal(s.dequantize(dtype=torch.float32), s.rowwise_sub_storage.dequantize(
        dtype=torch.float32))


def test_tensor_ops_keep_the_hybrid():
    x = _x()
    hq = HybridQuantizer(rowwise_quantizer=MAKERS["mxfp8"](),
                         columnwise_quantizer=MAKERS["nvfp4"]())
    h = hq(x)
    for other in (pickle.loads(pickle.dumps(h)), copy.deepcopy(h), h.clone(), h.detach(),
                  h.to("cpu"), h.view(128, 256)):
        assert isinstance(other, HybridQuantizedTensor)
        _assert_same_storage(other.rowwise_sub_storage, h.rowwise_sub_storage)
        _assert_same_storage(other.columnwise_sub_storage, h.columnwise_sub_storage)
    d = h.detach()
    d.update_usage(rowwise_usage=False)  # a detached copy's usage change leaves h whole
    assert h.rowwise_sub_storage is not None
    h2 = hq(_x(seed=3))
    h2.copy_(h)
    _assert_same_storage(h2.columnwise_sub_storage, h.columnwise_sub_storage)
    parts = torch.split(HybridQuantizer(rowwise_quantizer=MAKERS["fp8"](),
                                        columnwise_quantizer=MAKERS["identity"]())(x), 64)
    assert len(parts) == 2 and all(isinstance(p, HybridQuantizedTensor) for p in parts)
    assert torch.equal(parts[1].dequantize(), _alone("fp8", x, True).dequantize()[64:])
    # other ops run on the dequantized values
    assert torch.equal(h + 1, h.dequantize() + 1)


def test_general_gemm_reads_the_contracted_direction():
    x, w = _x((64, 128), 1), _x((96, 128), 2)
    mk = lambda: HybridQuantizer(rowwise_quantizer=MAKERS["mxfp8"](),  # noqa: E731
                                 columnwise_quantizer=MAKERS["fp8"]())
    hx, hw = mk()(x), mk()(w)
    y = general_gemm(hw, hx, out_dtype=torch.float32, layout="TN")[0]
    want = general_gemm(_alone("mxfp8", w, True), _alone("mxfp8", x, True),
                        out_dtype=torch.float32, layout="TN")[0]
    assert torch.equal(y, want)
    ref = _alone("mxfp8", x, True).dequantize(dtype=torch.float32).double() @ \
        _alone("mxfp8", w, True).dequantize(dtype=torch.float32).double().T
    # fp32 accumulation of exact products: K=128 roundings of sums of magnitude ~1e3
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-3)
    dy = _x((64, 96), 3)
    hdy = HybridQuantizer(rowwise_quantizer=MAKERS["fp8"](),
                          columnwise_quantizer=MAKERS["fp8"]())(dy)
    dx = general_gemm(hw, hdy, out_dtype=torch.float32, layout="NN")[0]  # W col x dy row
    assert torch.equal(dx, general_gemm(_alone("fp8", w, False), _alone("fp8", dy, True),
                                        out_dtype=torch.float32, layout="NN")[0])
    dw = general_gemm(hx, hdy, out_dtype=torch.float32, layout="NT")[0]  # x col x dy col
    assert torch.equal(dw, general_gemm(_alone("fp8", x, False), _alone("fp8", dy, False),
                                        out_dtype=torch.float32, layout="NT")[0])
    dy_c = _alone("fp8", dy, False).dequantize(dtype=torch.float32).double()
    x_c = _alone("fp8", x, False).dequantize(dtype=torch.float32).double()
    torch.testing.assert_close(dw.double(), dy_c.T @ x_c,
        rtol=1e-5, atol=1e-3)
    hw.update_usage(columnwise_usage=False)
    with pytest.raises(RuntimeError, match="columnwise representation"):
        general_gemm(hw, hdy, out_dtype=torch.float32, layout="NN")


# ----------------------------------------------------------------------------- modules
def _mixed_qfactory(role):
    """fprop MXFP8, dgrad / wgrad per-tensor FP8 (E4M3 operands, E5M2 gradients)."""
    if role is not None and role.module_type in ("linear", "grouped_linear"):
        if role.tensor_type in ("input", "weight"):
            return HybridQuantizer(rowwise_quantizer=MAKERS["mxfp8"](),
                                   columnwise_quantizer=MAKERS["fp8"]())
        if role.tensor_type == "grad_output":
            return Float8CurrentScalingQuantizer(E5M2)
    return MAKERS["mxfp8"]()


def test_linear_gemms_read_each_hybrid_direction_exactly():
    torch.manual_seed(0)
    lin = te.Linear(128, 96, bias=False, params_dtype=BF16)
    x = _x((64, 128), 4).requires_grad_()
    dy = _x((64, 96), 5)
    with te.autocast(enabled=True, recipe=CustomRecipe(qfactory=_mixed_qfactory)):
        y = lin(x)
    y.backward(dy)
    w = lin.weight.detach()
    x0 = x.detach()
    q = _alone
    want_y = general_gemm(q("mxfp8", w, True), q("mxfp8", x0, True), out_dtype=BF16,
                          layout="TN")[0]
    want_dx = general_gemm(q("fp8", w, False), q("fp8", dy, True, E5M2), out_dtype=BF16,
                           layout="NN")[0]
    want_dw = general_gemm(q("fp8", x0, False), q("fp8", dy, False, E5M2), out_dtype=BF16,
                           layout="NT")[0]
    assert torch.equal(y.detach(), want_y)
    assert torch.equal(x.grad, want_dx)
    assert torch.equal(lin.weight.grad, want_dw)
    # and the products are those of the dequantized operands (fp32 accumulation)
    ref = q("mxfp8", x0, True).dequantize(dtype=torch.float32).double() @ \
        q("mxfp8", w, True).dequantize(dtype=torch.float32).double().T
    torch.testing.assert_close(y.double(), ref, rtol=1e-2, atol=1e-2)  # one bf16 rounding


def test_mismatched_formats_in_one_gemm_raise():
    def qfactory(role):
        if role is not None and role.tensor_type == "weight":
            return HybridQuantizer(rowwise_quantizer=MAKERS["fp8"](),
                                   columnwise_quantizer=MAKERS["fp8"]())
        return _mixed_qfactory(role)

    lin = te.Linear(128, 96, bias=False, params_dtype=BF16)
    with te.autocast(enabled=True, recipe=CustomRecipe(qfactory=qfactory)):
        with pytest.raises(ValueError, match=r"fprop GEMM: weight rowwise format \(FP8 per-tensor\)"
                                             r" does not match input rowwise format \(MXFP8\)"):
            lin(_x((64, 128)))


@pytest.mark.parametrize("factory", [mxfp8_fwd_nvfp4_bwd_factory,
                                     mxfp8_fwd_high_precision_bwd_factory])
def test_grouped_linear_with_zoo_factories(factory):
    """Forward: the MXFP8 GEMMs of CustomRecipe(mxfp8_factory) exactly; backward runs (NVFP4 or
    high precision) with finite gradients; mxfp8_fwd_high_precision_bwd's dgrad is dy @ W's
    dequantized MXFP8 value."""
    from transformer_engine_lite.pytorch.custom_recipes.quantizer_factories import mxfp8_factory

    torch.manual_seed(0)
    gl = te.GroupedLinear(2, 128, 64, bias=False, params_dtype=BF16)
    x = _x((96, 128), 6).requires_grad_()
    with te.autocast(enabled=True, recipe=CustomRecipe(qfactory=factory)):
        y = gl(x, [64, 32])
    with te.autocast(enabled=True, recipe=CustomRecipe(qfactory=mxfp8_factory)):
        y_ref = gl(x.detach(), [64, 32])
    assert torch.equal(y.detach(), y_ref)
    dy = _x((96, 64), 7)
    y.backward(dy)
    assert torch.isfinite(x.grad).all() and torch.isfinite(gl.weight0.grad).all()
    if factory is mxfp8_fwd_high_precision_bwd_factory:
        w_deq = _alone("mxfp8", gl.weight1.detach(), True).dequantize()
        want = general_gemm(w_deq, dy[64:], out_dtype=BF16, layout="NN")[0]
        assert torch.equal(x.grad[64:], want)
