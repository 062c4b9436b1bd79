"""TE-JAX's `inspect_array(x, name)` / `load_array_dump(filename, shape, dtype)`: dump an array's
raw bytes from inside a jitted computation to `my_tensor_gpu{device}_{name}.bin` in the working
directory (TE's file name), and read such a dump back. `device` is 0: the callback receives one
host copy of the (whole, gathered) array, not a per-device shard as TE's per-GPU handler does.

TE does the dump in an XLA FFI handler; here it is a `jax.debug.callback` (a debug effect, so XLA
keeps it though its result is unused), which gives the same file on the CPU — the use is the same:
look at an intermediate of a compiled program without changing its results. It is unordered: an
ordered callback threads a runtime token array through every later call, and code that deletes all
live arrays between steps (TE's test conftest does) would delete that token too.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["inspect_array", "load_array_dump"]


def _file_name(name: str, device: int) -> str:
    return f"my_tensor_gpu{device}_{name}.bin"


def inspect_array(x, name: str):
    """Returns x unchanged; writes its bytes (C order) to my_tensor_gpu{device}_{name}.bin."""
    if not isinstance(name, str) or not name or "/" in name:
        raise ValueError(f"inspect_array: argument 'name': expected a non-empty file-name part, "
                         f"got {name!r}")
    dtype = np.dtype(x.dtype)

    def write(a):
        a = np.asarray(a)
        with open(_file_name(name, 0), "wb") as f:
            f.write(np.ascontiguousarray(a.astype(dtype, copy=False)).tobytes())

    jax.debug.callback(write, x)
    return x


def load_array_dump(filename: str, shape, dtype):
    """The array written by inspect_array, as a jnp array of `shape` and `dtype`."""
    dtype = np.dtype(dtype)
    raw = np.fromfile(filename, dtype=np.uint8)
    want = int(np.prod(shape)) * dtype.itemsize
    if raw.size != want:
        raise ValueError(f"load_array_dump: file {filename!r}: expected {want} bytes for shape "
                         f"{tuple(shape)} {dtype.name}, got {raw.size}")
    return jnp.asarray(raw.view(dtype).reshape(tuple(shape)))
