// gpusim's runtime API (include/gpusim/api.h): device memory, in-order stream queues, events,
// device properties and the sticky/last error, for the CUDA and HIP spellings alike.
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <vector>

#include "internal.h"

struct GpusimStream {
  std::deque<std::function<void()>> ops;
};
struct GpusimEvent {
  bool recorded = false;
  std::chrono::steady_clock::time_point when;
};

namespace gpusim {
namespace {

// One lock for the runtime's state; queued work runs under it (kernels call no API function).
std::recursive_mutex &lock() {
  static std::recursive_mutex m;
  return m;
}
thread_local cudaError_t tls_last_error = cudaSuccess;

cudaError_t fail(cudaError_t e) {
  tls_last_error = e;
  return e;
}

GpusimStream &default_stream() {
  static GpusimStream s;
  return s;
}
std::vector<GpusimStream *> &streams() {  // created streams, in creation order
  static std::vector<GpusimStream *> v;
  return v;
}
GpusimStream &stream_of(cudaStream_t s) { return s == nullptr ? default_stream() : *s; }

// Runs every queued operation: the default stream first, then each created stream in order. (A
// stronger order than CUDA guarantees between streams, never a weaker one within a stream.)
void flush_all() {
  std::lock_guard<std::recursive_mutex> g(lock());
  auto drain = [](GpusimStream &s) {
    while (!s.ops.empty()) {
      std::function<void()> op = std::move(s.ops.front());
      s.ops.pop_front();
      op();
    }
  };
  drain(default_stream());
  for (GpusimStream *s : streams()) drain(*s);
}

void enqueue(cudaStream_t s, std::function<void()> op) {
  std::lock_guard<std::recursive_mutex> g(lock());
  stream_of(s).ops.push_back(std::move(op));
}

// Live allocations: base -> size asked and size mapped (check builds: whole pages and the guard
// page after them, see allocate),
// to check frees, the device side of copies and memsets, and (check builds) kernel accesses.
struct Allocation {
  size_t size, mapped;
};
std::map<const char *, Allocation> &allocations() {
  static std::map<const char *, Allocation> m;
  return m;
}
size_t page_size() {
  static const size_t p = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return p;
}

// [p, p + bytes) lies inside one live allocation.
bool in_allocation(const void *p, size_t bytes) {
  const char *c = static_cast<const char *>(p);
  auto &m = allocations();
  auto it = m.upper_bound(c);
  if (it == m.begin()) return false;
  --it;
  const size_t size = it->second.size, off = static_cast<size_t>(c - it->first);
  return off <= size && bytes <= size - off;
}

cudaError_t bad_range(const char *api, const void *p, size_t bytes) {
  std::fprintf(stderr,
               "gpusim: %s: expected a device range inside one cudaMalloc allocation, got "
               "[%p, +%zu bytes)\n",
               api, p, bytes);
  return fail(cudaErrorInvalidValue);
}

cudaError_t check_device_range(const char *api, const void *p, size_t bytes) {
  if (bytes == 0) return cudaSuccess;
  return in_allocation(p, bytes) ? cudaSuccess : bad_range(api, p, bytes);
}

// The device sides of a copy of `kind` (cudaMemcpyDefault: whichever side is device memory).
cudaError_t check_copy(const char *api, void *dst, const void *src, size_t bytes,
                       cudaMemcpyKind kind) {
  if (bytes == 0) return cudaSuccess;
  const bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice ||
                       (kind == cudaMemcpyDefault && in_allocation(dst, bytes));
  const bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice ||
                       (kind == cudaMemcpyDefault && in_allocation(src, bytes));
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault)
    return fail(cudaErrorInvalidMemcpyDirection);
  if (dst_dev && !in_allocation(dst, bytes)) return bad_range(api, dst, bytes);
  if (src_dev && !in_allocation(src, bytes)) return bad_range(api, src, bytes);
  return cudaSuccess;
}

cudaError_t allocate(void **ptr, size_t bytes) {
  if (ptr == nullptr) return fail(cudaErrorInvalidValue);
  *ptr = nullptr;
  if (bytes == 0) return cudaSuccess;  // CUDA: a null pointer and success
  void *p = nullptr;
  size_t mapped = bytes;
  if (access_checks_enabled()) {
    // Pages of its own, then an inaccessible page: the access checks report an access past the
    // end up to the page's end, and one beyond faults; no other object lives in between.
    const size_t pages = (bytes + page_size() - 1) / page_size() * page_size();
    mapped = pages + page_size();
    p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
             -1, 0);
    if (p == MAP_FAILED) return fail(cudaErrorMemoryAllocation);
    mprotect(static_cast<char *>(p) + pages, page_size(), PROT_NONE);
  } else if (posix_memalign(&p, 256, bytes) != 0) {
    // Exactly `bytes` (ASan's red zone starts right after), 256-byte aligned like cudaMalloc.
    return fail(cudaErrorMemoryAllocation);
  }
  std::memset(p, fill_byte(), bytes);
  std::lock_guard<std::recursive_mutex> g(lock());
  allocations()[static_cast<const char *>(p)] = {bytes, mapped};
  *ptr = p;
  return cudaSuccess;
}

