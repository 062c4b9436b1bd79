// Fused attention on the GPU (the flash kernel of fused_attn.cu / fused_attn_bwd.cu) against the
// same calls on CPU tensors and against the double-precision reference of fused_attn_reference.h:
// bshd / sbhd / thd and packed layouts, every mask, GQA/MQA, sliding windows, post_scale_bias in
// its four shapes (dBias), ALiBi, dropout, head dims 32 / 59 / 64 / 128 / 256 (and d_qk != d_v),
// sequence lengths 1 to 1025 (2048 on a real GPU; 513 under gpusim). Both devices accumulate in fp32 but tile and round differently (the
// CPU's bf16 path rounds P and dS to bf16; the GPU forward for head dims up to 128 runs on tensor
// cores, fused_attn_fwd_mma.cu, and rounds P to the input dtype before P V: a relative 2^-9 (bf16)
// or 2^-11 (fp16) per term of a convex combination of V rows, well inside the 2e-2 / 2e-3 below),
// so values agree to the dtype's rel_tol of the largest magnitude; LSE to fp32 accuracy; padding and empty rows exactly (O = 0, LSE = -inf); the
// dropout mask byte for byte; the deterministic backward bit for bit between runs, the atomic one
// within the tolerance.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "fused_attn_reference.h"
#include "gpu/gpu_mirror.h"

