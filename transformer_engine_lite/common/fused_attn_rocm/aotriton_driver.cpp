// The GPU driver's module API, opened with dlopen at the first AOTriton launch (like cuBLASLt), so
// the library builds without driver headers and loads on hosts without a driver. CUDA builds use
// libcuda (cuModuleLoadData, cuLaunchKernel, ...), ROCm builds libamdhip64 (hipModuleLoadData,
// hipModuleLaunchKernel, ...): the two have the same shapes, which is all this file relies on.
#include "aotriton_driver.h"

#include <dlfcn.h>

#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "../util/error.h"

namespace nvte {
namespace aotriton {
namespace {

using detail::concat;

#ifdef NVTE_WITH_ROCM
constexpr const char *kLibs[] = {"libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6",
                                 "libamdhip64.so.5"};
constexpr const char *kLoad = "hipModuleLoadData", *kGetFunction = "hipModuleGetFunction",
                     *kLaunch = "hipModuleLaunchKernel", *kDriverName = "HIP runtime";
#else
constexpr const char *kLibs[] = {"libcuda.so.1", "libcuda.so"};
constexpr const char *kLoad = "cuModuleLoadData", *kGetFunction = "cuModuleGetFunction",
                     *kLaunch = "cuLaunchKernel", *kDriverName = "CUDA driver";
#endif

// Status codes are int-sized enums (CUresult, hipError_t), 0 = success; handles are pointers.
using LoadFn = int (*)(void **module, const void *image);
using GetFunctionFn = int (*)(void **function, void *module, const char *name);
using LaunchFn = int (*)(void *function, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                         unsigned by, unsigned bz, unsigned shared, void *stream, void **params,
                         void **extra);
using SetAttributeFn = int (*)(void *function, int attribute, int value);  // CUDA only
using CuErrorStringFn = int (*)(int status, const char **text);
using HipErrorStringFn = const char *(*)(int status);

struct Api {
  LoadFn load = nullptr;
  GetFunctionFn get_function = nullptr;
  LaunchFn launch = nullptr;
  SetAttributeFn set_attribute = nullptr;
  CuErrorStringFn cu_error = nullptr;
  HipErrorStringFn hip_error = nullptr;
  std::string lib;  // the file that was opened
};

template <typename F>
bool resolve(void *lib, const char *name, F *fn) {
  *fn = reinterpret_cast<F>(dlsym(lib, name));
  return *fn != nullptr;
}

const Api &api() {
  static const Api *a = []() -> const Api * {
    for (const char *name : kLibs) {
      void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (lib == nullptr) continue;
      auto *x = new Api;
      x->lib = name;
      bool ok = resolve(lib, kLoad, &x->load) && resolve(lib, kGetFunction, &x->get_function) &&
                resolve(lib, kLaunch, &x->launch);
#ifdef NVTE_WITH_ROCM
      ok = ok && resolve(lib, "hipGetErrorString", &x->hip_error);
#else
      ok = ok && resolve(lib, "cuFuncSetAttribute", &x->set_attribute) &&
           resolve(lib, "cuGetErrorString", &x->cu_error);
#endif
      if (ok) return x;
      delete x;
      dlclose(lib);
    }
    return nullptr;
  }();
  NVTE_CHECK_SUPPORTED(a != nullptr, "the AOTriton backend needs the ", kDriverName, " (",
                       kLibs[0], " with ", kLoad, ", ", kLaunch,
                       "), got none loadable on this host");
  return *a;
}

std::string status_text(int status) {
  const Api &a = api();
  const char *text = nullptr;
  if (a.cu_error != nullptr) a.cu_error(status, &text);
  if (a.hip_error != nullptr) text = a.hip_error(status);
  return concat(status, " (", text ? text : "unknown error", ")");
}

void check(int status, const char *call, const KernelImage &k) {
  if (status == 0) return;
  detail::throw_error(NVTE_ERROR_INTERNAL, __FILE__, __LINE__, call,
                      concat("aotriton: ", call, " for ", k.kernel, " (", k.dtype, ", BLOCK_D ",
                             k.block_d, ", ", k.arch, ") failed: ", status_text(status)));
}

}  // namespace

void *kernel_function(const KernelImage &k, int device) {
  // Modules belong to a device's context: one load per (device, image), kept for the process.
  static std::mutex mu;
  static std::map<std::pair<int, const KernelImage *>, void *> functions;
  std::lock_guard<std::mutex> lock(mu);
  auto it = functions.find({device, &k});
  if (it != functions.end()) return it->second;
  const Api &a = api();
  void *module = nullptr, *function = nullptr;
  check(a.load(&module, k.image), kLoad, k);
  check(a.get_function(&function, module, k.entry), kGetFunction, k);
#ifndef NVTE_WITH_ROCM
  // Dynamic shared memory above 48 KiB is refused at launch unless the function opts in.
  constexpr int kMaxDynamicSharedAttr = 8;  // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
  if (k.shared > 48 * 1024) {
    check(a.set_attribute(function, kMaxDynamicSharedAttr, static_cast<int>(k.shared)),
          "cuFuncSetAttribute", k);
  }
#endif
  functions[{device, &k}] = function;
  return function;
}

void launch(const KernelImage &k, int device, const unsigned grid[3], void *stream,
            void **params) {
  void *f = kernel_function(k, device);
  const unsigned block = static_cast<unsigned>(k.num_warps * k.warp_size);
  check(api().launch(f, grid[0], grid[1], grid[2], block, 1, 1, k.shared, stream, params, nullptr),
        kLaunch, k);
}

}  // namespace aotriton
}  // namespace nvte
