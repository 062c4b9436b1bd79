// What this library was built with and what the CPU it runs on offers (for import-time reporting).
#include "build_info.h"

#include <sstream>
#include <string>

#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef NVTE_WITH_ONEDNN
#include <dnnl.h>
#endif

#ifndef NVTE_BACKEND_NAME
#define NVTE_BACKEND_NAME "cpu"
#endif

namespace nvte {

namespace {
std::string make_info() {
  std::ostringstream ss;
  ss << "{\"version\": \"" << NVTE_VERSION_STRING << "\"";
  ss << ", \"device_backends\": [\"cpu\"";
  if (std::string(NVTE_BACKEND_NAME) != "cpu") ss << ", \"" << NVTE_BACKEND_NAME << "\"";
  ss << "]";
  // FP8 flavour of the GPU backend (FNUZ on gfx94x, OCP elsewhere); the CPU supports all four.
  ss << ", \"cpu_fp8_formats\": [\"e4m3\", \"e5m2\", \"e4m3fnuz\", \"e5m2fnuz\"]";
  ss << ", \"cpu_features\": {";
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  ss << "\"avx2\": " << (__builtin_cpu_supports("avx2") ? "true" : "false");
  ss << ", \"avx512f\": " << (__builtin_cpu_supports("avx512f") ? "true" : "false");
  ss << ", \"avx512bw\": " << (__builtin_cpu_supports("avx512bw") ? "true" : "false");
  ss << ", \"x86_64_v4\": " << (__builtin_cpu_supports("x86-64-v4") ? "true" : "false");
  ss << ", \"kernel_clones\": [\"x86-64-v4\", \"x86-64-v3\", \"default\"]";
#else
  ss << "\"kernel_clones\": [\"default\"]";
#endif
  ss << "}";
#ifdef _OPENMP
  ss << ", \"openmp\": true, \"max_threads\": " << omp_get_max_threads();
#else
  ss << ", \"openmp\": false, \"max_threads\": 1";
#endif
#ifdef NVTE_WITH_ONEDNN
  const dnnl_version_t *v = dnnl_version();
  ss << ", \"gemm_cpu\": \"oneDNN " << v->major << "." << v->minor << "." << v->patch << "\"";
#else
  ss << ", \"gemm_cpu\": null";
#endif
  ss << "}";
  return ss.str();
}
}  // namespace

const char *build_info_json() {
  static const std::string info = make_info();
  return info.c_str();
}

}  // namespace nvte
