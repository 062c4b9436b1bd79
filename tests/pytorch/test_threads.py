"""Ops called from several Python threads at once give the same bytes as serial calls.

torch.ops releases the GIL while an operator runs (torch's invokeOperatorFromPython), so these calls
really overlap in the core: each thread has its own OpenMP team, its own scratch buffers and its own
last-error slot, and the oneDNN primitive cache is shared under a lock."""

from __future__ import annotations

import threading

import torch

import transformer_engine_lite.pytorch  # noqa: F401  (registers torch.ops.te_lite)

ops = torch.ops.te_lite


def workload(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(67, 256, generator=g).to(torch.bfloat16)
    w = torch.randn(96, 256, generator=g).to(torch.bfloat16)
    gamma, beta = torch.rand(256, generator=g) + 0.5, torch.randn(256, generator=g)
    q, amax, scale_inv = ops.quantize(x, torch.tensor([8.0]), torch.float8_e4m3fn)
    ln = ops.layernorm_fwd(x, gamma, beta, 1e-5, False)
    D, *_ = ops.gemm(w, None, True, x, None, False, torch.bfloat16)
    qkv = [torch.randn(2, 70, 4, 64, generator=g).to(torch.bfloat16) for _ in range(3)]
    out, lse = ops.fused_attn_fwd(*qkv, "bshd_bshd_bshd", None, None, None, 70, 70, 0.125, 0.0, None,
                                  "no_bias", "causal", -1, 0, True)
    bad = None
    try:  # an error on one thread is reported to that thread, with its own message
        ops.gemm(w, None, True, torch.randn(3, 5).to(torch.bfloat16), None, False, torch.bfloat16)
    except RuntimeError as e:
        bad = str(e)
    assert bad is not None and "got B [3, 5]" in bad, bad
    return [q.view(torch.uint8), amax, scale_inv, *ln, D, out, lse]


def test_four_threads_match_serial_bytes():
    seeds = [11, 12, 13, 14]
    serial = {s: workload(s) for s in seeds}
    results: dict[int, list[torch.Tensor]] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(seeds))

    def run(seed):
        try:
            barrier.wait()
            for _ in range(3):
                results[seed] = workload(seed)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(s,)) for s in seeds]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for s in seeds:
        for i, (a, b) in enumerate(zip(serial[s], results[s])):
            assert torch.equal(a.view(torch.uint8) if a.dtype.is_floating_point else a,
                               b.view(torch.uint8) if b.dtype.is_floating_point else b), (s, i)
