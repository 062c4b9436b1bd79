// A stand-in for the GPU driver's module API, so the AOTriton glue runs, unchanged, on a host
// without a GPU: built as a shared library whose SONAME is the driver's (libcuda.so.1, or
// libamdhip64.so with FAKE_HIP), linked into test_aotriton_launch, so the glue's dlopen of that
// name returns this library. Every call is forwarded to hooks the test installs, which record it.
#include "fake_gpu_driver.h"

namespace {
FakeDriverHooks g_hooks{};
}

extern "C" {

void fake_driver_set_hooks(const FakeDriverHooks *hooks) { g_hooks = *hooks; }

#ifdef FAKE_HIP
int hipModuleLoadData(void **module, const void *image) { return g_hooks.load(module, image); }
int hipModuleGetFunction(void **function, void *module, const char *name) {
  return g_hooks.get_function(function, module, name);
}
int hipModuleLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                          unsigned bz, unsigned shared, void *stream, void **params, void **extra) {
  return g_hooks.launch(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra);
}
const char *hipGetErrorString(int status) { return status == 0 ? "hipSuccess" : "fake HIP error"; }
#else
int cuModuleLoadData(void **module, const void *image) { return g_hooks.load(module, image); }
int cuModuleGetFunction(void **function, void *module, const char *name) {
  return g_hooks.get_function(function, module, name);
}
int cuFuncSetAttribute(void *function, int attribute, int value) {
  return g_hooks.set_attribute(function, attribute, value);
}
int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                   unsigned bz, unsigned shared, void *stream, void **params, void **extra) {
  return g_hooks.launch(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra);
}
int cuGetErrorString(int status, const char **text) {
  *text = status == 0 ? "no error" : "fake CUDA error";
  return 0;
}
#endif

}  // extern "C"
