# gpusim part of libtransformer_engine_lite (NVTE_BACKEND=gpusim; included from CMakeLists.txt): the
# GPU kernels (<family>/*.cu) compiled as C++ by the host compiler and launched on gpusim, the
# kernel-execution harness in platform/gpusim (test infrastructure: GPU-tagged tensors run the real
# kernels on the CPU). NVTE_GPUSIM_FLAVOUR picks the platform branch the kernels take:
#   cuda  the sources as written, 32-lane warps (what nvcc compiles);
#   rocm  the sources hipified (build_tools/hipify.py, as the ROCm build), 64-lane warps.
# build_tools/gpusim.py rewrites launches and __shared__ declarations into the build tree. The
# runtime is its own shared library (libnvte_gpusim.so, beside the library), so the library and the
# GPU gtests share one runtime instance: one set of streams, allocations and last error.
set(NVTE_GPUSIM_FLAVOUR "cuda" CACHE STRING "gpusim platform branch: cuda (warp 32) or rocm (warp 64)")
set_property(CACHE NVTE_GPUSIM_FLAVOUR PROPERTY STRINGS cuda rocm)
if(NVTE_GPUSIM_FLAVOUR STREQUAL "cuda")
  set(_gpusim_warp 32)
elseif(NVTE_GPUSIM_FLAVOUR STREQUAL "rocm")
  set(_gpusim_warp 64)
else()
  message(FATAL_ERROR "NVTE_GPUSIM_FLAVOUR: expected cuda or rocm, got '${NVTE_GPUSIM_FLAVOUR}'")
endif()

# NVTE_GPUSIM_CHECK: the kernels' memory accesses are checked (platform/gpusim/access_check.cpp:
# shared-memory races between barriers, uninitialised shared reads, shared and global bounds),
# through GCC's kernel-address instrumentation in call mode, whose entry points the runtime defines.
# Not with -fsanitize=address in the same build (ASan's runtime defines the same entry points).
option(NVTE_GPUSIM_CHECK "gpusim: check the kernels' shared/global memory accesses" OFF)

set(_gpusim_dir ${CMAKE_CURRENT_SOURCE_DIR}/platform/gpusim)
add_library(nvte_gpusim SHARED ${_gpusim_dir}/runtime.cpp ${_gpusim_dir}/scheduler.cpp
            ${_gpusim_dir}/fiber.cpp ${_gpusim_dir}/access_check.cpp)
if(NVTE_GPUSIM_CHECK)
  if(CMAKE_CXX_FLAGS MATCHES "-fsanitize=[^ ]*address")
    message(FATAL_ERROR "NVTE_GPUSIM_CHECK=ON: expected a build without -fsanitize=address (both "
                        "define __asan_load*_noabort), got CMAKE_CXX_FLAGS='${CMAKE_CXX_FLAGS}'")
  endif()
  target_compile_definitions(nvte_gpusim PRIVATE GPUSIM_ACCESS_HOOKS=1)
  set(_gpusim_check_flags -fsanitize=kernel-address
      --param=asan-instrumentation-with-call-threshold=0 --param=asan-stack=0
      --param=asan-globals=0)
endif()
target_include_directories(nvte_gpusim PUBLIC $<BUILD_INTERFACE:${_gpusim_dir}/include>)
target_compile_definitions(nvte_gpusim PUBLIC GPUSIM_WARP_SIZE=${_gpusim_warp})
target_compile_options(nvte_gpusim PRIVATE -O2 -Wall -Wextra
  $<$<BOOL:${NVTE_WERROR}>:-Werror>)
find_package(Threads REQUIRED)
target_link_libraries(nvte_gpusim PRIVATE Threads::Threads)
set_target_properties(nvte_gpusim PROPERTIES CXX_VISIBILITY_PRESET hidden
  POSITION_INDEPENDENT_CODE ON)

# ------------------------------------------------------------------ kernel sources, rewritten
set(NVTE_GPU_SOURCES)
foreach(family ${NVTE_OP_FAMILIES})
  file(GLOB family_cu CONFIGURE_DEPENDS "${CMAKE_CURRENT_SOURCE_DIR}/${family}/*.cu")
  list(APPEND NVTE_GPU_SOURCES ${family_cu})
