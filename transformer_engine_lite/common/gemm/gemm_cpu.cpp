// CPU GEMM: operands fed to one oneDNN matmul, FP32 accumulation; bias/accumulate as oneDNN post-ops
// when the output is plain, else an fp32 result + our epilogue (GELU/dGELU from util/math.h, bias
// gradients, FP8 output through the OutputEmitter).
// Operand precision (Compute below): FP8 widens to bf16 and fp16 stays fp16 where oneDNN has such a
// kernel on this CPU level; otherwise (AVX2 and plain AVX-512 CPUs have no bf16/fp16 matmul in
// oneDNN 3.2) every operand widens to fp32. Both are exact: FP8, bf16 and fp16 values are fp32 values,
// and their pairwise products are exact in fp32 (at most 11 + 11 significant bits), so only the
// fp32 summation order differs between the paths.
#include "gemm_cpu.h"

#include <algorithm>
#include <array>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "../cast/emit_cpu.h"
#include "../platform/cpu_isa.h"
#include "../util/dtype_dispatch.h"
#include "../util/env.h"
#include "../util/math.h"
#include "../util/parallel.h"
#include "gemm_onednn_cpu.h"

namespace nvte {
namespace gemm {
namespace {

// ---------------------------------------------------------------- row helpers
using LoadFn = void (*)(const void *, float *, size_t);
using StoreFn = void (*)(const float *, void *, size_t);

// Converter from any storage type the GEMM reads (fp32/fp16/bf16/FP8, unscaled) into fp32.
LoadFn loader(DType t, const char *arg) {
  LoadFn f = nullptr;
  dispatch_dtype<OutputTypes>(t, arg, [&](auto tag) {
    using T = typename decltype(tag)::type;
    f = [](const void *src, float *dst, size_t n) { load_row(static_cast<const T *>(src), dst, n); };
  });
  return f;
}
// Converter from fp32 into a plain (non-FP8) type: bias gradients and pre_gelu_out.
StoreFn storer(DType t, const char *arg) {
  StoreFn f = nullptr;
  dispatch_dtype<HighPrecisionTypes>(t, arg, [&](auto tag) {
    using T = typename decltype(tag)::type;
    f = [](const float *src, void *dst, size_t n) { store_row(src, static_cast<T *>(dst), n); };
  });
  return f;
}

template <typename P>
P *offset(P *base, size_t elems, DType t) {
  using Byte = std::conditional_t<std::is_const_v<P>, const char, char>;
  return reinterpret_cast<P *>(reinterpret_cast<Byte *>(base) + elems * dtype_size(t));
}

NVTE_CPU_KERNEL void add_row(float *acc, const float *v, size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] += v[i];
}
// acc += s * v; with s = 1 the same bytes as add_row (s * v is exact, one rounding either way).
NVTE_CPU_KERNEL void axpy_row(float *acc, float s, const float *v, size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] += s * v[i];
}
NVTE_CPU_KERNEL void scale_row(float *v, float s, size_t n) {
  for (size_t i = 0; i < n; ++i) v[i] *= s;
}
NVTE_CPU_KERNEL void gelu_row(float *v, size_t n) {
  for (size_t i = 0; i < n; ++i) v[i] = Gelu::fwd(v[i]);
}
// v holds pre-GELU values on entry and x * gelu'(pre) on exit.
NVTE_CPU_KERNEL void dgelu_row(const float *x, float *v, size_t n) {
  for (size_t i = 0; i < n; ++i) v[i] = x[i] * Gelu::bwd(v[i]);
}
// Sum in fp32 with 16 partial sums: vectorizes without -ffast-math, and the fixed order makes the
// result independent of the thread count.
NVTE_CPU_KERNEL float sum_row(const float *v, size_t n) {
  constexpr size_t kLanes = 16;
  float part[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (size_t l = 0; l < kLanes; ++l) part[l] += v[i + l];
  float s = 0.0f;
  for (; i < n; ++i) s += v[i];
  for (size_t l = 0; l < kLanes; ++l) s += part[l];
  return s;
}

// out[c] = sum_r src[r, c] over a row-major [rows, cols] buffer of dtype t; each column is summed in
// row order, so results do not depend on the thread count.
void sum_columns(const void *src, DType t, size_t rows, size_t cols, float *out) {
  const LoadFn load = loader(t, "sum_columns");
  parallel_for(cols, 256, [&](size_t c0, size_t c1) {
    const size_t w = c1 - c0;
    std::vector<float> tmp(w);
    float *acc = out + c0;
    for (size_t c = 0; c < w; ++c) acc[c] = 0.0f;
    for (size_t r = 0; r < rows; ++r) {
      load(offset(src, r * cols + c0, t), tmp.data(), w);
      NVTE_CPU_DISPATCH(add_row(acc, tmp.data(), w));
    }
  });
}

// out[r] = sum_c src[r, c] over a row-major [rows, cols] buffer of dtype t.
void sum_rows(const void *src, DType t, size_t rows, size_t cols, float *out) {
  const LoadFn load = loader(t, "sum_rows");
  parallel_for(rows, 8, [&](size_t r0, size_t r1) {
    std::vector<float> tmp(cols);
    for (size_t r = r0; r < r1; ++r) {
      load(offset(src, r * cols, t), tmp.data(), cols);
      out[r] = NVTE_CPU_DISPATCH(sum_row(tmp.data(), cols));
    }
  });
}

// ---------------------------------------------------------------- operands
// FP8 -> bf16 is exact for all four formats (E4M3/E5M2 and FNUZ: <= 5 exponent bits, <= 3 mantissa
// bits, subnormals included, fit bf16's 8 and 7), so a code's bf16 bits are the top half of its fp32
// decoding. The 256 codes are decoded once by util/fp8.h into a table: the lookup loop runs at ~3.5
// G codes/s per core here, 8x the per-element decode (whose selects GCC does not vectorize).
// The fp32 path looks codes up in a table of their fp32 values the same way.
template <typename T>
const uint16_t *fp8_to_bf16_table() {
  static const std::array<uint16_t, 256> table = [] {
    std::array<uint16_t, 256> t{};
    for (int c = 0; c < 256; ++c)
      t[c] = static_cast<uint16_t>(float_bits(to_float(T{static_cast<uint8_t>(c)})) >> 16);
    return t;
  }();
  return table.data();
}
template <typename T>
const float *fp8_to_f32_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) t[c] = to_float(T{static_cast<uint8_t>(c)});
    return t;
  }();
  return table.data();
}
template <typename E>
NVTE_CPU_KERNEL void widen_fp8_row(const uint8_t *src, E *dst, size_t n, const E *table) {
  for (size_t i = 0; i < n; ++i) dst[i] = table[src[i]];
}

