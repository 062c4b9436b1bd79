# cuBLASLt for the CUDA GEMM (gemm/gemm_cublaslt.cu; included by gpu.cmake for NVTE_BACKEND=cuda).
# Build time needs cublasLt.h only: the library is opened with dlopen at the first GEMM, so
# libtransformer_engine_lite.so has no link-time dependency on it and loads (running the tiled GEMM)
# where it is absent. Header and library are searched in NVTE_CUBLASLT_ROOT, the CUDA toolkit, then
# PyPI's wheels under the Python prefix: nvidia-cublas (CUDA 13: nvidia/cu13/{include,lib}) or
# nvidia-cublas-cu12 (nvidia/cublas/{include,lib}). The library path found is compiled in as the
# last dlopen candidate (after the loader's search and the wheel beside the installed package).
# NVTE_WITH_CUBLASLT: AUTO (default) uses cuBLASLt when found and otherwise builds the tiled GEMM
# alone, saying so in one line (an automatic build never fails for a missing optional GPU piece); ON
# requires it (a missing cuBLASLt is an error); OFF leaves it out.
set(NVTE_WITH_CUBLASLT "AUTO" CACHE STRING "cuBLASLt for the CUDA GEMM: AUTO, ON or OFF")
set_property(CACHE NVTE_WITH_CUBLASLT PROPERTY STRINGS AUTO ON OFF)
set(NVTE_CUBLASLT_ROOT "" CACHE PATH "Prefix holding include/cublasLt.h and lib/libcublasLt.so.*")
string(TOUPPER "${NVTE_WITH_CUBLASLT}" _cublaslt_mode)
if(_cublaslt_mode STREQUAL "1" OR _cublaslt_mode STREQUAL "TRUE")
  set(_cublaslt_mode ON)
elseif(_cublaslt_mode STREQUAL "0" OR _cublaslt_mode STREQUAL "FALSE")
  set(_cublaslt_mode OFF)
endif()
if(NOT _cublaslt_mode MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "NVTE_WITH_CUBLASLT: expected AUTO, ON or OFF, got '${NVTE_WITH_CUBLASLT}'")
endif()

if(_cublaslt_mode STREQUAL "OFF")
  message(STATUS "cuBLASLt: off (NVTE_WITH_CUBLASLT=OFF); CUDA GEMMs use the tiled kernel")
  return()
endif()

set(_cublaslt_major ${CUDAToolkit_VERSION_MAJOR})
set(_cublaslt_prefixes)
if(NVTE_CUBLASLT_ROOT)
  list(APPEND _cublaslt_prefixes ${NVTE_CUBLASLT_ROOT})
endif()
list(APPEND _cublaslt_prefixes ${CUDAToolkit_LIBRARY_ROOT})
find_package(Python3 COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND)
  # Every folder of the `nvidia` namespace package (site-packages, user site, venvs).
  execute_process(
    COMMAND ${Python3_EXECUTABLE} -c "import nvidia; print(';'.join(nvidia.__path__))"
    OUTPUT_VARIABLE _nvidia_dirs OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  foreach(dir ${_nvidia_dirs})
    list(APPEND _cublaslt_prefixes ${dir}/cu${_cublaslt_major} ${dir}/cublas)
  endforeach()
endif()

find_path(NVTE_CUBLASLT_INCLUDE_DIR cublasLt.h HINTS ${CUDAToolkit_INCLUDE_DIRS}
  PATHS ${_cublaslt_prefixes} PATH_SUFFIXES include NO_DEFAULT_PATH)
# The versioned soname first: the wheels ship no unversioned libcublasLt.so.
find_library(NVTE_CUBLASLT_LIBRARY
  NAMES libcublasLt.so.${_cublaslt_major} cublasLt
  HINTS ${CUDAToolkit_LIBRARY_DIR} PATHS ${_cublaslt_prefixes} PATH_SUFFIXES lib lib64
  NO_DEFAULT_PATH)
if(NOT NVTE_CUBLASLT_INCLUDE_DIR OR NOT NVTE_CUBLASLT_LIBRARY)
  list(JOIN _cublaslt_prefixes ", " _searched)
  if(_cublaslt_mode STREQUAL "AUTO")
    # Cleared so a later configure (after `pip install nvidia-cublas`) searches again.
    unset(NVTE_CUBLASLT_INCLUDE_DIR CACHE)
    unset(NVTE_CUBLASLT_LIBRARY CACHE)
    message(STATUS "cuBLASLt: not found (pip install nvidia-cublas to add it); CUDA GEMMs use the "
                   "tiled kernel (NVTE_WITH_CUBLASLT=AUTO)")
    return()
  endif()
  message(FATAL_ERROR
    "NVTE_BACKEND=cuda, NVTE_WITH_CUBLASLT=ON: expected cuBLASLt (cublasLt.h and libcublasLt.so.${_cublaslt_major}) in "
    "the CUDA toolkit or a PyPI wheel, got header '${NVTE_CUBLASLT_INCLUDE_DIR}', library "
    "'${NVTE_CUBLASLT_LIBRARY}' (searched: ${_searched}). Install it with `pip install "
    "nvidia-cublas` (CUDA 13; nvidia-cublas-cu12 for CUDA 12), point NVTE_CUBLASLT_ROOT at a "
    "prefix holding include/cublasLt.h and lib/libcublasLt.so.*, or configure with "
    "-DNVTE_WITH_CUBLASLT=OFF or AUTO (GEMMs then run the tiled kernel).")
endif()

# A header of another major version than the toolkit's would name a soname this runtime cannot use.
file(STRINGS ${NVTE_CUBLASLT_INCLUDE_DIR}/cublas_api.h _cublas_major_line
     REGEX "^#define CUBLAS_VER_MAJOR [0-9]+")
string(REGEX REPLACE "^#define CUBLAS_VER_MAJOR ([0-9]+).*" "\\1" _cublas_header_major
       "${_cublas_major_line}")
if(NOT _cublas_header_major STREQUAL _cublaslt_major AND _cublaslt_mode STREQUAL "AUTO")
  message(STATUS "cuBLASLt: headers of major version ${_cublas_header_major} in "
                 "${NVTE_CUBLASLT_INCLUDE_DIR}, expected ${_cublaslt_major} (the CUDA toolkit's); CUDA "
                 "GEMMs use the tiled kernel (NVTE_WITH_CUBLASLT=AUTO)")
  return()
endif()
if(NOT _cublas_header_major STREQUAL _cublaslt_major)
  message(FATAL_ERROR "cuBLASLt: expected headers of major version ${_cublaslt_major} (the CUDA "
                      "toolkit's), got ${_cublas_header_major} in ${NVTE_CUBLASLT_INCLUDE_DIR}")
endif()

target_include_directories(transformer_engine_lite SYSTEM PRIVATE ${NVTE_CUBLASLT_INCLUDE_DIR})
target_compile_definitions(transformer_engine_lite PRIVATE NVTE_HAVE_CUBLASLT=1)
set_property(SOURCE ${CMAKE_CURRENT_SOURCE_DIR}/gemm/gemm_cublaslt.cu APPEND PROPERTY
  COMPILE_DEFINITIONS NVTE_CUBLASLT_LIBRARY="${NVTE_CUBLASLT_LIBRARY}")
target_link_libraries(transformer_engine_lite PRIVATE ${CMAKE_DL_LIBS})  # dlopen (glibc < 2.34)
message(STATUS "cuBLASLt: headers ${NVTE_CUBLASLT_INCLUDE_DIR}; loaded at run time "
               "(libcublasLt.so.${_cublaslt_major}; fallback path ${NVTE_CUBLASLT_LIBRARY})")
