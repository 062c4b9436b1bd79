# GPU part of libtransformer_engine_lite (included from CMakeLists.txt when NVTE_BACKEND is cuda/rocm).
# CUDA: every <family>/*.cu compiled by nvcc for NVTE_CUDA_ARCHS with the runtime linked statically,
# so the library loads on a host without a driver. ROCm: the same sources hipified into the build tree
# (build_tools/hipify.py) and compiled as HIP for NVTE_ROCM_ARCH.
set(NVTE_CUDA_ARCHS "80;90" CACHE STRING "CUDA architectures (NVTE_CUDA_ARCHS)")
set(NVTE_ROCM_ARCH "gfx942" CACHE STRING "AMD GPU architectures (NVTE_ROCM_ARCH)")
option(NVTE_PTXAS_VERBOSE "Print per-kernel register/spill/shared-memory figures" OFF)

set(NVTE_GPU_SOURCES)
foreach(family ${NVTE_OP_FAMILIES})
  file(GLOB family_cu CONFIGURE_DEPENDS "${CMAKE_CURRENT_SOURCE_DIR}/${family}/*.cu")
  list(APPEND NVTE_GPU_SOURCES ${family_cu})
endforeach()
if(NOT NVTE_GPU_SOURCES)
  message(FATAL_ERROR "NVTE_BACKEND=${NVTE_BACKEND}: no GPU kernels (*.cu) found under ${CMAKE_CURRENT_SOURCE_DIR}")
endif()

target_compile_definitions(transformer_engine_lite PRIVATE NVTE_WITH_GPU=1)

if(NVTE_BACKEND STREQUAL "cuda")
  set(CMAKE_CUDA_ARCHITECTURES ${NVTE_CUDA_ARCHS})
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  target_sources(transformer_engine_lite PRIVATE ${NVTE_GPU_SOURCES})
  set_target_properties(transformer_engine_lite PROPERTIES
    CUDA_ARCHITECTURES "${NVTE_CUDA_ARCHS}" CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON
    CUDA_RUNTIME_LIBRARY Static CUDA_VISIBILITY_PRESET hidden)
  target_compile_definitions(transformer_engine_lite PRIVATE NVTE_WITH_CUDA=1)
  # --fmad=false: no implicit FMA contraction, matching the CPU's -ffp-contract=off, so shared scalar
  # math (util/*.h) rounds identically on both devices.
  target_compile_options(transformer_engine_lite PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr --fmad=false -O3 -Xcompiler=-fno-math-errno>
    $<$<AND:$<COMPILE_LANGUAGE:CUDA>,$<BOOL:${NVTE_WERROR}>>:--Werror=all-warnings -Xcompiler=-Wall,-Wextra,-Werror>
    $<$<AND:$<COMPILE_LANGUAGE:CUDA>,$<BOOL:${NVTE_PTXAS_VERBOSE}>>:-Xptxas=-v>)
  target_link_libraries(transformer_engine_lite PRIVATE CUDA::cudart_static)
  include(${CMAKE_CURRENT_SOURCE_DIR}/gemm/cublaslt.cmake OPTIONAL)
elseif(NVTE_BACKEND STREQUAL "rocm")
  include(${CMAKE_CURRENT_SOURCE_DIR}/rocm.cmake)
endif()

# Build info (util/build_info.cpp): the GPU archs compiled and, per arch, the FP8 flavour its kernels
# use: "fnuz" on gfx94x (MI300: E4M3FNUZ/E5M2FNUZ), "ocp" everywhere else, every CUDA arch included
# (ARCHITECTURE.md §5). The device code makes the same choice per arch in platform/.
set(_gpu_archs)
set(_gpu_fp8)
if(NVTE_BACKEND STREQUAL "cuda")
  foreach(arch ${NVTE_CUDA_ARCHS})
    string(REGEX REPLACE "-(real|virtual)$" "" arch "${arch}")
    list(APPEND _gpu_archs "sm_${arch}")
    list(APPEND _gpu_fp8 ocp)
  endforeach()