// ---------------------------------------------------------------- scratch
// Per-thread scratch for widened operands and the fp32 product, grown on demand and kept. Allocating
// per call maps fresh pages every time (glibc serves these sizes with mmap): a 2048^2 FP8 operand
// widens into 8 MiB, ~2k page faults plus zeroing per operand per call. Buffers above kKeepBytes are
// freed after the call instead, so a thread holds at most 3 x 64 MiB.
enum ScratchSlot { kScratchA = 0, kScratchB = 1, kScratchX = 2 };
constexpr size_t kKeepBytes = size_t{64} << 20;

class Scratch {
 public:
  // Uninitialized storage of `bytes`; valid until the next get() of this slot on this thread.
  void *get(size_t bytes) {
    if (bytes > kKeepBytes) {
      once_.reset(new uint8_t[bytes]);
      return once_.get();
    }
    if (bytes > cap_) {
      kept_.reset();  // free first: peak memory stays one buffer
      kept_.reset(new uint8_t[bytes]);
      cap_ = bytes;
    }
    return kept_.get();
  }
  void release_oversized() { once_.reset(); }

 private:
  std::unique_ptr<uint8_t[]> kept_, once_;
  size_t cap_ = 0;
};

Scratch &scratch(ScratchSlot slot) {
  thread_local Scratch slots[3];
  return slots[slot];
}

