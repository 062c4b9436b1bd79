"""GroupedTensor (TE main's packed multi-tensor storage), tex.group_quantize and
general_grouped_gemm_for_grouped_tensor against independent references: bytes and scales bit for
bit against per-tensor quantization, GEMMs against an fp64 matmul."""

import math

import pytest
import torch

import transformer_engine_lite.pytorch as te
import transformer_engine_lite.pytorch.tex as tex
from transformer_engine_lite.pytorch.cpp_extensions import general_grouped_gemm_for_grouped_tensor
from transformer_engine_lite.pytorch.tensor import (
    Float8BlockQuantizer,
    Float8CurrentScalingQuantizer,
    Float8Quantizer,
    GroupedTensor,
    GroupedTensorStorage,
    MXFP8Quantizer,
)

E4M3 = torch.float8_e4m3fn
FP8_MAX = 448.0


def _quantizers():
    return {
        "delayed": lambda: Float8Quantizer(torch.tensor([2.0]), torch.zeros(1), E4M3),
        "current": lambda: Float8CurrentScalingQuantizer(E4M3),
        "mxfp8": lambda: MXFP8Quantizer(E4M3),
        "block1d": lambda: Float8BlockQuantizer(E4M3, rowwise=True, columnwise=True,
                                                block_scaling_dim=1),
        "block2d": lambda: Float8BlockQuantizer(E4M3, rowwise=True, columnwise=True,
                                                block_scaling_dim=2),
    }


_BUFS = ("_data", "_scale_inv", "_rowwise_data", "_rowwise_scale_inv", "_columnwise_data",
         "_columnwise_scale_inv")


def _bytes(t):
    return {n: getattr(t, n) for n in _BUFS if getattr(t, n, None) is not None}


