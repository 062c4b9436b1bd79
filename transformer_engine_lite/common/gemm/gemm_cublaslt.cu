// cuBLASLt GEMM (CUDA builds with NVTE_HAVE_CUBLASLT, see gemm/cublaslt.cmake): TE's column-major
// mapping of nvte_cublas_gemm onto one cublasLtMatmul with its epilogues. libcublasLt is opened
// with dlopen at the first GEMM, so the library loads, and runs its tiled GEMM, on hosts without
// it.
// Everything cuBLASLt cannot do exactly as gemm.h says returns false before anything is written,
// and the tiled kernel (gemm_tiled.cu) runs instead.
#include "gemm_gpu.h"

// Never on ROCm (NVTE_HAVE_CUBLASLT is CUDA-only; hipify renames the calls, so the guard also
// keeps this text from meeting hipBLASLt, whose API differs in what this code relies on).
#if defined(NVTE_HAVE_CUBLASLT) && !defined(__HIP_PLATFORM_AMD__)

#include <cublasLt.h>
#include <dlfcn.h>

#include <cstdint>
#include <string>
#include <vector>

#include "../cast/quantize_gpu.h"
#include "../platform/runtime.h"

namespace nvte {
namespace gpu {

namespace {

// ---------------------------------------------------------------- loading
// The entry points used, typed from the header the build found.
struct CublasLtApi {
  decltype(&cublasLtCreate) create = nullptr;
  decltype(&cublasLtGetStatusString) status_string = nullptr;
  decltype(&cublasLtMatmulDescCreate) desc_create = nullptr;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy = nullptr;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set = nullptr;
  decltype(&cublasLtMatrixLayoutCreate) layout_create = nullptr;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceCreate) pref_create = nullptr;
  decltype(&cublasLtMatmulPreferenceDestroy) pref_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set = nullptr;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic = nullptr;
  decltype(&cublasLtMatmul) matmul = nullptr;
};

#define NVTE_STRINGIFY_(x) #x
#define NVTE_STRINGIFY(x) NVTE_STRINGIFY_(x)
// The soname of the major version compiled against (cuBLAS keeps its ABI within a major version).
constexpr const char *kSoname = "libcublasLt.so." NVTE_STRINGIFY(CUBLAS_VER_MAJOR);

// Folder of this library (…/site-packages/transformer_engine_lite when installed).
std::string own_dir() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<const void *>(&own_dir), &info) == 0 || info.dli_fname == nullptr) {
    return ".";
  }
  const std::string path = info.dli_fname;
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

