"""Quantizers under torch.compile (pytorch.dynamo): value semantics of the registered quantizers,
custom ops taking them inside fullgraph graphs (guarded by value), and TensorSpec building
quantized tensors from data-free descriptions (fake implementations, reassembly of flat outputs).
Compiled results are compared with eager bit for bit: the same kernels run either way."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch._dynamo.utils import counters
from torch._library.opaque_object import get_opaque_type_name
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

import transformer_engine_lite.pytorch as te
import transformer_engine_lite.pytorch.tex as tex
from transformer_engine_lite.pytorch.constants import FP8BwdTensorIdx, FP8FwdTensorIdx
from transformer_engine_lite.pytorch.dynamo import (
    TensorSpec,
    is_value_opaque_quantizer,
    register_value_opaque_quantizer,
    to_tensor_spec,
)

E4M3, E5M2 = te.DType.kFloat8E4M3, te.DType.kFloat8E5M2


def _current(**kw: Any) -> te.Float8CurrentScalingQuantizer:
    return te.Float8CurrentScalingQuantizer(E4M3, torch.device("cpu"), **kw)


def _mxfp8(**kw: Any) -> te.MXFP8Quantizer:
    return te.MXFP8Quantizer(E4M3, **kw)


FACTORIES = {"current": _current, "mxfp8": _mxfp8}


def _bits(t: Any) -> dict[str, torch.Tensor]:
    return {n: getattr(t, n) for n in t._inner_names() if getattr(t, n) is not None}


# ------------------------------------------------------------------------- value semantics
@pytest.mark.parametrize("kind", FACTORIES)
def test_value_equality_follows_configuration(kind):
    make = FACTORIES[kind]
    a, b = make(), make()
    assert a is not b and a == b and hash(a) == hash(b)
    assert is_value_opaque_quantizer(a)
    b.set_usage(columnwise=False)
    assert a != b
    c = make()
    c.internal = True
    assert a != c
    other = te.MXFP8Quantizer(E5M2) if kind == "mxfp8" else _current(amax_epsilon=1e-3)
    assert a != other


def test_unregistered_quantizers_keep_identity():
    scale, amax = torch.ones(1), torch.zeros(1)
    a = te.Float8Quantizer(scale, amax, E4M3)
    b = te.Float8Quantizer(scale, amax, E4M3)
    assert a != b and a == a and not is_value_opaque_quantizer(a)

    class Sub(te.Float8CurrentScalingQuantizer):  # state of its own would be outside the value
        pass

    s1, s2 = Sub(E4M3), Sub(E4M3)
    assert s1 != s2 and not is_value_opaque_quantizer(s1)


@pytest.mark.parametrize("kind", FACTORIES)
def test_fx_repr_rebuilds_an_equal_quantizer(kind):
    q = FACTORIES[kind]()
    q.set_usage(columnwise=False)
    code, globs = q.__fx_repr__()
    rebuilt = eval(code, dict(globs))  # noqa: S307 - the code FX generation would emit
    assert rebuilt == q and rebuilt is not q and type(rebuilt) is type(q)
    assert getattr(rebuilt, "amax_reduction_group", None) is None
    x = torch.randn(64, 96, dtype=torch.bfloat16)
    for name, t in _bits(rebuilt(x)).items():
        assert torch.equal(t, _bits(q(x))[name]), name


def test_process_group_refuses_to_be_a_value():
    import torch.distributed as dist

    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        q = _current(with_amax_reduction=True, amax_reduction_group=dist.group.WORLD)
        for what in (lambda: hash(q), q.__fx_repr__, lambda: q == _current()):
            with pytest.raises(TypeError, match="amax_reduction_group"):
                what()
    finally:
        if created:
            dist.destroy_process_group()


def test_registration_rejects_non_value_annotations():
    class Holder(te.Float8CurrentScalingQuantizer):
        buffer: torch.Tensor

    with pytest.raises(TypeError, match=r"Holder\.buffer"):
        register_value_opaque_quantizer(Holder)


# ------------------------------------------------------------- custom ops under torch.compile
_LIB = torch.library.Library("te_lite_test_dynamo", "DEF")
_QDQ = {}
for _cls in (te.Float8CurrentScalingQuantizer, te.MXFP8Quantizer):
    _name = f"qdq_{_cls.__name__}"
    _LIB.define(f"{_name}(Tensor x, {get_opaque_type_name(_cls)} q) -> Tensor")
    torch.library.impl(f"te_lite_test_dynamo::{_name}", "CompositeExplicitAutograd", lib=_LIB)(
        lambda x, q: q(x).dequantize()
    )
    torch.library.register_fake(f"te_lite_test_dynamo::{_name}", lib=_LIB)(
        lambda x, q: torch.empty_like(x)
    )
    _QDQ[_cls] = getattr(torch.ops.te_lite_test_dynamo, _name)


@pytest.mark.parametrize("kind", FACTORIES)
def test_quantizer_argument_compiles_and_guards_by_value(kind):
    """fullgraph: one graph, no break; a quantizer of another value recompiles (the guard),
    one of the same value reuses the graph."""
    make = FACTORIES[kind]
    q1 = make()
    q2 = te.MXFP8Quantizer(E5M2) if kind == "mxfp8" else _current(force_pow_2_scales=True)
    op = _QDQ[type(q1)]
    g = torch.Generator().manual_seed(3)
    x = torch.randn(64, 128, generator=g).to(torch.bfloat16) * 3.7
    # Seeded: the two current-scaling values quantize alike when 448 / amax is already a power
    # of 2 (an unseeded bf16 input hit amax = 14.0 = 448 / 32 once in CI).

    def fn(inp, q):
        return op(inp, q) * 2

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(fn, fullgraph=True)
    for q in (q1, q2, make()):
        assert torch.equal(compiled(x, q), fn(x, q))
    assert not torch.equal(fn(x, q1), fn(x, q2))  # the two values really differ
    assert counters["stats"]["unique_graphs"] == 2
    assert not counters["graph_break"]


# ------------------------------------------------------------------------------ TensorSpec
SHAPES = [(4, 8), (40, 70), (3, 64, 96)]


@pytest.mark.parametrize("kind", FACTORIES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("usage", [(True, True), (True, False), (False, True)], ids=str)
def test_inner_tensor_specs_describe_the_kernel_output(kind, shape, usage):
    q = FACTORIES[kind](rowwise=usage[0], columnwise=usage[1])
    real = q(torch.randn(*shape, dtype=torch.bfloat16))
    specs = q.inner_tensor_specs(shape)
    assert list(specs) == list(_bits(real))
    for name, t in _bits(real).items():
        assert specs[name] == (tuple(t.shape), t.dtype), name
    with FakeTensorMode():
        fake = TensorSpec(shape, torch.bfloat16, quantizer=q).create_tensor()
    assert all(isinstance(t, FakeTensor) for t in _bits(fake).values())


@pytest.mark.parametrize("kind", FACTORIES)
def test_assemble_rebuilds_a_flat_kernel_output(kind):
    q = FACTORIES[kind]()
    x = torch.randn(3, 64, 96, dtype=torch.bfloat16)
    ref = q(x)
    spec = to_tensor_spec(ref)
    assert spec.is_quantized and spec.quantizer == q and spec.quantizer is not q
    out = spec.assemble([getattr(ref, n) for n in spec.inner_names()])
    assert type(out) is type(ref) and out.shape == ref.shape and out.dtype == torch.bfloat16
    assert torch.equal(out.dequantize(), ref.dequantize())
    # The flatten context keeps the value quantizer and requires_grad.
    names, ctx = ref.requires_grad_(True).__tensor_flatten__()
    back = type(ref).__tensor_unflatten__({n: getattr(ref, n) for n in names}, ctx, x.shape, None)
    assert back._quantizer == q and back.requires_grad


def test_spec_owns_its_quantizer_and_checks_arguments():
    q = _mxfp8()
    spec = TensorSpec((64, 64), torch.float32, quantizer=q)
    spec.update_usage(columnwise_usage=False)
    assert q.columnwise_usage and spec.inner_names() == ("_rowwise_data", "_rowwise_scale_inv")
    with pytest.raises(ValueError, match="inner_tensors: expected 2"):
        spec.assemble([torch.empty(1)])
    plain = to_tensor_spec(torch.empty(2, 3))
    assert not plain.is_quantized and plain.inner_names() == ("data",)
    with pytest.raises(ValueError, match="update_usage"):
        plain.update_usage(rowwise_usage=True)
    with pytest.raises(TypeError, match="to_tensor_spec: tensor"):
        to_tensor_spec([1, 2])
    with pytest.raises(ValueError, match="ctx: expected the dict"):
        te.MXFP8Tensor.__tensor_unflatten__({}, (E4M3, torch.float32), (2, 2), None)


# A custom op returning a quantized tensor as its flat inner tensors; its fake implementation is
# TensorSpec's, and the caller reassembles the tensor inside the compiled graph.
_LIB.define(
    f"quantize_flat(Tensor x, {get_opaque_type_name(te.MXFP8Quantizer)} q) -> Tensor[]"
)


@torch.library.impl("te_lite_test_dynamo::quantize_flat", "CompositeExplicitAutograd", lib=_LIB)
def _quantize_flat(x, q):
    out = q(x)
    return [getattr(out, n) for n in TensorSpec(tuple(x.shape), x.dtype, q).inner_names()]


@torch.library.register_fake("te_lite_test_dynamo::quantize_flat", lib=_LIB)
def _quantize_flat_fake(x, q):
    return TensorSpec(tuple(x.shape), x.dtype, q, device=x.device).create_inner_tensors()


@pytest.mark.parametrize("usage", [(True, True), (False, True)], ids=["both", "columnwise"])
def test_custom_op_returns_a_quantized_tensor_through_tensor_spec(usage):
    q = _mxfp8(rowwise=usage[0], columnwise=usage[1])
    x = torch.randn(96, 64, dtype=torch.bfloat16)

    def fn(inp):
        flat = torch.ops.te_lite_test_dynamo.quantize_flat(inp, q)
        return TensorSpec(tuple(inp.shape), inp.dtype, q, device=inp.device).assemble(flat)

    torch._dynamo.reset()
    counters.clear()
    got = torch.compile(fn, fullgraph=True)(x)
    assert isinstance(got, te.MXFP8Tensor) and not counters["graph_break"]
    ref = q(x)
    for name, t in _bits(ref).items():
        assert torch.equal(getattr(got, name), t), name


# ------------------------------------------------------------------------------ odds and ends
def test_tex_quantize_writes_into_output_and_honours_noop():
    q = _current()
    x = torch.randn(16, 32)
    dst = q.make_empty((16, 32), dtype=torch.float32)
    assert tex.quantize(x, q, dst, torch.zeros(1)) is dst
    assert torch.equal(dst._data, q(x)._data)
    before = dst._data.clone()
    assert tex.quantize(x * 2, q, dst, torch.ones(1)) is dst
    assert torch.equal(dst._data, before)  # noop set: untouched
    assert torch.equal(tex.quantize(x, q).dequantize(), q(x).dequantize())
    with pytest.raises(ValueError, match="noop: expected a one-element tensor"):
        tex.quantize(x, q, dst, torch.zeros(2))


def test_tensor_slot_numbers_are_te_s():
    # TE's FP8FwdTensors / FP8BwdTensors (csrc/common.h): three forward slots per GEMM
    # (input, weight, output), two backward ones (grad output, grad input), as our FP8 meta.
    fwd = [FP8FwdTensorIdx.GEMM1_INPUT, FP8FwdTensorIdx.GEMM1_WEIGHT, FP8FwdTensorIdx.GEMM1_OUTPUT]
    fwd += [FP8FwdTensorIdx.GEMM2_INPUT, FP8FwdTensorIdx.GEMM2_WEIGHT, FP8FwdTensorIdx.GEMM2_OUTPUT]
    assert fwd == list(range(6)) and FP8FwdTensorIdx.GEMM3_OUTPUT == 8
    bwd = [FP8BwdTensorIdx.GRAD_OUTPUT1, FP8BwdTensorIdx.GRAD_INPUT1, FP8BwdTensorIdx.GRAD_OUTPUT2]
    assert bwd == [0, 1, 2] and FP8BwdTensorIdx.GRAD_INPUT3 == 5


@pytest.mark.parametrize("cls", [te.NVFP4Quantizer])
def test_nvfp4_quantizer_is_a_value_type(cls):
    # TE code defines custom ops taking every quantizer class; NVFP4's is a value quantizer:
    # nameable in a schema, compared and hashed by its configuration.
    lib = torch.library.Library("te_lite_test_block_schema", "FRAGMENT")
    lib.define(f"f_{cls.__name__}(Tensor x, {get_opaque_type_name(cls)} q) -> Tensor")
    a, b = cls(with_rht=True, with_post_rht_amax=True), cls(with_rht=True, with_post_rht_amax=True)
    assert a == b and hash(a) == hash(b) and a != cls(stochastic_rounding=True)
