"""Activation offloading (TE's cpu_offload v2 API).

On the CPU backend the CPU is the compute device, so its saved activations go through the real
transport: copied to new host buffers at offload and copied back into new tensors at reload, as a
CUDA tensor would be (only the device of the copies differs). CPU streams are accepted and their
operations are no-ops (CPU copies are synchronous).
"""

from __future__ import annotations

import contextlib

import pytest
import torch

import transformer_engine_lite.pytorch as te
from transformer_engine_lite.common import recipe
from transformer_engine_lite.pytorch import cpu_offload as co

BIG = (512, 1024)  # 512Ki elements: above TE's 256Ki-element offload threshold


def _values(t):
    return t.dequantize() if isinstance(t, te.QuantizedTensor) else t


def test_cpu_tensors_are_offloaded_on_the_cpu_backend():
    # no CUDA: the CPU is the compute device and its tensors are copied out and back (before,
    # backward got the very tensor: TE's snapshot semantics and its errors were not kept)
    assert not torch.cuda.is_available()
    st = co.OffloadableLayerState()
    x = torch.randn(BIG)
    meta = torch.empty(BIG, device="meta")
    i = st.push_tensor(x)
    assert i == 0 and st.push_tensor(meta) is meta  # meta tensors hold no memory: kept
    st.start_offload()
    st.release_activation_forward_gpu_memory()
    assert st.fwd_tensors == [] and st.get_offloaded_total_size_mb() == pytest.approx(2.0)
    st.start_reload()
    back = st.pop_tensor(i)
    assert back is not x and back.device.type == "cpu" and torch.equal(back, x)
    assert back.data_ptr() != x.data_ptr() != st.cpu_tensors[0].data_ptr()


@pytest.mark.parametrize("make", [torch.cpu.Stream, lambda: torch.Stream(device="cpu")],
                         ids=["cpu.Stream", "Stream(cpu)"])
def test_cpu_streams_are_accepted_and_no_ops(make):
    # TE's documented manual-synchronization example, with the CPU's stream: CPU copies are
    # synchronous, so the stream orders nothing and the results are the unoffloaded ones
    stream = make()
    n = 3
    torch.manual_seed(0)
    layers = [te.Linear(1024, 1024, params_dtype=torch.float32) for _ in range(n)]
    inp = [torch.randn(512, 1024, requires_grad=True) for _ in range(n)]
    ref = []
    for m, x in zip(layers, inp):
        m(x).sum().backward()
        ref.append((x.grad.clone(), m.weight.grad.clone()))
        x.grad, m.weight.grad, m.bias.grad = None, None, None
    ctx, sync, controller = co.get_cpu_offload_context(
        enabled=True, model_layers=n, manual_synchronization=True, offload_stream=stream)
    assert all(s.offload_stream is stream for s in controller.layer_states.values())
    out = []
    for i in range(n):
        with ctx:
            out.append(layers[i](inp[i]))
        out[i] = sync(out[i])
        controller.start_offload_layer(i)
    for i in range(n):
        controller.release_activation_forward_gpu_memory(i)
    assert controller.get_offloaded_total_size_mb() > 0
    for i in reversed(range(n)):
        controller.start_reload_layer(i)
    for i in range(n):
        out[i].sum().backward()
        assert torch.equal(inp[i].grad, ref[i][0]) and torch.equal(layers[i].weight.grad, ref[i][1])


@pytest.mark.parametrize("bad", [object(), "cpu", torch.device("cpu")],
                         ids=["object", "str", "device"])
def test_offload_stream_must_be_a_cpu_stream(bad):
    with pytest.raises(ValueError, match=r"offload_stream: expected a CPU stream .* got "
                       + type(bad).__name__):
        co.get_cpu_offload_context(enabled=True, model_layers=2, manual_synchronization=True,
                                   offload_stream=bad)


