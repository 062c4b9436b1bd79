// CPU kernels of the multi-tensor ops: every tensor cut into pieces (L2 norm: chunk_size
// elements, else kGrain), pieces in parallel, the per-element math of multi_tensor_params.h in
// each. Per-piece results (finite flags, FP8 amax, L2 partial sums) are combined after the loop
// in piece order.
#include <algorithm>
#include <cmath>
#include <vector>

#include "../recipe/scaling_math.h"
#include "../util/dtype_dispatch.h"
#include "../util/parallel.h"
#include "multi_tensor_cpu.h"
#include "multi_tensor_types.h"

namespace nvte {

namespace {

// Elements per piece: 16K elements (64 KiB of fp32) keeps a task well above the scheduling cost.
constexpr size_t kGrain = 16384;

struct Piece {
  size_t tensor, begin, end;
};

std::vector<Piece> pieces_of(const MultiTensorBatch &b, size_t grain) {
  std::vector<Piece> pieces;
  for (size_t j = 0; j < b.tensors.size(); ++j) {
    for (size_t s = 0; s < b.tensors[j].numel; s += grain) {
      pieces.push_back({j, s, std::min(b.tensors[j].numel, s + grain)});
    }
  }
  return pieces;
}

// f(piece index, piece) over every piece, in parallel.
template <typename F>
void for_each_piece(const std::vector<Piece> &pieces, F &&f) {
  parallel_for(pieces.size(), 1, [&](size_t k0, size_t k1) {
    for (size_t k = k0; k < k1; ++k) f(k, pieces[k]);
  });
}

// NaN wins, as atomic_max_abs on the GPU (a positive NaN's bits order above +Inf).
float max_abs(float acc, float v) { return (v > acc || v != v) ? v : acc; }

}  // namespace

void launch_multi_tensor_scale(const MultiTensorBatch &b, float scale) {
  const std::vector<Piece> pieces = pieces_of(b, kGrain);
  std::vector<unsigned char> finite(pieces.size(), 1);
  dispatch_dtype<HighPrecisionTypes>(b.dtype[0], "tensor_lists[0]", [&](auto in_tag) {
    using I = typename decltype(in_tag)::type;
    dispatch_dtype<HighPrecisionTypes>(b.dtype[1], "tensor_lists[1]", [&](auto out_tag) {
      using O = typename decltype(out_tag)::type;
      for_each_piece(pieces, [&](size_t k, const Piece &pc) {
        const TensorSet &t = b.tensors[pc.tensor];
        const I *in = static_cast<const I *>(t.ptr[0]);
        O *out = static_cast<O *>(t.ptr[1]);
        bool ok = true;
        for (size_t i = pc.begin; i < pc.end; ++i) {
          const float x = to_float(in[i]);
          ok = ok && finite_f32(x);
          out[i] = from_float<O>(x * scale);
        }
        finite[k] = ok;
      });
    });
  });
  if (std::find(finite.begin(), finite.end(), 0) != finite.end()) *b.noop = 1;
}

void launch_multi_tensor_l2norm(const MultiTensorBatch &b, size_t chunk_size, size_t max_chunks,
                                const float *inv_scale, float *output, float *partials,
                                float *ret, float *ret_per_tensor, bool per_tensor) {
  std::fill(partials, partials + b.tensors.size() * max_chunks, 0.0f);
  const std::vector<Piece> pieces = pieces_of(b, chunk_size);
  const float unscale = inv_scale != nullptr ? *inv_scale : 1.0f;
  dispatch_dtype<HighPrecisionTypes>(b.dtype[0], "tensor_lists[0]", [&](auto tag) {
    using T = typename decltype(tag)::type;
    for_each_piece(pieces, [&](size_t, const Piece &pc) {
      const T *x = static_cast<const T *>(b.tensors[pc.tensor].ptr[0]);
      double sum = 0.0;  // fp32 squares summed in double: one rounding per chunk
      for (size_t i = pc.begin; i < pc.end; ++i) {
        const float v = to_float(x[i]) * unscale;
        sum += static_cast<double>(v * v);
      }
      partials[pc.tensor * max_chunks + pc.begin / chunk_size] = static_cast<float>(sum);
    });
  });
  l2norm_finalize(b.tensors.size(), max_chunks, partials, output, ret, ret_per_tensor, per_tensor,
                  b.noop);
}

void launch_multi_tensor_adam(const MultiTensorBatch &b, const AdamParams &p) {
  if (p.lr_ptr != nullptr && *b.noop == 1) return;  // capturable: skipped step
  const AdamScalars s = adam_scalars(p);
  const std::vector<Piece> pieces = pieces_of(b, kGrain);
  std::vector<float> amax(pieces.size(), 0.0f);
  auto run = [&](auto g_tag, auto p_tag) {
    using G = typename decltype(g_tag)::type;
    using P = typename decltype(p_tag)::type;
    for_each_piece(pieces, [&](size_t k, const Piece &pc) {
      const TensorSet &t = b.tensors[pc.tensor];
      const float scale = p.kind == AdamKind::kFp8 ? *static_cast<const float *>(t.ptr[5]) : 1.0f;
      float a = 0.0f;
      for (size_t i = pc.begin; i < pc.end; ++i) {
        a = max_abs(a, adam_element<G, P>(t, i, p.kind, s, scale));
      }
      amax[k] = a;
    });
  };
  dispatch_dtype<HighPrecisionTypes>(b.dtype[0], "tensor_lists[0]", [&](auto g_tag) {
    if (p.kind == AdamKind::kRemainder) {
      run(g_tag, TypeTag<bf16>{});
    } else if (p.kind == AdamKind::kFp8) {
      dispatch_dtype<Fp8Types>(p.fp8_dtype, "fp8_dtype", [&](auto p_tag) { run(g_tag, p_tag); });
    } else {
      dispatch_dtype<HighPrecisionTypes>(b.dtype[1], "tensor_lists[1]",
                                         [&](auto p_tag) { run(g_tag, p_tag); });
    }
  });
  if (p.kind != AdamKind::kFp8) return;
  for (size_t k = 0; k < pieces.size(); ++k) {
    float *a = static_cast<float *>(b.tensors[pieces[k].tensor].ptr[6]);
    *a = max_abs(*a, amax[k]);
  }
  for (const TensorSet &t : b.tensors) {
    *static_cast<float *>(t.ptr[7]) = 1.0f / *static_cast<const float *>(t.ptr[5]);
  }
}

void launch_multi_tensor_sgd(const MultiTensorBatch &b, const SgdParams &p) {
  if (*b.noop != 0) return;
  const std::vector<Piece> pieces = pieces_of(b, kGrain);
  const bool has_out = b.num_lists == 4;
  const DType out_dtype = has_out ? b.dtype[3] : kNVTEFloat16;
  dispatch_dtype<HighPrecisionTypes>(b.dtype[0], "tensor_lists[0]", [&](auto g_tag) {
    using G = typename decltype(g_tag)::type;
    dispatch_dtype<HighPrecisionTypes>(b.dtype[1], "tensor_lists[1]", [&](auto w_tag) {
      using W = typename decltype(w_tag)::type;
      dispatch_dtype<SgdModelOutTypes>(out_dtype, "tensor_lists[3]", [&](auto o_tag) {
        using O = typename decltype(o_tag)::type;
        for_each_piece(pieces, [&](size_t, const Piece &pc) {
          for (size_t i = pc.begin; i < pc.end; ++i) {
            sgd_element<G, W, O>(b.tensors[pc.tensor], i, p, has_out);
          }
        });
      });
    });
  });
}

void launch_multi_tensor_compute_scale(const MultiTensorBatch &b, float max_fp8, bool pow2,
                                       float epsilon) {
  for_each_piece(pieces_of(b, kGrain), [&](size_t, const Piece &pc) {
    const TensorSet &t = b.tensors[pc.tensor];
    const float *amax = static_cast<const float *>(t.ptr[0]);
    float *scale = static_cast<float *>(t.ptr[1]);
    float *scale_inv = static_cast<float *>(t.ptr[2]);
    for (size_t i = pc.begin; i < pc.end; ++i) {
      scale[i] = compute_scale_from_amax(amax[i], max_fp8, epsilon, pow2);
      scale_inv[i] = 1.0f / scale[i];
    }
  });
}

}  // namespace nvte
