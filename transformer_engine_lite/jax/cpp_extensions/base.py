"""The XLA FFI handlers of libte_lite_jax.so as JAX primitives.

Loading: the core library first (transformer_engine_lite.common.get_lib honours NVTE_LIB_PATH), then
jax/libte_lite_jax.so, whose C registry `te_lite_jax_handlers` lists every handler
(`registrations()`); each is registered with XLA for the "cpu" platform, and for CUDA / ROCm when the
core is a GPU build and jax has that platform.

One `FFIOp` per handler (TE's BasePrimitive, in our shape): an outer primitive with
- abstract evaluation (`abstract`), which also checks arguments at trace time with errors that name
  the argument (the handler checks again at run time and returns an ffi::Error, never aborts);
- a lowering through `jax.ffi.ffi_call`, wrapped in `custom_partitioning` when the op has a sharding
  rule (`partition`, see sharding rules in .partitioning), so it runs on a Mesh without gathering;
- a batching rule: ops over rows batch natively by moving the vmapped dim to the front, the others
  loop with `lax.map`;
- a pure-JAX reference (`reference`) used when NVTE_JAX_CUSTOM_CALLS disables the primitive (TE's
  syntax: "false", or "NormFwdPrimitive=false,GemmPrimitive=true"; keys are TE's class names).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
import warnings
from collections.abc import Callable, Sequence
from functools import cache, lru_cache, partial
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from jax._src import dispatch
from jax._src.interpreters import batching
from jax.extend.core import Primitive
from jax.interpreters import mlir

from transformer_engine_lite.common import build_info, config, get_lib

__all__ = [
    "FFIOp", "custom_calls_enabled", "extension_path", "reference_mode", "registrations",
]


def extension_path() -> Path:
    here = Path(__file__).resolve().parent.parent
    path = here / "libte_lite_jax.so"
    if not path.exists():
        raise ImportError(
            f"transformer_engine_lite.jax: the XLA FFI library {path.name} is not built in {here}; "
            "build it with `pip install --no-build-isolation -e .` in an environment where jax is "
            "importable (NVTE_FRAMEWORK unset, or naming jax)"
        )
    return path


class _Handler(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("cpu", ctypes.c_void_p), ("gpu", ctypes.c_void_p)]


@lru_cache(maxsize=1)
def _library() -> ctypes.CDLL:
    get_lib()  # the core first, so the extension's dependency resolves to that very library
    return ctypes.CDLL(str(extension_path()))


def _capsule(address: int):
    return jax.ffi.pycapsule(ctypes.CFUNCTYPE(None)(address))


@lru_cache(maxsize=1)
def registrations() -> dict[str, dict[str, Any]]:
    """Every handler of the extension: name -> {"cpu": capsule, "gpu": capsule (GPU builds)}."""
    lib = _library()
    fn = lib.te_lite_jax_handlers
    fn.restype = ctypes.POINTER(_Handler)
    fn.argtypes = [ctypes.POINTER(ctypes.c_size_t)]
    count = ctypes.c_size_t(0)
    table = fn(ctypes.byref(count))
    out: dict[str, dict[str, Any]] = {}
    for i in range(count.value):
        h = table[i]
        entry = {"cpu": _capsule(h.cpu)}
        if h.gpu:
            entry["gpu"] = _capsule(h.gpu)
        out[h.name.decode()] = entry
    return out


def _gpu_platforms() -> list[str]:
    """XLA platform names to register GPU handlers for: the core's GPU backend, if jax has it."""
    backends = build_info().get("device_backends", [])
    wanted = [p for b, p in (("cuda", "CUDA"), ("rocm", "ROCM")) if b in backends]
    found = []
    for p in wanted:
        try:
            if jax.devices(p.lower()):
                found.append(p)
        except RuntimeError:
            pass
    return found


@lru_cache(maxsize=1)
def register_targets() -> None:
    gpu = _gpu_platforms()
    for name, entry in registrations().items():
        jax.ffi.register_ffi_target(name, entry["cpu"], platform="cpu")
        for platform in gpu:
            if "gpu" in entry:
                jax.ffi.register_ffi_target(name, entry["gpu"], platform=platform)


# ------------------------------------------------------------------------ NVTE_JAX_CUSTOM_CALLS
def _parse_custom_calls(value: str) -> tuple[bool | None, dict[str, bool]]:
    """("false" | "true" | "Name=bool,...") -> (global switch or None, per-name switches)."""
    truth = {"1": True, "true": True, "0": False, "false": False}
    value = value.strip()
    if not value:
        return None, {}
    if value.lower() in truth:
        return truth[value.lower()], {}
    per: dict[str, bool] = {}
    for item in value.split(","):
        if not item.strip():
            continue
        name, sep, flag = item.partition("=")
        if not sep or flag.strip().lower() not in truth:
            raise ValueError(
                "NVTE_JAX_CUSTOM_CALLS: expected 'true', 'false' or 'PrimitiveName=true|false,...', "
                f"got {value!r} (item {item!r})"
            )
        per[name.strip()] = truth[flag.strip().lower()]
    return None, per


_REFERENCE = threading.local()


@contextlib.contextmanager
def reference_mode():
    """Within it (on this thread), every FFIOp traces its pure-JAX reference instead of its handler.

    This is how TE-JAX's `_jax_*` references (`_jax_quantize(x, quantizer)` etc.) are built: they
    run the same Quantizer code as `tex.quantize`, but with ARCHITECTURE §5's pure-JAX arithmetic,
    so the two are independent implementations that tests can compare byte for byte."""
    prev = getattr(_REFERENCE, "on", False)
    _REFERENCE.on = True
    try:
        yield
    finally:
        _REFERENCE.on = prev


