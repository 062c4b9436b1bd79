"""Builds libtransformer_engine_lite.so with CMake (build/cmake, reused between builds) and installs it
inside the transformer_engine_lite package. Framework extensions: see build_tools/utils.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_tools import utils  # noqa: E402

LIB_NAME = "libtransformer_engine_lite.so"


class CMakeExtension(Extension):
    def __init__(self, name: str) -> None:
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def get_ext_filename(self, ext_name: str) -> str:
        # A plain shared library loaded with ctypes, not a Python extension module.
        return os.path.join(*ext_name.split(".")[:-1], LIB_NAME)

    def build_extension(self, ext: Extension) -> None:
        choice = utils.detect_backend()
        frameworks = utils.select_frameworks()
        print(f"[transformer_engine_lite] device backend: {choice.backend} ({choice.reason}); "
              f"frameworks: {frameworks or 'none'} (this tree has no framework extensions to "
              "compile yet; the Python packages are pure Python)")
        build_dir = utils.build_dir()
        build_dir.mkdir(parents=True, exist_ok=True)
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        subprocess.check_call(
            ["cmake", "-S", str(utils.ROOT), "-B", str(build_dir), *generator, *utils.cmake_args()]
        )
        jobs = os.environ.get("MAX_JOBS", str(os.cpu_count() or 1))
        subprocess.check_call(["cmake", "--build", str(build_dir), "--parallel", jobs])
        built = build_dir / "transformer_engine_lite" / "common" / LIB_NAME
        dest = Path(self.get_ext_fullpath(ext.name))
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built, dest)


setup(
    packages=find_packages(include=["transformer_engine_lite", "transformer_engine_lite.*"]),
    ext_modules=[CMakeExtension("transformer_engine_lite.libtransformer_engine_lite")],
    cmdclass={"build_ext": CMakeBuild},
    package_data={"transformer_engine_lite": ["common/include/transformer_engine_lite/*.h"]},
    zip_safe=False,
)
