# ROCm part of libtransformer_engine_lite (included from gpu.cmake when NVTE_BACKEND=rocm).
# The CUDA sources (.cu/.cuh/.h) are hipified into ${NVTE_HIPIFY_DIR} by build_tools/hipify.py
# (PyTorch's hipify engine + build_tools/hipify/custom_map.json) at configure time and again
# whenever a source changes; the hipified .cu files are compiled as HIP by clang (the compiler hipcc
# runs) for NVTE_ROCM_ARCH. The CPU sources stay compiled by the host compiler from the source tree.
#
# Works with a ROCm install (/opt/rocm) and with Debian's packages (hipcc libamdhip64-dev
# rocm-device-libs, HIP 5.2, clang-15), whose multiarch layout CMake's HIP support does not expect:
# see "Debian layout" below.

# ---------------------------------------------------------------------------------------- platform
# Debian's hipcc targets NVIDIA when nvcc is installed unless HIP_PLATFORM=amd; this build is AMD
# only.
if(DEFINED ENV{HIP_PLATFORM} AND NOT "$ENV{HIP_PLATFORM}" STREQUAL "amd")
  message(FATAL_ERROR "NVTE_BACKEND=rocm: expected HIP_PLATFORM=amd (or unset), got "
                      "'$ENV{HIP_PLATFORM}'")
endif()
set(ENV{HIP_PLATFORM} amd)  # for hipconfig below and CMake's own HIP probing

