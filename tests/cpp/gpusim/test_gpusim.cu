// gpusim's own tests: the kernel language and runtime behave as CUDA/HIP define them (shuffles,
// votes, barriers, shared memory, atomics, coordinates, stream order), and every rule the harness
// checks is reported (death tests: the harness aborts with a message naming the kernel). Compiled
// through build_tools/gpusim.py like the library's kernels, at the flavour's warp size.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstring>
#include <numeric>
#include <vector>

namespace {

template <typename T>
struct DeviceBuf {
  explicit DeviceBuf(size_t n) : n(n) { EXPECT_EQ(cudaMalloc(reinterpret_cast<void **>(&p), n * sizeof(T)), cudaSuccess); }
  ~DeviceBuf() { (void)cudaFree(p); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
  void put(const std::vector<T> &h) {
    EXPECT_EQ(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  size_t n;
  T *p = nullptr;
};

constexpr int kW = GPUSIM_WARP_SIZE;

// ---------------------------------------------------------------- shuffles and votes
constexpr unsigned long long kFull = kW == 64 ? ~0ull : 0xffffffffull;

__global__ void shuffle_kernel(int *out, unsigned long long *ballots, int width) {
  const int t = threadIdx.x, lane = t % kW;
  const int n = blockDim.x;
  out[0 * n + t] = __shfl_xor_sync(kFull, t, 1, width);
  out[1 * n + t] = __shfl_up_sync(kFull, t, 1, width);
  out[2 * n + t] = __shfl_down_sync(kFull, t, 2, width);
  out[3 * n + t] = __shfl_sync(kFull, t, 3, width);
  out[4 * n + t] = __any_sync(kFull, lane == 5) + 2 * __all_sync(kFull, lane >= 0);
  ballots[t] = __ballot_sync(kFull, lane % 3 == 0);
}

TEST(GpusimShuffle, MatchesCudaSemantics) {
  for (int width : {kW, 8}) {
    const int n = 2 * kW;
    DeviceBuf<int> out(5 * n);
    DeviceBuf<unsigned long long> ballots(n);
    shuffle_kernel<<<1, n>>>(out.p, ballots.p, width);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    const std::vector<int> h = out.get();
    const std::vector<unsigned long long> b = ballots.get();
    unsigned long long ballot = 0;
    for (int l = 0; l < kW; ++l) ballot |= (l % 3 == 0 ? 1ull : 0ull) << l;
    for (int t = 0; t < n; ++t) {
      const int lane = t % kW, seg = lane / width * width;
      EXPECT_EQ(h[t], (lane ^ 1) < seg + width ? t ^ 1 : t) << "xor t=" << t;
      EXPECT_EQ(h[n + t], lane - 1 >= seg ? t - 1 : t) << "up t=" << t;
      EXPECT_EQ(h[2 * n + t], lane + 2 < seg + width ? t + 2 : t) << "down t=" << t;
      EXPECT_EQ(h[3 * n + t], t - lane + seg + 3) << "idx t=" << t;
      EXPECT_EQ(h[4 * n + t], 3) << "any/all t=" << t;
      EXPECT_EQ(b[t], ballot) << "ballot t=" << t;
    }
  }
}

// The HIP spellings (no mask) over the flavour's whole warp.
__global__ void wave_sum_kernel(float *out) {
  float v = static_cast<float>(threadIdx.x % kW);
  for (int m = kW / 2; m > 0; m /= 2) v += __shfl_xor(v, m);
  out[threadIdx.x] = v;
}

TEST(GpusimShuffle, WholeWarpReduction) {
  DeviceBuf<float> out(2 * kW);
  wave_sum_kernel<<<1, 2 * kW>>>(out.p);
  for (float v : out.get()) EXPECT_EQ(v, kW * (kW - 1) / 2.0f);
}

// ------------------------------------------------------ barriers, shared memory, atomics
__global__ void reverse_kernel(const int *in, int *out) {
  __shared__ int tile[256];
  extern __shared__ int extra[];
  const int t = threadIdx.x, n = blockDim.x;
  tile[t] = in[blockIdx.x * n + t];
  extra[t] = 2 * tile[t];
  __syncthreads();
  out[blockIdx.x * n + t] = tile[n - 1 - t] + extra[n - 1 - t];
}

TEST(GpusimBlock, SharedMemoryAndBarriers) {
  const int blocks = 7, n = 256;
  std::vector<int> h(blocks * n);
  std::iota(h.begin(), h.end(), 0);
  DeviceBuf<int> in(h.size()), out(h.size());
  in.put(h);
  reverse_kernel<<<blocks, n, n * sizeof(int)>>>(in.p, out.p);
  const std::vector<int> r = out.get();
  for (int b = 0; b < blocks; ++b)
    for (int t = 0; t < n; ++t) EXPECT_EQ(r[b * n + t], 3 * h[b * n + n - 1 - t]);
}

__global__ void coords_kernel(unsigned *out) {
  const unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const unsigned thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const unsigned per_block = blockDim.x * blockDim.y * blockDim.z;
  out[block * per_block + thread] = block * 1000 + thread;
  atomicAdd(out + gridDim.x * gridDim.y * gridDim.z * per_block, 1u);
}

TEST(GpusimBlock, CoordinatesAndAtomics) {
  const dim3 grid(3, 2, 2), block(4, 3, 2);
  const unsigned total = 12 * 24;
  DeviceBuf<unsigned> out(total + 1);
  ASSERT_EQ(cudaMemset(out.p + total, 0, sizeof(unsigned)), cudaSuccess);
  coords_kernel<<<grid, block>>>(out.p);
  const std::vector<unsigned> h = out.get();
  for (unsigned i = 0; i < total; ++i) EXPECT_EQ(h[i], i / 24 * 1000 + i % 24);
  EXPECT_EQ(h[total], total);
}

// Trip counts that differ between warps of a block are legal (warp operations need only the warp).
__global__ void uneven_kernel(int *out, int rows) {
  const int warp = threadIdx.x / kW, lane = threadIdx.x % kW;
  for (int r = warp; r < rows; r += blockDim.x / kW) {
    int v = lane;
    for (int m = kW / 2; m > 0; m /= 2) v += __shfl_xor(v, m);
    if (lane == 0) out[r] = v;
  }
}

TEST(GpusimBlock, WarpUniformLoopsNeedNotBeBlockUniform) {
  DeviceBuf<int> out(5);
  uneven_kernel<<<1, 4 * kW>>>(out.p, 5);
  for (int v : out.get()) EXPECT_EQ(v, kW * (kW - 1) / 2);
}

// --------------------------------------------------------------------- stream order
__global__ void set_kernel(int *p, int v) { p[threadIdx.x] = v; }

TEST(GpusimStream, LaunchesRunInOrderAtSynchronisation) {
  DeviceBuf<int> buf(32);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  set_kernel<<<1, 32, 0, s>>>(buf.p, 1);
  set_kernel<<<1, 32, 0, s>>>(buf.p, 2);
  // Nothing ran yet: the host sees the fill pattern, as it may see stale bytes on a GPU.
  int first;
  std::memcpy(&first, buf.p, sizeof first);
  EXPECT_NE(first, 2);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  for (int v : buf.get()) EXPECT_EQ(v, 2);
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

TEST(GpusimRuntime, BadArgumentsAreErrorsNotCrashes) {
  int *p = nullptr;
  set_kernel<<<1, 2048>>>(p, 0);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // cleared by the read
  DeviceBuf<int> buf(4);
  std::vector<int> h(8);
  EXPECT_EQ(cudaMemcpy(buf.p, h.data(), 8 * sizeof(int), cudaMemcpyHostToDevice),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaFree(h.data()), cudaErrorInvalidDevicePointer);
  int count = 0;
  EXPECT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  EXPECT_EQ(count, 1);
  cudaDeviceProp prop;
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  EXPECT_EQ(prop.warpSize, kW);
}

// --------------------------------------------------------------- checks (death tests)
__global__ void early_exit_kernel(int *p) {
  if (threadIdx.x == 5) return;
  __syncthreads();
  p[threadIdx.x] = 1;
}

__global__ void two_barriers_kernel(int *p) {
  if (threadIdx.x < 32) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  p[threadIdx.x] = 1;
}

__global__ void exited_lane_kernel(int *p) {
  if (threadIdx.x % kW == 3) return;
  p[threadIdx.x] = __shfl_xor(static_cast<int>(threadIdx.x), 1);
}

__global__ void partial_warp_kernel(int *p) {
  p[threadIdx.x] = __shfl_xor(static_cast<int>(threadIdx.x), kW / 2);
}

__global__ void too_much_shared_kernel(int *p) {
  __shared__ char big[100 * 1024];
  big[threadIdx.x] = 1;
  p[threadIdx.x] = big[0];
}

__global__ void recursion_kernel(int *p, int depth) {
  volatile char frame[4096];
  frame[0] = static_cast<char>(depth);
  if (depth > 0) recursion_kernel(p, depth - 1);
  p[0] = frame[0];
}

void launch_and_sync(void (*launch)(int *)) {
  int *p = nullptr;
  (void)cudaMalloc(reinterpret_cast<void **>(&p), 4096 * sizeof(int));
  launch(p);
  (void)cudaDeviceSynchronize();
}

TEST(GpusimChecksDeathTest, BarrierDivergence) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(launch_and_sync([](int *p) { early_exit_kernel<<<2, 64>>>(p); }),
               "early_exit_kernel.*barrier divergence.*exited without reaching.*linear ids 5");
  EXPECT_DEATH(launch_and_sync([](int *p) { two_barriers_kernel<<<1, 64>>>(p); }),
               "two_barriers_kernel.*barrier divergence: thread \\(0,0,0\\) waits at "
               "__syncthreads .*test_gpusim.cu");
}

TEST(GpusimChecksDeathTest, WarpOperations) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(launch_and_sync([](int *p) { exited_lane_kernel<<<1, kW>>>(p); }),
               "exited_lane_kernel.*reads lane 3 of warp 0, which did not take part");
  EXPECT_DEATH(launch_and_sync([](int *p) { partial_warp_kernel<<<1, kW / 2>>>(p); }),
               "partial_warp_kernel.*beyond the block's");
}

TEST(GpusimChecksDeathTest, SharedMemoryLimit) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(launch_and_sync([](int *p) { too_much_shared_kernel<<<1, 32>>>(p); }),
               "too_much_shared_kernel.*static shared memory 102400 bytes");
}

// (GCC defines __SANITIZE_ADDRESS__ for the access checks' kernel-address instrumentation too.)
#if (!defined(__SANITIZE_ADDRESS__) || defined(GPUSIM_ACCESS_CHECKS))
TEST(GpusimChecksDeathTest, StackOverflowHitsTheGuardPage) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(launch_and_sync([](int *p) { recursion_kernel<<<1, 2>>>(p, 1 << 20); }),
               "recursion_kernel.*overflowed its .* KiB stack");
}
#endif

#if defined(__SANITIZE_ADDRESS__) && !defined(GPUSIM_ACCESS_CHECKS)
__global__ void shared_oob_kernel(int *p) {
  __shared__ int a[32];
  __shared__ int b[32];
  a[threadIdx.x] = 1;
  b[threadIdx.x] = 2;
  __syncthreads();
  const int *pa = a;  // through a pointer: UBSan's array-bounds check would report first
  p[threadIdx.x] = pa[threadIdx.x + 32];  // one past a: the red zone, not b
}

__global__ void global_oob_kernel(int *p) { p[threadIdx.x + 4096] = 1; }

TEST(GpusimChecksDeathTest, OutOfBoundsUnderAsan) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(launch_and_sync([](int *p) { shared_oob_kernel<<<1, 32>>>(p); }),
               "use-after-poison.*\n.*shared_oob_kernel");
  EXPECT_DEATH(launch_and_sync([](int *p) { global_oob_kernel<<<1, 32>>>(p); }),
               "heap-buffer-overflow.*\n.*global_oob_kernel");
}
#endif

