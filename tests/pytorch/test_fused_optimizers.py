"""FusedAdam / FusedSGD against torch.optim, and TE's multi-tensor functions through
multi_tensor_applier against pure-torch references (transformer_engine_lite.pytorch.optimizers)."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch

pytest.importorskip(
    "transformer_engine_lite.pytorch.te_lite_ops",
    reason="PyTorch extension not built",
    exc_type=ImportError,
)
from op_helpers import run_opcheck  # noqa: E402

from transformer_engine_lite.pytorch.optimizers import (  # noqa: E402
    FusedAdam,
    FusedSGD,
    multi_tensor_adam,
    multi_tensor_applier,
    multi_tensor_compute_scale_and_scale_inv,
    multi_tensor_l2norm,
    multi_tensor_scale,
    multi_tensor_sgd,
    multi_tensor_unscale_l2norm,
)

# One table: (atol, rtol) of a parameter after a few steps vs torch (fp32: a few ulps of p; the
# low-precision rows: one rounding of the stored dtype, or the state's scaled storage).
TOL = {
    torch.float32: (2e-6, 2e-6),
    torch.bfloat16: (1e-2, 1e-2),
    torch.float16: (1e-3, 1e-3),
    "exp_avg_fp16": (1e-4, 1e-3),
    "exp_avg_bf16": (2e-3, 2e-3),
    "exp_avg_fp8": (2e-2, 5e-2),
}
SHAPES = [(37, 5), (1,), (129,), (3, 7, 11)]
STEPS = 5


def _params(dtype: torch.dtype = torch.float32, seed: int = 0) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=g).to(dtype)) for s in SHAPES]


def _run(opt, params, ref_opt=None, ref_params=None, steps=STEPS, grad_dtype=None, seed=1,
         grad_round=None):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        for i, p in enumerate(params):
            grad = torch.randn(p.shape, generator=g)
            if grad_round is not None:  # the values of grad_round grads, stored in p's dtype
                grad = grad.to(grad_round).float()
            p.grad = grad.to(grad_dtype or p.dtype)
            if ref_params is not None:
                ref_params[i].grad = p.grad.to(ref_params[i].dtype)
        opt.step()
        if ref_opt is not None:
            ref_opt.step()


def _close(actual, expected, tol):
    atol, rtol = tol
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a.float(), e.float(), atol=atol, rtol=rtol)


@pytest.mark.parametrize("adam_w_mode", [True, False])
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
@pytest.mark.parametrize("bias_correction", [True, False])
def test_fused_adam_fp32_matches_torch(adam_w_mode, weight_decay, bias_correction):
    params, ref = _params(), _params()
    opt = FusedAdam(params, lr=1e-2, weight_decay=weight_decay, adam_w_mode=adam_w_mode,
                    bias_correction=bias_correction)
    if bias_correction:
        cls = torch.optim.AdamW if adam_w_mode else torch.optim.Adam
        ref_opt = cls(ref, lr=1e-2, weight_decay=weight_decay)
        _run(opt, params, ref_opt, ref)
        _close(params, ref, TOL[torch.float32])
        for p, q in zip(params, ref):
            _close([opt.state[p]["exp_avg"], opt.state[p]["exp_avg_sq"]],
                   [ref_opt.state[q]["exp_avg"], ref_opt.state[q]["exp_avg_sq"]],
                   TOL[torch.float32])
    else:  # torch has no switch for it: one step by hand
        p0 = [p.detach().clone() for p in params]
        _run(opt, params, steps=1)
        for p, q in zip(params, p0):
            g = p.grad
            if not adam_w_mode:
                g = g + weight_decay * q
            m, v = 0.1 * g, 0.001 * g * g
            upd = m / (v.sqrt() + 1e-8) + (weight_decay * q if adam_w_mode else 0)
            _close([p], [q - 1e-2 * upd], TOL[torch.float32])


@pytest.mark.parametrize("store_param_remainders", [False, True])
def test_fused_adam_bf16_master_weights(store_param_remainders):
    params = _params(torch.bfloat16)
    ref = [torch.nn.Parameter(p.detach().float()) for p in params]
    opt = FusedAdam(params, lr=1e-2, master_weights=True,
                    store_param_remainders=store_param_remainders)
    ref_opt = torch.optim.AdamW(ref, lr=1e-2, weight_decay=0.0)
    _run(opt, params, ref_opt, ref)  # bf16 grads (the same values for the fp32 reference)
    _close(params, ref, TOL[torch.bfloat16])
    for p, q in zip(params, ref):
        master = opt.get_unscaled_state(p, "master_param")
        if store_param_remainders:
            assert master.dtype == torch.int16
        else:
            _close([master], [q], TOL[torch.float32])


@pytest.mark.parametrize("name,dtype", [("exp_avg_fp16", torch.float16),
                                        ("exp_avg_bf16", torch.bfloat16),
                                        ("exp_avg_fp8", torch.uint8)])
def test_fused_adam_low_precision_states(name, dtype):
    params, ref = _params(), _params()
    opt = FusedAdam(params, lr=1e-2, exp_avg_dtype=dtype,
                    exp_avg_sq_dtype=dtype if dtype != torch.uint8 else torch.float16)
    ref_opt = torch.optim.AdamW(ref, lr=1e-2, weight_decay=0.0)
    _run(opt, params, ref_opt, ref)
    _close(params, ref, TOL[name])


def test_fused_adam_fp8_params():
    from transformer_engine_lite.pytorch.tensor.float8_tensor import Float8Quantizer

    hp = _params()
    quantizers = [Float8Quantizer(torch.ones(1) * 8, torch.zeros(1), torch.float8_e4m3fn)
                  for _ in hp]
    params = [torch.nn.Parameter(q(p.detach()), requires_grad=True) for q, p in zip(quantizers, hp)]
    ref = [torch.nn.Parameter(p.dequantize().detach()) for p in params]  # master = FP8 values
    opt = FusedAdam(params, lr=1e-2, master_weights=True)
    ref_opt = torch.optim.AdamW(ref, lr=1e-2, weight_decay=0.0)
    data_before = [p._data.clone() for p in params]
    _run(opt, params, ref_opt, ref, grad_dtype=torch.float32)
    for p, q, d0, r in zip(params, quantizers, data_before, ref):
        master = opt.state[p]["master_param"]
        _close([master], [r], TOL[torch.float32])
        assert not torch.equal(p._data, d0)  # the FP8 bytes were rewritten in place
        expected = (master * 8).to(torch.float8_e4m3fn).view(torch.uint8)
        assert torch.equal(p._data.reshape(-1), expected.reshape(-1))
        assert p._scale_inv.item() == 0.125
        assert q.amax.item() >= master.abs().max().item()


def test_fused_adam_fp8_params_need_master_weights():
    from transformer_engine_lite.pytorch.tensor.float8_tensor import Float8Quantizer

    q = Float8Quantizer(torch.ones(1), torch.zeros(1), torch.float8_e4m3fn)
    p = torch.nn.Parameter(q(torch.randn(8)), requires_grad=True)
    p.grad = torch.randn(8)
    with pytest.raises(ValueError, match="master_weights"):
        FusedAdam([p]).step()


def test_fused_adam_capturable_matches_plain():
    params, ref = _params(), _params()
    opt = FusedAdam(params, lr=1e-2, capturable=True)
    ref_opt = FusedAdam(ref, lr=1e-2)
    _run(opt, params, ref_opt, ref)
    _close(params, ref, (0.0, 0.0))
    assert int(opt.param_groups[0]["step"]) == STEPS


def test_fused_adam_decoupled_grad_and_zero_grad():
    params, ref = _params(), _params()
    opt = FusedAdam(params, lr=1e-2, use_decoupled_grad=True)
    ref_opt = torch.optim.AdamW(ref, lr=1e-2, weight_decay=0.0)
    g = torch.Generator().manual_seed(3)
    for p, q in zip(params, ref):
        p.decoupled_grad = torch.randn(p.shape, generator=g)
        q.grad = p.decoupled_grad.clone()
    opt.step()
    ref_opt.step()
    _close(params, ref, TOL[torch.float32])
    opt.zero_grad()
    assert all(p.decoupled_grad is None for p in params)
    with pytest.warns(DeprecationWarning):
        opt2 = FusedAdam(_params(), set_grad_none=True)
    with pytest.raises(ValueError, match="set_grad_none"):
        opt2.zero_grad(set_to_none=False)


@pytest.mark.parametrize("exp_avg_dtype", [torch.float32, torch.float16, torch.uint8])
def test_fused_adam_state_dict_round_trip(exp_avg_dtype):
    params = _params(torch.bfloat16)
    opt = FusedAdam(params, lr=1e-2, master_weights=True, exp_avg_dtype=exp_avg_dtype)
    _run(opt, params, steps=2)
    sd = copy.deepcopy(opt.state_dict())
    for v in sd["state"].values():
        assert all(t.dtype == torch.float32 for t in v.values())
    params2 = [torch.nn.Parameter(p.detach().clone()) for p in params]
    opt2 = FusedAdam(params2, lr=1e-2, master_weights=True, exp_avg_dtype=exp_avg_dtype)
    opt2.load_state_dict(sd)
    for p, q in zip(params, params2):
        for name in ("exp_avg", "exp_avg_sq", "master_param"):
            _close([opt2.get_unscaled_state(q, name)], [opt.get_unscaled_state(p, name)],
                   TOL["exp_avg_fp8"] if exp_avg_dtype == torch.uint8 else (0.0, 0.0))
    _run(opt, params, steps=1, seed=9)
    _run(opt2, params2, steps=1, seed=9)
    _close(params2, params, TOL[torch.bfloat16])


def test_fused_adam_bad_arguments():
    with pytest.raises(RuntimeError, match="AMSGrad"):
        FusedAdam(_params(), amsgrad=True)
    with pytest.raises(ValueError, match="master_weight_dtype"):
        FusedAdam(_params(), master_weights=True, master_weight_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="exp_avg_dtype"):
        FusedAdam(_params(), exp_avg_dtype=torch.float64)
    with pytest.raises(ValueError, match="exp_avg_sq_dtype"):
        FusedAdam(_params(), capturable=True, exp_avg_sq_dtype=torch.float16)
    with pytest.raises(ValueError, match="betas"):
        FusedAdam(_params(), betas=(1.5, 0.9))
    p = torch.nn.Parameter(torch.randn(3, dtype=torch.float64))
    p.grad = torch.randn(3, dtype=torch.float64)
    with pytest.raises(TypeError, match="params"):
        FusedAdam([p]).step()


@pytest.mark.parametrize("momentum,dampening,nesterov,weight_decay", [
    (0.0, 0.0, False, 0.0), (0.9, 0.0, False, 0.01), (0.9, 0.1, False, 0.0),
    (0.9, 0.0, True, 0.01)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_sgd_matches_torch(momentum, dampening, nesterov, weight_decay, dtype):
    params, ref = _params(dtype), _params(dtype)
    kw = dict(lr=0.1, momentum=momentum, dampening=dampening, nesterov=nesterov,
              weight_decay=weight_decay)
    opt, ref_opt = FusedSGD(params, **kw), torch.optim.SGD(ref, **kw)
    _run(opt, params, ref_opt, ref)
    if dtype == torch.float32:
        _close(params, ref, TOL[dtype])
        return
    # bf16: torch rounds every op to bf16, we compute in fp32 and round once per buffer: bound our
    # error against an fp32 run by twice torch's own (STYLE.md 11).
    hi = [torch.nn.Parameter(p.float()) for p in _params(dtype)]
    hi_opt = torch.optim.SGD(hi, **kw)
    _run(hi_opt, hi, grad_round=dtype)
    for p, q, h in zip(params, ref, hi):
        assert (p.float() - h).abs().max() <= 2 * (q.float() - h).abs().max() + 1e-6


def test_fused_sgd_fp16_matches_torch_bitwise():
    """fp16 weights: the step -lr * g is rounded to fp16 before it is added (TE's kernel). With a
    power-of-two lr and momentum that is exactly torch's update from its rounded fp16 buffer, so
    the two agree bit for bit; an update added in fp32 (one rounding) drifts by ulps per step."""
    params, ref = _params(torch.float16), _params(torch.float16)
    kw = dict(lr=0.25, momentum=0.125)
    opt, ref_opt = FusedSGD(params, **kw), torch.optim.SGD(ref, **kw)
    _run(opt, params, ref_opt, ref, steps=7)
    _close(params, ref, (0.0, 0.0))
    _close([opt.state[p]["momentum_buffer"] for p in params],
           [ref_opt.state[p]["momentum_buffer"] for p in ref], (0.0, 0.0))


def test_fused_sgd_bad_arguments():
    with pytest.raises(ValueError, match="momentum"):
        FusedSGD(_params(), lr=0.1, momentum=-1.0)
    with pytest.raises(ValueError, match="nesterov"):
        FusedSGD(_params(), lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="lr"):
        FusedSGD(_params(), lr=-0.1)


# ---- multi_tensor_applier with each op against pure torch
def _tensors(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g).to(dtype) for s in [(70000,), (5, 3), (1,), (0,)]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_scale_and_overflow_flag(dtype):
    src = _tensors(dtype)
    dst = [torch.empty_like(t, dtype=torch.float32) for t in src]
    buf = torch.zeros(1, dtype=torch.int)
    multi_tensor_applier(multi_tensor_scale, buf, [src, dst], 0.5)
    _close(dst, [t.float() * 0.5 for t in src], (0.0, 0.0))
    assert buf.item() == 0
    src[1][0, 0] = float("nan")
    multi_tensor_applier(multi_tensor_scale, buf, [src, dst], 0.5)
    assert buf.item() == 1


def test_megatron_shaped_use():
    """Megatron's clip_grads: l2 norm of the grads, then in-place scale by the clip coefficient."""
    grads = _tensors()
    ref = [g.clone() for g in grads]
    buf = torch.zeros(1, dtype=torch.int)
    grad_norm, _ = multi_tensor_applier(multi_tensor_l2norm, buf, [grads], False)
    total = torch.linalg.vector_norm(torch.cat([g.flatten() for g in ref]))
    torch.testing.assert_close(grad_norm, total.reshape(1), atol=1e-5, rtol=1e-6)
    clip_coeff = 1.0 / (grad_norm.item() + 1e-6)
    multi_tensor_applier(multi_tensor_scale, buf, [grads, grads], clip_coeff)
    _close(grads, [g * clip_coeff for g in ref], (1e-7, 1e-6))


def test_l2norm_per_tensor_and_unscale():
    xs = _tensors(torch.bfloat16)
    buf = torch.zeros(1, dtype=torch.int)
    norm, per = multi_tensor_applier(multi_tensor_l2norm, buf, [xs], True)
    ref = torch.stack([torch.linalg.vector_norm(x.float()) for x in xs])
    torch.testing.assert_close(per, ref, atol=1e-5, rtol=1e-5)
    inv = torch.tensor([0.25])
    norm2, per2 = multi_tensor_applier(multi_tensor_unscale_l2norm, buf, [xs], inv, True)
    torch.testing.assert_close(norm2, norm * 0.25, atol=1e-5, rtol=1e-5)
    assert per2.shape == (len(xs),)
    _, none = multi_tensor_applier(multi_tensor_l2norm, buf, [xs], False)
    assert none.numel() == 0


def test_multi_tensor_adam_and_sgd_functions():
    p = _tensors()
    g = _tensors(seed=1)
    m = [torch.zeros_like(t) for t in p]
    v = [torch.zeros_like(t) for t in p]
    ref = [torch.nn.Parameter(t.clone()) for t in p]
    ref_opt = torch.optim.Adam(ref, lr=1e-3, weight_decay=0.01)
    for r, gg in zip(ref, g):
        r.grad = gg.clone()
    ref_opt.step()
    buf = torch.zeros(1, dtype=torch.int)
    multi_tensor_applier(multi_tensor_adam, buf, [g, p, m, v], 1e-3, 0.9, 0.999, 1e-8, 1, 0, 1,
                         0.01)
    _close(p, ref, TOL[torch.float32])
    w, mom = _tensors(), [torch.zeros_like(t) for t in p]
    w_ref = [t.clone() - 0.1 * gg for t, gg in zip(w, g)]
    multi_tensor_applier(multi_tensor_sgd, buf, [g, w, mom], 0.0, 0.9, 0.0, 0.1, False, True,
                         False, 1.0)
    _close(w, w_ref, TOL[torch.float32])
    _close(mom, g, (0.0, 0.0))


def test_compute_scale_and_scale_inv():
    amax = [torch.tensor([0.0, 1.0, 3.0]), torch.tensor([float("inf")])]
    scale = [torch.empty_like(a) for a in amax]
    scale_inv = [torch.empty_like(a) for a in amax]
    buf = torch.zeros(1, dtype=torch.int)
    multi_tensor_applier(multi_tensor_compute_scale_and_scale_inv, buf, [amax, scale, scale_inv],
                         448.0, True, 0.0)
    assert scale[0].tolist() == [1.0, 256.0, 128.0] and scale[1].tolist() == [1.0]
    assert scale_inv[0].tolist() == [1.0, 1 / 256, 1 / 128]


def test_tex_multi_tensor_names():
    """TE code calls these as transformer_engine_torch.multi_tensor_* (our pytorch.tex)."""
    from transformer_engine_lite.pytorch import optimizers, tex

    for name in ("multi_tensor_scale", "multi_tensor_l2norm", "multi_tensor_unscale_l2norm",
                 "multi_tensor_adam", "multi_tensor_adam_param_remainder",
                 "multi_tensor_adam_fp8", "multi_tensor_adam_capturable",
                 "multi_tensor_adam_capturable_master", "multi_tensor_sgd",
                 "multi_tensor_compute_scale_and_scale_inv"):
        assert getattr(tex, name) is getattr(optimizers, name)
    with pytest.raises(AttributeError, match="multi_tensor_nope"):
        tex.multi_tensor_nope  # noqa: B018


def test_multi_tensor_bad_inputs():
    buf = torch.zeros(1, dtype=torch.int)
    x = [torch.randn(4)]
    with pytest.raises(ValueError, match="tensor_lists: expected 2 lists"):
        multi_tensor_applier(multi_tensor_scale, buf, [x], 1.0)
    with pytest.raises(TypeError, match="tensor_lists"):
        multi_tensor_applier(multi_tensor_scale, buf, x, 1.0)
    with pytest.raises(RuntimeError, match=r"tensor_lists\[2\]\[0\] \(exp_avg\)"):
        multi_tensor_applier(multi_tensor_adam, buf, [x, x, [torch.zeros(4).half()], x],
                             1e-3, 0.9, 0.999, 1e-8, 1, 1, 1, 0.0)
    with pytest.raises(RuntimeError, match="'outputs'"):
        multi_tensor_applier(multi_tensor_scale, buf, [x, []], 1.0)
    with pytest.raises(RuntimeError, match="contiguous"):
        multi_tensor_applier(multi_tensor_scale, buf, [[torch.randn(4, 4).t()], x], 1.0)
    with pytest.raises(RuntimeError, match="noop_flag"):
        multi_tensor_applier(multi_tensor_scale, torch.zeros(1), [x, x], 1.0)


# ---- opcheck cases of the te_lite multi-tensor ops (collected by test_ops.py's coverage check)
def _mt(*shapes, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g).to(dtype) for s in shapes]


