"""The JAX extension: transformer_engine_lite/jax/libte_lite_jax.so, the XLA FFI handlers
(jax/csrc/*.cpp) linked against libtransformer_engine_lite.so, which it finds at run time beside
the package ($ORIGIN/..) or already loaded by transformer_engine_lite.common (NVTE_LIB_PATH, build
folder).

A plain shared library: no pybind and no Python C API (it exports a C table of handler pointers,
te_lite_jax_handlers, that the Python side reads with ctypes), compiled with the system g++ against
the XLA FFI headers of the installed jaxlib (jax.ffi.include_dir()). Only those headers are needed,
not CUDA's, so one build holds both the CPU and the GPU handlers.

Objects are cached in <build>/jax-ffi/ (beside NVTE_BUILD_DIR) under a hash of the source, every
header it may include, the compiler and the flags, so a rebuild recompiles only what changed and
always relinks (about a second). Sources compile in parallel (MAX_JOBS, default: the core count).

Run alone (from the repository root): python -m build_tools.jax [--core-lib-dir DIR] [--out PATH]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import utils

LIB_NAME = "libte_lite_jax.so"
CSRC = utils.ROOT / "transformer_engine_lite" / "jax" / "csrc"
DEFAULT_OUT = utils.ROOT / "transformer_engine_lite" / "jax" / LIB_NAME
CORE_INCLUDE = utils.COMMON / "include"

# -isystem for XLA's headers: with -I they give 20 warnings under -Wall -Wextra.
# -fvisibility=hidden: only te_lite_jax_handlers is exported (registrations.cpp).
CXXFLAGS = ["-std=c++17", "-O2", "-fPIC", "-fvisibility=hidden", "-Wall", "-Wextra", "-Werror"]


def ffi_include_dir() -> Path:
    """jaxlib's XLA FFI headers; a clear error when jax cannot be imported."""
    try:
        import jax
        import jax.ffi
    except ImportError as e:
        raise RuntimeError(
            "the jax extension is selected (NVTE_FRAMEWORK or an importable jax) but jax cannot be "
            f"imported ({e}): its XLA FFI headers (jax.ffi.include_dir()) are needed to build "
            f"{LIB_NAME}; install jax and jaxlib and build with pip install --no-build-isolation, "
            "or set NVTE_FRAMEWORK to leave jax out (e.g. NVTE_FRAMEWORK=pytorch)"
        ) from e
    return Path(jax.ffi.include_dir())


def compiler() -> str:
    cxx = shutil.which("g++")
    if cxx is None:
        raise RuntimeError(f"building {LIB_NAME}: expected g++ on PATH, got none")
    return cxx


def cache_dir() -> Path:
    return utils.build_dir().parent / "jax-ffi"


def _digest(paths: list[Path], *extra: str) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(str(p.name).encode())
        h.update(p.read_bytes())
    for e in extra:
        h.update(e.encode())
    return h.hexdigest()[:16]


def _compile(cmd: list[str], obj: Path) -> str | None:
    """Compiles to a temporary name then renames, so an interrupted build leaves no bad object.
    Returns the compiler output on failure."""
    tmp = obj.with_suffix(f".{os.getpid()}.tmp")
    out = subprocess.run([*cmd, "-o", str(tmp)], check=False, capture_output=True, text=True)
    if out.returncode != 0:
        tmp.unlink(missing_ok=True)
        return out.stdout + out.stderr
    os.replace(tmp, obj)
    return None


def build(core_lib_dir: Path, out: Path = DEFAULT_OUT) -> Path:
    """Compiles (or reuses) the objects and links `out`; `core_lib_dir` holds
    libtransformer_engine_lite.so (linked here, found at run time through $ORIGIN/..)."""
    core_lib_dir = Path(core_lib_dir)
    if not (core_lib_dir / "libtransformer_engine_lite.so").is_file():
        raise RuntimeError(
            f"building {LIB_NAME}: expected libtransformer_engine_lite.so in {core_lib_dir}, got "
            "none (build the core library first)"
        )
    include = ffi_include_dir()
    cxx = compiler()
    version = subprocess.run([cxx, "--version"], check=False, capture_output=True, text=True).stdout
    flags = [*CXXFLAGS, "-isystem", str(include), "-I", str(CORE_INCLUDE)]
    # Every header a source may include: ours, the core's C API, the core's platform layer
    # (cpu_fpenv.h) and XLA's FFI API.
    headers = sorted(CSRC.glob("*.h")) + sorted(CORE_INCLUDE.rglob("*.h"))
    headers += sorted((CORE_INCLUDE.parent / "platform").glob("*.h"))
    headers += sorted((include / "xla" / "ffi" / "api").glob("*.h"))
    header_digest = _digest(headers, cxx, version, *flags)

    objdir = cache_dir()
    objdir.mkdir(parents=True, exist_ok=True)
    sources = sorted(CSRC.glob("*.cpp"))
    objects: list[Path] = []
    todo: list[tuple[list[str], Path]] = []
    for src in sources:
        obj = objdir / f"{src.stem}-{_digest([src], header_digest)}.o"
        objects.append(obj)
        if not obj.is_file():
            todo.append(([cxx, *flags, "-c", str(src)], obj))

    jobs = int(utils._flag("MAX_JOBS") or os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=max(1, min(jobs, len(todo) or 1))) as pool:
        errors = [e for e in pool.map(lambda t: _compile(*t), todo) if e]
    if errors:
        raise RuntimeError(f"building {LIB_NAME}: compilation failed:\n" + "\n".join(errors))
    # Objects of earlier versions of the sources are never reused: keep the cache at one per source.
    for stale in set(objdir.glob("*.o")) - set(objects):
        stale.unlink(missing_ok=True)

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    link = [
        cxx,
        "-shared",
        "-o",
        str(tmp),
        *map(str, objects),
        f"-L{core_lib_dir}",
        "-ltransformer_engine_lite",
        # The core library sits in the package folder, one level above jax/.
        "-Wl,-rpath,$ORIGIN/..",
        # Every symbol resolved at link time (XLA's FFI API is reached through a table).
        "-Wl,--no-undefined",
        # A static-only libstdc++ stays private (see common/CMakeLists.txt).
        "-Wl,--exclude-libs,libstdc++.a",
    ]
    result = subprocess.run(link, check=False, capture_output=True, text=True)
    if result.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"building {LIB_NAME}: link failed:\n{result.stdout}{result.stderr}")
    # A rename, not an overwrite: a process that has the old library mapped keeps a valid file.
    os.replace(tmp, out)
    print(
        f"[transformer_engine_lite] jax: {LIB_NAME}: compiled {len(todo)} of {len(sources)} "
        f"sources ({len(sources) - len(todo)} cached in {objdir}) -> {out}"
    )
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--core-lib-dir",
        type=Path,
        default=utils.ROOT / "transformer_engine_lite",
        help="folder of libtransformer_engine_lite.so (default: the package's)",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    build(args.core_lib_dir, args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
