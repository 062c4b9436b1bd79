"""Builds libtransformer_engine_lite.so with CMake (build/cmake, reused between builds) and installs it
inside the transformer_engine_lite package, then the framework extensions chosen by
build_tools/utils.select_frameworks() (NVTE_FRAMEWORK; default: the importable ones), which link it:
pytorch -> transformer_engine_lite/pytorch/_C*.so (build_tools/pytorch.py);
jax -> transformer_engine_lite/jax/libte_lite_jax.so, the XLA FFI handlers (build_tools/jax.py: g++
against jax.ffi.include_dir(), objects cached in build/jax-ffi)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_tools import as_te_hook, utils  # noqa: E402

LIB_NAME = "libtransformer_engine_lite.so"
CORE_EXT_NAME = "transformer_engine_lite.libtransformer_engine_lite"
JAX_EXT_NAME = "transformer_engine_lite.jax.libte_lite_jax"  # build_tools/jax.py
PLAIN_LIBS = {CORE_EXT_NAME.split(".")[-1], JAX_EXT_NAME.split(".")[-1]}
FRAMEWORKS = utils.select_frameworks()
BACKEND = utils.detect_backend()

if "jax" in FRAMEWORKS:
    from build_tools import jax as jax_build
if "pytorch" in FRAMEWORKS:
    from build_tools import pytorch as pytorch_build  # noqa: E402

    _BuildExtBase = pytorch_build.build_ext_base()  # torch's flags and parallel (ninja) compiles
else:
    _BuildExtBase = build_ext


class CMakeExtension(Extension):
    def __init__(self, name: str) -> None:
        super().__init__(name, sources=[])


class JaxFfiExtension(Extension):
    """libte_lite_jax.so, built by build_tools/jax.py (its own Extension, so editable installs copy
    it into the source tree like the others)."""

    def __init__(self) -> None:
        super().__init__(JAX_EXT_NAME, sources=[])


class CMakeBuild(_BuildExtBase):
    """The core library first (CMake), then the framework extensions (listed after it)."""

    def get_ext_filename(self, ext_name: str) -> str:
        # Called with the full dotted name and with its last component alone.
        parts = ext_name.split(".")
        if parts[-1] not in PLAIN_LIBS:
            return super().get_ext_filename(ext_name)
        # A plain shared library loaded with ctypes, not a Python extension module: no ABI tag.
        return os.path.join(*parts[:-1], parts[-1] + ".so")

    def build_extension(self, ext: Extension) -> None:
        if isinstance(ext, JaxFfiExtension):
            jax_build.build(utils.core_lib_dir(), Path(self.get_ext_fullpath(ext.name)))
            return
        if not isinstance(ext, CMakeExtension):
            super().build_extension(ext)
            return
        print(f"[transformer_engine_lite] device backend: {BACKEND.backend} ({BACKEND.reason}); "
              f"framework extensions: {FRAMEWORKS or 'none'}")
        build_dir = utils.build_dir()
        build_dir.mkdir(parents=True, exist_ok=True)
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        subprocess.check_call(
            ["cmake", "-S", str(utils.ROOT), "-B", str(build_dir), *generator, *utils.cmake_args()]
        )
        jobs = os.environ.get("MAX_JOBS", str(os.cpu_count() or 1))
        subprocess.check_call(["cmake", "--build", str(build_dir), "--parallel", jobs])
        built = utils.core_lib_dir() / LIB_NAME
        dest = Path(self.get_ext_fullpath(ext.name))
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built, dest)


ext_modules: list[Extension] = [CMakeExtension(CORE_EXT_NAME)]
if "jax" in FRAMEWORKS:
    ext_modules.append(JaxFfiExtension())
if "pytorch" in FRAMEWORKS:
    ext_modules.append(pytorch_build.extension(utils.core_lib_dir(), BACKEND.backend))

# build_py and editable_wheel also install the TE_LITE_AS_TRANSFORMER_ENGINE startup hook.
cmdclass = {"build_ext": CMakeBuild, "build_py": as_te_hook.BuildPyWithHook}
editable_wheel = as_te_hook.editable_wheel_with_hook()
if editable_wheel is not None:
    cmdclass["editable_wheel"] = editable_wheel

setup(
    packages=find_packages(include=["transformer_engine_lite", "transformer_engine_lite.*"]),
    ext_modules=ext_modules,
    cmdclass=cmdclass,
    package_data={"transformer_engine_lite": ["common/include/transformer_engine_lite/*.h"]},
    zip_safe=False,
)