def _flag():
    return torch.zeros(1, dtype=torch.int32)


_C = 2048 * 32
_ADAM = (1e-3, 0.9, 0.999, 1e-8, 2, 1, 1, 0.01)
MULTI_TENSOR_OPCHECK_CASES: list[tuple[str, str, Callable[[], tuple]]] = [
    ("multi_tensor_scale", "bf16-to-fp32",
     lambda: (_C, _flag(), _mt(5, 7, dtype=torch.bfloat16), _mt(5, 7), 0.5)),
    ("multi_tensor_l2norm", "per-tensor", lambda: (_C, _flag(), _mt(5, 70), True)),
    ("multi_tensor_unscale_l2norm", "fp16",
     lambda: (_C, _flag(), _mt(5, 7, dtype=torch.float16), torch.tensor([0.5]), False)),
    ("multi_tensor_adam", "fp32",
     lambda: (_C, _flag(), _mt(5, 7), _mt(5, 7, seed=1), _mt(5, 7, seed=2),
              [t.abs() for t in _mt(5, 7, seed=3)], [], *_ADAM)),
    ("multi_tensor_adam", "bf16-master",
     lambda: (_C, _flag(), _mt(6, dtype=torch.bfloat16), _mt(6, dtype=torch.bfloat16, seed=1),
              _mt(6, seed=2), [t.abs() for t in _mt(6, seed=3)], _mt(6, seed=1), *_ADAM)),
    ("multi_tensor_adam_param_remainder", "bf16",
     lambda: (_C, _flag(), _mt(6), _mt(6, dtype=torch.bfloat16, seed=1), _mt(6, seed=2),
              [t.abs() for t in _mt(6, seed=3)], [torch.zeros(6, dtype=torch.int16)], *_ADAM)),
    ("multi_tensor_adam_fp8", "e4m3",
     lambda: (_C, _flag(), _mt(6), [torch.zeros(6, dtype=torch.uint8)], _mt(6, seed=2),
              [t.abs() for t in _mt(6, seed=3)], _mt(6, seed=1), [torch.ones(1)],
              [torch.zeros(1)], [torch.ones(1)], *_ADAM, torch.float8_e4m3fn)),
    ("multi_tensor_adam_capturable", "fp32",
     lambda: (_C, _flag(), _mt(6), _mt(6, seed=1), _mt(6, seed=2),
              [t.abs() for t in _mt(6, seed=3)], [], torch.tensor([1e-3]), 0.9, 0.999, 1e-8,
              torch.tensor([2], dtype=torch.int32), 1, 1, 0.0, torch.ones(1))),
    ("multi_tensor_sgd", "fp32-momentum",
     lambda: (_C, _flag(), _mt(6), _mt(6, seed=1), _mt(6, seed=2), [], 0.01, 0.9, 0.0, 0.1,
              False, False, False, 1.0)),
    ("multi_tensor_compute_scale_and_scale_inv", "fp32",
     lambda: (_C, _flag(), [torch.tensor([0.5, 2.0])], [torch.empty(2)], [torch.empty(2)],
              448.0, False, 0.0)),
]


@pytest.mark.parametrize(
    "name,factory",
    [(c[0], c[2]) for c in MULTI_TENSOR_OPCHECK_CASES],
    ids=[f"{c[0]}-{c[1]}" for c in MULTI_TENSOR_OPCHECK_CASES],
)
def test_opcheck(name, factory):
    run_opcheck(name, factory())