// An operand as oneDNN sees it: the caller's buffer, or a widened copy (same layout) in scratch.
struct Operand {
  const void *ptr = nullptr;
  DType dtype = kNVTEFloat32;
};

// How the operands enter oneDNN, cheapest first. kNative: FP8 as bf16, bf16/fp16/fp32 as they are;
// kFp16AsF32: the same with fp16 widened to fp32 (CPUs with bf16 but no fp16 matmul); kF32: every
// operand widened to fp32 (CPUs with no bf16 matmul at all).
enum class Compute { kNative, kFp16AsF32, kF32 };

DType compute_dtype(DType t, Compute c) {
  if (c == Compute::kF32) return kNVTEFloat32;
  if (is_fp8(t)) return kNVTEBFloat16;
  if (t == kNVTEFloat16 && c == Compute::kFp16AsF32) return kNVTEFloat32;
  return t;
}

// The widening of one operand into its compute dtype: FP8 codes through a table (to bf16 or fp32),
// or fp16/bf16 -> fp32.
struct Widen {
  const void *src = nullptr;
  void *dst = nullptr;
  size_t n = 0;
  const uint16_t *fp8_bf16 = nullptr;  // FP8 -> bf16 table
  const float *fp8_f32 = nullptr;      // FP8 -> fp32 table
  LoadFn load = nullptr;               // fp16/bf16 -> fp32
  void run(size_t b, size_t e) const {
    const uint8_t *codes = static_cast<const uint8_t *>(src) + b;
    if (fp8_bf16) {
      NVTE_CPU_DISPATCH(widen_fp8_row(codes, static_cast<uint16_t *>(dst) + b, e - b, fp8_bf16));
    } else if (fp8_f32) {
      NVTE_CPU_DISPATCH(widen_fp8_row(codes, static_cast<float *>(dst) + b, e - b, fp8_f32));
    } else {
      load(offset(src, b, dtype), static_cast<float *>(dst) + b, e - b);
    }
  }
  DType dtype = kNVTEFloat32;  // of src
};

// Points `op` at the operand as oneDNN reads it; returns the widening it needs (n = 0: none).
Widen plan_operand(const Tensor &t, DType target, ScratchSlot slot, Operand *op) {
  op->dtype = target;
  op->ptr = t.data.dptr;
  Widen w;
  if (t.data.dtype == target) return w;
  w.src = t.data.dptr;
  w.n = t.data.numel();
  w.dtype = t.data.dtype;
  w.dst = scratch(slot).get(w.n * dtype_size(target));  // fully written by the widening
  if (is_fp8(t.data.dtype)) {
    dispatch_dtype<Fp8Types>(t.data.dtype, "operand", [&](auto tag) {
      using T = typename decltype(tag)::type;
      if (target == kNVTEFloat32) w.fp8_f32 = fp8_to_f32_table<T>();
      else w.fp8_bf16 = fp8_to_bf16_table<T>();
    });
  } else {
    w.load = loader(t.data.dtype, "operand");
  }
  op->ptr = w.dst;
  return w;
}

// Widens both operands in one parallel region (one fork/join instead of two: on a loaded machine
// every extra barrier can wait a scheduler time slice).
void prepare_operands(const GemmParams &p, DType a_target, DType b_target, Operand *a,
                      Operand *b) {
  const Widen wa = plan_operand(*p.A, a_target, kScratchA, a);
  const Widen wb = plan_operand(*p.B, b_target, kScratchB, b);
  constexpr size_t kGrain = size_t{1} << 16;
  parallel_for(wa.n + wb.n, kGrain, [&](size_t lo, size_t hi) {
    if (lo < wa.n) wa.run(lo, std::min(hi, wa.n));
    if (hi > wa.n) wb.run(std::max(lo, wa.n) - wa.n, hi - wa.n);
  });
}

// ---------------------------------------------------------------- plan
struct Plan {
  std::shared_ptr<const MatmulPrimitive> prim;  // nullptr when the product is empty (m, n or k = 0)
  bool direct = false;  // oneDNN writes D itself (bias / accumulate as post-ops)
  Compute compute = Compute::kNative;
  bool bias_post_op = false;
};