// Candidates in order: the loader's search (LD_LIBRARY_PATH, RUNPATH, ld.so.cache: a toolkit
// install), the PyPI wheel beside the package (nvidia-cublas: nvidia/cu<major>/lib; the older
// nvidia-cublas-cu12: nvidia/cublas/lib), then the file the build linked against.
void *open_cublaslt() {
  std::vector<std::string> candidates = {kSoname};
  const std::string dir = own_dir();
  candidates.push_back(dir + "/../nvidia/cu" NVTE_STRINGIFY(CUBLAS_VER_MAJOR) "/lib/" + kSoname);
  candidates.push_back(dir + "/../nvidia/cublas/lib/" + kSoname);
#ifdef NVTE_CUBLASLT_LIBRARY
  candidates.push_back(NVTE_CUBLASLT_LIBRARY);
#endif
  for (const std::string &c : candidates) {
    if (void *h = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
  }
  return nullptr;
}

template <typename F>
bool resolve(void *lib, const char *name, F *fn) {
  *fn = reinterpret_cast<F>(dlsym(lib, name));
  return *fn != nullptr;
}

// nullptr when libcublasLt cannot be opened or lacks an entry point (then it is closed again).
const CublasLtApi *cublaslt() {
  static const CublasLtApi *api = []() -> const CublasLtApi * {
    void *lib = open_cublaslt();
    if (lib == nullptr) return nullptr;
    static CublasLtApi a;
    const bool ok = resolve(lib, "cublasLtCreate", &a.create) &&
                    resolve(lib, "cublasLtGetStatusString", &a.status_string) &&
                    resolve(lib, "cublasLtMatmulDescCreate", &a.desc_create) &&
                    resolve(lib, "cublasLtMatmulDescDestroy", &a.desc_destroy) &&
                    resolve(lib, "cublasLtMatmulDescSetAttribute", &a.desc_set) &&
                    resolve(lib, "cublasLtMatrixLayoutCreate", &a.layout_create) &&
                    resolve(lib, "cublasLtMatrixLayoutDestroy", &a.layout_destroy) &&
                    resolve(lib, "cublasLtMatmulPreferenceCreate", &a.pref_create) &&
                    resolve(lib, "cublasLtMatmulPreferenceDestroy", &a.pref_destroy) &&
                    resolve(lib, "cublasLtMatmulPreferenceSetAttribute", &a.pref_set) &&
                    resolve(lib, "cublasLtMatmulAlgoGetHeuristic", &a.heuristic) &&
                    resolve(lib, "cublasLtMatmul", &a.matmul);
    if (!ok) {
      dlclose(lib);
      return nullptr;
    }
    return &a;  // the library stays open for the life of the process
  }();
  return api;
}

#define NVTE_CHECK_CUBLASLT(api, call)                                                      \
  do {                                                                                      \
    const cublasStatus_t _s = (call);                                                       \
    if (_s != CUBLAS_STATUS_SUCCESS) {                                                      \
      ::nvte::detail::throw_error(NVTE_ERROR_INTERNAL, __FILE__, __LINE__, #call,           \
                                  ::nvte::detail::concat("cuBLASLt error: ",                \
                                                         (api).status_string(_s)));         \
    }                                                                                       \
  } while (0)

// One handle per thread and device, created at first use and kept (a handle is per-device state;
// per-thread avoids sharing one between concurrent callers). Never destroyed: the process may
// outlive the CUDA context at exit, and destroying it then would fault.
cublasLtHandle_t handle_for(const CublasLtApi &lt, int device) {
  thread_local std::vector<cublasLtHandle_t> handles;
  if (static_cast<size_t>(device) >= handles.size()) handles.resize(device + 1, nullptr);
  if (handles[device] == nullptr) NVTE_CHECK_CUBLASLT(lt, lt.create(&handles[device]));
  return handles[device];
}

// ---------------------------------------------------------------- descriptors (RAII)
class MatmulDesc {
 public:
  explicit MatmulDesc(const CublasLtApi &lt) : lt_(lt) {
    NVTE_CHECK_CUBLASLT(lt, lt.desc_create(&d_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  }
  ~MatmulDesc() { (void)lt_.desc_destroy(d_); }
  MatmulDesc(const MatmulDesc &) = delete;
  MatmulDesc &operator=(const MatmulDesc &) = delete;
  template <typename T>
  void set(cublasLtMatmulDescAttributes_t attr, const T &value) {
    NVTE_CHECK_CUBLASLT(lt_, lt_.desc_set(d_, attr, &value, sizeof(value)));
  }
  cublasLtMatmulDesc_t get() const { return d_; }

 private:
  const CublasLtApi &lt_;
  cublasLtMatmulDesc_t d_ = nullptr;
};

// A column-major rows x cols matrix with leading dimension rows (our row-major buffers, seen
// column-major, are exactly that).
class Layout {
 public:
  Layout(const CublasLtApi &lt, cudaDataType_t type, size_t rows, size_t cols) : lt_(lt) {
    NVTE_CHECK_CUBLASLT(lt, lt.layout_create(&l_, type, rows, cols, static_cast<int64_t>(rows)));
  }
  ~Layout() { (void)lt_.layout_destroy(l_); }
  Layout(const Layout &) = delete;
  Layout &operator=(const Layout &) = delete;
  cublasLtMatrixLayout_t get() const { return l_; }

 private:
  const CublasLtApi &lt_;
  cublasLtMatrixLayout_t l_ = nullptr;
};

class Preference {
 public:
  explicit Preference(const CublasLtApi &lt) : lt_(lt) {
    NVTE_CHECK_CUBLASLT(lt, lt.pref_create(&p_));
  }
  ~Preference() { (void)lt_.pref_destroy(p_); }
  Preference(const Preference &) = delete;
  Preference &operator=(const Preference &) = delete;
  template <typename T>
  void set(cublasLtMatmulPreferenceAttributes_t attr, const T &value) {
    NVTE_CHECK_CUBLASLT(lt_, lt_.pref_set(p_, attr, &value, sizeof(value)));
  }
  cublasLtMatmulPreference_t get() const { return p_; }

 private:
  const CublasLtApi &lt_;
  cublasLtMatmulPreference_t p_ = nullptr;
};

// Stream-ordered workspace when the caller passed none, freed on the stream (errors included).
class Workspace {
 public:
  Workspace(void *given, size_t given_bytes) : ptr_(given), bytes_(given_bytes) {}
  void allocate(size_t bytes, cudaStream_t stream) {
    if (bytes == 0) return;
    NVTE_CHECK_CUDA(cudaMallocAsync(&owned_, bytes, stream));
    stream_ = stream;
    ptr_ = owned_;
    bytes_ = bytes;
  }
  ~Workspace() {
    if (owned_ != nullptr) (void)cudaFreeAsync(owned_, stream_);
  }
  Workspace(const Workspace &) = delete;
  Workspace &operator=(const Workspace &) = delete;
  void *ptr() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void *ptr_ = nullptr;
  size_t bytes_ = 0;
  void *owned_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

// ---------------------------------------------------------------- the mapping
// Workspace the heuristic may ask for when the caller passes none (TE passes 32 MiB on Hopper).
constexpr size_t kDefaultWorkspaceBytes = size_t{32} << 20;

// cuBLASLt's type of a dtype; false for the FNUZ FP8 formats, which CUDA has no kernels for.
bool cuda_type(DType t, cudaDataType_t *out) {
  switch (t) {
    case kNVTEFloat32: *out = CUDA_R_32F; return true;
    case kNVTEFloat16: *out = CUDA_R_16F; return true;
    case kNVTEBFloat16: *out = CUDA_R_16BF; return true;
    case kNVTEFloat8E4M3: *out = CUDA_R_8F_E4M3; return true;
    case kNVTEFloat8E5M2: *out = CUDA_R_8F_E5M2; return true;
    default: return false;
  }
}
// For dtypes eligible() has accepted.
cudaDataType_t cuda_type(DType t) {
  cudaDataType_t r = CUDA_R_32F;
  NVTE_CHECK(cuda_type(t, &r), "cuBLASLt GEMM: no CUDA data type for ", dtype_name(t),
             " (internal)");
  return r;
}

// Largest power of two (up to 256) dividing the address: the alignment the heuristic may assume.
uint32_t alignment_of(const void *p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && a % align != 0) align /= 2;
  return align;
}

__global__ void scale_inv_kernel(const float *scale, float *scale_inv) {
  *scale_inv = 1.0f / *scale;
}

// The combinations cuBLASLt computes as gemm.h specifies, before any library call. Anything else
// is the tiled kernel's: empty products; FNUZ FP8; E5M2 x E5M2 (no cuBLASLt kernels); FP8 before
// sm_89; the amax of a high-precision D (cuBLASLt records amax only for FP8 outputs); GELU or dGELU
// with beta != 0 (cuBLASLt applies them to alpha AB + beta C, gemm.h adds D's previous value
// afterwards); dGELU or bias gradients with alpha != 1 (whether cuBLASLt's bias gradients carry
// alpha is undocumented: gemm.h scales the dGELU one and not that of op(B));
// dGELU / bias gradients of FP8 operands (TE never asks for them; how cuBLASLt would scale them is
// undocumented); non-FP8 bias or pre-GELU buffers of a dtype other than D's (cuBLASLt ties them to
// D's type).
bool eligible(const GemmArgs &g, const OutputSpec &spec, int device) {
  const DType at = g.A->data.dtype, bt = g.B->data.dtype;
  cudaDataType_t unused;
  if (g.m == 0 || g.n == 0 || g.k == 0) return false;
  if (!cuda_type(at, &unused) || !cuda_type(bt, &unused) || !cuda_type(spec.dtype, &unused)) {
    return false;
  }
  const bool fp8 = is_fp8(at);  // gemm.cpp: both FP8, or one high-precision dtype
  if (fp8 && at == kNVTEFloat8E5M2 && bt == kNVTEFloat8E5M2) return false;
  if (!spec.fp8 && g.D->amax.has_data()) return false;
  if (g.pre_gelu_out != nullptr && g.accumulate) return false;
  if (g.grad && g.alpha != 1.0f && (g.bias != nullptr || g.pre_gelu_out != nullptr)) return false;
  if (fp8 && g.grad && (g.bias != nullptr || g.pre_gelu_out != nullptr)) return false;
  if (!fp8 && g.bias != nullptr && g.bias->data.dtype != spec.dtype) return false;
  if (!fp8 && g.pre_gelu_out != nullptr && g.pre_gelu_out->data.dtype != spec.dtype) return false;
  if (fp8) {
    int major = 0, minor = 0;
    NVTE_CHECK_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    NVTE_CHECK_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    if (major * 10 + minor < 89) return false;
  }
  return true;
}

cublasLtEpilogue_t epilogue_of(const GemmArgs &g) {
  const bool bias = g.bias != nullptr, pre = g.pre_gelu_out != nullptr;
  if (!g.grad) {
    if (pre) return bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    return bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  }
  if (pre) return bias ? CUBLASLT_EPILOGUE_DGELU_BGRAD : CUBLASLT_EPILOGUE_DGELU;
  // bias[j] = sum_k op(B)[k, j] in cuBLAS terms: gemm.h's bias gradient of op(B) ([n]).
  return bias ? CUBLASLT_EPILOGUE_BGRADB : CUBLASLT_EPILOGUE_DEFAULT;
}

}  // namespace

bool launch_gemm_cublaslt(const GemmArgs &g, const OutputSpec &spec, void *stream) {
  int device = 0;
  NVTE_CHECK_CUDA(cudaGetDevice(&device));
  if (!eligible(g, spec, device)) return false;
  const CublasLtApi *api = cublaslt();
  if (api == nullptr) return false;
  const CublasLtApi &lt = *api;
  const cudaStream_t s = as_stream(stream);
  const Tensor &A = *g.A, &B = *g.B, &D = *g.D;
  const bool fp8 = is_fp8(A.data.dtype);
  const cudaDataType_t a_type = cuda_type(A.data.dtype), b_type = cuda_type(B.data.dtype);
  const cudaDataType_t d_type = cuda_type(spec.dtype);

  // Column-major view (gemm.h): op(A) m x k, op(B) k x n, D m x n with leading dimension m.
  MatmulDesc desc(lt);
  const cublasOperation_t op_a = g.transa ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = g.transb ? CUBLAS_OP_T : CUBLAS_OP_N;
  desc.set(CUBLASLT_MATMUL_DESC_TRANSA, op_a);
  desc.set(CUBLASLT_MATMUL_DESC_TRANSB, op_b);
  const Layout a_layout(lt, a_type, g.transa ? g.k : g.m, g.transa ? g.m : g.k);
  const Layout b_layout(lt, b_type, g.transb ? g.n : g.k, g.transb ? g.k : g.n);
  const Layout d_layout(lt, d_type, g.m, g.n);
  // C is D's previous value (scaled by beta when accumulating). An FP8 D is never accumulated into,
  // cuBLASLt wants C in bf16/fp16 then (the bias dtype, as TE), with no C pointer.
  cudaDataType_t c_type = d_type;
  if (spec.fp8) c_type = g.bias != nullptr ? cuda_type(g.bias->data.dtype) : CUDA_R_16BF;
  const Layout c_layout(lt, c_type, g.m, g.n);

  // FP8: X = scale_inv_A * scale_inv_B * AB (device scalars), D = encode(scale_D * result), amax.
  // Fast accumulation stays off (its default): accumulation is FP32 throughout (ARCHITECTURE.md
  // §5), so use_split_accumulator changes nothing here.
  if (fp8) {
    desc.set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, A.scale_inv.dptr);
    desc.set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, B.scale_inv.dptr);
  }
  if (spec.fp8) {
    desc.set(CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, D.scale.dptr);
    if (D.amax.has_data()) desc.set(CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, D.amax.dptr);
  }
  const cublasLtEpilogue_t epilogue = epilogue_of(g);
  desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue);
  if (g.bias != nullptr) {
    desc.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias->data.dptr);
    if (fp8) {
      desc.set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
               static_cast<int32_t>(cuda_type(g.bias->data.dtype)));
    }
  }
  if (g.pre_gelu_out != nullptr) {
    desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, g.pre_gelu_out->data.dptr);
    desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, static_cast<int64_t>(g.m));
    if (fp8) {
      desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE,
               static_cast<int32_t>(cuda_type(g.pre_gelu_out->data.dtype)));
    }
  }
  if (g.math_sm_count > 0) {
    desc.set(CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, static_cast<int32_t>(g.math_sm_count));
  }

  // Algorithm: the heuristic's first choice for these pointers' alignment and the workspace.
  const bool ws_given = g.workspace != nullptr && g.workspace->data.has_data();
  Workspace ws(ws_given ? g.workspace->data.dptr : nullptr,
               ws_given ? g.workspace->data.numel() * dtype_size(g.workspace->data.dtype) : 0);
  Preference pref(lt);
  pref.set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
           static_cast<uint64_t>(ws_given ? ws.bytes() : kDefaultWorkspaceBytes));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment_of(A.data.dptr));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment_of(B.data.dptr));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignment_of(D.data.dptr));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment_of(D.data.dptr));
  const cublasLtHandle_t handle = handle_for(lt, device);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t hs =
      lt.heuristic(handle, desc.get(), a_layout.get(), b_layout.get(), c_layout.get(),
                   d_layout.get(), pref.get(), 1, &result, &found);
  if (hs != CUBLAS_STATUS_SUCCESS || found == 0) return false;  // e.g. FP8 layouts other than TN
  if (!ws_given) ws.allocate(result.workspaceSize, s);

  // Host scalars (the default pointer mode); beta = 0 when not accumulating, so C is not read.
  const float alpha = g.alpha, beta = g.accumulate ? g.beta : 0.0f;
  const void *c_ptr = spec.fp8 ? nullptr : D.data.dptr;
  const cublasStatus_t ms =
      lt.matmul(handle, desc.get(), &alpha, A.data.dptr, a_layout.get(), B.data.dptr,
                b_layout.get(), &beta, c_ptr, c_layout.get(), D.data.dptr, d_layout.get(),
                &result.algo, ws.ptr(), ws.bytes(), s);
  // Argument checks happen before any launch: a rejection has written nothing.
  if (ms == CUBLAS_STATUS_NOT_SUPPORTED || ms == CUBLAS_STATUS_INVALID_VALUE) return false;
  NVTE_CHECK_CUBLASLT(lt, ms);

  if (spec.fp8 && D.scale_inv.has_data()) {
    scale_inv_kernel<<<1, 1, 0, s>>>(D.scale.ptr<const float>(), D.scale_inv.ptr<float>());
    NVTE_CHECK_LAUNCH();
  }
  if (spec.colwise) {  // the transposed FP8 copy [m, n], from the row-wise bytes just written
    Tensor rows, cols;
    rows.data = D.data;
    rows.data.shape = {g.n, g.m};
    cols.data = D.columnwise_data;
    launch_transpose(rows, cols, stream);
  }
  return true;
}

}  // namespace gpu
}  // namespace nvte

#else  // no cuBLASLt in this build (ROCm, or CUDA configured with NVTE_WITH_CUBLASLT=OFF)

namespace nvte {
namespace gpu {

bool launch_gemm_cublaslt(const GemmArgs &, const OutputSpec &, void *) { return false; }

}  // namespace gpu
}  // namespace nvte

#endif
