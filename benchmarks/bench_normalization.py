"""Times nvte_layernorm_fwd / nvte_rmsnorm_fwd / *_bwd (CPU) against torch on the same buffers.

Usage: python benchmarks/bench_normalization.py [path/to/libtransformer_engine_lite.so] [--compile]
Calls the C API through ctypes on torch tensors' memory; prints best-of-N milliseconds and ratios.
--compile also times the LayerNorm + FP8-cast composite under torch.compile (slow to compile).
"""

import ctypes
import json
import sys
import time

import torch
import torch.nn.functional as F

ARGS = [a for a in sys.argv[1:] if not a.startswith("--")]
COMPILE = "--compile" in sys.argv
LIB = ARGS[0] if ARGS else "transformer_engine_lite/libtransformer_engine_lite.so"
lib = ctypes.CDLL(LIB)

NVTE_MAX_NDIM = 8
DT = {torch.float32: 4, torch.float16: 5, torch.bfloat16: 6, torch.float8_e4m3fn: 7,
      torch.float8_e5m2: 8, torch.uint8: 0}
ROWWISE, SCALE, AMAX, SCALE_INV = 0, 2, 3, 4


class Shape(ctypes.Structure):
    _fields_ = [("data", ctypes.c_size_t * NVTE_MAX_NDIM), ("ndim", ctypes.c_size_t)]


class Basic(ctypes.Structure):
    _fields_ = [("data_ptr", ctypes.c_void_p), ("dtype", ctypes.c_int), ("shape", Shape)]


lib.nvte_create_tensor.restype = ctypes.c_void_p
lib.nvte_create_tensor.argtypes = [ctypes.c_int]
lib.nvte_set_tensor_param.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                                      ctypes.POINTER(Basic)]
lib.nvte_get_last_error.restype = ctypes.c_char_p
V = ctypes.c_void_p
lib.nvte_layernorm_fwd.argtypes = [V, V, V, ctypes.c_float, V, V, V, V, ctypes.c_int,
                                   ctypes.c_bool, V]
lib.nvte_rmsnorm_fwd.argtypes = [V, V, ctypes.c_float, V, V, V, ctypes.c_int, ctypes.c_bool, V]
lib.nvte_layernorm_bwd.argtypes = [V, V, V, V, V, V, V, V, V, ctypes.c_int, ctypes.c_bool, V]
lib.nvte_rmsnorm_bwd.argtypes = [V, V, V, V, V, V, V, ctypes.c_int, ctypes.c_bool, V]


def tensor(t=None, **params):
    """NVTETensor over torch tensors: rowwise data `t` and extra params (scale=..., amax=...)."""
    h = ctypes.c_void_p(lib.nvte_create_tensor(0))
    slots = {ROWWISE: t, SCALE: params.get("scale"), AMAX: params.get("amax"),
             SCALE_INV: params.get("scale_inv")}
    for slot, v in slots.items():
        if v is None:
            continue
        b = Basic(v.data_ptr(), DT[v.dtype], Shape((ctypes.c_size_t * 8)(*v.shape), v.dim()))
        assert lib.nvte_set_tensor_param(ctypes.byref(h), slot, ctypes.byref(b)) == 0
    return h


def check(st):
    if st != 0:
        raise RuntimeError(lib.nvte_get_last_error().decode())


def bench(f, n=10):
    f()
    f()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    return min(ts) * 1e3