def test_layer_state_copies_out_and_back():
    st = co.OffloadableLayerState()
    x = torch.randn(BIG)
    small, param = torch.randn(8), torch.nn.Parameter(torch.randn(BIG))
    kept = torch.randn(BIG)
    co.mark_not_offload(kept)
    f8 = te.tensor.float8_tensor.Float8CurrentScalingQuantizer(te.DType.kFloat8E4M3)(x)
    mx = te.tensor.mxfp8_tensor.MXFP8Quantizer(te.DType.kFloat8E4M3)(x)
    saved = [x, small, param, kept, f8, mx, x]
    ids = [st.push_tensor(t) for t in saved]
    assert ids[1] is small and ids[2] is param and ids[3] is kept  # not offloaded (TE's rules)
    st.start_offload()
    st.release_activation_forward_gpu_memory()
    assert st.fwd_tensors == []  # the device tensors are no longer referenced
    # x once (saved twice), the FP8 bytes, the MXFP8 row- and column-wise bytes (their scales
    # are below the threshold)
    assert st.get_offloaded_total_size_mb() == pytest.approx(2.0 + 0.5 + 0.5 + 0.5)
    x_before = x.clone()
    x.zero_()  # the offloaded copy is the one made at offload time
    st.start_reload()
    back = [st.pop_tensor(i) for i in ids]
    assert back[0] is not x and torch.equal(back[0], x_before)
    assert back[6] is back[0]  # duplicates come back as one tensor
    assert type(back[4]) is type(f8) and type(back[5]) is type(mx)
    assert torch.equal(_values(back[4]), _values(f8)) and torch.equal(_values(back[5]), _values(mx))
    st.release_all_memory()
    assert st.state == "not_offloaded" and st.cpu_tensors == []


def test_views_are_offloaded_as_their_base():
    st = co.OffloadableLayerState()
    base = torch.randn(BIG)
    a, b = base[::2], base[1::2]
    co.start_offload(a, b, offload_base_tensor=True)
    ia, ib = st.push_tensor(a), st.push_tensor(b)
    st.start_offload()
    st.release_activation_forward_gpu_memory()
    assert st.get_offloaded_total_size_mb() == pytest.approx(2.0)  # the base, once
    st.start_reload()
    ra, rb = st.pop_tensor(ia), st.pop_tensor(ib)
    assert torch.equal(ra, a) and torch.equal(rb, b) and ra.stride() == a.stride()
    assert ra.untyped_storage().data_ptr() == rb.untyped_storage().data_ptr()
    with pytest.warns(UserWarning, match="non-contiguous"):  # an unmarked strided view: kept
        st2 = co.OffloadableLayerState()
        t = torch.randn(BIG)[:, ::2]
        assert st2.push_tensor(t) is t


def test_state_machine_errors():
    st = co.OffloadableLayerState()
    with pytest.raises(RuntimeError, match="Invalid state: not_offloaded for start_reload"):
        st.start_reload()
    st.push_tensor(torch.randn(BIG))
    st.start_offload()
    with pytest.raises(RuntimeError, match="Invalid state: offload_started for push_tensor"):
        st.push_tensor(torch.randn(BIG))
    with pytest.raises(RuntimeError, match="for pop_tensor"):
        st.pop_tensor(0)
    with pytest.raises(RuntimeError, match="for start_offload"):
        st.start_offload()


def test_retained_buffers_are_reused_and_checked():
    st = co.OffloadableLayerState(retain_pinned_cpu_buffers=True)
    for _ in range(2):
        x = torch.randn(BIG)
        i = st.push_tensor(x)
        st.start_offload()
        buf = st.cpu_tensors[0]
        st.release_activation_forward_gpu_memory()
        st.start_reload()
        assert torch.equal(st.pop_tensor(i), x)
        st.release_all_memory()
        assert st.cpu_tensors == [buf]
    st.push_tensor(torch.randn(1024, 1024))
    with pytest.raises(ValueError, match="CPU buffer shape does not match"):
        st.start_offload()