cudaError_t release(void *ptr, const char *api) {
  if (ptr == nullptr) return cudaSuccess;
  std::lock_guard<std::recursive_mutex> g(lock());
  auto it = allocations().find(static_cast<const char *>(ptr));
  if (it == allocations().end()) {
    std::fprintf(stderr, "gpusim: %s: expected a pointer cudaMalloc returned, got %p\n", api, ptr);
    return fail(cudaErrorInvalidDevicePointer);
  }
  const size_t mapped = it->second.mapped;
  allocations().erase(it);
  if (access_checks_enabled()) {
    munmap(ptr, mapped);
  } else {
    std::free(ptr);
  }
  return cudaSuccess;
}

}  // namespace

bool find_allocation(uintptr_t p, size_t n, uintptr_t *base, size_t *size, size_t *mapped) {
  auto &m = allocations();
  const char *c = reinterpret_cast<const char *>(p);
  auto it = m.upper_bound(c);  // the first allocation above p
  if (it != m.end() && reinterpret_cast<uintptr_t>(it->first) - p <= 256 + n) {
    *base = reinterpret_cast<uintptr_t>(it->first);  // p lies just before it
    *size = it->second.size;
    *mapped = it->second.mapped;
    if (it == m.begin()) return true;
    auto prev = std::prev(it);  // unless it lies inside the one below
    if (p >= reinterpret_cast<uintptr_t>(prev->first) + prev->second.mapped) return true;
  }
  if (it == m.begin()) return false;
  --it;
  const uintptr_t b = reinterpret_cast<uintptr_t>(it->first);
  if (p >= b + it->second.mapped) return false;
  *base = b;
  *size = it->second.size;
  *mapped = it->second.mapped;
  return true;
}

unsigned char fill_byte() {
  static const unsigned char b = [] {
    const char *e = std::getenv("GPUSIM_FILL");
    return static_cast<unsigned char>(e != nullptr && *e != '\0' ? std::strtoul(e, nullptr, 0)
                                                                  : 0xFFu);
  }();
  return b;
}

cudaError_t launch(const LaunchSpec &spec) {
  auto reject = [&](const char *why) {
    std::fprintf(stderr, "gpusim: launch of %s at %s:%d rejected: %s\n",
                 kernel_name(spec).c_str(), spec.file, spec.line, why);
    spec.destroy(spec.ctx);
    return fail(cudaErrorInvalidConfiguration);
  };
  const dim3 g = spec.grid, b = spec.block;
  const unsigned long long threads = 1ull * b.x * b.y * b.z;
  if (spec.warp_size != GPUSIM_WARP_SIZE)
    return reject("translation unit and runtime disagree on the warp size");
  if (threads == 0 || threads > 1024 || b.x > 1024 || b.y > 1024 || b.z > 64)
    return reject("block dims: expected 1..1024 threads (x, y <= 1024, z <= 64)");
  if (g.x == 0 || g.y == 0 || g.z == 0 || g.x > 0x7FFFFFFFu || g.y > 65535 || g.z > 65535)
    return reject("grid dims: expected x in 1..2^31-1, y and z in 1..65535");
  if (spec.dynamic_smem > kSharedLimitOptin)
    return reject("dynamic shared memory above the device's per-block limit");
  LaunchSpec copy = spec;
  enqueue(spec.stream, [copy] {
    execute(copy);
    copy.destroy(copy.ctx);
  });
  return cudaSuccess;
}

}  // namespace gpusim

using gpusim::fail;

extern "C" {

cudaError_t cudaGetDeviceCount(int *count) {
  if (count == nullptr) return fail(cudaErrorInvalidValue);
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int *device) {
  if (device == nullptr) return fail(cudaErrorInvalidValue);
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  return device == 0 ? cudaSuccess : fail(cudaErrorInvalidDevice);
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int device) {
  if (prop == nullptr) return fail(cudaErrorInvalidValue);
  if (device != 0) return fail(cudaErrorInvalidDevice);
  std::memset(prop, 0, sizeof(*prop));
  std::snprintf(prop->name, sizeof(prop->name), "gpusim (%s flavour, warp %d)",
                GPUSIM_WARP_SIZE == 64 ? "ROCm" : "CUDA", GPUSIM_WARP_SIZE);
  // gfx90a / sm_90: OCP FP8, what the kernels compute when compiled for gpusim.
  std::snprintf(prop->gcnArchName, sizeof(prop->gcnArchName), "gfx90a");
  prop->totalGlobalMem = size_t{16} << 30;
  prop->sharedMemPerBlock = gpusim::kStaticSharedLimit;
  prop->sharedMemPerBlockOptin = gpusim::kSharedLimitOptin;
  prop->warpSize = GPUSIM_WARP_SIZE;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = 1024;
  prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 0x7FFFFFFF;
  prop->maxGridSize[1] = 65535;
  prop->maxGridSize[2] = 65535;
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 8;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int device) {
  if (value == nullptr) return fail(cudaErrorInvalidValue);
  cudaDeviceProp p;
  const cudaError_t e = cudaGetDeviceProperties(&p, device);
  if (e != cudaSuccess) return e;
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = p.maxThreadsPerBlock; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = static_cast<int>(p.sharedMemPerBlock); break;
    case cudaDevAttrWarpSize: *value = p.warpSize; break;
    case cudaDevAttrMultiProcessorCount: *value = p.multiProcessorCount; break;
    case cudaDevAttrComputeCapabilityMajor: *value = p.major; break;
    case cudaDevAttrComputeCapabilityMinor: *value = p.minor; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = static_cast<int>(p.sharedMemPerBlockOptin);
      break;
    default: return fail(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  gpusim::flush_all();
  return cudaSuccess;
}
cudaError_t cudaGetLastError(void) {
  const cudaError_t e = gpusim::tls_last_error;
  gpusim::tls_last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError(void) { return gpusim::tls_last_error; }

const char *cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorLaunchOutOfResources: return "cudaErrorLaunchOutOfResources";
  }
  return "cudaErrorUnknown";
}
const char *cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
  }
  return "unknown error";
}

