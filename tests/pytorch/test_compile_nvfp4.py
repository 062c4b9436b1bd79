"""NVFP4Quantizer under torch.compile (TE's test_torch_compile taught these): TensorSpec allocation
traces with fullgraph=True, a quantizer rebuilt from its value key (the code dynamo generates) keeps
the attributes derived from the value, and quantizing inside a compiled graph gives eager's bytes.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters
from torch._library.opaque_object import get_opaque_type_name

import transformer_engine_lite.pytorch as te
from transformer_engine_lite.pytorch.dynamo import TensorSpec, is_value_opaque_quantizer
from transformer_engine_lite.pytorch.dynamo.quantizer_opaque import _rebuild_quantizer

_BUFFERS = ("_rowwise_data", "_rowwise_scale_inv", "_columnwise_data", "_columnwise_scale_inv",
            "_amax_rowwise", "_amax_columnwise")


def _quantizer(**kw) -> te.NVFP4Quantizer:
    # TE's test default: RHT on the column-wise copy (post-RHT amax, what the kernel supports).
    return te.NVFP4Quantizer(with_rht=True, with_post_rht_amax=True, **kw)


def test_tensor_spec_create_tensor_traces_fullgraph():
    # NVFP4Quantizer's class holds staticmethods; looking its value fields up in the class
    # __dict__ made dynamo wrap that dict and fail on them (graph break under fullgraph=True).
    q = _quantizer()

    def fn(x):
        spec = TensorSpec(shape=tuple(x.shape), dtype=x.dtype, quantizer=q)
        t = spec.create_tensor()
        return [getattr(t, n) for n in spec.inner_names()]

    x = torch.zeros(32, 64, dtype=torch.bfloat16)
    torch._dynamo.reset()
    got = torch.compile(fn, fullgraph=True)(x)
    want = fn(x)
    assert [(tuple(g.shape), g.dtype) for g in got] == [(tuple(w.shape), w.dtype) for w in want]
    assert len(got) == len(_BUFFERS)


def test_rebuilt_quantizer_has_derived_state():
    # Dynamo bakes a value quantizer into generated code as _rebuild_quantizer(cls, items), which
    # bypasses __init__: the RHT matrix (derived from the sign mask) must come back too.
    for mask in (True, False):
        q = _quantizer(with_random_sign_mask=mask)
        r = _rebuild_quantizer(type(q), q._value_key()[1])
        assert r == q and hash(r) == hash(q)
        assert r.amax_reduction_group is None
        assert torch.equal(r.rht_matrix, q.rht_matrix)
        assert r.rht_matrix.dtype == torch.bfloat16


def test_unregistered_subclass_keeps_identity_semantics():
    # Value semantics belong to the registered class only: a subclass's extra state would not be
    # in the key, so it compares by identity until it registers itself.
    class Sub(te.NVFP4Quantizer):
        pass

    a, b = Sub(), Sub()
    assert a != b and a == a
    assert hash(a) != hash(b)
    assert not is_value_opaque_quantizer(a)
    assert is_value_opaque_quantizer(te.NVFP4Quantizer())


# A custom op taking the quantizer (TE's pattern: a quantizer is a value a schema can name);
# calling a quantizer object directly in a graph is not traceable for any quantizer class.
_LIB = torch.library.Library("te_lite_test_nvfp4", "FRAGMENT")
_LIB.define(
    f"quantize_bytes(Tensor x, {get_opaque_type_name(te.NVFP4Quantizer)} q) -> Tensor[]"
)


def _quantize_bytes(x: torch.Tensor, q: te.NVFP4Quantizer) -> list[torch.Tensor]:
    t = q(x)
    return [getattr(t, n) for n in _BUFFERS if getattr(t, n) is not None]


def _quantize_bytes_fake(x: torch.Tensor, q: te.NVFP4Quantizer) -> list[torch.Tensor]:
    # The data-free primitives describe exactly the buffers the kernel writes.
    specs = q.inner_tensor_specs(tuple(x.shape))
    return [torch.empty(specs[n][0], dtype=specs[n][1], device=x.device)
            for n in _BUFFERS if n in specs]


_LIB.impl("quantize_bytes", _quantize_bytes, "CompositeExplicitAutograd")
torch.library.register_fake("te_lite_test_nvfp4::quantize_bytes", _quantize_bytes_fake, lib=_LIB)


@pytest.mark.parametrize(
    "kw", [{}, {"with_2d_quantization": True}, {"columnwise": False}], ids=["1d", "2d", "rowwise"]
)
def test_quantize_compiled_matches_eager(kw):
    # Same kernel either way (the core's quantize_nvfp4 op): the bytes, scales and amaxes must be
    # identical, not close; the quantizer is baked in by value (a different one recompiles).
    q = _quantizer(**kw)
    other = _quantizer(**{**kw, "with_random_sign_mask": False})
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(64, 128, dtype=torch.bfloat16, generator=gen) * 3

    def fn(inp, quantizer):
        return torch.ops.te_lite_test_nvfp4.quantize_bytes(inp, quantizer)

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(fn, fullgraph=True)
    for quantizer in (q, other, _quantizer(**kw)):
        got, want = compiled(x, quantizer), _quantize_bytes(x, quantizer)
        assert len(got) == len(want) == (3 if kw.get("columnwise") is False else 6)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and torch.equal(g, w)
    assert counters["stats"]["unique_graphs"] == 2
    assert not counters["graph_break"]
    if kw.get("columnwise") is not False:  # the sign mask changes the column-wise (RHT) copy
        assert not torch.equal(_quantize_bytes(x, q)[2], _quantize_bytes(x, other)[2])