#if defined(GPUSIM_ACCESS_CHECKS)
// Each kernel breaks one rule the access checks enforce.
__global__ void shared_race_kernel(int *p) {
  __shared__ int s[64];
  s[threadIdx.x] = static_cast<int>(threadIdx.x);
  // Thread t reads what thread t - 1 wrote: no barrier orders the two.
  p[threadIdx.x] = threadIdx.x > 0 ? s[threadIdx.x - 1] : 0;
}

__global__ void write_after_read_kernel(int *p) {
  __shared__ int s[64];
  s[threadIdx.x] = 1;
  __syncthreads();
  p[threadIdx.x] = s[0];
  if (threadIdx.x == 63) s[0] = 2;  // every thread read s[0] in this same interval
}

__global__ void uninit_shared_kernel(int *p) {
  __shared__ int s[64];
  if (threadIdx.x < 32) s[threadIdx.x] = 1;
  __syncthreads();
  p[threadIdx.x] = s[threadIdx.x];
}

__global__ void shared_bounds_kernel(int *p) {
  __shared__ int s[32];
  s[threadIdx.x] = 1;
  __syncthreads();
  const int *ps = s;  // through a pointer: UBSan's array-bounds check would report first
  p[threadIdx.x] = ps[threadIdx.x + 1];  // thread 31 reads s[32]
}