@pytest.mark.parametrize("first,last,logical", [
    (None, None, (12, 8)),          # 3 x [4, 8]
    ([2, 0, 7], None, (9, 8)),      # rows vary (an empty member too)
    (None, [3, 5, 8], (4, 16)),     # columns vary
    ([1, 2, 3], [4, 5, 6], (1, 32)),  # both vary: 4 + 10 + 18 elements
])
def test_layout_offsets_and_member_views(first, last, logical):
    fd = None if first is None else torch.tensor(first)
    ld = None if last is None else torch.tensor(last)
    g = GroupedTensor.make_grouped_tensor(3, fd, ld, logical[0], logical[1], None, "cpu",
                                          torch.float32)
    rows = first or [logical[0] // 3 if last is None else logical[0]] * 3
    cols = last or [logical[1]] * 3
    shapes = list(zip(rows, cols))
    assert g.tensor_shapes == shapes and g.logical_shape == logical
    want_off = [0]
    for r, c in shapes:
        want_off.append(want_off[-1] + r * c)
    assert g.offsets == want_off
    assert g.all_same_first_dim() == (first is None) and g.all_same_last_dim() == (last is None)
    assert g.varying_both_dims() == (first is not None and last is not None)
    if first is None and last is None:
        assert tuple(g.shape) == (3, *shapes[0]) and g.tensor_offsets is None
    else:
        assert g.tensor_offsets.tolist() == want_off
    members = g.split_into_quantized_tensors()
    for i, (m, s) in enumerate(zip(members, shapes)):
        assert tuple(m.shape) == s
        m.fill_(float(i + 1))  # a member is a view of the packed buffer
    expect = torch.cat([torch.full((r * c,), float(i + 1)) for i, (r, c) in enumerate(shapes)])
    assert torch.equal(g.rowwise_data[: want_off[-1]], expect)


def test_make_with_shapes_and_from_rowwise_data():
    g = GroupedTensorStorage.make_grouped_tensor_with_shapes(2, [(3, 4), (5, 4)], None, "cpu",
                                                             torch.bfloat16)
    assert g.logical_shape == (8, 4) and g.first_dims.tolist() == [3, 5] and g.last_dims is None
    g = GroupedTensorStorage.make_grouped_tensor_with_shapes(2, [(3, 4), (3, 6)], None, "cpu",
                                                             torch.bfloat16)
    assert g.logical_shape == (3, 10) and g.get_common_first_dim() == 3
    buf = torch.arange(24.0)
    w = GroupedTensorStorage.make_grouped_tensor_from_rowwise_data(
        num_tensors=2, tensor_shape=(3, 4), rowwise_data=buf)
    assert isinstance(w, GroupedTensor) and tuple(w.shape) == (2, 3, 4)
    assert torch.equal(w.split_into_quantized_tensors()[1], buf[12:].view(3, 4))
    v = GroupedTensorStorage.make_grouped_tensor_from_rowwise_data(
        num_tensors=4, tensor_shape=(6,), rowwise_data=buf, internal=True)
    assert type(v) is GroupedTensorStorage and v.logical_shape == (24, 1)
    with pytest.raises(ValueError, match="rowwise_data: expected 30 elements"):
        GroupedTensorStorage.make_grouped_tensor_from_rowwise_data(
            num_tensors=2, tensor_shape=(3, 5), rowwise_data=buf)
    with pytest.raises(ValueError, match="dtype"):
        GroupedTensor.make_grouped_tensor(2, None, None, 4, 4, None, "cpu", None)
    with pytest.raises(ValueError, match="multiple of num_tensors"):
        GroupedTensor.make_grouped_tensor(3, None, None, 4, 4, None, "cpu", torch.float32)
    with pytest.raises(ValueError, match="first_dims"):
        GroupedTensor.make_grouped_tensor(3, torch.tensor([1, 2]), None, 3, 4, None, "cpu",
                                          torch.float32)


@pytest.mark.parametrize("kind", list(_quantizers()))
@pytest.mark.parametrize("rows", [[128, 128, 256], [128, 0, 256]])
def test_group_quantize_matches_per_tensor_bytes(kind, rows):
    torch.manual_seed(0)
    x = torch.randn(sum(rows), 256, dtype=torch.bfloat16) * 3
    q = _quantizers()[kind]()
    g = tex.group_quantize(x, q, len(rows), torch.tensor(rows))
    assert isinstance(g, GroupedTensor) and g.quantizer is q
    ref_q = _quantizers()[kind]()
    for i, (m, part) in enumerate(zip(g.split_into_quantized_tensors(), x.split(rows))):
        if part.numel() == 0:
            assert m.numel() == 0
            continue
        ref = _bytes(ref_q(part))
        got = _bytes(m)
        assert got.keys() == ref.keys()
        for name in ref:
            assert torch.equal(got[name].view(torch.uint8), ref[name].view(torch.uint8)), name
        if kind in ("delayed", "current"):
            amax = part.double().abs().max()
            assert g.amax[i].item() == pytest.approx(amax.item(), rel=0, abs=0)
        if kind == "current":  # scale = fp8_max / amax (fp32 division)
            assert g.scale[i].item() == pytest.approx(FP8_MAX / amax.item(), rel=2**-23)
    # the packed row-wise buffer is the members' bytes back to back
    field = "_data" if kind in ("delayed", "current") else "_rowwise_data"
    packed = torch.cat([getattr(ref_q(p), field).reshape(-1).view(torch.uint8)
                        for p in x.split(rows) if p.numel()])
    assert torch.equal(g.rowwise_data.view(torch.uint8)[: packed.numel()], packed)


def test_quantize_in_place_and_noop():
    q = MXFP8Quantizer(E4M3)
    g = GroupedTensor.make_grouped_tensor(2, None, None, 64, 64, q, "cpu", torch.float32)
    data_ptr = g.rowwise_data.data_ptr()
    xs = [torch.randn(32, 64), torch.randn(32, 64)]
    g.quantize(xs)
    assert g.rowwise_data.data_ptr() == data_ptr
    for m, x in zip(g.split_into_quantized_tensors(), xs):
        assert torch.equal(m.dequantize(), q(x).dequantize())
    before = g.rowwise_data.clone()
    g.quantize([torch.randn(32, 64) * 10] * 2, noop_flag=torch.ones(1))
    assert torch.equal(g.rowwise_data, before)
    with pytest.raises(ValueError, match="tensors: expected 2"):
        g.quantize(xs[:1])


def test_torch_ops_on_grouped_parameter():
    q = Float8CurrentScalingQuantizer(E4M3)
    g = GroupedTensor.make_grouped_tensor(3, None, None, 12, 16, q, "cpu", torch.float32)
    xs = [torch.randn(4, 16) for _ in range(3)]
    g.quantize(xs)
    p = torch.nn.Parameter(g)
    assert isinstance(p, GroupedTensor) and p.num_tensors == 3
    stacked = torch.stack([q(x).dequantize() for x in xs])
    assert torch.equal(p.detach() * 1.0, stacked)
    with torch.no_grad():
        p.mul_(2.0)  # dequantize, multiply, requantize into the packed buffers
    want = torch.stack([q(2 * x).dequantize() for x in [s for s in stacked]])
    assert torch.equal(p.detach() + 0.0, want)
    with pytest.raises(RuntimeError, match="shape-changing"):
        p.detach().transpose(0, 1)
    u = GroupedTensor.make_grouped_tensor(2, None, None, 4, 3, None, "cpu", torch.float32)
    assert u.view(-1).data_ptr() == u.rowwise_data.data_ptr()
    v = GroupedTensor.make_grouped_tensor(2, torch.tensor([1, 3]), None, 4, 3, None, "cpu",
                                          torch.float32)
    with pytest.raises(NotImplementedError, match="different shapes"):
        v + 1


def _ref_gemm(a, b, layout):
    """fp64 op(B) @ op(A) in TE's naming."""
    a, b = a.double(), b.double()
    if layout == "TN":
        return b @ a.t()
    if layout == "NN":
        return b @ a
    return b.t() @ a


def _close(got, exact, gemm_part):
    """bf16 output rounded once after the fp32 GEMM and once after the bias add: at most half a
    bf16 ulp (2^-8 relative) of each, plus fp32 accumulation noise."""
    tol = 2.0**-8 * (gemm_part.abs() + exact.abs()) + 1e-6
    assert ((got.double() - exact).abs() <= tol).all()


@pytest.mark.parametrize("layout", ["TN", "NN", "NT"])
@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
def test_grouped_gemm_for_grouped_tensor_vs_fp64(layout, accumulate, with_bias):
    torch.manual_seed(1)
    dt, m_sizes, n, k = torch.bfloat16, [5, 0, 11], 24, 32
    z = len(m_sizes)
    mk = lambda sizes, last: GroupedTensor.make_grouped_tensor(  # noqa: E731
        z, torch.tensor(sizes), None, sum(sizes), last, None, "cpu", dt)
    uni = lambda r, c: GroupedTensor.make_grouped_tensor(  # noqa: E731
        z, None, None, z * r, c, None, "cpu", dt)
    if layout == "NT":  # wgrad: A = input, B = grad_output, out = [n, k] per group
        A, B, out = mk(m_sizes, k), mk(m_sizes, n), uni(n, k)
    else:  # A = weight [n, k]; B = input (TN) / grad_output (NN)
        A, B = uni(n, k), mk(m_sizes, k if layout == "TN" else n)
        out = mk(m_sizes, n if layout == "TN" else k)
    for g in (A, B, out):
        for t in g.split_into_quantized_tensors():
            t.copy_(torch.randn(t.shape))
    out0 = [t.double() for t in out.split_into_quantized_tensors()]
    bias = scale = None
    if with_bias and layout != "NT":
        last = n if layout == "TN" else k
        bias = uni(1, last)
        for t in bias.split_into_quantized_tensors():
            t.copy_(torch.randn(t.shape))
        scale = torch.randn(sum(m_sizes))
    ret = general_grouped_gemm_for_grouped_tensor(A, B, out, layout=layout,
                                                  accumulate=accumulate, bias=bias,
                                                  bias_scale=scale)
    assert ret is out
    row = 0
    for i, (a, b, o) in enumerate(zip(A.split_into_quantized_tensors(),
                                      B.split_into_quantized_tensors(),
                                      out.split_into_quantized_tensors())):
        gemm = _ref_gemm(a, b, layout) + (out0[i] if accumulate else 0)
        exact = gemm.clone()
        if bias is not None:
            bi = bias.split_into_quantized_tensors()[i].double()
            exact = exact + bi * scale[row:row + o.shape[0]].double().unsqueeze(-1)
        _close(o, exact, gemm)
        row += o.shape[0]


def test_grouped_gemm_alpha_beta_discrete_and_errors():
    torch.manual_seed(2)
    z, n, k = 2, 8, 16
    W = [torch.randn(n, k) for _ in range(z)]
    X = GroupedTensor.make_grouped_tensor(z, torch.tensor([3, 4]), None, 7, k, None, "cpu",
                                          torch.float32)
    for t in X.split_into_quantized_tensors():
        t.copy_(torch.randn(t.shape))
    Y = GroupedTensor.make_grouped_tensor(z, torch.tensor([3, 4]), None, 7, n, None, "cpu",
                                          torch.float32)
    for t in Y.split_into_quantized_tensors():
        t.fill_(1.0)
    general_grouped_gemm_for_grouped_tensor(W, X, Y, layout="TN", alpha=torch.tensor([2.0, 3.0]),
                                            beta=torch.tensor([0.5, 0.0]))
    for i, (x, y) in enumerate(zip(X.split_into_quantized_tensors(),
                                   Y.split_into_quantized_tensors())):
        exact = (2.0, 3.0)[i] * (x.double() @ W[i].double().t()) + (0.5, 0.0)[i]
        torch.testing.assert_close(y.double(), exact, rtol=1e-5, atol=1e-5)
    # discrete out (wgrad list) with a zero-token group: the empty sum keeps beta * out
    Xz = GroupedTensor.make_grouped_tensor(z, torch.tensor([0, 7]), None, 7, k, None, "cpu",
                                           torch.float32)
    Yz = GroupedTensor.make_grouped_tensor(z, torch.tensor([0, 7]), None, 7, n, None, "cpu",
                                           torch.float32)
    for t in list(Xz.split_into_quantized_tensors()) + list(Yz.split_into_quantized_tensors()):
        t.copy_(torch.randn(t.shape))
    outs = [torch.ones(n, k), torch.ones(n, k)]
    general_grouped_gemm_for_grouped_tensor(Xz, Yz, outs, layout="NT", accumulate=True)
    assert torch.equal(outs[0], torch.ones(n, k))
    dy, x = Yz.split_into_quantized_tensors()[1], Xz.split_into_quantized_tensors()[1]
    torch.testing.assert_close(outs[1].double(), 1 + dy.double().t() @ x.double(),
                               rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="both lists"):
        general_grouped_gemm_for_grouped_tensor(W, X, [torch.empty(3, n)] * 2)
    with pytest.raises(ValueError, match="bias_scale: given without a bias"):
        general_grouped_gemm_for_grouped_tensor(W, X, Y, bias_scale=torch.ones(7))
    with pytest.raises(ValueError, match="bias: not supported when out is a list"):
        general_grouped_gemm_for_grouped_tensor(Xz, Yz, outs, layout="NT", bias=outs)
    with pytest.raises(NotImplementedError, match="grad=True"):
        general_grouped_gemm_for_grouped_tensor(W, X, Y, grad=True)
    with pytest.raises(ValueError, match="layout"):
        general_grouped_gemm_for_grouped_tensor(W, X, Y, layout="TT")
    with pytest.raises(ValueError, match="alpha: expected a tensor of 1 or 2"):
        general_grouped_gemm_for_grouped_tensor(W, X, Y, alpha=torch.ones(3))


def test_grouped_gemm_mxfp8_grouped_operands_match_discrete():
    """MXFP8 grouped operands give the per-tensor general_grouped_gemm's result bit for bit."""
    torch.manual_seed(3)
    z, n, k, sizes = 2, 64, 64, [32, 64]
    w = [torch.randn(n, k, dtype=torch.bfloat16) for _ in range(z)]
    x = torch.randn(sum(sizes), k, dtype=torch.bfloat16)
    gw = tex.group_quantize(torch.cat(w), MXFP8Quantizer(E4M3, columnwise=False), z, None)
    gx = tex.group_quantize(x, MXFP8Quantizer(E4M3, columnwise=False), z, torch.tensor(sizes))
    out = GroupedTensor.make_grouped_tensor(z, torch.tensor(sizes), None, sum(sizes), n, None,
                                            "cpu", torch.bfloat16)
    general_grouped_gemm_for_grouped_tensor(gw, gx, out, layout="TN")
    q = MXFP8Quantizer(E4M3, columnwise=False)
    ref = [torch.empty(s, n, dtype=torch.bfloat16) for s in sizes]
    te.cpp_extensions.general_grouped_gemm([q(t) for t in w], [q(t) for t in x.split(sizes)],
                                           ref, [None] * z, torch.bfloat16)
    for o, r in zip(out.split_into_quantized_tensors(), ref):
        assert torch.equal(o, r)


def test_tex_helpers_and_rejections():
    assert tex.get_cublasLt_version() == 0  # no cuBLASLt linked
    swz = tex.grouped_mlp_experimental.swizzle_scales_and_pack_ptrs_for_discrete_weights
    with pytest.raises(ValueError, match="swizzle_type"):
        swz([], [], "bogus", "cpu")
    with pytest.raises(ValueError, match="expected as many scale tensors as data tensors"):
        swz([torch.zeros(4, 32, dtype=torch.uint8)], [], "mxfp8_rowwise", "cpu")
    with pytest.raises(ValueError, match=r"expert 1: expected data \(4, 32\)"):
        swz([torch.zeros(4, 32, dtype=torch.uint8), torch.zeros(8, 32, dtype=torch.uint8)],
            [torch.zeros(4, 1, dtype=torch.uint8)] * 2, "mxfp8_rowwise", "cpu")
    with pytest.raises(NotImplementedError, match="last_dims"):
        tex.group_quantize(torch.randn(4, 4), MXFP8Quantizer(E4M3), 2, None,
                           last_dims=torch.tensor([2, 2]))
    # Members may cover fewer rows than the tensor (TE's paged stashing), never more.
    with pytest.raises(ValueError, match="first_dims: expected 2 non-negative entries summing to "
                                         "at most 4 rows"):
        tex.group_quantize(torch.randn(4, 4), MXFP8Quantizer(E4M3), 2, torch.tensor([3, 2]))
    with pytest.raises(NotImplementedError, match="row_scaled_nvfp4"):
        GroupedTensor.make_grouped_tensor(2, None, None, 32, 32, te.tensor.NVFP4Quantizer(
            row_scaled_nvfp4=True), "cpu", torch.float32)
    with pytest.raises(NotImplementedError, match="with_gemm_swizzled_scales"):
        GroupedTensorStorage((4, 4), torch.float32, num_tensors=1,
                             with_gemm_swizzled_scales=True)
    q = MXFP8Quantizer(E4M3)
    q.internal = True
    s = GroupedTensor.make_grouped_tensor(2, None, None, 64, 32, q, "cpu", torch.float32)
    assert type(s) is GroupedTensorStorage  # internal quantizer: storage without the wrapper
    saved, obj = s.prepare_for_saving()
    assert obj is s and s.rowwise_data is None and len(saved) == 10
    assert s.restore_from_saved(saved + ["rest"]) == ["rest"] and s.rowwise_data is saved[0]
    assert math.prod(s.scale_inv.shape) == s.scale_inv_offsets[-1]


def test_grouped_linear_delayed_wgrad_fallback_error():
    """TE's rule: use_grouped_tensor=True that ran the split path cannot deliver delayed
    per-expert bias gradients (is_module_grouped_tensor_path_supported() is False here)."""
    for use_gt, bias, raises in ((True, True, True), (False, True, False), (True, False, False)):
        m = te.GroupedLinear(2, 16, 16, bias=bias, device="cpu", delay_wgrad_compute=True,
                             use_grouped_tensor=use_gt)
        m(torch.randn(8, 16, requires_grad=True), [3, 5]).sum().backward()
        if raises:
            with pytest.raises(RuntimeError, match="implicit fallback is unsupported"):
                m.backward_dw()
        else:
            m.backward_dw()
            assert m.weight0.grad is not None and m.weight1.grad is not None
