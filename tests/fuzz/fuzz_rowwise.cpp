// Fuzzes the row-wise op families: LayerNorm / RMSNorm forward and backward (TE's workspace query
// protocol, then the call with the queried workspace), every activation and gated activation
// forward and backward (clamped SwiGLU included, with any limit / alpha), the four scaled-softmax
// variants forward and backward (byte masks, in-place), and fused RoPE forward and backward in
// sbhd / bshd / thd (cu_seqlens contents included). Outputs take every encoding (HP, per-tensor FP8,
// MXFP8); shapes, dtypes, handles, pointers and overlaps are mutated by the input.
#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "transformer_engine_lite/activation.h"
#include "transformer_engine_lite/fused_rope.h"
#include "transformer_engine_lite/normalization.h"
#include "transformer_engine_lite/softmax.h"

namespace {

using fz::Buf;
using fz::Ctx;
using fz::Input;

std::vector<size_t> rows_of(const std::vector<size_t> &s) {
  return {s.empty() ? 1 : fz::numel(std::vector<size_t>(s.begin(), s.end() - 1))};
}

// TE's protocol: a workspace handle without data is a size query; then the call with that much.
// Returns the workspace handle (possibly still a query when the input says so).
NVTETensor workspace_after_query(Ctx &ctx, const char *op, const std::function<NVTEStatus(NVTETensor)> &f) {
  NVTETensor ws = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {});
  const NVTEStatus st = ctx.call(op, [&] { return f(ws); });
  if (st != NVTE_SUCCESS || ws == nullptr) return ws;
  const NVTEBasicTensor q = nvte_get_tensor_param(ws, kNVTERowwiseData);
  std::vector<size_t> shape(q.shape.data, q.shape.data + q.shape.ndim);
  if (fz::numel(shape) > fz::kMaxElems) fz::fail(std::string(op) + ": workspace query too large");
  ctx.set(ws, Buf{kNVTERowwiseData, q.dtype, shape});
  return ws;
}

void norm(Ctx &ctx, bool ln, bool bwd) {
  Input &in = ctx.in();
  std::vector<size_t> xs = fz::small_shape(in, in.range(0, 2), 0, 20);
  xs.push_back(in.range(0, 80));
  if (fz::numel(xs) > 4096) xs.back() = 1;
  if (xs.size() >= 3) fz::maybe_huge_empty(in, xs, 0, 1);  // [0, huge, hidden]: no rows
  const std::vector<size_t> hidden = {xs.back()}, rows = rows_of(xs);
  const NVTEDType xt = fz::pick_hp(in);
  const NVTEDType wt = in.flag() ? kNVTEFloat32 : xt;
  const bool zc = in.flag();
  const int sm = static_cast<int>(in.i64(0));
  NVTETensor x = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {Buf{kNVTERowwiseData, xt, xs}});
  NVTETensor gamma = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {Buf{kNVTERowwiseData, wt, hidden}});
  if (!bwd) {
    NVTETensor beta = ln ? ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {Buf{kNVTERowwiseData, wt, hidden}})
                         : nullptr;
    const float eps = in.real(1e-5f);
    fz::OutputChoice o = fz::output_buffers(in, xs);
    NVTETensor z = ctx.tensor(o.mode, o.bufs);
    NVTETensor mu = ln ? ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {Buf{kNVTERowwiseData, kNVTEFloat32, rows}})
                       : nullptr;
    NVTETensor rs = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {Buf{kNVTERowwiseData, kNVTEFloat32, rows}});
    const char *op = ln ? "nvte_layernorm_fwd" : "nvte_rmsnorm_fwd";
    auto f = [&](NVTETensor ws) {
      return ln ? nvte_layernorm_fwd(x, gamma, beta, eps, z, mu, rs, ws, sm, zc, nullptr)
                : nvte_rmsnorm_fwd(x, gamma, eps, z, rs, ws, sm, zc, nullptr);
    };
    NVTETensor ws = workspace_after_query(ctx, op, f);
    ctx.call(op, [&] { return f(ws); });
    return;
  }
  NVTETensor dz = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {Buf{kNVTERowwiseData, fz::pick_hp(in), xs}});
  NVTETensor mu = ln ? ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {Buf{kNVTERowwiseData, kNVTEFloat32, rows}})
                     : nullptr;
  NVTETensor rs = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {Buf{kNVTERowwiseData, kNVTEFloat32, rows}});
  NVTETensor dx = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {Buf{kNVTERowwiseData, fz::pick_hp(in), xs}});
  NVTETensor dg = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {Buf{kNVTERowwiseData, wt, hidden}});
  NVTETensor db = ln ? ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {Buf{kNVTERowwiseData, wt, hidden}})
                     : nullptr;
  const char *op = ln ? "nvte_layernorm_bwd" : "nvte_rmsnorm_bwd";
  auto f = [&](NVTETensor ws) {
    return ln ? nvte_layernorm_bwd(dz, x, mu, rs, gamma, dx, dg, db, ws, sm, zc, nullptr)
              : nvte_rmsnorm_bwd(dz, x, rs, gamma, dx, dg, ws, sm, zc, nullptr);
  };
  NVTETensor ws = workspace_after_query(ctx, op, f);
  ctx.call(op, [&] { return f(ws); });
}

