// What this library was built with and what the CPU it runs on offers (for import-time reporting).
#include "build_info.h"
#ifdef NVTE_WITH_AOTRITON
#include "../fused_attn_rocm/aotriton_index.h"
#endif

#include <sstream>
#include <string>
#include <vector>

#include "../gemm/gemm_onednn_cpu.h"
#include "../platform/cpu_isa.h"

#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef NVTE_WITH_ONEDNN
#include <dnnl.h>
#endif

#ifndef NVTE_BACKEND_NAME
#define NVTE_BACKEND_NAME "cpu"
#endif
// GPU builds: comma lists from gpu.cmake, the compiled archs and each one's FP8 flavour ("ocp" or
// "fnuz", same order).
#ifndef NVTE_GPU_ARCHS
#define NVTE_GPU_ARCHS ""
#define NVTE_GPU_FP8 ""
#endif

namespace nvte {

namespace {
std::vector<std::string> split_commas(const std::string &s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string item; std::getline(in, item, ',');) out.push_back(item);
  return out;
}

// "gpu_archs": ["gfx90a", "gfx940"], "gpu_fp8": {"gfx90a": "ocp", "gfx940": "fnuz"}
void write_gpu_archs(std::ostringstream &ss) {
  const std::vector<std::string> archs = split_commas(NVTE_GPU_ARCHS);
  const std::vector<std::string> fp8 = split_commas(NVTE_GPU_FP8);
  ss << ", \"gpu_archs\": [";
  for (size_t i = 0; i < archs.size(); ++i) ss << (i ? ", " : "") << '"' << archs[i] << '"';
  ss << "], \"gpu_fp8\": {";
  for (size_t i = 0; i < archs.size() && i < fp8.size(); ++i) {
    ss << (i ? ", " : "") << '"' << archs[i] << "\": \"" << fp8[i] << '"';
  }
  ss << "}";
}

std::string make_info() {
  std::ostringstream ss;
  ss << "{\"version\": \"" << NVTE_VERSION_STRING << "\"";
  ss << ", \"device_backends\": [\"cpu\"";
  if (std::string(NVTE_BACKEND_NAME) != "cpu") ss << ", \"" << NVTE_BACKEND_NAME << "\"";
  ss << "]";
  // GPU archs with their FP8 flavour (FNUZ on gfx94x, OCP elsewhere); the CPU supports all four.
  write_gpu_archs(ss);
  // Archs with AOTriton images (the Triton attention kernels compiled ahead of time).
  ss << ", \"aotriton_archs\": [";
#ifdef NVTE_WITH_AOTRITON
  const std::vector<std::string> aot = split_commas(aotriton::kArchs);
  for (size_t i = 0; i < aot.size(); ++i) ss << (i ? ", " : "") << '"' << aot[i] << '"';
#endif
  ss << "]";
  // GPU GEMM providers of this build (null in a CPU-only build).
#if defined(NVTE_HAVE_CUBLASLT)
  ss << ", \"gpu_gemm\": [\"cublaslt\", \"tiled\"]";
#else
  if (std::string(NVTE_BACKEND_NAME) != "cpu") ss << ", \"gpu_gemm\": [\"tiled\"]";
  else ss << ", \"gpu_gemm\": null";
#endif
  // Block-scaled formats with GPU quantize + dequantize kernels (cast/block_quantize.cu,
  // nvfp4_quantize.cu): the recipes' availability on a GPU reads this (pytorch/_availability.py).
  ss << ", \"gpu_block_scaling\": "
     << (std::string(NVTE_BACKEND_NAME) != "cpu" ? "[\"fp8_block\", \"nvfp4\"]" : "[]");
  ss << ", \"cpu_fp8_formats\": [\"e4m3\", \"e5m2\", \"e4m3fnuz\", \"e5m2fnuz\"]";
  ss << ", \"cpu_features\": {";
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  ss << "\"avx2\": " << (__builtin_cpu_supports("avx2") ? "true" : "false");
  ss << ", \"avx512f\": " << (__builtin_cpu_supports("avx512f") ? "true" : "false");
  ss << ", \"avx512bw\": " << (__builtin_cpu_supports("avx512bw") ? "true" : "false");
#if defined(__clang__)  // clang 15 (ci/fuzz.sh) cannot query these three: from the level, or false
  ss << ", \"x86_64_v4\": " << (cpu_isa_detected() >= CpuIsa::kAvx512Core ? "true" : "false");
  ss << ", \"avx512_bf16\": " << (__builtin_cpu_supports("avx512bf16") ? "true" : "false");
  ss << ", \"avx512_fp16\": false, \"amx_bf16\": false";
#else
  ss << ", \"x86_64_v4\": " << (__builtin_cpu_supports("x86-64-v4") ? "true" : "false");
  ss << ", \"avx512_bf16\": " << (__builtin_cpu_supports("avx512bf16") ? "true" : "false");
  ss << ", \"avx512_fp16\": " << (__builtin_cpu_supports("avx512fp16") ? "true" : "false");
  ss << ", \"amx_bf16\": " << (__builtin_cpu_supports("amx-bf16") ? "true" : "false");
#endif
  ss << ", \"kernel_clones\": [\"x86-64-v4\", \"x86-64-v3\", \"baseline\"]";
#else
  ss << "\"kernel_clones\": [\"baseline\"]";
#endif
  ss << "}";
  // The CPU level the kernels run at (NVTE_CPU_ISA caps it) and the clone that level picks.
  ss << ", \"cpu_isa\": {\"detected\": \"" << cpu_isa_name(cpu_isa_detected())
     << "\", \"level\": \"" << cpu_isa_name(cpu_isa_level()) << "\", \"clone\": \""
     << cpu_clone_name(cpu_isa_level()) << "\", \"vendor_amd\": "
     << (cpu_is_amd() ? "true" : "false") << ", \"matmul_path\": \""
     << matmul_path_name(cpu_matmul_path()) << "\"}";
#ifdef _OPENMP
  ss << ", \"openmp\": true, \"max_threads\": " << omp_get_max_threads();
#else
  ss << ", \"openmp\": false, \"max_threads\": 1";
#endif
#ifdef NVTE_WITH_ONEDNN
  const dnnl_version_t *v = dnnl_version();
  ss << ", \"gemm_cpu\": \"oneDNN " << v->major << "." << v->minor << "." << v->patch << "\"";
  ss << ", \"onednn_isa\": \"" << gemm::onednn_isa_name() << "\"";
#else
  ss << ", \"gemm_cpu\": null, \"onednn_isa\": null";
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