def test_default_synchronizer_schedule():
    n = 4
    sync = co.DefaultOffloadSynchronizer(num_layers=n, num_offloaded_layers=2)
    saved = []
    for _ in range(n):
        layer = sync.fwd_step()
        x = torch.randn(BIG)
        saved.append((layer, x, sync.push_tensor(x)))
    st = sync.layer_states
    # layer i's copy-out finishes when layer n - k + i starts (k = 2 offloaded layers)
    assert [st[i].state for i in range(n)] == ["offload_finished", "offload_finished",
                                                "not_offloaded", "not_offloaded"]
    assert saved[2][2] is saved[2][1]  # layers 2 and 3 are not offloaded
    for layer, x, pushed in reversed(saved):
        sync.bwd_step(layer)
        got = sync.pop_tensor(pushed)
        assert torch.equal(got, x) and (got is x) == (layer >= 2)
    sync.finish_part_of_bwd()
    assert all(s.state == "not_offloaded" for s in st.values())
    with pytest.raises(ValueError, match="num_offloaded_layers"):
        co.DefaultOffloadSynchronizer(num_layers=2, num_offloaded_layers=2)


def _model(n):
    torch.manual_seed(0)
    return [te.Linear(1024, 1024, params_dtype=torch.float32) for _ in range(n)]


@pytest.mark.parametrize("rec", [None, recipe.Float8CurrentScaling(), recipe.MXFP8BlockScaling()],
                         ids=["hp", "current", "mxfp8"])
@pytest.mark.parametrize("manual", [False, True])
def test_training_with_offload_is_bit_exact(rec, manual):
    layers, n = _model(3), 3
    x = torch.randn(512, 1024, requires_grad=True)
    autocast = (lambda: te.fp8_autocast(enabled=True, fp8_recipe=rec)) if rec else \
        contextlib.nullcontext

    def run(ctx, sync, controller=None):
        for m in layers:
            m.zero_grad(set_to_none=True)
        x.grad = None
        h = x
        for i, m in enumerate(layers):
            with ctx, autocast():
                h = m(h)
            h = sync(h)
            if controller is not None and i < n - 1:
                controller.start_offload_layer(i)
        if controller is not None:
            for i in range(n - 1):
                controller.release_activation_forward_gpu_memory(i)
            for i in reversed(range(n - 1)):
                controller.start_reload_layer(i)
        h.square().sum().backward()
        return [x.grad.clone()] + [m.weight.grad.clone() for m in layers]

    ref = run(contextlib.nullcontext(), lambda t: t)
    if manual:
        ctx, sync, controller = co.get_cpu_offload_context(
            enabled=True, model_layers=n, manual_synchronization=True)
        assert isinstance(controller, co.ManualOffloadSynchronizer)
    else:
        with pytest.warns(UserWarning, match="not recommended"):
            ctx, sync = co.get_cpu_offload_context(enabled=True, num_layers=2, model_layers=n)
        controller = None
    seen = []
    orig = co.OffloadableLayerState.start_offload

    def counting(self):
        orig(self)
        seen.append(len(self.cpu_tensors))

    co.OffloadableLayerState.start_offload = counting
    try:
        got = run(ctx, sync, controller)
    finally:
        co.OffloadableLayerState.start_offload = orig
    assert len(seen) == 2 and all(k > 0 for k in seen)  # two layers copied something
    for a, b in zip(got, ref):
        assert torch.equal(a, b)
    assert not co.is_cpu_offload_enabled()


def test_context_errors():
    ctx, sync = co.get_cpu_offload_context(enabled=True, num_layers=0, model_layers=2)
    with ctx:
        with pytest.raises(RuntimeError, match="entered without synchronization"):
            ctx.__enter__()
        assert co.is_cpu_offload_enabled()
        y = torch.randn(3, requires_grad=True) * 2
    with pytest.raises(ValueError, match="must require grad"):
        sync(torch.randn(3))
    assert sync(y) is y
    with pytest.raises(ValueError, match="offload_stream: expected a CPU stream"):
        co.get_cpu_offload_context(enabled=True, num_layers=0, model_layers=2,
                                   manual_synchronization=True, offload_stream=object())
    assert co.get_cpu_offload_context(enabled=False, manual_synchronization=True)[2] is None