using ActFwd = NVTEStatus (*)(const NVTETensor, NVTETensor, NVTEStream);
using ActBwd = NVTEStatus (*)(const NVTETensor, const NVTETensor, NVTETensor, NVTEStream);
struct Act {
  const char *fwd_name;
  ActFwd fwd;
  const char *bwd_name;
  ActBwd bwd;
  bool gated;
};
const Act kActs[] = {
    {"nvte_gelu", nvte_gelu, "nvte_dgelu", nvte_dgelu, false},
    {"nvte_qgelu", nvte_qgelu, "nvte_dqgelu", nvte_dqgelu, false},
    {"nvte_relu", nvte_relu, "nvte_drelu", nvte_drelu, false},
    {"nvte_srelu", nvte_srelu, "nvte_dsrelu", nvte_dsrelu, false},
    {"nvte_silu", nvte_silu, "nvte_dsilu", nvte_dsilu, false},
    {"nvte_geglu", nvte_geglu, "nvte_dgeglu", nvte_dgeglu, true},
    {"nvte_qgeglu", nvte_qgeglu, "nvte_dqgeglu", nvte_dqgeglu, true},
    {"nvte_reglu", nvte_reglu, "nvte_dreglu", nvte_dreglu, true},
    {"nvte_sreglu", nvte_sreglu, "nvte_dsreglu", nvte_dsreglu, true},
    {"nvte_swiglu", nvte_swiglu, "nvte_dswiglu", nvte_dswiglu, true},
    {"nvte_glu", nvte_glu, "nvte_dglu", nvte_dglu, true},
};
constexpr size_t kNumActs = sizeof(kActs) / sizeof(kActs[0]);