namespace {

using namespace attn_test;
using test::GpuTensor;

// Device copies of a call's tensors (absent host tensors stay absent).
struct GpuSet {
  std::unique_ptr<GpuTensor> q, k, v, bias, cu_q, cu_kv, rng, o, lse, d_o, dq, dk, dv, dbias;
};

std::unique_ptr<GpuTensor> mirror(const TestTensor &t) {
  return t.handle() != nullptr ? std::make_unique<GpuTensor>(t) : nullptr;
}
NVTETensor handle(const std::unique_ptr<GpuTensor> &g) {
  return g ? static_cast<NVTETensor>(*g) : nullptr;
}

GpuSet mirror(const Tensors &t) {
  GpuSet g;
  g.q = mirror(t.q), g.k = mirror(t.k), g.v = mirror(t.v), g.bias = mirror(t.bias);
  g.cu_q = mirror(t.cu_q), g.cu_kv = mirror(t.cu_kv), g.rng = mirror(t.rng);
  g.o = mirror(t.o), g.lse = mirror(t.lse), g.d_o = mirror(t.d_o);
  g.dq = mirror(t.dq), g.dk = mirror(t.dk), g.dv = mirror(t.dv), g.dbias = mirror(t.dbias);
  return g;
}

// The problem's call with every tensor on the GPU.
Call gpu_call(const Problem &p, const Tensors &t, const GpuSet &g) {
  Call c(p, t);
  c.q = handle(g.q), c.k = handle(g.k), c.v = handle(g.v), c.bias = handle(g.bias);
  c.cu_q = handle(g.cu_q), c.cu_kv = handle(g.cu_kv), c.rng = handle(g.rng);
  c.o = handle(g.o), c.lse = handle(g.lse), c.d_o = handle(g.d_o);
  c.dq = handle(g.dq), c.dk = handle(g.dk), c.dv = handle(g.dv), c.dbias = handle(g.dbias);
  return c;
}

// TE's workspace protocol on the GPU: a handle without data is a size query (the call computes
// nothing and sets its shape), then the call runs with that much device memory.
template <typename F>
NVTEStatus with_workspace(F &&call) {
  NVTETensor query = nvte_create_tensor(NVTE_DELAYED_TENSOR_SCALING);
  const NVTEStatus st = call(query);
  const NVTEShape shape = nvte_tensor_shape(query);
  nvte_destroy_tensor(query);
  if (st != NVTE_SUCCESS) return st;
  EXPECT_EQ(shape.ndim, 1u) << "the workspace query must give a 1-D byte shape";
  if (shape.ndim != 1 || shape.data[0] == 0) return call(nullptr);
  GpuTensor ws({shape.data[0]}, kNVTEByte);
  return call(static_cast<NVTETensor>(ws));
}

NVTEStatus gpu_bwd(const Call &c, bool deterministic) {
  return with_workspace([&](NVTETensor ws) {
    return nvte_fused_attn_bwd(c.q, c.k, c.v, c.o, c.d_o, c.lse, c.bias, c.dq, c.dk, c.dv, c.dbias,
                               c.cu_q, c.cu_kv, c.rng, c.max_q, c.max_kv, c.scale, c.dropout,
                               c.layout, c.bias_type, c.mask, c.left, c.right, deterministic, ws,
                               nullptr);
  });
}

void download(const std::unique_ptr<GpuTensor> &g, TestTensor &host) {
  if (g) g->download(host, kNVTERowwiseData);
}

// GPU values against the CPU's: max |gpu - cpu| <= rel_tol * max |cpu| + atol (NaN: a sentinel the
// GPU left unwritten, counts as infinite).
::testing::AssertionResult close_to_cpu(const char *what, const TestTensor &gpu,
                                        const TestTensor &cpu, double atol = 0) {
  Stat s(what);
  for (size_t i = 0; i < cpu.numel(); ++i) s.add(gpu.get(i), cpu.get(i), false, i);
  return s.check(rel_tol(cpu.buffer().dtype), atol);
}

::testing::AssertionResult same_bytes(const char *what, const TestTensor &a, const TestTensor &b) {
  ::testing::AssertionResult r =
      test::same_bytes(a.buffer().bytes.data(), b.buffer().bytes.data(), a.buffer().bytes.size());
  if (!r) return ::testing::AssertionFailure() << what << ": " << r.message();
  return r;
}

void run_case(const Case &c) {
  Problem p = make_problem(c);
  auto cpu = make_tensors(p);  // also fetches the dropout keep mask into p for the reference
  const Ref ref = reference(p);
  const Call cpu_call(p, *cpu);
  ASSERT_NVTE_OK(cpu_call.fwd());
  ASSERT_NVTE_OK(cpu_call.bwd());

  // Forward and deterministic backward on the GPU.
  auto gt = make_tensors(p);
  GpuSet g = mirror(*gt);
  const Call gc = gpu_call(p, *gt, g);
  ASSERT_NVTE_OK(gc.fwd());
  ASSERT_NVTE_OK(gpu_bwd(gc, /*deterministic=*/true));
  for (auto [d, h] : {std::pair{&g.o, &gt->o}, {&g.lse, &gt->lse}, {&g.dq, &gt->dq},
                      {&g.dk, &gt->dk}, {&g.dv, &gt->dv}, {&g.dbias, &gt->dbias}})
    download(*d, *h);
  expect_matches(p, *gt, ref);  // the reference bounds, exact zeros and -inf included
  EXPECT_TRUE(close_to_cpu("O", gt->o, cpu->o));
  EXPECT_TRUE(test::close(gt->lse.to_double(), cpu->lse.to_double(), {kLseTol, kLseTol}))
      << "softmax_lse";
  const double dq_noise = 2 * kAccumNoise * max_abs(ref.dq_mag);
  const double dk_noise = 2 * kAccumNoise * max_abs(ref.dk_mag);
  EXPECT_TRUE(close_to_cpu("dQ", gt->dq, cpu->dq, dq_noise));
  EXPECT_TRUE(close_to_cpu("dK", gt->dk, cpu->dk, dk_noise));
  EXPECT_TRUE(close_to_cpu("dV", gt->dv, cpu->dv));
  if (c.bias == NVTE_POST_SCALE_BIAS) {
    EXPECT_TRUE(close_to_cpu("dBias", gt->dbias, cpu->dbias,
                             2 * kAccumNoise * max_abs(ref.dbias_mag)));
  }

  // Deterministic again into fresh buffers: bit for bit. Then the atomic dQ path: within bounds.
  for (bool deterministic : {true, false}) {
    auto again = make_tensors(p);
    GpuSet g2 = mirror(*again);
    Call c2 = gpu_call(p, *again, g2);
    c2.o = handle(g.o), c2.lse = handle(g.lse);  // the first run's forward outputs
    ASSERT_NVTE_OK(gpu_bwd(c2, deterministic));
    for (auto [d, h] : {std::pair{&g2.dq, &again->dq}, {&g2.dk, &again->dk},
                        {&g2.dv, &again->dv}, {&g2.dbias, &again->dbias}})
      download(*d, *h);
    // dK, dV, dBias are reduced in a fixed order in both modes.
    EXPECT_TRUE(same_bytes("dK", again->dk, gt->dk)) << "deterministic=" << deterministic;
    EXPECT_TRUE(same_bytes("dV", again->dv, gt->dv)) << "deterministic=" << deterministic;
    if (c.bias == NVTE_POST_SCALE_BIAS) {
      EXPECT_TRUE(same_bytes("dBias", again->dbias, gt->dbias))
          << "deterministic=" << deterministic;
    }
    if (deterministic) {
      EXPECT_TRUE(same_bytes("dQ", again->dq, gt->dq)) << "deterministic run twice";
    } else {
      EXPECT_TRUE(close_to_cpu("dQ (atomic)", again->dq, cpu->dq, dq_noise));
    }
  }
}

// ------------------------------------------------------------------ the swept cases
std::vector<Case> gpu_cases() {
  std::vector<Case> out;
  auto add = [&](Case c) {
    // Variable lengths where the format or mask uses them (sequence 0 fewer queries, 1 fewer keys).
    if ((c.fmt == NVTE_THD || is_padding(c.mask)) && c.len_q.empty()) {
      c.len_q.assign(c.b, static_cast<int32_t>(c.s_q));
      c.len_kv.assign(c.b, static_cast<int32_t>(c.s_kv));
      c.len_q[0] = std::max<int32_t>(1, static_cast<int32_t>(c.s_q * 2 / 3));
      if (c.b > 1) c.len_kv[1] = std::max<int32_t>(1, static_cast<int32_t>(c.s_kv * 2 / 3));
    }
    out.push_back(c);
  };
  const NVTEDType f16 = kNVTEFloat16, bf16 = kNVTEBFloat16;
  // 1. dtype x format x mask around the base case (b 2, h 4, h_kv 2, s 29 x 37, d 32).
  for (NVTEDType dt : {f16, bf16})
    for (NVTE_QKV_Format fmt : {NVTE_BSHD, NVTE_SBHD, NVTE_THD})
      for (NVTE_Mask_Type m : {NVTE_NO_MASK, NVTE_PADDING_MASK, NVTE_CAUSAL_MASK,
                               NVTE_PADDING_CAUSAL_MASK, NVTE_CAUSAL_BOTTOM_RIGHT_MASK,
                               NVTE_PADDING_CAUSAL_BOTTOM_RIGHT_MASK})
        add(make_case(dt, fmt, m));
  // 2. head dims per bucket (64 / 128 / 256), odd ones and d_v != d_qk.
  const size_t dims[][2] = {{32, 32}, {59, 59}, {64, 64},  {128, 128}, {256, 256},
                            {64, 32}, {59, 17}, {100, 80}, {2, 255},   {1, 1}};
  for (auto d : dims)
    for (NVTEDType dt : {f16, bf16}) {
      Case c = make_case(dt, dt == f16 ? NVTE_SBHD : NVTE_BSHD, NVTE_CAUSAL_MASK, 70, 70);
      c.d_qk = d[0];
      c.d_v = d[1];
      add(c);
    }
  // 3. sequence lengths: one row / key, both directions of s_q != s_kv, many tiles. The long one is
  // 1025 = 16 x 64 + 1 on a GPU; gpusim runs 513 = 8 x 64 + 1, the same paths in a quarter of the
  // time (1025 was 34 s of test_gpu_fused_attn's 89 per flavour): every kernel's tiles are 32 or 64
  // rows / keys at d 64 (fp32 forward 64 x 32, tensor-core forward 64 x 64, backward 32 x 32), so
  // both lengths give many query and key tiles, each with a one-row tail.
#if defined(GPUSIM_WARP_SIZE)
  constexpr size_t kLong = 513;
#else
  constexpr size_t kLong = 1025;
#endif
  const size_t lens[][2] = {{1, 1},   {17, 17}, {97, 97},   {1, 130},
                            {130, 1}, {97, 130}, {130, 97}, {kLong, kLong}};
  for (auto l : lens)
    for (NVTE_Mask_Type m : {NVTE_NO_MASK, NVTE_CAUSAL_BOTTOM_RIGHT_MASK}) {
      Case c = make_case(bf16, NVTE_BSHD, m, l[0], l[1]);
      if (l[0] > 512) c.b = 1, c.h = 2, c.h_kv = 1, c.d_qk = c.d_v = 64;
      add(c);
    }
  add(make_case(f16, NVTE_BSHD, NVTE_CAUSAL_MASK, 130, 97));
  // 4. GQA / MQA.
  const size_t heads[][2] = {{4, 1}, {6, 3}, {6, 2}, {8, 1}};
  for (auto hh : heads) {
    Case c = make_case(f16, hh[1] == 1 ? NVTE_THD : NVTE_BSHD,
                       hh[1] == 1 ? NVTE_PADDING_CAUSAL_MASK : NVTE_CAUSAL_MASK, 70, 70);
    c.h = hh[0];
    c.h_kv = hh[1];
    add(c);
  }
  // 4b. the tensor-core forward (head dims 64 and 128) over many query and key tiles: causal with
  // GQA, thd with unequal lengths and padding-causal, bottom-right with s_q < s_kv. The long
  // versions (s 2048, 1100, 1000 x 1300) run on a real GPU only: on gpusim each takes many
  // minutes (the scalar backward dominates), and the medium ones exercise the same tile paths.
  struct Long {
    NVTEDType dt;
    NVTE_QKV_Format f;
    NVTE_Mask_Type m;
    size_t s_q, s_kv, h, h_kv, d;
  };
#if defined(GPUSIM_WARP_SIZE)
  const Long longs[] = {{bf16, NVTE_BSHD, NVTE_CAUSAL_MASK, 333, 333, 2, 1, 128},
                        {f16, NVTE_THD, NVTE_PADDING_CAUSAL_MASK, 300, 300, 4, 2, 64},
                        {f16, NVTE_BSHD, NVTE_CAUSAL_BOTTOM_RIGHT_MASK, 200, 330, 2, 2, 128}};
#else
  const Long longs[] = {{bf16, NVTE_BSHD, NVTE_CAUSAL_MASK, 2048, 2048, 2, 1, 128},
                        {f16, NVTE_THD, NVTE_PADDING_CAUSAL_MASK, 1100, 1100, 4, 2, 64},
                        {f16, NVTE_BSHD, NVTE_CAUSAL_BOTTOM_RIGHT_MASK, 1000, 1300, 2, 2, 128}};
#endif
  for (const Long &l : longs) {
    Case c = make_case(l.dt, l.f, l.m, l.s_q, l.s_kv);
    c.b = l.f == NVTE_THD ? 2 : 1;
    c.h = l.h, c.h_kv = l.h_kv, c.d_qk = c.d_v = l.d;
    if (l.f == NVTE_THD) c.len_q = c.len_kv = {static_cast<int32_t>(l.s_q),
                                               static_cast<int32_t>(l.s_q * 5 / 9)};
    add(c);
  }
  // 5. sliding windows (some key tiles entirely outside a query tile's window).
  struct W {
    NVTE_Mask_Type m;
    NVTE_QKV_Format f;
    int64_t l, r;
  };
  const W wins[] = {{NVTE_CAUSAL_MASK, NVTE_BSHD, 8, 0},
                    {NVTE_CAUSAL_BOTTOM_RIGHT_MASK, NVTE_SBHD, 70, -1},
                    {NVTE_PADDING_CAUSAL_BOTTOM_RIGHT_MASK, NVTE_THD, 20, 0},
                    {NVTE_NO_MASK, NVTE_BSHD, 3, 5},
                    {NVTE_PADDING_MASK, NVTE_THD, 9, 2},
                    {NVTE_NO_MASK, NVTE_BSHD, 0, 0},
                    {NVTE_NO_MASK, NVTE_SBHD, -1, 4}};
  for (const W &w : wins) {
    Case c = make_case(f16, w.f, w.m, 97, 130);
    c.left = w.l;
    c.right = w.r;
    add(c);
  }
  // 6. post_scale_bias in its four shapes (dBias summed over broadcast dims), with padding, with
  // -inf holes (a row of head 0 loses every key); ALiBi with default and explicit slopes.
  for (NVTEDType dt : {f16, bf16})
    for (auto bs :
         {std::vector<size_t>{1, 4, 29, 37}, {2, 1, 29, 37}, {2, 4, 29, 37}, {1, 1, 29, 37}}) {
      Case c = make_case(dt, NVTE_BSHD, NVTE_NO_MASK);
      c.bias = NVTE_POST_SCALE_BIAS;
      c.bias_shape = bs;
      add(c);
    }
  {
    Case c = make_case(bf16, NVTE_THD, NVTE_PADDING_CAUSAL_MASK, 130, 97);
    c.bias = NVTE_POST_SCALE_BIAS;
    c.bias_shape = {2, 4, 130, 97};
    add(c);
    Case h = make_case(f16, NVTE_BSHD, NVTE_PADDING_CAUSAL_BOTTOM_RIGHT_MASK, 97, 130);
    h.bias = NVTE_POST_SCALE_BIAS;
    h.bias_shape = {1, 4, 97, 130};
    h.bias_holes = true;
    add(h);
  }
  for (std::vector<size_t> shape : {std::vector<size_t>{}, {4}, {2, 4}}) {
    Case c = make_case(shape.size() == 1 ? bf16 : f16, NVTE_BSHD, NVTE_CAUSAL_BOTTOM_RIGHT_MASK,
                       97, 70);
    c.bias = NVTE_ALIBI;
    c.bias_shape = shape;
    add(c);
  }
  // 7. dropout (the reference applies the library's keep mask).
  for (float pdrop : {0.1f, 0.5f}) {
    Case c1 = make_case(bf16, NVTE_BSHD, NVTE_NO_MASK, 70, 97);
    Case c2 = make_case(f16, NVTE_THD, NVTE_PADDING_CAUSAL_BOTTOM_RIGHT_MASK, 97, 70);
    Case c3 = make_case(f16, NVTE_SBHD, NVTE_PADDING_MASK);
    c3.bias = NVTE_POST_SCALE_BIAS;
    c3.bias_shape = {1, 4, 29, 37};
    for (Case *c : {&c1, &c2, &c3}) {
      c->dropout = pdrop;
      add(*c);
    }
  }
  // 8. mixed: several features at once, a sequence without keys, a sharp and a negative scale.
  Case m1 = make_case(bf16, NVTE_SBHD, NVTE_CAUSAL_BOTTOM_RIGHT_MASK, 97, 130);
  m1.h = 6;
  m1.d_qk = 64;
  m1.d_v = 48;
  m1.left = 40;
  m1.bias = NVTE_ALIBI;
  m1.dropout = 0.2f;
  add(m1);
  Case m2 = make_case(f16, NVTE_THD, NVTE_PADDING_CAUSAL_MASK, 130, 97);
  m2.b = 3;
  m2.h_kv = 1;
  m2.d_qk = m2.d_v = 59;
  m2.bias = NVTE_POST_SCALE_BIAS;
  m2.bias_shape = {3, 1, 130, 97};
  m2.len_q = {130, 5, 64};
  m2.len_kv = {97, 0, 65};
  m2.dropout = 0.1f;
  add(m2);
  Case m3 = make_case(f16, NVTE_BSHD, NVTE_PADDING_CAUSAL_BOTTOM_RIGHT_MASK, 40, 50);
  m3.b = 3;
  m3.len_q = {40, 0, 12};
  m3.len_kv = {0, 50, 3};
  m3.left = 2;
  add(m3);
  for (float sc : {2.5f, -0.7f}) {
    Case c = make_case(bf16, NVTE_BSHD, NVTE_NO_MASK, 70, 200);
    c.scale = sc;
    add(c);
  }
  return out;
}

class GpuFusedAttn : public ::testing::TestWithParam<Case> {};

TEST_P(GpuFusedAttn, MatchesCpuAndReference) {
  SKIP_WITHOUT_GPU();
  run_case(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Sweep, GpuFusedAttn, ::testing::ValuesIn(gpu_cases()),
                         [](const auto &info) { return info.param.name(); });

// ------------------------------------------------------------------ packed layouts
// QKV interleaved in one buffer through the packed entry points: GPU against CPU (gradients written
// into a packed dQKV).
class GpuFusedAttnPacked : public ::testing::TestWithParam<NVTE_QKV_Layout> {};

TEST_P(GpuFusedAttnPacked, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  const NVTE_QKV_Layout L = GetParam();
  const bool h3d = nvte_get_qkv_layout_group(L) == NVTE_H3D;
  const NVTE_QKV_Format fmt = nvte_get_qkv_format(L);
  const bool thd = fmt == NVTE_THD;
  const NVTEDType dt = h3d ? kNVTEBFloat16 : kNVTEFloat16;
  Case c = make_case(dt, fmt, thd ? NVTE_PADDING_CAUSAL_MASK : NVTE_CAUSAL_MASK, 70, 70);
  c.h = c.h_kv = 3;
  c.d_qk = c.d_v = 40;
  if (thd) c.len_q = c.len_kv = {70, 41};
  Problem p = make_problem(c);
  auto t = make_tensors(p);
  // [rows, 3, h, d] or [rows, h, 3, d] (rows: b*s, s*b or t) from the dense Q, K, V.
  const size_t H = c.h, D = c.d_qk, es = nvte_dtype_size(dt), R = p.rows(true);
  std::vector<size_t> pshape = t->q.buffer().shape;
  pshape.insert(pshape.end() - (h3d ? 1 : 2), 3);
  TestTensor packed(pshape, dt);
  const TestTensor *src[3] = {&t->q, &t->k, &t->v};
  for (size_t n = 0; n < 3; ++n)
    for (size_t r = 0; r < R; ++r)
      for (size_t hd = 0; hd < H; ++hd) {
        const size_t at = h3d ? ((r * H + hd) * 3 + n) * D : ((r * 3 + n) * H + hd) * D;
        std::memcpy(packed.bytes() + at * es, src[n]->buffer().bytes.data() + (r * H + hd) * D * es,
                    D * es);
      }
  const float sc = static_cast<float>(p.scale);
  auto run = [&](NVTETensor qkv, NVTETensor o, NVTETensor lse, NVTETensor d_o, NVTETensor dqkv,
                 NVTETensor cu, bool gpu) {
    auto fwd = [&](NVTETensor ws) {
      return nvte_fused_attn_fwd_qkvpacked(qkv, nullptr, o, lse, cu, nullptr, c.s_q, true, sc,
                                           0.0f, L, NVTE_NO_BIAS, c.mask, -1, -1, ws, nullptr);
    };
    auto bwd = [&](NVTETensor ws) {
      return nvte_fused_attn_bwd_qkvpacked(qkv, o, d_o, lse, nullptr, dqkv, nullptr, cu, nullptr,
                                           c.s_q, sc, 0.0f, L, NVTE_NO_BIAS, c.mask, -1, -1, true,
                                           ws, nullptr);
    };
    ASSERT_NVTE_OK(fwd(nullptr));  // the forward needs no workspace on either device
    ASSERT_NVTE_OK(gpu ? with_workspace(bwd) : bwd(nullptr));
  };
  TestTensor dpacked(pshape, dt), gdpacked(pshape, dt), go(t->o.buffer().shape, dt),
      glse(t->lse.buffer().shape, kNVTEFloat32);
  for (TestTensor *x : {&dpacked, &gdpacked, &go, &glse}) fill_sentinel(*x);
  run(packed, t->o, t->lse, t->d_o, dpacked, t->cu_q, false);
  GpuTensor d_packed(packed), d_o(go), d_lse(glse), d_do(t->d_o), d_dpacked(gdpacked);
  std::unique_ptr<GpuTensor> d_cu = mirror(t->cu_q);
  run(d_packed, d_o, d_lse, d_do, d_dpacked, handle(d_cu), true);
  d_o.download(go, kNVTERowwiseData);
  d_lse.download(glse, kNVTERowwiseData);
  d_dpacked.download(gdpacked, kNVTERowwiseData);
  EXPECT_TRUE(close_to_cpu("O", go, t->o));
  EXPECT_TRUE(test::close(glse.to_double(), t->lse.to_double(), {kLseTol, kLseTol}))
      << "softmax_lse";
  // thd: rows past the last sequence belong to no sequence; both devices leave them alone.
  EXPECT_TRUE(close_to_cpu("dQKV", gdpacked, dpacked, 1e-6));
}

INSTANTIATE_TEST_SUITE_P(Layouts, GpuFusedAttnPacked,
                         ::testing::Values(NVTE_BS3HD, NVTE_BSH3D, NVTE_SB3HD, NVTE_T3HD),
                         [](const auto &info) {
                           return std::string(nvte_qkv_layout_name(info.param));
                         });

// ------------------------------------------------------------------ dropout mask
// The keep mask the GPU kernels apply, materialised on both devices: identical bytes.
class GpuDropoutMask
    : public ::testing::TestWithParam<std::tuple<std::vector<size_t>, float, int64_t>> {};

TEST_P(GpuDropoutMask, SameBytesAsCpu) {
  SKIP_WITHOUT_GPU();
  const auto &[shape, pdrop, seed] = GetParam();
  TestTensor rng({2}, kNVTEInt64);
  const int64_t st[2] = {seed, 12345 + seed};
  std::memcpy(rng.bytes(), st, sizeof(st));
  TestTensor cpu(shape, kNVTEByte), gpu(shape, kNVTEByte);
  fill_sentinel(cpu);
  fill_sentinel(gpu);
  ASSERT_NVTE_OK(nvte_fused_attn_dropout_mask(rng, pdrop, cpu, nullptr));
  GpuTensor d_rng(rng), d_mask(gpu);
  ASSERT_NVTE_OK(nvte_fused_attn_dropout_mask(d_rng, pdrop, d_mask, nullptr));
  d_mask.download(gpu, kNVTERowwiseData);
  EXPECT_TRUE(same_bytes("mask", gpu, cpu));
}

std::string mask_case_name(
    const ::testing::TestParamInfo<std::tuple<std::vector<size_t>, float, int64_t>> &info) {
  const auto &[shape, pdrop, seed] = info.param;
  return test::shape_tag(shape) + "_p" + std::to_string(static_cast<int>(pdrop * 100)) + "_seed" +
         std::to_string(seed != 0);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GpuDropoutMask,
    ::testing::Combine(::testing::Values(std::vector<size_t>{1, 1, 1, 1},
                                         std::vector<size_t>{2, 3, 17, 33},
                                         std::vector<size_t>{2, 2, 97, 130},
                                         std::vector<size_t>{1, 4, 1025, 7}),
                       ::testing::Values(0.0f, 0.1f, 0.5f, 0.9f),
                       ::testing::Values(int64_t{0}, int64_t{0x7eadbeefcafe})),
    mask_case_name);

// ------------------------------------------------------------------ the AOTriton backend
// Configs the aotriton rules take (bf16/fp16, no bias, bshd/sbhd, no_mask/causal, h == h_kv, head
// dims up to 128 incl. padded ones, dropout): in a build with AOTriton images for this device they
// run on the Triton kernels (the selection must say so), against the CPU and the reference as
// above; in any other build or without a device they skip, naming why.
std::vector<Case> aotriton_cases() {
  std::vector<Case> out;
  for (NVTEDType dt : {kNVTEBFloat16, kNVTEFloat16})
    for (size_t d : {64, 128, 80, 40})
      for (NVTE_Mask_Type m : {NVTE_NO_MASK, NVTE_CAUSAL_MASK}) {
        Case c = make_case(dt, d == 80 ? NVTE_SBHD : NVTE_BSHD, m, 97, 97);
        c.h_kv = c.h;
        c.d_qk = c.d_v = d;
        if (m == NVTE_CAUSAL_MASK) c.right = 0;
        if (d == 64) c.dropout = 0.2f;
        out.push_back(c);
      }
  Case c = make_case(kNVTEBFloat16, NVTE_BSHD, NVTE_NO_MASK, 1, 130);  // one query row
  c.h_kv = c.h;
  c.d_qk = c.d_v = 64;
  out.push_back(c);
  return out;
}

class GpuFusedAttnAotriton : public ::testing::TestWithParam<Case> {};

TEST_P(GpuFusedAttnAotriton, MatchesCpuAndReference) {
  SKIP_WITHOUT_GPU();
  const Case &c = GetParam();
  const NVTEFusedAttnConfig cfg{kNVTEDeviceGPU, c.dtype, c.dtype, c.layout(), c.bias, c.mask,
                                c.dropout, c.h, c.h_kv, c.s_q, c.s_kv, c.d_qk, c.d_v, c.left,
                                c.right};
  NVTE_Fused_Attn_Backend selected = NVTE_No_Backend;
  const char *reasons[NVTE_NUM_FUSED_ATTN_BACKENDS] = {};
  ASSERT_EQ(nvte_fused_attn_backend_reasons(&cfg, nullptr, &selected, reasons), NVTE_SUCCESS);
  if (selected != NVTE_AOTriton) GTEST_SKIP() << "aotriton not selected: " << reasons[NVTE_AOTriton];
  run_case(c);
}

INSTANTIATE_TEST_SUITE_P(Aotriton, GpuFusedAttnAotriton, ::testing::ValuesIn(aotriton_cases()),
                         [](const auto &info) { return info.param.name(); });

}  // namespace
