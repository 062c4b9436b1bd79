"""bench_core's RMSNorm forward and LayerNorm / RMSNorm backward cases (bf16, the C API through
ctypes on torch tensors) against torch eager. Every output is checked against an fp64 computation
before its time counts: ours within 2x torch's own bf16 error (flash-attention's rule, _common).
The LayerNorm forward cases live in bench_core.py beside the FP8-output ones."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from _capi import workspace_for
from _common import Case, bf16_close, first_error

from transformer_engine_lite.common import capi

EPS = 1e-5


def _inputs(quick: bool):
    rows, hidden = (1024, 1024) if quick else (8192, 4096)
    torch.manual_seed(2)
    x = (torch.randn(rows, hidden) * 2 + 0.5).to(torch.bfloat16)
    gamma = (1 + 0.1 * torch.randn(hidden)).to(torch.bfloat16)
    beta = (0.1 * torch.randn(hidden)).to(torch.bfloat16)
    dz = torch.randn(rows, hidden).to(torch.bfloat16)
    return x, gamma, beta, dz


def _ref64(kind: str, x, gamma, beta, dz):
    """fp64 output and gradients (dx, dgamma[, dbeta]) of the norm at x."""
    xd = x.double().requires_grad_()
    gd = gamma.double().requires_grad_()
    if kind == "layernorm":
        bd = beta.double().requires_grad_()
        y = F.layer_norm(xd, (x.shape[-1],), gd, bd, EPS)
        grads = torch.autograd.grad(y, (xd, gd, bd), dz.double())
    else:
        y = F.rms_norm(xd, (x.shape[-1],), gd, EPS)
        grads = torch.autograd.grad(y, (xd, gd), dz.double())
    return y.detach(), grads


def _torch_bf16(kind: str, x, gamma, beta):
    """torch's bf16 forward with a graph to differentiate, and its parameters."""
    xr, gr, br = (t.clone().requires_grad_() for t in (x, gamma, beta))
    if kind == "layernorm":
        return F.layer_norm(xr, (x.shape[-1],), gr, br, EPS), (xr, gr, br)
    return F.rms_norm(xr, (x.shape[-1],), gr, EPS), (xr, gr)


def case_rmsnorm_fwd(quick: bool) -> Case:
    x, gamma, beta, dz = _inputs(quick)
    z, rsigma = torch.empty_like(x), torch.empty(x.shape[0])
    tx, tg, tz, trs = capi.Tensor(x), capi.Tensor(gamma), capi.Tensor(z), capi.Tensor(rsigma)

    def call(ws):
        capi.call("nvte_rmsnorm_fwd", tx, tg, EPS, tz, trs, ws, 0, False, None)

    ws = workspace_for(call)

    def ref():
        return F.rms_norm(x, (x.shape[-1],), gamma, EPS)

    def check() -> str | None:
        call(ws)
        y64, _ = _ref64("rmsnorm", x, gamma, beta, dz)
        rs64 = torch.rsqrt(x.double().pow(2).mean(-1) + EPS)
        rs_err = None
        if not torch.allclose(rsigma.double(), rs64, rtol=1e-5, atol=1e-6):
            rs_err = "rsigma differs from fp64"
        return first_error(bf16_close(z, ref(), y64, "z"), rs_err)

    return Case(lambda: call(ws), ref, check)


def case_norm_bwd(kind: str, quick: bool) -> Case:
    """nvte_{layernorm,rmsnorm}_bwd against torch autograd's backward of the same bf16 forward
    (the graph is kept, so only the backward is timed on either side)."""
    x, gamma, beta, dz = _inputs(quick)
    rows = x.shape[0]
    mu, rsigma = torch.empty(rows), torch.empty(rows)
    z = torch.empty_like(x)
    dx, dgamma, dbeta = torch.empty_like(x), torch.empty_like(gamma), torch.empty_like(beta)
    tx, tg, tb, tz = capi.Tensor(x), capi.Tensor(gamma), capi.Tensor(beta), capi.Tensor(z)
    tmu, trs, tdz = capi.Tensor(mu), capi.Tensor(rsigma), capi.Tensor(dz)
    tdx, tdg, tdb = capi.Tensor(dx), capi.Tensor(dgamma), capi.Tensor(dbeta)
    if kind == "layernorm":
        def fwd(ws):
            capi.call("nvte_layernorm_fwd", tx, tg, tb, EPS, tz, tmu, trs, ws, 0, False, None)

        def bwd(ws):
            capi.call("nvte_layernorm_bwd", tdz, tx, tmu, trs, tg, tdx, tdg, tdb, ws, 0, False,
                      None)
    else:
        def fwd(ws):
            capi.call("nvte_rmsnorm_fwd", tx, tg, EPS, tz, trs, ws, 0, False, None)

        def bwd(ws):
            capi.call("nvte_rmsnorm_bwd", tdz, tx, trs, tg, tdx, tdg, ws, 0, False, None)

    fwd(workspace_for(fwd))  # mu / rsigma of this x, as a training step saves them
    ws = workspace_for(bwd)
    y, params = _torch_bf16(kind, x, gamma, beta)

    def ref():
        return torch.autograd.grad(y, params, dz, retain_graph=True)

    def check() -> str | None:
        bwd(ws)
        _, grads64 = _ref64(kind, x, gamma, beta, dz)
        base = ref()
        ours = (dx, dgamma, dbeta)
        names = ("dx", "dgamma", "dbeta")
        return first_error(*(bf16_close(o, b, r, n)
                             for o, b, r, n in zip(ours, base, grads64, names)))

    return Case(lambda: bwd(ws), ref, check)


# name: (builder, target ratio); the norms are memory-bound, so parity with torch is the goal
CASES = {
    "rmsnorm_fwd_bf16": (case_rmsnorm_fwd, 1.0),
    "layernorm_bwd_bf16": (lambda q: case_norm_bwd("layernorm", q), 1.0),
    "rmsnorm_bwd_bf16": (lambda q: case_norm_bwd("rmsnorm", q), 1.0),
}