void activation(Ctx &ctx, bool bwd) {
  Input &in = ctx.in();
  const size_t which = in.u8() % (kNumActs + 1);  // the last one: clamped SwiGLU
  const bool clamped = which == kNumActs;
  const bool gated = clamped || kActs[which].gated;
  std::vector<size_t> xs = fz::small_shape(in, in.range(0, 2), 0, 20);
  const size_t last = in.range(0, 40) * (gated ? 2 : 1);
  xs.push_back(last + (in.u8() % 8 == 7 ? 1 : 0));  // sometimes odd (gated: rejected)
  if (fz::numel(xs) > 4096) xs.back() = gated ? 2 : 1;
  fz::maybe_huge_empty(in, xs);
  std::vector<size_t> ys = xs;
  if (gated) ys.back() /= 2;
  const NVTEDType xt = fz::pick_hp(in);
  const float limit = in.real(7.0f), alpha = in.real(1.702f);
  NVTETensor x = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {Buf{kNVTERowwiseData, xt, xs}});
  if (!bwd) {
    fz::OutputChoice o = fz::output_buffers(in, ys);
    NVTETensor y = ctx.tensor(o.mode, o.bufs);
    if (clamped) {
      ctx.call("nvte_clamped_swiglu", [&] { return nvte_clamped_swiglu(x, y, limit, alpha, nullptr); });
    } else {
      ctx.call(kActs[which].fwd_name, [&] { return kActs[which].fwd(x, y, nullptr); });
    }
    return;
  }
  NVTETensor g = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {Buf{kNVTERowwiseData, xt, ys}});
  fz::OutputChoice o = fz::output_buffers(in, xs);
  NVTETensor dx = ctx.tensor(o.mode, o.bufs);
  if (clamped) {
    ctx.call("nvte_clamped_dswiglu",
             [&] { return nvte_clamped_dswiglu(g, x, dx, limit, alpha, nullptr); });
  } else {
    ctx.call(kActs[which].bwd_name, [&] { return kActs[which].bwd(g, x, dx, nullptr); });
  }
}

void softmax(Ctx &ctx, bool bwd) {
  Input &in = ctx.in();
  const uint8_t kind = in.u8() % 4;  // 0 plain, 1 byte mask, 2 upper triangular, 3 aligned causal
  std::vector<size_t> s;
  if (kind == 2) {
    const size_t sq = in.range(0, 40);
    s = {in.range(0, 4), sq, sq};
  } else {
    s = {in.range(0, 3), in.range(0, 3), in.range(0, 24), in.range(0, 40)};
  }
  if (fz::numel(s) > 4096) s[0] = 1;
  if (kind == 2 && in.u8() % 32 == 31) {
    s = {fz::huge_dim(in) >> 8, 0, 0};  // [huge, 0, 0]: square and empty
  } else if (kind != 2) {
    fz::maybe_huge_empty(in, s);
  }
  const NVTEDType t = fz::pick_hp(in);
  const float scale = in.real(0.125f);
  NVTETensor x = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {Buf{kNVTERowwiseData, t, s}});
  if (!bwd) {
    NVTETensor mask = nullptr;
    if (kind == 1) {
      std::vector<size_t> ms = {in.flag() ? 1 : s[0], 1, s[2], s[3]};
      if (fz::numel(ms) > fz::kMaxElems) ms = {1, 1, 0, 0};
      mask = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {Buf{kNVTERowwiseData, kNVTEByte, ms}});
    }
    NVTETensor y = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {Buf{kNVTERowwiseData, t, s}});
    switch (kind) {
      case 0:
        ctx.call("nvte_scaled_softmax_forward",
                 [&] { return nvte_scaled_softmax_forward(x, y, scale, nullptr); });
        break;
      case 1:
        ctx.call("nvte_scaled_masked_softmax_forward",
                 [&] { return nvte_scaled_masked_softmax_forward(x, mask, y, scale, nullptr); });
        break;
      case 2:
        ctx.call("nvte_scaled_upper_triang_masked_softmax_forward", [&] {
          return nvte_scaled_upper_triang_masked_softmax_forward(x, y, scale, nullptr);
        });
        break;
      default:
        ctx.call("nvte_scaled_aligned_causal_masked_softmax_forward", [&] {
          return nvte_scaled_aligned_causal_masked_softmax_forward(x, y, scale, nullptr);
        });
        break;
    }
    return;
  }
  NVTETensor y = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {Buf{kNVTERowwiseData, t, s}});
  NVTETensor dx = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {Buf{kNVTERowwiseData, t, s}});
  switch (kind) {
    case 0:
      ctx.call("nvte_scaled_softmax_backward",
               [&] { return nvte_scaled_softmax_backward(x, y, dx, scale, nullptr); });
      break;
    case 1:
      ctx.call("nvte_scaled_masked_softmax_backward",
               [&] { return nvte_scaled_masked_softmax_backward(x, y, dx, scale, nullptr); });
      break;
    case 2:
      ctx.call("nvte_scaled_upper_triang_masked_softmax_backward", [&] {
        return nvte_scaled_upper_triang_masked_softmax_backward(x, y, dx, scale, nullptr);
      });
      break;
    default:
      ctx.call("nvte_scaled_aligned_causal_masked_softmax_backward", [&] {
        return nvte_scaled_aligned_causal_masked_softmax_backward(x, y, dx, scale, nullptr);
      });
      break;
  }
}