def custom_calls_enabled(name: str) -> bool:
    """Whether the primitive named `name` (TE's class name) runs its FFI handler (default True)."""
    if getattr(_REFERENCE, "on", False):
        return False
    glob, per = _parse_custom_calls(config.get("NVTE_JAX_CUSTOM_CALLS") or "")
    if name in per:
        return per[name]
    return True if glob is None else glob


# ------------------------------------------------------------------------------------- FFIOp
def _shape_dtype(x) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(tuple(x.shape), x.dtype)


class FFIOp:
    """One FFI handler as a primitive (see the module docstring).

    abstract(*avals, **params) -> tuple of ShapeDtypeStruct (and trace-time argument checks)
    attrs(params) -> the FFI attributes (params that only shape the results are left out)
    reference(*args, **params) -> tuple of arrays: the pure-JAX equivalent
    row_args: indices of the arguments whose leading dims the handler treats as rows (the op then
        batches natively when only they are vmapped and no result reduces over rows)
    reducing_results: indices of results that reduce over rows (amax, dgamma): no native batching
    partition: a partitioning rule object (see .partitioning) or None (replicated)
    fold_rows: the op takes a fixed rank (softmax: [b, h, sq, sk]): native batching folds the
        vmapped dim into dim 0 of the row arguments and unfolds every result
    """

    def __init__(
        self,
        name: str,
        ffi_name: str,
        abstract: Callable[..., tuple],
        reference: Callable[..., tuple],
        attrs: Callable[[dict], dict] | None = None,
        row_args: Sequence[int] = (),
        reducing_results: Sequence[int] = (),
        partition: Any = None,
        fold_rows: bool = False,
    ) -> None:
        self.name = name
        self.ffi_name = ffi_name
        self.abstract = abstract
        self.reference = reference
        self._attrs = attrs or (lambda params: dict(params))
        self.row_args = tuple(row_args)
        self.reducing_results = tuple(reducing_results)
        self.partition = partition
        self.fold_rows = fold_rows
        self.prim = Primitive(name)
        self.prim.multiple_results = True
        self.prim.def_impl(partial(dispatch.apply_primitive, self.prim))
        self.prim.def_abstract_eval(self._abstract_eval)
        mlir.register_lowering(self.prim, self._lowering)
        batching.primitive_batchers[self.prim] = self._batch
        # custom_partitioning's lowering needs the device assignment (TE registers its primitives
        # the same way).
        dispatch.prim_requires_devices_during_lowering.add(self.prim)

    # -- call
    def __call__(self, *args, **params) -> tuple:
        if not custom_calls_enabled(self.name):
            self.abstract(*map(_shape_dtype, args), **params)  # the same argument checks
            return tuple(self.reference(*args, **params))
        register_targets()
        return tuple(self.prim.bind(*args, **params))

    def ffi(self, *args, **params) -> tuple:
        """The handler called on (local) arrays: result shapes from `abstract`."""
        out = self.abstract(*map(_shape_dtype, args), **params)
        call = jax.ffi.ffi_call(self.ffi_name, tuple(out))
        return tuple(call(*args, **self._attrs(params)))

    # -- primitive rules
    def _abstract_eval(self, *avals, **params):
        return [jax.core.ShapedArray(s.shape, s.dtype) for s in self.abstract(*avals, **params)]

    def _lowering(self, ctx, *args, **params):
        if self.partition is None:
            fn = partial(self.ffi, **params)
        else:
            fn = self.partition.wrap(self, params, len(args))
        return mlir.lower_fun(fn, multiple_results=True)(ctx, *args)

    def _batch(self, args, dims, **params):
        batched = [i for i, d in enumerate(dims) if d is not None]
        if (self.row_args and set(batched) <= set(self.row_args) and not self.reducing_results):
            moved = [
                jnp.moveaxis(a, d, 0) if d is not None else a for a, d in zip(args, dims)
            ]
            size = next(moved[i].shape[0] for i in batched)
            moved = [
                jnp.broadcast_to(a, (size, *a.shape)) if i in self.row_args and d is None else a
                for i, (a, d) in enumerate(zip(moved, dims))
            ]
            if not self.fold_rows:
                out = self.prim.bind(*moved, **params)
                return out, [0] * len(out)
            folded = [a.reshape(size * a.shape[1], *a.shape[2:]) if i in self.row_args else a
                      for i, a in enumerate(moved)]
            out = self.prim.bind(*folded, **params)
            return [o.reshape(size, -1, *o.shape[1:]) for o in out], [0] * len(out)
        xs = [jnp.moveaxis(a, d, 0) if d is not None else None for a, d in zip(args, dims)]

        def one(slices):
            full = [s if s is not None else a for s, a in zip(slices, args)]
            return tuple(self.prim.bind(*full, **params))

        # lax.map is a scan: also right for a zero-length batch (no call is made).
        out = jax.lax.map(one, xs)
        return list(out), [0] * len(out)


def warn_once(message: str, category=UserWarning) -> None:
    _warn_once(message, category)


@cache
def _warn_once(message: str, category) -> None:
    warnings.warn(message, category, stacklevel=3)


def env_flag(name: str, default: str = "0") -> bool:
    return os.environ.get(name, default) == "1"