MatmulDesc make_desc(const GemmParams &p, Compute compute) {
  MatmulDesc d;
  d.M = static_cast<int64_t>(p.n);
  d.K = static_cast<int64_t>(p.k);
  d.N = static_cast<int64_t>(p.m);
  // src = opB(B) [n, k]: B is [n, k], or [k, n] read transposed.
  d.src_stride[0] = p.transb ? 1 : d.K;
  d.src_stride[1] = p.transb ? d.M : 1;
  // wei = opA(A) [k, m]: A is [k, m], or [m, k] read transposed.
  d.wei_stride[0] = p.transa ? 1 : d.N;
  d.wei_stride[1] = p.transa ? d.K : 1;
  d.src_dtype = compute_dtype(p.B->data.dtype, compute);
  d.wei_dtype = compute_dtype(p.A->data.dtype, compute);
  // alpha rides on the src scale (run_product), so it multiplies the fp32 accumulator with the
  // FP8 scale_inv, before bias and sum post-ops; alpha = 1 keeps the primitive of nvte_cublas_gemm.
  d.src_scale = is_fp8(p.B->data.dtype) || p.alpha != 1.0f;
  d.wei_scale = is_fp8(p.A->data.dtype);
  return d;
}

// Below this many rows or columns of D, widening an operand costs more than fp32 FMAs save: the
// widening touches m k + k n elements for m n k multiply-adds, m n / (m + n) per element, and a
// widened element costs about as much as 50 fp32 multiply-adds (a table lookup or shift, 6 bytes of
// memory traffic) while fp32 saves ~40% of each (kF32's 1.75x); a decode-sized GEMM (m = 1..32)
// also reads its bf16 weight once where the widened one is read at twice the bytes.
constexpr size_t kWidenMinDim = 128;

// The operand precisions to try, in order. NVTE_CPU_GEMM_COMPUTE (read at every call): auto (the
// CPU's fastest exact path, platform/cpu_isa.h cpu_matmul_path(); widened fp32 only when both
// output dims reach kWidenMinDim; then anything oneDNN implements), native (bf16/fp16 operands:
// the GEMM fails where oneDNN lacks the kernel), fp32 (always widen to fp32: tests the fallback on
// any CPU).
std::vector<Compute> compute_candidates(const GemmParams &p) {
  const std::string mode = cpu_compute_mode();
  if (mode == "fp32") return {Compute::kF32};
  const bool all_f32 = p.A->data.dtype == kNVTEFloat32 && p.B->data.dtype == kNVTEFloat32;
  if (mode == "auto" && !all_f32 && cpu_matmul_path() == MatmulPath::kF32 &&
      std::min(p.m, p.n) >= kWidenMinDim) {
    return {Compute::kF32, Compute::kNative};
  }
  std::vector<Compute> c{Compute::kNative};
  if (p.A->data.dtype == kNVTEFloat16 || p.B->data.dtype == kNVTEFloat16) {
    c.push_back(Compute::kFp16AsF32);
  }
  if (mode == "auto" && !all_f32) c.push_back(Compute::kF32);
  return c;
}