endforeach()
find_package(Python3 COMPONENTS Interpreter REQUIRED)
set(_gpusim_src ${CMAKE_CURRENT_BINARY_DIR}/gpusim_${NVTE_GPUSIM_FLAVOUR})
set(_gpusim_tool ${PROJECT_SOURCE_DIR}/build_tools/gpusim.py)
set(_gpusim_cmd ${Python3_EXECUTABLE} ${_gpusim_tool} --flavour ${NVTE_GPUSIM_FLAVOUR}
                --src ${CMAKE_CURRENT_SOURCE_DIR} --dst ${_gpusim_src})
execute_process(COMMAND ${_gpusim_cmd} --print-outputs OUTPUT_VARIABLE _gpusim_outputs
                RESULT_VARIABLE _gpusim_rc)
if(NOT _gpusim_rc EQUAL 0)
  message(FATAL_ERROR "build_tools/gpusim.py failed (exit ${_gpusim_rc}); see the message above")
endif()
string(REPLACE "\n" ";" _gpusim_outputs "${_gpusim_outputs}")
list(FILTER _gpusim_outputs EXCLUDE REGEX "^$")
file(GLOB_RECURSE _gpusim_inputs CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*.cu
  ${CMAKE_CURRENT_SOURCE_DIR}/*.cuh ${CMAKE_CURRENT_SOURCE_DIR}/*.h)
set(_gpusim_stamp ${CMAKE_CURRENT_BINARY_DIR}/gpusim_${NVTE_GPUSIM_FLAVOUR}.stamp)
add_custom_command(
  OUTPUT ${_gpusim_stamp}
  BYPRODUCTS ${_gpusim_outputs}
  COMMAND ${_gpusim_cmd}
  COMMAND ${CMAKE_COMMAND} -E touch ${_gpusim_stamp}
  DEPENDS ${_gpusim_inputs} ${_gpusim_tool} ${PROJECT_SOURCE_DIR}/build_tools/hipify.py
          ${PROJECT_SOURCE_DIR}/build_tools/hipify/custom_map.json
  COMMENT "gpusim: transformer_engine_lite/common -> ${_gpusim_src} (${NVTE_GPUSIM_FLAVOUR})"
  VERBATIM)
add_custom_target(nvte_gpusim_sources DEPENDS ${_gpusim_stamp})
add_dependencies(transformer_engine_lite nvte_gpusim_sources)

set(_gpusim_kernels)
foreach(src ${NVTE_GPU_SOURCES})
  file(RELATIVE_PATH rel ${CMAKE_CURRENT_SOURCE_DIR} ${src})
  list(APPEND _gpusim_kernels ${_gpusim_src}/${rel})
endforeach()
# The kernels are C++ here (#pragma unroll is nvcc's: ignored); the harness's cuda_runtime.h / hip/hip_runtime.h come first on their
# include path (the CPU sources never include a runtime header).
set_source_files_properties(${_gpusim_kernels} PROPERTIES LANGUAGE CXX
  COMPILE_OPTIONS "-Wno-unknown-pragmas;${_gpusim_check_flags}"
  INCLUDE_DIRECTORIES "${_gpusim_src};${_gpusim_dir}/include" GENERATED ON)
target_sources(transformer_engine_lite PRIVATE ${_gpusim_kernels})
target_link_libraries(transformer_engine_lite PRIVATE nvte_gpusim)
target_compile_definitions(transformer_engine_lite PRIVATE NVTE_WITH_GPU=1 NVTE_WITH_GPUSIM=1)
if(NVTE_GPUSIM_FLAVOUR STREQUAL "rocm")
  target_compile_definitions(transformer_engine_lite PRIVATE NVTE_WITH_ROCM=1)
endif()
# The runtime sits beside the library (same folder), which finds it through $ORIGIN.
set_property(TARGET transformer_engine_lite APPEND PROPERTY BUILD_RPATH "$ORIGIN")
set_property(TARGET transformer_engine_lite APPEND PROPERTY INSTALL_RPATH "$ORIGIN")
set_property(SOURCE ${CMAKE_CURRENT_SOURCE_DIR}/util/build_info.cpp APPEND PROPERTY
  COMPILE_DEFINITIONS NVTE_GPU_ARCHS="gpusim-${NVTE_GPUSIM_FLAVOUR}" NVTE_GPU_FP8="ocp")
install(TARGETS nvte_gpusim LIBRARY DESTINATION .)
message(STATUS "gpusim: ${NVTE_GPUSIM_FLAVOUR} flavour (warp ${_gpusim_warp}), access checks "
               "${NVTE_GPUSIM_CHECK}; kernel sources in ${_gpusim_src}")
