"""Test-only fixes to Triton's CPU interpreter (TRITON_INTERPRET=1) so it computes what a GPU does
with bf16; the kernels stay untouched.

1. tl.dot: the interpreter keeps bf16 as raw uint16 bits and np.matmul's them as integers
   (triton issue #11584: O comes out ~1e9). bf16 operands are widened to fp32 first (exact).
2. fp32 -> bf16 casts: the interpreter truncates the mantissa; GPUs (and torch) round to nearest
   even. Truncation doubles the rounding error of every stored bf16 output.
3. `interpreted(...)`: @triton.jit picks interpreter or compiler when a function is decorated, so
   triton.language's own jit functions (tl.max, tl.sum, ...) are compiled-mode objects when
   anything imported triton before TRITON_INTERPRET=1 was set (in a pytest process: torch's
   dynamo, imported by transformer_engine_lite.pytorch). Within the context, every such function
   of triton.language and of the given modules is an interpreted one, restored on exit.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator

import numpy as np
import triton.language as tl
from triton.runtime import interpreter as _interp
from triton.runtime.jit import JITFunction

_INSTALLED = False
_INTERPRETED: dict[int, _interp.InterpretedFunction] = {}  # id(JITFunction) -> its twin


def _bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def _f32_to_bf16_bits_rne(x: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    quiet = (bits >> np.uint32(16)) | np.uint32(0x40)  # keep NaNs NaN (rounding could make inf)
    return np.where(nan, quiet, rounded).astype(np.uint16)


def install() -> None:
    """Patches InterpreterBuilder.create_dot and cast_impl (idempotent)."""
    global _INSTALLED
    if _INSTALLED:
        return
    builder = _interp.InterpreterBuilder
    orig_dot, orig_cast = builder.create_dot, builder.cast_impl

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.dtype.scalar == tl.bfloat16 or b.dtype.scalar == tl.bfloat16:
            a = _interp.TensorHandle(
                _bf16_bits_to_f32(a.data)
                if a.dtype.scalar == tl.bfloat16
                else a.data.astype(np.float32),
                tl.float32,
            )
            b = _interp.TensorHandle(
                _bf16_bits_to_f32(b.data)
                if b.dtype.scalar == tl.bfloat16
                else b.data.astype(np.float32),
                tl.float32,
            )
        return orig_dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            return _interp.TensorHandle(_f32_to_bf16_bits_rne(src.data), tl.bfloat16)
        return orig_cast(self, src, dst_type)

    builder.create_dot = create_dot
    builder.cast_impl = cast_impl
    _INSTALLED = True


@contextlib.contextmanager
def interpreted(*modules: types.ModuleType) -> Iterator[None]:
    """Swaps compiled-mode jit functions of triton.language and `modules` for interpreted ones."""
    from triton.language import core, math, random, standard

    saved = []
    for mod in (tl, core, standard, math, random, *modules):
        for name, value in list(vars(mod).items()):
            if isinstance(value, JITFunction):
                twin = _INTERPRETED.setdefault(id(value), _interp.InterpretedFunction(value.fn))
                saved.append((mod, name, value))
                setattr(mod, name, twin)
    try:
        yield
    finally:
        for mod, name, value in reversed(saved):
            setattr(mod, name, value)