__global__ void global_bounds_kernel(int *p) { p[threadIdx.x + 4096] = 1; }
__global__ void global_before_kernel(int *p) { p[static_cast<int>(threadIdx.x) - 8] = 1; }

// Correct communication through shared memory passes.
__global__ void clean_kernel(int *p) {
  __shared__ int s[64];
  s[threadIdx.x] = static_cast<int>(threadIdx.x);
  __syncthreads();
  p[threadIdx.x] = s[63 - threadIdx.x];
  __syncthreads();
  s[threadIdx.x] = 0;
}

TEST(GpusimAccessChecks, CleanKernelPasses) {
  DeviceBuf<int> out(4096);
  clean_kernel<<<3, 64>>>(out.p);
  const std::vector<int> h = out.get();
  for (int t = 0; t < 64; ++t) EXPECT_EQ(h[t], 63 - t);
}

TEST(GpusimChecksDeathTest, AccessChecks) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(launch_and_sync([](int *p) { shared_race_kernel<<<1, 64>>>(p); }),
               "shared_race_kernel.*shared-memory race on __shared__ s byte 0: thread "
               "\\(1,0,0\\) reads it after thread \\(0,0,0\\) wrote it");
  EXPECT_DEATH(launch_and_sync([](int *p) { write_after_read_kernel<<<1, 64>>>(p); }),
               "write_after_read_kernel.*race on __shared__ s byte 0: thread \\(63,0,0\\) "
               "writes it after another thread read it");
  EXPECT_DEATH(launch_and_sync([](int *p) { uninit_shared_kernel<<<1, 64>>>(p); }),
               "uninit_shared_kernel.*thread \\(32,0,0\\) reads __shared__ s byte 128.*no "
               "thread of the block wrote");
  EXPECT_DEATH(launch_and_sync([](int *p) { shared_bounds_kernel<<<1, 32>>>(p); }),
               "shared_bounds_kernel.*thread \\(31,0,0\\): 4-byte read of __shared__ s at "
               "byte 128, out of bounds \\(it has 128 bytes\\)");
  EXPECT_DEATH(launch_and_sync([](int *p) { global_bounds_kernel<<<1, 32>>>(p); }),
               "global_bounds_kernel.*thread \\(0,0,0\\): 4-byte write .* 4 bytes past the end "
               "of a 16384-byte device allocation");
  EXPECT_DEATH(launch_and_sync([](int *p) { global_before_kernel<<<1, 32>>>(p); }),
               "global_before_kernel.*32 bytes before the start of a 16384-byte");
}
#endif


}  // namespace