def main():
    torch.manual_seed(0)
    R, H = 8192, 4096
    x = torch.randn(R, H).bfloat16()
    g = torch.randn(H).bfloat16()
    b = torch.randn(H).bfloat16()
    mu = torch.empty(R)
    rs = torch.empty(R)
    z = torch.empty(R, H, dtype=torch.bfloat16)
    X, G, B, MU, RS = tensor(x), tensor(g), tensor(b), tensor(mu), tensor(rs)
    Z = tensor(z)
    ws = torch.empty(1, dtype=torch.uint8)
    WS = tensor(ws)
    print(f"threads {torch.get_num_threads()}, x bf16 [{R}, {H}]")
    lib.nvte_get_build_info.restype = ctypes.c_char_p
    info = json.loads(lib.nvte_get_build_info().decode())
    isa = info["cpu_isa"]
    print(f"CPU level: ours {isa['level']} (detected {isa['detected']}, clone {isa['clone']}), "
          f"oneDNN {info['onednn_isa']}")

    def ln(zt):
        check(lib.nvte_layernorm_fwd(X, G, B, 1e-5, zt, MU, RS, WS, 0, False, None))

    t_ours = bench(lambda: ln(Z))
    t_torch = bench(lambda: F.layer_norm(x, (H,), g, b, 1e-5))
    ref = F.layer_norm(x.float(), (H,), g.float(), b.float(), 1e-5)
    print(f"layernorm fwd bf16->bf16: ours {t_ours:.1f} ms, torch {t_torch:.1f} ms, "
          f"speedup {t_torch / t_ours:.2f}x, max err {(z.float() - ref).abs().max():.3g}")

    scale = torch.tensor([448.0 / ref.abs().max().item()])
    amax, sinv = torch.zeros(1), torch.zeros(1)
    q = torch.empty(R, H, dtype=torch.float8_e4m3fn)
    Q = tensor(q, scale=scale, amax=amax, scale_inv=sinv)
    t_fp8 = bench(lambda: ln(Q))

    def composite():
        y = F.layer_norm(x, (H,), g, b, 1e-5)
        a = y.abs().amax().float()
        s = 448.0 / a
        return (y.float() * s).clamp(-448, 448).to(torch.float8_e4m3fn), a

    t_comp = bench(composite)
    q_ref, _ = composite()
    mismatch = (q.view(torch.uint8) != q_ref.view(torch.uint8)).float().mean().item()
    print(f"layernorm fwd bf16->e4m3: ours {t_fp8:.1f} ms, torch composite {t_comp:.1f} ms, "
          f"speedup {t_comp / t_fp8:.2f}x (bytes differing from torch: {mismatch:.2%}, "
          f"amax ours {amax.item():.6g})")
    if COMPILE:
        compiled = torch.compile(composite)
        t_compiled = bench(compiled)
        print(f"layernorm fwd bf16->e4m3: torch.compile composite {t_compiled:.1f} ms, "
              f"speedup {t_compiled / t_fp8:.2f}x")

    def rms(zt):
        check(lib.nvte_rmsnorm_fwd(X, G, 1e-5, zt, RS, WS, 0, False, None))

    t_rms = bench(lambda: rms(Z))
    t_rms_torch = bench(lambda: F.rms_norm(x, (H,), g, 1e-5))
    print(f"rmsnorm fwd bf16->bf16: ours {t_rms:.1f} ms, torch {t_rms_torch:.1f} ms, "
          f"speedup {t_rms_torch / t_rms:.2f}x")

    # Backward: query the workspace, then time.
    dz = torch.randn(R, H).bfloat16()
    dx = torch.empty_like(x)
    dg, db = torch.empty_like(g), torch.empty_like(b)
    DZ, DX, DG, DB = tensor(dz), tensor(dx), tensor(dg), tensor(db)
    q_ws = ctypes.c_void_p(lib.nvte_create_tensor(0))
    ln(Z)
    check(lib.nvte_layernorm_bwd(DZ, X, MU, RS, G, DX, DG, DB, q_ws, 0, False, None))
    lib.nvte_tensor_shape.restype = Shape
    lib.nvte_tensor_shape.argtypes = [V]
    shp = lib.nvte_tensor_shape(q_ws)
    wsb = torch.empty([shp.data[i] for i in range(shp.ndim)], dtype=torch.float32)
    WSB = tensor(wsb)
    t_bwd = bench(lambda: check(lib.nvte_layernorm_bwd(DZ, X, MU, RS, G, DX, DG, DB, WSB, 0, False,
                                                       None)))
    xr = x.clone().requires_grad_()
    gr, br = g.clone().requires_grad_(), b.clone().requires_grad_()
    y = F.layer_norm(xr, (H,), gr, br, 1e-5)

    def torch_bwd():
        torch.autograd.grad(y, (xr, gr, br), dz, retain_graph=True)

    t_bwd_torch = bench(torch_bwd)
    print(f"layernorm bwd bf16: ours {t_bwd:.1f} ms, torch {t_bwd_torch:.1f} ms, "
          f"speedup {t_bwd_torch / t_bwd:.2f}x")


if __name__ == "__main__":
    main()