else()
  foreach(arch ${NVTE_ROCM_ARCH})
    string(REGEX REPLACE ":.*" "" arch "${arch}")  # gfx90a:xnack+ -> gfx90a
    list(APPEND _gpu_archs "${arch}")
    if(arch MATCHES "^gfx94[0-9a-f]$")
      list(APPEND _gpu_fp8 fnuz)
    else()
      list(APPEND _gpu_fp8 ocp)
    endif()
  endforeach()
endif()
list(JOIN _gpu_archs "," _gpu_archs)
list(JOIN _gpu_fp8 "," _gpu_fp8)
set_property(SOURCE ${CMAKE_CURRENT_SOURCE_DIR}/util/build_info.cpp APPEND PROPERTY
  COMPILE_DEFINITIONS NVTE_GPU_ARCHS="${_gpu_archs}" NVTE_GPU_FP8="${_gpu_fp8}")

# AOTriton backend: the Triton attention kernels of aotriton/kernels compiled ahead of time for every
# target arch by build_tools/aotriton.py (gfx90a/gfx942/gfx950 on ROCm, sm_80/sm_90 on CUDA;
# NVTE_AOTRITON_ARCHS overrides), embedded into the library with their index, and launched by
# fused_attn_rocm/ through the driver's module API. AUTO builds it when Python can import triton.
set(NVTE_WITH_AOTRITON "AUTO" CACHE STRING "AOTriton attention images: AUTO, ON or OFF")
set_property(CACHE NVTE_WITH_AOTRITON PROPERTY STRINGS AUTO ON OFF)
if(NOT NVTE_WITH_AOTRITON STREQUAL "OFF")
  find_package(Python3 COMPONENTS Interpreter)
  set(_triton_rc 1)
  if(Python3_EXECUTABLE)
    execute_process(COMMAND ${Python3_EXECUTABLE} -c "import triton; print(triton.__version__)"
                    RESULT_VARIABLE _triton_rc OUTPUT_VARIABLE _triton_version
                    OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  endif()
  set(_aot_tool ${PROJECT_SOURCE_DIR}/build_tools/aotriton.py)
  if(_triton_rc EQUAL 0)
    set(_aot_backend ${NVTE_BACKEND})
    execute_process(COMMAND ${Python3_EXECUTABLE} ${_aot_tool} archs --backend ${_aot_backend}
                            --gpu-archs "${NVTE_CUDA_ARCHS}"
                    RESULT_VARIABLE _aot_rc OUTPUT_VARIABLE _aot_archs
                    OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_VARIABLE _aot_err)
    if(NOT _aot_rc EQUAL 0)
      message(FATAL_ERROR "AOTriton: build_tools/aotriton.py archs failed: ${_aot_err}")
    endif()
  endif()
  if(_triton_rc EQUAL 0 AND _aot_archs)
    set(_aot_dir ${CMAKE_CURRENT_BINARY_DIR}/aotriton)
    file(GLOB _aot_kernels CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/aotriton/kernels/*.py)
    add_custom_command(
      OUTPUT ${_aot_dir}/aotriton_index.cpp ${_aot_dir}/index.json
      COMMAND ${Python3_EXECUTABLE} ${_aot_tool} build --archs "${_aot_archs}" --out ${_aot_dir}
      DEPENDS ${_aot_kernels} ${_aot_tool}
      COMMENT "AOTriton: compiling the Triton attention kernels for ${_aot_archs}"
      VERBATIM)
    file(GLOB _aot_glue CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/fused_attn_rocm/*.cpp)
    target_sources(transformer_engine_lite PRIVATE ${_aot_glue} ${_aot_dir}/aotriton_index.cpp)
    target_compile_definitions(transformer_engine_lite PRIVATE NVTE_WITH_AOTRITON=1)
    target_link_libraries(transformer_engine_lite PRIVATE ${CMAKE_DL_LIBS})
    set(NVTE_AOTRITON_INDEX ${_aot_dir}/index.json CACHE INTERNAL "AOTriton index of this build")
    message(STATUS "AOTriton: images for ${_aot_archs} (triton ${_triton_version})")
  elseif(NVTE_WITH_AOTRITON STREQUAL "ON")
    message(FATAL_ERROR "NVTE_WITH_AOTRITON=ON: expected Python with triton (pip install "
                        "triton==3.9.0) and a target arch, got none")
  else()
    message(STATUS "AOTriton: not built (no importable triton: pip install triton==3.9.0)")
  endif()
endif()
