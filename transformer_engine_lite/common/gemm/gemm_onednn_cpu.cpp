// oneDNN matmul primitives for the CPU GEMM: descriptor -> cached primitive -> execution.
#include "gemm_onednn_cpu.h"

#ifdef NVTE_WITH_ONEDNN

#include <dnnl.hpp>

#include "../platform/cpu_isa.h"

#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <list>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace nvte {
namespace gemm {

struct MatmulPrimitive {
  dnnl::matmul prim;
  dnnl::memory::desc src, wei, dst, bias, scratchpad;
  MatmulDesc desc;
  std::string impl;
};

namespace {

using dt = dnnl::memory::data_type;

dt to_dnnl(DType t) {
  switch (t) {
    case kNVTEFloat32: return dt::f32;
    case kNVTEBFloat16: return dt::bf16;
    case kNVTEFloat16: return dt::f16;
    default:
      NVTE_ERROR("gemm: internal: no oneDNN type for ", dtype_name(t),
                 " (expected float32, bfloat16 or float16)");
  }
}

// NVTE_CPU_ISA caps oneDNN too, unless ONEDNN_MAX_CPU_ISA (oneDNN's own cap) is set: one variable
// moves the whole library to a lower CPU level. oneDNN accepts the cap only before its first
// ISA-dependent call, so every entry here goes through this once.
void apply_isa_cap() {
  static const bool done = [] {
    const char *own = std::getenv("ONEDNN_MAX_CPU_ISA");
    const char *ours = std::getenv("NVTE_CPU_ISA");
    if ((own != nullptr && *own != '\0') || ours == nullptr || *ours == '\0') return true;
    if (cpu_isa_level() == cpu_isa_detected()) return true;  // no cap below this CPU
    dnnl::cpu_isa isa = dnnl::cpu_isa::isa_default;
    switch (cpu_isa_level()) {
      case CpuIsa::kBaseline: isa = dnnl::cpu_isa::sse41; break;
      case CpuIsa::kAvx2: isa = dnnl::cpu_isa::avx2; break;
      case CpuIsa::kAvx512Core: isa = dnnl::cpu_isa::avx512_core; break;
      case CpuIsa::kAvx512CoreBf16: isa = dnnl::cpu_isa::avx512_core_bf16; break;
      case CpuIsa::kAvx512CoreFp16: isa = dnnl::cpu_isa::avx512_core_fp16; break;
      case CpuIsa::kAvx512CoreAmx: return true;
    }
    try {
      dnnl::set_max_cpu_isa(isa);
    } catch (const dnnl::error &) {
      // Too late (another oneDNN user in the process went first): oneDNN keeps its own level,
      // which onednn_isa_name() reports.
    }
    return true;
  }();
  (void)done;
}

const dnnl::engine &cpu_engine() {
  apply_isa_cap();
  static const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}

// ---------------------------------------------------------------- cache key
// Every field of MatmulDesc as integers (no padding bytes, so plain equality and hashing are exact).
using Key = std::array<int64_t, 16>;
struct KeyHash {
  size_t operator()(const Key &k) const {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the fields
    for (int64_t v : k) h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

int64_t bits_of(float f) {
  uint32_t u = 0;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

Key make_key(const MatmulDesc &d) {
  return Key{d.M, d.K, d.N, d.src_stride[0], d.src_stride[1], d.wei_stride[0], d.wei_stride[1],
             d.src_dtype, d.wei_dtype, d.dst_dtype, d.src_scale, d.wei_scale, d.bias,
             d.bias ? d.bias_dtype : kNVTEFloat32, d.accumulate,
             d.accumulate ? bits_of(d.sum_scale) : 0};
}

// LRU cache. Creating a matmul primitive descriptor costs 0.1-1 ms (ISA dispatch, blocking
// heuristics), more than a whole small GEMM; a training step reuses a handful of shapes, so a small
// cache hits almost always. Entries are shared_ptrs: eviction never frees a primitive in use.
class PrimitiveCache {
 public:
  static constexpr size_t kCapacity = 256;

  bool find(const Key &k, std::shared_ptr<const MatmulPrimitive> *out) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(k);
    if (it == map_.end()) return false;
    lru_.splice(lru_.begin(), lru_, it->second.pos);
    *out = it->second.prim;
    return true;
  }

  // Inserts unless another thread won the race; returns the entry that is cached.
  std::shared_ptr<const MatmulPrimitive> insert(const Key &k,
                                                std::shared_ptr<const MatmulPrimitive> prim) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(k);
    if (it != map_.end()) return it->second.prim;
    lru_.push_front(k);
    map_.emplace(k, Entry{std::move(prim), lru_.begin()});
    if (map_.size() > kCapacity) {
      map_.erase(lru_.back());
      lru_.pop_back();
    }
    return map_.find(k)->second.prim;
  }

 private:
  struct Entry {
    std::shared_ptr<const MatmulPrimitive> prim;  // nullptr: oneDNN has no implementation
    std::list<Key>::iterator pos;
  };
  std::mutex mu_;
  std::list<Key> lru_;
  std::unordered_map<Key, Entry, KeyHash> map_;
};

PrimitiveCache &cache() {
  static PrimitiveCache *c = new PrimitiveCache();  // never destroyed: safe during static teardown
  return *c;
}

std::shared_ptr<const MatmulPrimitive> create(const MatmulDesc &d) {
  using dims = dnnl::memory::dims;
  auto prim = std::make_shared<MatmulPrimitive>();
  prim->desc = d;
  prim->src = dnnl::memory::desc(dims{d.M, d.K}, to_dnnl(d.src_dtype),
                                 dims{d.src_stride[0], d.src_stride[1]});
  prim->wei = dnnl::memory::desc(dims{d.K, d.N}, to_dnnl(d.wei_dtype),
                                 dims{d.wei_stride[0], d.wei_stride[1]});
  prim->dst = dnnl::memory::desc(dims{d.M, d.N}, to_dnnl(d.dst_dtype), dims{d.N, 1});
  dnnl::primitive_attr attr;
  // Scales multiply the fp32 accumulator before any post-op: dst = s_src * s_wei * acc + ...
  if (d.src_scale) attr.set_scales_mask(DNNL_ARG_SRC, 0);
  if (d.wei_scale) attr.set_scales_mask(DNNL_ARG_WEIGHTS, 0);
  dnnl::post_ops po;
  if (d.bias) {
    prim->bias = dnnl::memory::desc(dims{1, d.N}, to_dnnl(d.bias_dtype), dims{d.N, 1});
    po.append_binary(dnnl::algorithm::binary_add, prim->bias);
  }
  if (d.accumulate) po.append_sum(d.sum_scale);
  attr.set_post_ops(po);
  // The primitives are cached for every thread (JAX runs one GEMM per device concurrently). oneDNN's
  // library scratchpad (ONEDNN_ENABLE_CONCURRENT_EXEC=OFF builds) ties a primitive to the thread
  // that created it: run from other threads at once, brgemm kernels gave wrong values. With a user
  // scratchpad, each execution brings its own (run_matmul: one per thread).
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  try {
    dnnl::matmul::primitive_desc pd(cpu_engine(), prim->src, prim->wei, prim->dst, attr);
    prim->impl = pd.impl_info_str();
    prim->scratchpad = pd.scratchpad_desc();
    prim->prim = dnnl::matmul(pd);
  } catch (const dnnl::error &e) {
    if (e.status == dnnl_unimplemented) return nullptr;
    throw;
  }
  return prim;
}

}  // namespace

std::shared_ptr<const MatmulPrimitive> get_matmul(const MatmulDesc &desc) {
  const Key key = make_key(desc);
  std::shared_ptr<const MatmulPrimitive> prim;
  if (cache().find(key, &prim)) return prim;
  // Built outside the lock: other threads' hits are not stalled by a slow creation.
  return cache().insert(key, create(desc));
}

const char *matmul_impl_name(const MatmulPrimitive &prim) { return prim.impl.c_str(); }

const char *onednn_isa_name() {
  apply_isa_cap();
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::sse41: return "sse41";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx2_vnni_2: return "avx2_vnni_2";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_fp16: return "avx512_core_fp16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    case dnnl::cpu_isa::avx512_core_amx_fp16: return "avx512_core_amx_fp16";
    default: return "other";
  }
}

void run_matmul(const MatmulPrimitive &p, const MatmulArgs &a) {
  const dnnl::engine &eng = cpu_engine();
  // dnnl::memory wraps our pointers (no copies); it wants non-const handles even for inputs.
  dnnl::memory src(p.src, eng, const_cast<void *>(a.src));
  dnnl::memory wei(p.wei, eng, const_cast<void *>(a.wei));
  dnnl::memory dst(p.dst, eng, a.dst);
  std::unordered_map<int, dnnl::memory> args{
      {DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}};
  float src_scale = a.src_scale, wei_scale = a.wei_scale;
  const dnnl::memory::desc scalar({1}, dt::f32, dnnl::memory::dims{1});
  if (p.desc.src_scale) args.emplace(DNNL_ARG_ATTR_SCALES | DNNL_ARG_SRC, dnnl::memory(scalar, eng, &src_scale));
  if (p.desc.wei_scale) args.emplace(DNNL_ARG_ATTR_SCALES | DNNL_ARG_WEIGHTS, dnnl::memory(scalar, eng, &wei_scale));
  if (p.desc.bias) {
    args.emplace(DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1,
                 dnnl::memory(p.bias, eng, const_cast<void *>(a.bias)));
  }
  const size_t scratch_bytes = p.scratchpad.get_size();
  if (scratch_bytes > 0) {
    constexpr size_t kAlign = 64;
    thread_local std::vector<unsigned char> scratch;  // this thread's; grown on demand, kept
    if (scratch.size() < scratch_bytes + kAlign) scratch.resize(scratch_bytes + kAlign);
    const uintptr_t base = reinterpret_cast<uintptr_t>(scratch.data());
    void *aligned = reinterpret_cast<void *>((base + kAlign - 1) / kAlign * kAlign);
    args.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(p.scratchpad, eng, aligned));
  }
  // A stream per call: creating one on the CPU is cheap (no device queue), and a shared stream would
  // need a lock around every execution.
  dnnl::stream stream(eng);
  p.prim.execute(stream, args);
  stream.wait();
}

}  // namespace gemm
}  // namespace nvte

#else  // !NVTE_WITH_ONEDNN: nvte_cublas_gemm rejects every call before reaching these.

namespace nvte {
namespace gemm {
struct MatmulPrimitive {};
std::shared_ptr<const MatmulPrimitive> get_matmul(const MatmulDesc &) {
  NVTE_CHECK_SUPPORTED(false, "gemm: this build has no oneDNN (configure with NVTE_WITH_ONEDNN=ON)");
  return nullptr;
}
const char *matmul_impl_name(const MatmulPrimitive &) { return "none"; }
const char *onednn_isa_name() { return "none"; }
void run_matmul(const MatmulPrimitive &, const MatmulArgs &) {
  NVTE_CHECK_SUPPORTED(false, "gemm: this build has no oneDNN (configure with NVTE_WITH_ONEDNN=ON)");
}
}  // namespace gemm
}  // namespace nvte

#endif