// Picks the cheapest formulation oneDNN implements: per operand precision (compute_candidates), D
// written directly with post-ops, else an fp32 result for our epilogue. Creates (or finds) the
// primitive now, before anything is written, so a failure leaves every output untouched.
Plan make_plan(const GemmParams &p, bool grad) {
  Plan plan;
  const std::vector<Compute> candidates = compute_candidates(p);
  if (p.m == 0 || p.n == 0 || p.k == 0) return plan;  // no product to compute
  const Tensor &D = *p.D;
  // The epilogue is needed for GELU/dGELU, FP8 output (scale, amax, transposed copy) and amax.
  const bool can_direct = p.pre_gelu_out == nullptr && !is_fp8(D.data.dtype) && !D.amax.has_data();
  for (Compute compute : candidates) {
    MatmulDesc d = make_desc(p, compute);
    if (can_direct) {
      MatmulDesc dd = d;
      dd.dst_dtype = D.data.dtype;
      // The bias enters as fp32 whatever its dtype (launch converts it): oneDNN 3.2's brgemm matmul
      // on avx512_core_fp16 CPUs (bf16 x bf16 -> f32/bf16 with an f16 binary-add post-op) returns
      // wrong values for every output, silently; an fp32 bias avoids that kernel path everywhere
      // (regression test: GemmOneDnnWorkarounds.Fp16BiasOnBf16Operands in tests/cpp/test_gemm.cpp).
      dd.bias = !grad && p.bias != nullptr;
      dd.bias_dtype = kNVTEFloat32;
      dd.accumulate = p.accumulate;
      dd.sum_scale = p.beta;
      if ((plan.prim = get_matmul(dd))) {
        plan.direct = true;
        plan.compute = compute;
        plan.bias_post_op = dd.bias;
        return plan;
      }
    }
    d.dst_dtype = kNVTEFloat32;
    if ((plan.prim = get_matmul(d))) {
      plan.compute = compute;
      return plan;
    }
  }
  NVTE_CHECK_SUPPORTED(false, "gemm: oneDNN has no matmul for A ",
                       dtype_name(p.A->data.dtype), " x B ", dtype_name(p.B->data.dtype),
                       " on this CPU (CPU level ", cpu_isa_name(cpu_isa_level()), ", oneDNN ISA ",
                       onednn_isa_name(), ", NVTE_CPU_GEMM_COMPUTE=",
                       env_value("NVTE_CPU_GEMM_COMPUTE") ? env_value("NVTE_CPU_GEMM_COMPUTE")
                                                          : "auto",
                       "; auto widens the operands to fp32 where no such kernel exists)");
  return plan;
}

// Runs the product into dst (D itself for a direct plan, else an fp32 [n, m] buffer).
void run_product(const GemmParams &p, const Plan &plan, const Operand &a, const Operand &b,
                 const float *bias_f, void *dst) {
  MatmulArgs args;
  args.src = b.ptr;
  args.wei = a.ptr;
  args.dst = dst;
  args.bias = plan.bias_post_op ? bias_f : nullptr;
  args.src_scale = p.scale_inv_b * p.alpha;  // one fp32 scalar: exact for alpha = 1
  args.wei_scale = p.scale_inv_a;
  run_matmul(*plan.prim, args);
}

// ---------------------------------------------------------------- epilogue
enum class Epilogue { kPlain, kBiasGelu, kDgelu };

// X: fp32 [n, m] product (already scaled by the scale_inv and alpha). Writes D (and pre_gelu_out in
// kBiasGelu); in kDgelu X is
// overwritten with x * gelu'(pre) for the bias gradient.
void run_epilogue(const GemmParams &p, Epilogue mode, float *X, const float *bias_f,
                  const OutputEmitter &em) {
  const size_t m = p.m;
  const LoadFn load_d = p.accumulate ? loader(p.D->data.dtype, "D") : nullptr;
  const LoadFn load_pre =
      mode == Epilogue::kDgelu ? loader(p.pre_gelu_out->data.dtype, "pre_gelu_out") : nullptr;
  const StoreFn store_pre =
      mode == Epilogue::kBiasGelu && p.pre_gelu_out ? storer(p.pre_gelu_out->data.dtype, "pre_gelu_out")
                                                   : nullptr;
  if (p.n == 0 || m == 0) {  // nothing to store: an empty D still gets amax = 0 and scale_inv
    em.finish(AbsMax{});
    return;
  }
  emit_rows(em, [&](size_t row0, size_t nrows, float *vals) {
    std::vector<float> prev(load_d ? m : 0);
    for (size_t r = 0; r < nrows; ++r) {
      const size_t row = row0 + r;
      float *x = X + row * m;
      float *v = vals + r * m;
      if (mode == Epilogue::kDgelu) {
        load_pre(offset<const void>(p.pre_gelu_out->data.dptr, row * m, p.pre_gelu_out->data.dtype),
                 v, m);
        NVTE_CPU_DISPATCH(dgelu_row(x, v, m));
        if (p.bias) std::copy(v, v + m, x);  // kept for the bias gradient
      } else {
        for (size_t j = 0; j < m; ++j) v[j] = x[j];
        if (bias_f) NVTE_CPU_DISPATCH(add_row(v, bias_f, m));
        if (store_pre) {
          store_pre(v, offset(p.pre_gelu_out->data.dptr, row * m, p.pre_gelu_out->data.dtype), m);
          NVTE_CPU_DISPATCH(gelu_row(v, m));
        }
      }
      if (load_d) {  // D's previous row, read before emit overwrites this row block
        load_d(offset<const void>(p.D->data.dptr, row * m, p.D->data.dtype), prev.data(), m);
        NVTE_CPU_DISPATCH(axpy_row(v, p.beta, prev.data(), m));
      }
    }
  });
}