find_program(NVTE_HIPCONFIG hipconfig PATHS $ENV{ROCM_PATH}/bin /opt/rocm/bin)
set(NVTE_ROCM_ROOT "$ENV{ROCM_PATH}" CACHE PATH "ROCm prefix (default: hipconfig --rocmpath)")
if(NOT NVTE_ROCM_ROOT AND NVTE_HIPCONFIG)
  execute_process(COMMAND ${NVTE_HIPCONFIG} --rocmpath OUTPUT_VARIABLE _rocm_root
                  OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  set(NVTE_ROCM_ROOT "${_rocm_root}" CACHE PATH "ROCm prefix (default: hipconfig --rocmpath)" FORCE)
endif()
if(NOT NVTE_ROCM_ROOT OR NOT EXISTS "${NVTE_ROCM_ROOT}/include/hip/hip_runtime.h")
  message(FATAL_ERROR "NVTE_BACKEND=rocm: expected a HIP installation (include/hip/hip_runtime.h) "
                      "under ROCM_PATH or 'hipconfig --rocmpath', got '${NVTE_ROCM_ROOT}'. On "
                      "Debian: apt-get install hipcc libamdhip64-dev rocm-device-libs")
endif()

# HIP compiler: the clang hipcc runs (CMake refuses hipcc itself), as hipcc reports it with
# HIPCC_VERBOSE=1: Debian's HIP 5.2 runs /usr/bin/clang++-15, ROCm <root>/llvm/bin/clang++.
if(NOT CMAKE_HIP_COMPILER AND NOT DEFINED ENV{HIPCXX})
  find_program(NVTE_HIPCC hipcc PATHS $ENV{ROCM_PATH}/bin /opt/rocm/bin)
  if(NVTE_HIPCC)
    list(GET NVTE_ROCM_ARCH 0 _probe_arch)
    execute_process(
      COMMAND ${CMAKE_COMMAND} -E env HIPCC_VERBOSE=1 ${NVTE_HIPCC} --offload-arch=${_probe_arch}
              -x hip -E /dev/null -o /dev/null
      OUTPUT_VARIABLE _hipcc_out ERROR_VARIABLE _hipcc_out)
    if(_hipcc_out MATCHES "hipcc-cmd: *\"?([^\" \n]+)")
      set(NVTE_HIP_CLANG ${CMAKE_MATCH_1})
    endif()
  endif()
  if(NOT NVTE_HIP_CLANG)
    find_program(NVTE_HIP_CLANG NAMES clang++ PATHS ${NVTE_ROCM_ROOT}/llvm/bin NO_DEFAULT_PATH)
  endif()
  if(NOT NVTE_HIP_CLANG)
    message(FATAL_ERROR "NVTE_BACKEND=rocm: expected hipcc (to name its clang) or clang++ in "
                        "${NVTE_ROCM_ROOT}/llvm/bin, got neither; set CMAKE_HIP_COMPILER")
  endif()
  set(CMAKE_HIP_COMPILER ${NVTE_HIP_CLANG})
endif()

# Arch check up front: an arch this clang does not know otherwise fails every compile.
# gfx94x (MI300) uses the FNUZ FP8 formats, everything else OCP (ARCHITECTURE.md §5): platform/.
set(_hip_clang ${CMAKE_HIP_COMPILER})
if(DEFINED ENV{HIPCXX} AND NOT CMAKE_HIP_COMPILER)
  set(_hip_clang $ENV{HIPCXX})
endif()
execute_process(COMMAND ${_hip_clang} --target=amdgcn-amd-amdhsa -nogpulib -print-supported-cpus
                OUTPUT_VARIABLE _cpus ERROR_VARIABLE _cpus)
foreach(arch ${NVTE_ROCM_ARCH})
  string(REGEX REPLACE ":.*" "" arch_name "${arch}")  # gfx90a:xnack+ -> gfx90a
  if(NOT _cpus MATCHES "[ \t\n]${arch_name}[ \t\n]")
    string(REGEX MATCHALL "gfx[0-9a-f]+" _known "${_cpus}")
    list(JOIN _known " " _known)
    message(FATAL_ERROR "NVTE_ROCM_ARCH: expected archs known to ${_hip_clang}, got '${arch}'; it "
                        "knows: ${_known}. (Debian's clang 15 stops at gfx940: use "
                        "NVTE_ROCM_ARCH=\"gfx90a;gfx940\".)")
  endif()
endforeach()

# ----------------------------------------------------------------------------------- Debian layout
# CMake 3.25 expects <root>/lib/cmake/hip-lang and the device libraries where clang looks by
# default; Debian has /usr/lib/<multiarch>/cmake/hip-lang and /usr/lib/<multiarch>/amdgcn/bitcode.
# Point CMake at a shim root holding a link to the real hip-lang config (whose paths resolve
# through the link), let find_package see the multiarch configs it depends on (amd_comgr), and tell
# clang where the device libraries are. A regular ROCm install needs none of this.
set(_multiarch_cmake ${NVTE_ROCM_ROOT}/lib/${CMAKE_LIBRARY_ARCHITECTURE}/cmake)
if(NOT EXISTS ${NVTE_ROCM_ROOT}/lib/cmake/hip-lang/hip-lang-config.cmake AND
   EXISTS ${_multiarch_cmake}/hip-lang/hip-lang-config.cmake)
  set(_shim ${CMAKE_BINARY_DIR}/rocm-root-shim)
  file(MAKE_DIRECTORY ${_shim}/lib/cmake)
  file(CREATE_LINK ${_multiarch_cmake}/hip-lang ${_shim}/lib/cmake/hip-lang SYMBOLIC)
  set(CMAKE_HIP_COMPILER_ROCM_ROOT ${_shim})
  # (an environment variable, so CMake's try_compile of the HIP compiler sees it too)
  set(ENV{CMAKE_PREFIX_PATH} "${_multiarch_cmake}:$ENV{CMAKE_PREFIX_PATH}")
endif()
find_path(NVTE_ROCM_DEVICE_LIB_PATH ocml.bc NO_DEFAULT_PATH PATHS
  ${NVTE_ROCM_ROOT}/amdgcn/bitcode
  ${NVTE_ROCM_ROOT}/lib/${CMAKE_LIBRARY_ARCHITECTURE}/amdgcn/bitcode
  ${NVTE_ROCM_ROOT}/lib/amdgcn/bitcode)
if(NOT NVTE_ROCM_DEVICE_LIB_PATH)
  message(FATAL_ERROR "NVTE_BACKEND=rocm: expected the ROCm device libraries (ocml.bc) under "
                      "${NVTE_ROCM_ROOT}, got none. On Debian: apt-get install rocm-device-libs")
endif()
string(APPEND CMAKE_HIP_FLAGS
       " --rocm-path=${NVTE_ROCM_ROOT} --rocm-device-lib-path=${NVTE_ROCM_DEVICE_LIB_PATH}")

set(CMAKE_HIP_ARCHITECTURES ${NVTE_ROCM_ARCH})  # also stops CMake probing for a GPU
enable_language(HIP)

# ----------------------------------------------------------------------------------------- hipify
find_package(Python3 COMPONENTS Interpreter REQUIRED)
set(NVTE_HIPIFY_DIR ${CMAKE_CURRENT_BINARY_DIR}/hipified CACHE INTERNAL "hipified copy of common/")
set(_hipify_tool ${PROJECT_SOURCE_DIR}/build_tools/hipify.py)
set(_hipify_map ${PROJECT_SOURCE_DIR}/build_tools/hipify/custom_map.json)
set(_hipify_cmd ${Python3_EXECUTABLE} ${_hipify_tool} --src ${CMAKE_CURRENT_SOURCE_DIR}
                --dst ${NVTE_HIPIFY_DIR} --custom-map ${_hipify_map})
# At configure time, so the output list is known; CONFIGURE_DEPENDS re-runs configure when a file
# that hipify may read appears or disappears.
execute_process(COMMAND ${_hipify_cmd} --print-outputs OUTPUT_VARIABLE _hipify_outputs
                RESULT_VARIABLE _hipify_rc)
if(NOT _hipify_rc EQUAL 0)
  message(FATAL_ERROR "build_tools/hipify.py failed (exit ${_hipify_rc}); see the message above")
endif()
string(REPLACE "\n" ";" _hipify_outputs "${_hipify_outputs}")
list(FILTER _hipify_outputs EXCLUDE REGEX "^$")
file(GLOB_RECURSE _hipify_inputs CONFIGURE_DEPENDS
  ${CMAKE_CURRENT_SOURCE_DIR}/*.cu ${CMAKE_CURRENT_SOURCE_DIR}/*.cuh ${CMAKE_CURRENT_SOURCE_DIR}/*.h
  ${CMAKE_CURRENT_SOURCE_DIR}/*.hpp ${CMAKE_CURRENT_SOURCE_DIR}/*.inl
  ${CMAKE_CURRENT_SOURCE_DIR}/amd_detail/* ${CMAKE_CURRENT_SOURCE_DIR}/ck_fused_attn/*
  ${CMAKE_CURRENT_SOURCE_DIR}/aotriton/*)
# At build time when a source changes. hipify.py rewrites only outputs whose bytes change and ninja
# re-stats byproducts, so editing one header recompiles only the objects that include it.
set(_hipify_stamp ${CMAKE_CURRENT_BINARY_DIR}/hipify.stamp)
add_custom_command(
  OUTPUT ${_hipify_stamp}
  BYPRODUCTS ${_hipify_outputs}
  COMMAND ${_hipify_cmd} --quiet
  COMMAND ${CMAKE_COMMAND} -E touch ${_hipify_stamp}
  DEPENDS ${_hipify_inputs} ${_hipify_tool} ${_hipify_map}
  COMMENT "hipify: transformer_engine_lite/common -> ${NVTE_HIPIFY_DIR}"
  VERBATIM)
add_custom_target(nvte_hipify DEPENDS ${_hipify_stamp})
add_dependencies(transformer_engine_lite nvte_hipify)

# ------------------------------------------------------------------------------------ HIP sources
set(NVTE_HIP_SOURCES)
foreach(src ${NVTE_GPU_SOURCES})
  file(RELATIVE_PATH rel ${CMAKE_CURRENT_SOURCE_DIR} ${src})
  list(APPEND NVTE_HIP_SOURCES ${NVTE_HIPIFY_DIR}/${rel})
endforeach()
set_source_files_properties(${NVTE_HIP_SOURCES} PROPERTIES LANGUAGE HIP)
target_sources(transformer_engine_lite PRIVATE ${NVTE_HIP_SOURCES})
# The hipified folder first, so "util/x.h"-style includes of HIP sources never reach the CUDA
# originals ("../x.h" includes resolve next to the hipified file anyway).
target_include_directories(transformer_engine_lite BEFORE PRIVATE
  $<$<COMPILE_LANGUAGE:HIP>:${NVTE_HIPIFY_DIR}>)
set_target_properties(transformer_engine_lite PROPERTIES
  HIP_ARCHITECTURES "${NVTE_ROCM_ARCH}" HIP_STANDARD 17 HIP_STANDARD_REQUIRED ON
  HIP_VISIBILITY_PRESET hidden
  # g++ links (libgomp, libstdc++ as the CPU objects expect); HIP objects carry their device code
  # in a .hip_fatbin section and need only libamdhip64 at link time.
  LINKER_LANGUAGE CXX)
target_compile_definitions(transformer_engine_lite PRIVATE NVTE_WITH_ROCM=1)
# -ffp-contract=off: clang's HIP default contracts a*b+c into FMAs; off matches the CPU build and
# nvcc --fmad=false, so shared scalar math (util/*.h) rounds identically on every device.
# NVTE_PTXAS_VERBOSE: the HIP equivalent of -Xptxas -v, a remark per kernel with its SGPRs, VGPRs,
# AGPRs, spills, scratch, LDS and occupancy.
set(_resource_remarks -Rpass-analysis=kernel-resource-usage)
target_compile_options(transformer_engine_lite PRIVATE
  $<$<COMPILE_LANGUAGE:HIP>:-O3 -ffp-contract=off -Wall -Wextra>
  $<$<AND:$<COMPILE_LANGUAGE:HIP>,$<BOOL:${NVTE_WERROR}>>:-Werror>
  $<$<AND:$<COMPILE_LANGUAGE:HIP>,$<BOOL:${NVTE_PTXAS_VERBOSE}>>:${_resource_remarks}>)

# HIP runtime: kernels register themselves with it when the library loads; it talks to the driver
# (/dev/kfd) only on the first API call, so the library loads on a host without a GPU.
if(TARGET hip-lang::amdhip64)
  target_link_libraries(transformer_engine_lite PRIVATE hip-lang::amdhip64)
else()
  find_library(NVTE_AMDHIP64 amdhip64 REQUIRED
    HINTS ${NVTE_ROCM_ROOT}/lib ${NVTE_ROCM_ROOT}/lib/${CMAKE_LIBRARY_ARCHITECTURE})
  target_link_libraries(transformer_engine_lite PRIVATE ${NVTE_AMDHIP64})
endif()
# Every symbol resolved at link time: a missing GPU launcher fails the build, not the first import.
target_link_options(transformer_engine_lite PRIVATE -Wl,--no-undefined)

# GEMM on ROCm is the project's tiled kernel (gemm/gemm_tiled.cu, hipified). A hipBLASLt path is not
# written yet: its headers are not available on the machines this project builds on (Debian 12 does
# not package them), and code that was never compiled is not shipped.

message(STATUS "ROCm: ${CMAKE_HIP_COMPILER} for ${NVTE_ROCM_ARCH}; HIP from ${NVTE_ROCM_ROOT}; "
               "GEMM: tiled kernel; hipified sources in ${NVTE_HIPIFY_DIR}")