void rope(Ctx &ctx, bool bwd) {
  Input &in = ctx.in();
  const uint8_t f = in.u8();
  const NVTE_QKV_Format fmt =
      f < 250 ? static_cast<NVTE_QKV_Format>(f % 3) : static_cast<NVTE_QKV_Format>(static_cast<int>(in.i64(3)));
  const bool thd = fmt == NVTE_THD;
  const size_t h = in.range(0, 4), d = in.range(0, 24);
  const size_t d2 = std::min(d, 2 * in.range(0, 12));
  const bool interleaved = in.flag();
  std::vector<size_t> xs;
  std::vector<int32_t> cu;
  size_t s_max;
  if (thd) {
    const size_t b = in.range(0, 5);
    cu.push_back(0);
    for (size_t i = 0; i < b; ++i) cu.push_back(cu.back() + static_cast<int32_t>(in.range(0, 12)));
    const size_t t = static_cast<size_t>(cu.back()) + in.range(0, 3);
    for (int32_t &c : cu) {  // sometimes any value (wrapping: the harness does no UB itself)
      if (in.u8() % 16 == 15) c = static_cast<int32_t>(static_cast<uint32_t>(c) + static_cast<uint32_t>(in.i64(0)));
    }
    xs = {t, h, d};
    s_max = in.range(0, 14);
  } else {
    const size_t s = in.range(0, 16), b = in.range(0, 4);
    xs = fmt == NVTE_SBHD ? std::vector<size_t>{s, b, h, d} : std::vector<size_t>{b, s, h, d};
    s_max = s + (in.flag() ? in.range(0, 3) : 0);
  }
  if (fz::numel(xs) > 4096) xs[0] = 1;
  const NVTEDType t = fz::pick_hp(in);
  NVTETensor x = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {Buf{kNVTERowwiseData, t, xs}});
  NVTETensor freqs = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING,
                                {Buf{kNVTERowwiseData, kNVTEFloat32, {s_max, 1, 1, d2}}});
  NVTETensor cus = thd || in.u8() % 16 == 15 ? ctx.int32_tensor(cu.empty() ? std::vector<int32_t>{0} : cu)
                                            : nullptr;
  NVTETensor y = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {Buf{kNVTERowwiseData, t, xs}});
  if (bwd) {
    ctx.call("nvte_fused_rope_backward",
             [&] {
               return nvte_fused_rope_backward(x, cus, freqs, nullptr, y, fmt, interleaved, 1, 0,
                                           nullptr);
             });
  } else {
    ctx.call("nvte_fused_rope_forward",
             [&] {
               return nvte_fused_rope_forward(x, cus, freqs, nullptr, y, fmt, interleaved, 1, 0,
                                           nullptr);
             });
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  Input in(data, size);
  Ctx ctx(in);
  const uint8_t op = in.u8() % 12;
  const bool bwd = op & 1;
  switch (op / 2) {
    case 0: norm(ctx, true, bwd); break;
    case 1: norm(ctx, false, bwd); break;
    case 2:
    case 3: activation(ctx, bwd); break;
    case 4: softmax(ctx, bwd); break;
    default: rope(ctx, bwd); break;
  }
  return 0;
}