void store_bias(const Tensor &bias, const std::vector<float> &vals) {
  storer(bias.data.dtype, "bias")(vals.data(), bias.data.dptr, vals.size());
}

// ---------------------------------------------------------------- driver
void launch(const GemmParams &p, const OutputEmitter &em, bool grad) {
  // Everything that can fail (primitive creation, allocations, dtype dispatch) happens before the
  // first output byte is written.
  struct ReleaseOversized {  // on every exit, exceptions included
    ~ReleaseOversized() {
      for (ScratchSlot s : {kScratchA, kScratchB, kScratchX}) scratch(s).release_oversized();
    }
  } release;
  const Plan plan = make_plan(p, grad);
  Operand a, b;
  if (plan.prim) {
    const MatmulDesc d = make_desc(p, plan.compute);
    prepare_operands(p, d.wei_dtype, d.src_dtype, &a, &b);
  }
  const bool dgelu = grad && p.pre_gelu_out != nullptr;
  const Epilogue mode = dgelu ? Epilogue::kDgelu
                        : (!grad && p.pre_gelu_out) ? Epilogue::kBiasGelu
                                                    : Epilogue::kPlain;
  std::vector<float> bias_f;  // forward bias in fp32, for the post-op or the epilogue
  if (!grad && p.bias && p.m > 0) {
    bias_f.resize(p.m);
    loader(p.bias->data.dtype, "bias")(p.bias->data.dptr, bias_f.data(), p.m);
  }
  std::vector<float> bias_grad;
  if (grad && p.bias) bias_grad.resize(dgelu ? p.m : p.n);
  if (grad && p.bias && !dgelu) {
    // Bias gradient of op(B) [n, k]: row sums of B [n, k], or column sums of B [k, n] when transb;
    // B is only read, so it is computed before any output is touched.
    if (p.transb) sum_columns(p.B->data.dptr, p.B->data.dtype, p.k, p.n, bias_grad.data());
    else sum_rows(p.B->data.dptr, p.B->data.dtype, p.n, p.k, bias_grad.data());
    if (p.scale_inv_b != 1.0f) NVTE_CPU_DISPATCH(
        scale_row(bias_grad.data(), p.scale_inv_b, bias_grad.size()));
  }

  if (plan.direct) {
    run_product(p, plan, a, b, bias_f.data(), p.D->data.dptr);
  } else {
    // The product in fp32; for k = 0 it is all zeros (an empty sum), and oneDNN is not called.
    float *X = static_cast<float *>(scratch(kScratchX).get(p.n * p.m * sizeof(float)));
    if (plan.prim) {
      run_product(p, plan, a, b, nullptr, X);
    } else {
      std::fill(X, X + p.n * p.m, 0.0f);
    }
    run_epilogue(p, mode, X, bias_f.empty() ? nullptr : bias_f.data(), em);
    if (dgelu && p.bias) sum_columns(X, kNVTEFloat32, p.n, p.m, bias_grad.data());
  }
  if (grad && p.bias && !bias_grad.empty()) store_bias(*p.bias, bias_grad);
}

}  // namespace

void launch_gemm_fwd(const GemmParams &p, const OutputEmitter &d_out) { launch(p, d_out, false); }
void launch_gemm_bwd(const GemmParams &p, const OutputEmitter &d_out) { launch(p, d_out, true); }

}  // namespace gemm
}  // namespace nvte