cudaError_t cudaMalloc(void **ptr, size_t bytes) { return gpusim::allocate(ptr, bytes); }
cudaError_t cudaFree(void *ptr) {
  gpusim::flush_all();  // cudaFree synchronises the device
  return gpusim::release(ptr, "cudaFree");
}
// The allocation happens now, so the pointer is usable at once (CUDA's is, in stream order).
cudaError_t cudaMallocAsync(void **ptr, size_t bytes, cudaStream_t) {
  return gpusim::allocate(ptr, bytes);
}
cudaError_t cudaFreeAsync(void *ptr, cudaStream_t stream) {
  if (ptr == nullptr) return cudaSuccess;
  {
    std::lock_guard<std::recursive_mutex> g(gpusim::lock());
    if (gpusim::allocations().count(static_cast<const char *>(ptr)) == 0)
      return gpusim::release(ptr, "cudaFreeAsync");  // reports the bad pointer
  }
  gpusim::enqueue(stream, [ptr] { (void)gpusim::release(ptr, "cudaFreeAsync"); });
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
  gpusim::flush_all();  // a synchronous copy waits for all earlier work
  std::lock_guard<std::recursive_mutex> g(gpusim::lock());
  const cudaError_t e = gpusim::check_copy("cudaMemcpy", dst, src, bytes, kind);
  if (e != cudaSuccess) return e;
  if (bytes != 0) std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  std::lock_guard<std::recursive_mutex> g(gpusim::lock());
  const cudaError_t e = gpusim::check_copy("cudaMemcpyAsync", dst, src, bytes, kind);
  if (e != cudaSuccess) return e;
  if (bytes != 0) gpusim::enqueue(stream, [=] { std::memmove(dst, src, bytes); });
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *ptr, int value, size_t bytes, cudaStream_t stream) {
  std::lock_guard<std::recursive_mutex> g(gpusim::lock());
  const cudaError_t e = gpusim::check_device_range("cudaMemsetAsync", ptr, bytes);
  if (e != cudaSuccess) return e;
  if (bytes != 0) gpusim::enqueue(stream, [=] { std::memset(ptr, value, bytes); });
  return cudaSuccess;
}
cudaError_t cudaMemset(void *ptr, int value, size_t bytes) {
  const cudaError_t e = cudaMemsetAsync(ptr, value, bytes, nullptr);
  gpusim::flush_all();
  return e;
}

cudaError_t cudaStreamCreate(cudaStream_t *stream) {
  if (stream == nullptr) return fail(cudaErrorInvalidValue);
  std::lock_guard<std::recursive_mutex> g(gpusim::lock());
  *stream = new GpusimStream;
  gpusim::streams().push_back(*stream);
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  std::lock_guard<std::recursive_mutex> g(gpusim::lock());
  auto &v = gpusim::streams();
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (*it == stream) {
      gpusim::flush_all();  // pending work still runs, as CUDA's does
      v.erase(it);
      delete stream;
      return cudaSuccess;
    }
  }
  return fail(cudaErrorInvalidResourceHandle);
}
cudaError_t cudaStreamSynchronize(cudaStream_t) {
  gpusim::flush_all();
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *event) {
  if (event == nullptr) return fail(cudaErrorInvalidValue);
  *event = new GpusimEvent;
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete event;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (event == nullptr) return fail(cudaErrorInvalidResourceHandle);
  gpusim::enqueue(stream, [event] {
    event->recorded = true;
    event->when = std::chrono::steady_clock::now();
  });
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t) {
  gpusim::flush_all();
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
  if (ms == nullptr || start == nullptr || end == nullptr) return fail(cudaErrorInvalidValue);
  if (!start->recorded || !end->recorded) return fail(cudaErrorNotReady);
  *ms = std::chrono::duration<float, std::milli>(end->when - start->when).count();
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned) {
  return cudaSuccess;  // every flush runs all streams, in an order that already satisfies it
}
cudaError_t cudaFuncSetAttribute(const void *, int, int) { return cudaSuccess; }

}  // extern "C"
