"""Shared helpers of the te_lite op tests (test_ops.py, test_ops_attention.py,
test_ops_numerics.py): the core's per-dtype tolerance table, a verbose closeness check, FP8 oracles
(ml_dtypes with satfinite clamping), seeded inputs and the opcheck both opcheck files run. Importing
it needs the built extension (the test files skip first when it is not)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch

import transformer_engine_lite.pytorch.te_lite_ops  # noqa: F401  (registers torch.ops.te_lite)

ops = torch.ops.te_lite


def _python_conftest():
    # The per-dtype tolerance table lives once, in tests/python/conftest.py (STYLE.md item 10).
    path = Path(__file__).resolve().parents[1] / "python" / "conftest.py"
    spec = importlib.util.spec_from_file_location("_te_lite_python_conftest", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TOLERANCES = _python_conftest().TOLERANCES
HP_DTYPES = [torch.float32, torch.bfloat16]

# (torch dtype, ml_dtypes type, max finite, fnuz)
FP8 = {
    torch.float8_e4m3fn: (ml_dtypes.float8_e4m3fn, 448.0, False),
    torch.float8_e5m2: (ml_dtypes.float8_e5m2, 57344.0, False),
    torch.float8_e4m3fnuz: (ml_dtypes.float8_e4m3fnuz, 240.0, True),
    torch.float8_e5m2fnuz: (ml_dtypes.float8_e5m2fnuz, 57344.0, True),
}
FP8_IDS = [str(d).removeprefix("torch.float8_") for d in FP8]


def assert_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    """Closeness with the table's tolerance for `dtype`; reports count, max error, first indices."""
    atol, rtol = TOLERANCES[dtype]
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    out64, ref64 = out.double(), ref.double()
    bad = ~torch.isclose(out64, ref64, atol=atol, rtol=rtol, equal_nan=True)
    if bad.any():
        idx = bad.nonzero()[:5].tolist()
        pytest.fail(
            f"{what}: {int(bad.sum())}/{bad.numel()} off (atol {atol}, rtol {rtol}); max abs err "
            f"{(out64 - ref64).abs().max().item():.3g}; first at {idx}: got "
            f"{[out64[tuple(i)].item() for i in idx]}, expected "
            f"{[ref64[tuple(i)].item() for i in idx]}"
        )


def encode_oracle(v: np.ndarray, fp8_dtype: torch.dtype) -> np.ndarray:
    """satfinite FP8 bytes of fp32 `v` by ml_dtypes (which does not saturate: clamp first)."""
    md, fmax, fnuz = FP8[fp8_dtype]
    nan = np.isnan(v)
    with np.errstate(invalid="ignore"):
        q = np.clip(v, -fmax, fmax).astype(md).view(np.uint8).copy()
    if fnuz:
        q[q == 0x80] = 0
        q[nan] = 0x80
    return q


def decode(q: torch.Tensor) -> torch.Tensor:
    md = FP8[q.dtype][0]
    return torch.from_numpy(q.view(torch.uint8).numpy().view(md).astype(np.float32))


def assert_bytes_equal(got: torch.Tensor, want: np.ndarray, what: str) -> None:
    g = got.contiguous().view(torch.uint8).numpy().ravel()
    w = want.ravel()
    bad = np.flatnonzero(g != w)
    assert bad.size == 0, (
        f"{what}: {bad.size}/{g.size} bytes differ; first at {bad[:5].tolist()}: got "
        f"{[hex(b) for b in g[bad[:5]]]}, expected {[hex(b) for b in w[bad[:5]]]}"
    )


def randn(*shape, dtype=torch.float32, seed=0, scale=1.0, requires_grad=False) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    t = (torch.randn(shape, generator=g) * scale).to(dtype)
    return t.requires_grad_(requires_grad)


def f32(v: float) -> torch.Tensor:
    return torch.tensor([v], dtype=torch.float32)


def fp8_operand(shape, dtype=torch.float8_e4m3fn, seed=0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random FP8 bytes of `shape` (per-tensor scale 4) and their scale_inv (op test inputs)."""
    q, _, scale_inv = ops.quantize(randn(*shape, seed=seed), f32(4.0), dtype)
    return q, scale_inv


def mxfp8_operand(shape, columnwise: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Random MXFP8 bytes of `shape` and their E8M0 scales, rowwise or columnwise."""
    row, row_s, col, col_s = ops.quantize_mxfp8(
        randn(*shape), torch.float8_e4m3fn, not columnwise, columnwise
    )
    return (col, col_s) if columnwise else (row, row_s)


def _has_fp8_input(args: tuple) -> bool:
    return any(isinstance(a, torch.Tensor) and a.dtype in FP8 for a in args)


def run_opcheck(name: str, args: tuple) -> None:
    """torch.library.opcheck of te_lite op `name` on `args` (test_ops.py, test_ops_attention.py)."""
    op = getattr(ops, name)
    if not _has_fp8_input(args):
        torch.library.opcheck(op, args)
        return
    # torch's schema check compares inputs before/after with allclose, which has no CPU kernel
    # for float8: run the other checks, and check "inputs not mutated" on the bytes ourselves.
    before = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    torch.library.opcheck(
        op,
        args,
        test_utils=("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"),
    )
    op(*args)
    for i, (b, a) in enumerate(zip(before, args)):
        if isinstance(a, torch.Tensor):
            assert torch.equal(
                b.view(torch.uint8) if b.dtype in FP8 else b,
                a.view(torch.uint8) if a.dtype in FP8 else a,
            ), f"arg {i} mutated"
