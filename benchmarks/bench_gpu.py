#!/usr/bin/env python
"""Times the library's GPU kernels against torch on the same device (ci/gpu_check.sh, step timing):
attention (flash kernel, AOTriton images) vs torch SDPA, GEMM vs torch.matmul / torch._scaled_mm,
current-scaling quantize and LayerNorm vs their torch equivalents. Prints one markdown table:
case | ours ms | torch ms | ratio.

    python benchmarks/bench_gpu.py                 # every case, median of 20 (CUDA events)
    python benchmarks/bench_gpu.py --cases gemm_bf16,layernorm_fwd_bf16 --repeat 50
    python benchmarks/bench_gpu.py --list          # the cases; touches no device

Timing: --warmup calls, then the median of --repeat calls, each timed by a pair of CUDA events
around the one call (so host-side dispatch shows only where it delays the kernels); ours and torch
alternate call by call, as in _common.time_pair_ms. ratio = torch ms / ours ms (> 1: ours is
faster). Each case's output is checked against torch before it is timed (the rules of _common.py);
a mismatch is reported instead of a time and makes the exit status 1.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import Case, NotAvailable, bf16_close, first_error, rel_close

E4M3, E4M3_MAX = torch.float8_e4m3fn, 448.0
SWITCHES = ("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "NVTE_FUSED_ATTN_CK", "NVTE_FUSED_ATTN_AOTRITON")
MODES = {  # ci/_utils.sh configure_fused_attn_env, read by the core at every call
    "flash": {"NVTE_FUSED_ATTN": "0", "NVTE_FUSED_ATTN_CK": "0", "NVTE_FUSED_ATTN_AOTRITON": "0"},
    "aotriton": {"NVTE_FLASH_ATTN": "0", "NVTE_FUSED_ATTN_CK": "0"},
}
ATTN = (4, 2048, 16, 128)  # b, s, h, d: a training-size causal problem, bf16
GEMM_N = 8192  # 8192^3: ~1 ms of bf16 tensor-core work on an H100, well above launch costs
NVFP4_N = 4096  # the NVFP4 block GEMM: 4096^3 (its exactness check sums 256 block terms)
ROWS, COLS = 8192, 8192  # quantize / LayerNorm: 128 MiB of bf16, bandwidth-bound
# Where the cases put their tensors. "cpu" (with smaller sizes set on this module) lets a machine
# without a GPU call each case's ours/ref/check once: a check of this file, not a timing.
DEVICE = "cuda"


def _ops():
    import transformer_engine_lite.pytorch  # noqa: F401  (registers torch.ops.te_lite)

    return torch.ops.te_lite


def _in_mode(mode: str, fn: Callable[[], object], extra: dict | None = None) -> Callable:
    """fn with the attention switches of `mode` set (putenv costs microseconds, not kernels)."""

    def run():
        for k in (*SWITCHES, "NVTE_LOG_AOTRITON_CONFIG"):
            os.environ.pop(k, None)
        os.environ.update({**MODES[mode], **(extra or {})})
        return fn()

    return run


class _stderr_of_c:
    """What C code writes to file descriptor 2 inside the block (the core logs there)."""

    def __enter__(self):
        import tempfile

        sys.stderr.flush()
        self._file = tempfile.TemporaryFile(mode="w+")
        self._saved = os.dup(2)
        os.dup2(self._file.fileno(), 2)
        self.text = ""
        return self

    def __exit__(self, *exc):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        os.dup2(self._saved, 2)
        os.close(self._saved)
        self._file.seek(0)
        self.text = self._file.read()
        self._file.close()
        return False


# ------------------------------------------------------------------------------------- cases
def _attention(mode: str, backward: bool) -> Case:
    ops = _ops()
    b, s, h, d = ATTN
    if mode == "aotriton":
        from transformer_engine_lite.common import build_info

        if DEVICE != "cuda":
            raise NotAvailable("AOTriton images run on a GPU only")
        major, minor = torch.cuda.get_device_capability()
        if f"sm_{major}{minor}" not in build_info().get("aotriton_archs", []):
            raise NotAvailable(f"no AOTriton images for sm_{major}{minor} in this build")
    g = torch.Generator(device=DEVICE).manual_seed(0)
    q, k, v, dout = (torch.randn(b, s, h, d, device=DEVICE, generator=g, dtype=torch.bfloat16)
                     for _ in range(4))
    # layout, bias, cu_seqlens q/kv, max_seqlen q/kv, scale, dropout, rng_state, bias and mask
    # types, window: causal (-1, 0)
    args = ("bshd_bshd_bshd", None, None, None, s, s, d**-0.5, 0.0, None, "no_bias", "causal")
    args += (-1, 0)
    qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_(backward) for t in (q, k, v))

    def ours():
        # A training forward (softmax_lse kept) in both cases: the AOTriton kernels always write
        # it, and an inference forward is the flash kernel's (fused_attn_aotriton.cpp).
        out, lse = ops.fused_attn_fwd(q, k, v, *args, True)
        if backward:
            return out, *ops.fused_attn_bwd(q, k, v, out, dout, lse, *args, False)[:3]
        return (out,)

    def ref():
        out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
        if not backward:
            return (out.transpose(1, 2),)
        dq, dk, dv = torch.autograd.grad(out, (qt, kt, vt), dout.transpose(1, 2))
        return tuple(t.transpose(1, 2) for t in (out, dq, dk, dv))

    ours_logged = _in_mode(mode, ours, {"NVTE_LOG_AOTRITON_CONFIG": "1"})
    ours = _in_mode(mode, ours)

    def check():
        # fp32 SDPA on the same inputs is the reference; torch's bf16 result the baseline.
        q32, k32, v32 = (t.detach().float().transpose(1, 2).requires_grad_(backward)
                         for t in (q, k, v))
        o32 = F.scaled_dot_product_attention(q32, k32, v32, is_causal=True)
        ref32 = [o32.transpose(1, 2)]
        if backward:
            grads = torch.autograd.grad(o32, (q32, k32, v32), dout.float().transpose(1, 2))
            ref32 += [t.transpose(1, 2) for t in grads]
        names = ("out", "dq", "dk", "dv")
        if mode == "aotriton":
            # The core falls back to the flash kernel (with a log line) where an image does not
            # fit: the time must be the Triton kernels' own.
            with _stderr_of_c() as log:
                got = ours_logged()
            if "[aotriton] launch" not in log.text:
                return "expected AOTriton launches (NVTE_LOG_AOTRITON_CONFIG=1), got none"
        else:
            got = ours()
        base = ref()
        return first_error(
            *(bf16_close(o, b_, r, n) for n, o, b_, r in zip(names, got, base, ref32))
        )

    return Case(ours, ref, check, [f"b{b} s{s} h{h} d{d} causal bf16, {mode}"])


def _gemm_bf16() -> Case:
    ops, n = _ops(), GEMM_N
    x = torch.randn(n, n, device=DEVICE, dtype=torch.bfloat16)
    w = torch.randn(n, n, device=DEVICE, dtype=torch.bfloat16)

    def ours():
        return ops.gemm(w, None, True, x, None, False, torch.bfloat16)[0]  # x @ w^T

    def ref():
        return torch.matmul(x, w.t())

    def check():
        ref32 = x.float() @ w.float().t()
        return rel_close(ours(), ref(), ref32, "x @ w^T")

    return Case(ours, ref, check, [f"{n}^3 bf16 -> bf16"])


def _gemm_fp8() -> Case:
    ops, n = _ops(), GEMM_N
    if not hasattr(torch, "_scaled_mm"):
        raise NotAvailable("torch._scaled_mm is not in this torch")
    x, w = (torch.randn(n, n, device=DEVICE).to(E4M3) for _ in range(2))
    one = torch.ones(1, device=DEVICE)

    def ours():
        return ops.gemm(w, one, True, x, one, False, torch.bfloat16)[0]

    def ref():
        return torch._scaled_mm(x, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

    def check():
        ref32 = x.float() @ w.float().t()
        return rel_close(ours(), ref(), ref32, "fp8 x @ w^T")

    return Case(ours, ref, check, [f"{n}^3 E4M3 -> bf16, vs torch._scaled_mm"])

def _gemm_nvfp4() -> Case:
    from transformer_engine_lite.pytorch.cpp_extensions import nvfp4_gemm

    ops, n = _ops(), NVFP4_N
    g = torch.Generator(device=DEVICE).manual_seed(0)

    def operand():  # random packed E2M1 codes and positive normal E4M3 scales near 1
        data = torch.randint(0, 256, (n, n // 2), device=DEVICE, generator=g, dtype=torch.uint8)
        scales = torch.randint(0x28, 0x58, (n, n // 16), device=DEVICE, generator=g,
                               dtype=torch.uint8)
        return data, scales

    (bd, bs), (ad, as_) = operand(), operand()
    x = torch.randn(n, n, device=DEVICE, dtype=torch.bfloat16)
    w = torch.randn(n, n, device=DEVICE, dtype=torch.bfloat16)

    def ours():
        return ops.nvfp4_block_gemm(bd, bs, ad, as_)

    def ref():
        return torch.matmul(x, w.t())

    def decoded(data, scales):  # the exact block-scaled values, [n, n] fp32
        e2m1 = torch.tensor(nvfp4_gemm._E2M1, device=DEVICE)
        codes = torch.stack((data & 15, data >> 4), dim=-1).reshape(n, n).long()
        s = scales.view(E4M3).float().repeat_interleave(16, dim=1)
        return e2m1[codes] * s

    def check():
        want = nvfp4_gemm._blocked_sum(decoded(bd, bs), decoded(ad, as_), n, n, n // 16)
        got = ours()
        if not torch.equal(got, want):
            bad = (got != want).sum().item()
            return f"NVFP4 block GEMM: {bad} of {n * n} values differ from the blocked sum"
        return None

    return Case(ours, ref, check, [f"{n}^3 NVFP4 (1x16 blocks) -> fp32, exact block terms in K "
                                   "order, vs torch bf16 matmul of the same shape"])


def _quantize() -> Case:
    ops = _ops()
    x = torch.randn(ROWS, COLS, device=DEVICE, dtype=torch.bfloat16)

    def ours():
        amax = ops.compute_amax(x)
        scale, _ = ops.compute_scale_from_amax(amax, E4M3, 0.0, False)
        return ops.quantize(x, scale, E4M3)

    def ref():
        scale = E4M3_MAX / x.abs().amax().float()
        return (x.float() * scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3), scale

    def check():
        q, _, scale_inv = ours()
        qr, scale = ref()
        return rel_close(q.float() * scale_inv, qr.float() / scale, x.float(), "dequantized")

    return Case(ours, ref, check, [f"{ROWS}x{COLS} bf16 -> E4M3, amax + scale + cast"])


def _layernorm() -> Case:
    ops = _ops()
    x = torch.randn(ROWS, COLS, device=DEVICE, dtype=torch.bfloat16)
    gamma = torch.rand(COLS, device=DEVICE, dtype=torch.bfloat16) + 0.5
    beta = torch.randn(COLS, device=DEVICE, dtype=torch.bfloat16)

    def ours():
        return ops.layernorm_fwd(x, gamma, beta, 1e-5, False)[0]

    def ref():
        return F.layer_norm(x, (COLS,), gamma, beta, 1e-5)

    def check():
        ref32 = F.layer_norm(x.float(), (COLS,), gamma.float(), beta.float(), 1e-5)
        return bf16_close(ours(), ref(), ref32, "layernorm")

    return Case(ours, ref, check, [f"{ROWS}x{COLS} bf16, fp32 statistics"])


CASES: dict[str, Callable[[], Case]] = {
    "attn_fwd_flash": lambda: _attention("flash", False),
    "attn_fwd_bwd_flash": lambda: _attention("flash", True),
    "attn_fwd_aotriton": lambda: _attention("aotriton", False),
    "attn_fwd_bwd_aotriton": lambda: _attention("aotriton", True),
    "gemm_bf16": _gemm_bf16,
    "gemm_fp8_vs_scaled_mm": _gemm_fp8,
    "gemm_nvfp4_vs_bf16": _gemm_nvfp4,
    "quantize_current_e4m3": _quantize,
    "layernorm_fwd_bf16": _layernorm,
}


# ------------------------------------------------------------------------------------- timing
def time_pair_ms(ours, ref, warmup: int, repeat: int) -> tuple[float, float]:
    """Median ms of each side, CUDA events around every call, the sides alternating."""
    for _ in range(warmup):
        ours()
        ref()
    events = [[], []]
    for _ in range(repeat):
        for fn, acc in ((ours, events[0]), (ref, events[1])):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            acc.append((start, end))
    torch.cuda.synchronize()
    return tuple(statistics.median(s.elapsed_time(e) for s, e in acc) for acc in events)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default="all", help="comma-separated names, or 'all'")
    p.add_argument("--list", action="store_true", help="list the cases and exit (no device use)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeat", type=int, default=20)
    args = p.parse_args(argv)
    if args.list:
        print("\n".join(CASES))
        return 0
    names = list(CASES) if args.cases == "all" else [c for c in args.cases.split(",") if c]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        p.error(f"unknown case(s) {unknown}; expected some of {list(CASES)}")
    if not torch.cuda.is_available():
        print("bench_gpu.py: expected a CUDA device, got none", file=sys.stderr)
        return 1
    saved = {k: os.environ.get(k) for k in (*SWITCHES, "NVTE_LOG_AOTRITON_CONFIG")}
    print(f"# ours vs torch on {torch.cuda.get_device_name()}\n")
    print(f"torch {torch.__version__} (CUDA {torch.version.cuda}); median of {args.repeat} after "
          f"{args.warmup} warmup, CUDA events; ratio = torch ms / ours ms (> 1: ours is faster)\n")
    print("| case | ours ms | torch ms | ratio |\n|---|---:|---:|---:|")
    notes, ok = [], True
    for name in names:
        try:
            case = CASES[name]()
            problem = case.check()
            if problem:
                print(f"| {name} | - | - | mismatch |")
                notes.append(f"{name}: NUMERICS MISMATCH: {problem}")
                ok = False
                continue
            ours_ms, ref_ms = time_pair_ms(case.ours, case.ref, args.warmup, args.repeat)
            print(f"| {name} | {ours_ms:.3f} | {ref_ms:.3f} | {ref_ms / ours_ms:.2f}x |")
            notes += [f"{name}: {n}" for n in case.notes]
        except NotAvailable as e:
            print(f"| {name} | - | - | n/a |")
            notes.append(f"{name}: not available: {e}")
        except Exception as e:  # noqa: BLE001 - one broken case must not hide the others' times
            print(f"| {name} | - | - | error |")
            notes.append(f"{name}: ERROR {type(e).__name__}: {e}")
            ok = False
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            sys.stdout.flush()
    print()
    print("\n".join(f"- {n}" for n in notes))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
