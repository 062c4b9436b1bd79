// CPU kernels of the fused MoE router: tokens in parallel, each routed by the shared per-token
// math (fused_router_params.h); the aux loss sums each column over the rows in fp32.
#include <algorithm>
#include <vector>

#include "../util/dtype_dispatch.h"
#include "../util/parallel.h"
#include "fused_router_cpu.h"
#include "fused_router_types.h"

namespace nvte {

namespace {

// Tokens per task: about 16K experts' worth of work.
size_t token_grain(const RouterParams &p) {
  return std::max<size_t>(1, 16384 / std::max<size_t>(1, p.experts));
}

template <typename C>
float count_at(const void *counts, size_t i) {
  return to_float(static_cast<const C *>(counts)[i]);
}

}  // namespace

void launch_router_topk_fwd(const RouterParams &p, DType dtype, const void *logits, void *probs,
                            uint8_t *map, float *inter) {
  dispatch_dtype<HighPrecisionTypes>(dtype, "logits", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const size_t n = p.experts;
    parallel_for(p.tokens, token_grain(p), [&](size_t t0, size_t t1) {
      for (size_t t = t0; t < t1; ++t) {
        router_topk_fwd_token(p, static_cast<const T *>(logits) + t * n,
                              static_cast<T *>(probs) + t * n, map + t * n, inter + t * n);
      }
    });
  });
}

void launch_router_topk_bwd(const RouterParams &p, DType dtype, const uint8_t *map,
                            const float *inter, const void *grad_probs, void *grad_logits) {
  dispatch_dtype<HighPrecisionTypes>(dtype, "grad_probs", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const size_t n = p.experts;
    parallel_for(p.tokens, token_grain(p), [&](size_t t0, size_t t1) {
      for (size_t t = t0; t < t1; ++t) {
        router_topk_bwd_token(p, map + t * n, inter + t * n,
                              static_cast<const T *>(grad_probs) + t * n,
                              static_cast<T *>(grad_logits) + t * n);
      }
    });
  });
}

void launch_router_score_fwd(const RouterParams &p, DType dtype, const void *logits, float *scores,
                             uint8_t *map, float *inter) {
  dispatch_dtype<HighPrecisionTypes>(dtype, "logits", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const size_t n = p.experts;
    parallel_for(p.tokens, token_grain(p), [&](size_t t0, size_t t1) {
      for (size_t t = t0; t < t1; ++t) {
        router_score_fwd_token(p, static_cast<const T *>(logits) + t * n, scores + t * n,
                               map + t * n, inter + t * n);
      }
    });
  });
}

void launch_router_score_bwd(const RouterParams &p, DType dtype, const float *inter,
                             const float *grad_scores, void *grad_logits) {
  dispatch_dtype<HighPrecisionTypes>(dtype, "grad_logits", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const size_t n = p.experts;
    parallel_for(p.tokens, token_grain(p), [&](size_t t0, size_t t1) {
      for (size_t t = t0; t < t1; ++t) {
        router_score_bwd_token(p, inter + t * n, grad_scores + t * n,
                               static_cast<T *>(grad_logits) + t * n);
      }
    });
  });
}

void launch_moe_aux_loss_fwd(size_t rows, size_t cols, float c, DType dtype, const void *probs,
                             DType count_dtype, const void *counts, void *aux_loss) {
  dispatch_dtype<HighPrecisionTypes>(dtype, "probs", [&](auto tag) {
    using T = typename decltype(tag)::type;
    dispatch_dtype<RouterCountTypes>(count_dtype, "tokens_per_expert", [&](auto ctag) {
      using C = typename decltype(ctag)::type;
      // Column sums in parallel over columns, each over the rows in order (the GPU's order).
      std::vector<float> col(cols, 0.0f);
      parallel_for(cols, 1, [&](size_t c0, size_t c1) {
        for (size_t j = c0; j < c1; ++j) {
          float s = 0.0f;
          const T *column = static_cast<const T *>(probs) + j;
          for (size_t r = 0; r < rows; ++r) s += to_float(column[r * cols]);
          col[j] = s * count_at<C>(counts, j);
        }
      });
      float total = 0.0f;
      for (size_t j = 0; j < cols; ++j) total += col[j];
      *static_cast<T *>(aux_loss) = from_float<T>(total * c);
    });
  });
}

void launch_moe_aux_loss_bwd(size_t rows, size_t cols, float c, DType count_dtype,
                             const void *counts, DType dtype, const void *grad_aux_loss,
                             void *grad_probs) {
  dispatch_dtype<HighPrecisionTypes>(dtype, "grad_probs", [&](auto tag) {
    using T = typename decltype(tag)::type;
    dispatch_dtype<RouterCountTypes>(count_dtype, "tokens_per_expert", [&](auto ctag) {
      using C = typename decltype(ctag)::type;
      const float g = to_float(*static_cast<const T *>(grad_aux_loss));
      T *out = static_cast<T *>(grad_probs);
      parallel_for(rows, std::max<size_t>(1, 16384 / std::max<size_t>(1, cols)),
                   [&](size_t r0, size_t r1) {
                     for (size_t r = r0; r < r1; ++r) {
                       for (size_t j = 0; j < cols; ++j) {
                         out[r * cols + j] = from_float<T>(c * count_at<C>(counts, j) * g);
                       }
                     }
                   });
    });
  });
}

}  // namespace nvte
