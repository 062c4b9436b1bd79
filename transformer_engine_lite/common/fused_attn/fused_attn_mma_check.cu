// One m16n8k16 tensor-core product through platform/gpu_mma.h, for tests/cpp/gpu/test_gpu_mma.cpp:
// the fragment layout the flash attention forward (fused_attn_fwd_mma.cu) relies on, checked alone
// against a host reference, so a layout error shows up as one failing case rather than as wrong
// attention outputs.
#include "../platform/gpu_mma.h"
#include "../platform/runtime.h"
#include "../util/api.h"
#include "../util/dtype_dispatch.h"
#include "fused_attn_gpu.h"

namespace nvte {
namespace gpu {
namespace {

// Every lane of a 32-lane group loads its registers straight from the row-major matrices by the
// layout of gpu_mma.h (A[16][16], B[16][8] as B[k][n], C/D[16][8]); lanes of a second group of a
// 64-lane wavefront compute the same product and do not store.
template <typename T>
__global__ void __launch_bounds__(kWarpSize) mma_check_kernel(const T *a, const T *b, float *d) {
  const int lane = static_cast<int>(threadIdx.x) % kMmaLanes, g = lane / 4, t = lane % 4;
  const uint32_t af[4] = {mma_pack(a[g * 16 + 2 * t], a[g * 16 + 2 * t + 1]),
                          mma_pack(a[(g + 8) * 16 + 2 * t], a[(g + 8) * 16 + 2 * t + 1]),
                          mma_pack(a[g * 16 + 2 * t + 8], a[g * 16 + 2 * t + 9]),
                          mma_pack(a[(g + 8) * 16 + 2 * t + 8], a[(g + 8) * 16 + 2 * t + 9])};
  const uint32_t bf[2] = {mma_pack(b[(2 * t) * 8 + g], b[(2 * t + 1) * 8 + g]),
                          mma_pack(b[(2 * t + 8) * 8 + g], b[(2 * t + 9) * 8 + g])};
  float c[4] = {d[g * 8 + 2 * t], d[g * 8 + 2 * t + 1], d[(g + 8) * 8 + 2 * t],
                d[(g + 8) * 8 + 2 * t + 1]};
  mma_m16n8k16<T>(c, af, bf);
  if (threadIdx.x >= kMmaLanes) return;
  d[g * 8 + 2 * t] = c[0];
  d[g * 8 + 2 * t + 1] = c[1];
  d[(g + 8) * 8 + 2 * t] = c[2];
  d[(g + 8) * 8 + 2 * t + 1] = c[3];
}

}  // namespace
}  // namespace gpu
}  // namespace nvte

NVTEStatus nvte_gpu_mma_m16n8k16_check(const void *a, const void *b, float *d, NVTEDType dtype,
                                       NVTEStream stream) {
  return nvte::guarded("nvte_gpu_mma_m16n8k16_check", [&] {
    NVTE_CHECK(a != nullptr && b != nullptr && d != nullptr,
               "nvte_gpu_mma_m16n8k16_check: expected device pointers a, b, d, got a null one");
    nvte::dispatch_dtype<nvte::TypeList<nvte::fp16, nvte::bf16>>(dtype, "dtype", [&](auto tag) {
      using T = typename decltype(tag)::type;
      nvte::gpu::mma_check_kernel<T><<<1, nvte::kWarpSize, 0, nvte::as_stream(stream)>>>(
          static_cast<const T *>(a), static_cast<const T *>(b), d);
      NVTE_CHECK_LAUNCH();
    });
  });
}
