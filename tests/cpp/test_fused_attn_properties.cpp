// Fused attention on the CPU, the exact properties beyond the reference sweep of
// test_fused_attn.cpp: fully masked rows exactly zero, inference without LSE, ignored optional
// arguments and the workspace query; thd equal to per-sequence bshd runs and packed layouts
// (nvte_fused_attn_fwd/_bwd with views and the packed entry points) equal to unpacked ones bit for
// bit; dropout mask statistics and determinism across calls and OpenMP thread counts; the forward's
// work split across thread counts.
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "fused_attn_reference.h"

namespace {

using namespace attn_test;

// The dtypes of the sweep (test_fused_attn.cpp), in the same order: the inference case runs each,
// the packed cases pick one by layout index.
const NVTEDType kDtypes[] = {kNVTEFloat32, kNVTEFloat16, kNVTEBFloat16};

// ------------------------------------------------------------------ edge rows, inference
// causal_bottom_right with s_q > s_kv: the first s_q - s_kv rows see no key. Their O and dQ are 0,
// their LSE -inf, and they contribute nothing to dK / dV (checked by the reference comparison).
TEST(FusedAttnEdge, FullyMaskedRowsAreZero) {
  Case c = make_case(kNVTEBFloat16, NVTE_BSHD, NVTE_CAUSAL_BOTTOM_RIGHT_MASK, 80, 17);
  Problem p = make_problem(c);
  auto t = make_tensors(p);
  const Call call(p, *t);
  ASSERT_NVTE_OK(call.fwd());
  ASSERT_NVTE_OK(call.bwd());
  size_t bad = 0;
  for (size_t bi = 0; bi < c.b; ++bi)
    for (size_t i = 0; i < c.s_q - c.s_kv; ++i)
      for (size_t hd = 0; hd < c.h; ++hd) {
        bad += t->lse.get(p.ils(bi, hd, i)) != -kInf;
        for (size_t d = 0; d < c.d_v; ++d) bad += t->o.get(p.io(bi, i, hd, d)) != 0.0;
        for (size_t d = 0; d < c.d_qk; ++d) bad += t->dq.get(p.iq(bi, i, hd, d)) != 0.0;
      }
  EXPECT_EQ(bad, 0u);
  expect_matches(p, *t, reference(p));
}

TEST(FusedAttnEdge, InferenceWithoutLse) {
  for (NVTEDType dt : kDtypes) {
    Case c = make_case(dt, NVTE_THD, NVTE_PADDING_CAUSAL_MASK, 70, 70);
    Problem p = make_problem(c);
    auto t = make_tensors(p);
    Call call(p, *t);
    ASSERT_NVTE_OK(call.fwd());
    TestTensor o2(t->o.buffer().shape, dt);
    fill_sentinel(o2);
    call.o = o2;
    call.lse = nullptr;
    call.training = false;
    ASSERT_NVTE_OK(call.fwd());
    EXPECT_TRUE(test::same_bytes(o2.bytes(), t->o.bytes(), o2.buffer().bytes.size()));
  }
}

// bshd with a mask without padding: cu_seqlens are ignored (even lengths shorter than s); a
// post_scale_bias backward without dBias computes the same dQ / dK / dV.
TEST(FusedAttnEdge, OptionalArgumentsIgnored) {
  Case c = make_case(kNVTEFloat32, NVTE_BSHD, NVTE_CAUSAL_MASK);
  c.bias = NVTE_POST_SCALE_BIAS;
  c.bias_shape = {2, 1, 29, 37};
  Problem p = make_problem(c);
  auto t = make_tensors(p);
  const Call call(p, *t);
  ASSERT_NVTE_OK(call.fwd());
  ASSERT_NVTE_OK(call.bwd());
  TestTensor cu({3}, kNVTEInt32), o2(t->o.buffer().shape, c.dtype),
      dq2(t->dq.buffer().shape, c.dtype), dk2(t->dk.buffer().shape, c.dtype),
      dv2(t->dv.buffer().shape, c.dtype);
  const int32_t lens[3] = {0, 3, 8};
  std::memcpy(cu.bytes(), lens, sizeof(lens));
  Call c2 = call;
  c2.cu_q = c2.cu_kv = cu;
  c2.o = o2;
  ASSERT_NVTE_OK(c2.fwd());
  EXPECT_TRUE(test::same_bytes(o2.bytes(), t->o.bytes(), o2.buffer().bytes.size()));
  c2.o = t->o;
  c2.dq = dq2;
  c2.dk = dk2;
  c2.dv = dv2;
  c2.dbias = nullptr;
  ASSERT_NVTE_OK(c2.bwd());
  EXPECT_TRUE(test::same_bytes(dq2.bytes(), t->dq.bytes(), dq2.buffer().bytes.size()));
  EXPECT_TRUE(test::same_bytes(dk2.bytes(), t->dk.bytes(), dk2.buffer().bytes.size()));
  EXPECT_TRUE(test::same_bytes(dv2.bytes(), t->dv.bytes(), dv2.buffer().bytes.size()));
}

// fused_attn.h: "this library needs none [workspace] on the CPU (a handle without data gets shape
// [0])" -- TE's query protocol, where the caller allocates what the query call reports.
TEST(FusedAttnEdge, WorkspaceQueryGetsShapeZero) {
  Problem p = make_problem(make_case(kNVTEFloat32, NVTE_BSHD, NVTE_NO_MASK));
  auto t = make_tensors(p);
  const Case &c = p.c;
  for (bool bwd : {false, true}) {
    TestTensor ws({7}, kNVTEByte);
    ws.set_null(kNVTERowwiseData, {7}, kNVTEByte);  // no data; the shape of a stale query
    const float sc = static_cast<float>(p.scale);
    if (bwd)
      ASSERT_NVTE_OK(nvte_fused_attn_bwd(t->q, t->k, t->v, t->o, t->d_o, t->lse, nullptr, t->dq,
                                         t->dk, t->dv, nullptr, nullptr, nullptr, nullptr, c.s_q,
                                         c.s_kv, sc, 0.0f, c.layout(), NVTE_NO_BIAS, c.mask, -1, -1,
                                         true, ws, nullptr));
    else
      ASSERT_NVTE_OK(nvte_fused_attn_fwd(t->q, t->k, t->v, nullptr, t->o, t->lse, nullptr, nullptr,
                                         nullptr, c.s_q, c.s_kv, true, sc, 0.0f, c.layout(),
                                         NVTE_NO_BIAS, c.mask, -1, -1, ws, nullptr));
    const NVTEShape sh = nvte_tensor_shape(ws);
    EXPECT_TRUE(sh.ndim == 1 && sh.data[0] == 0)
        << (bwd ? "backward" : "forward") << ": workspace shape has " << sh.ndim << " dims, first "
        << (sh.ndim ? sh.data[0] : 0);
  }
}

// Fuzzing finding (fuzz_attn): a window of INT64_MAX (any size >= -1 is valid) overflowed
// i + off - window in the key-range computation (undefined behaviour). A window longer than every
// sequence is unbounded: the results equal those of -1, bit for bit, forward and backward.
TEST(FusedAttnEdge, HugeWindowsAreUnbounded) {
  for (NVTE_Mask_Type mask : {NVTE_NO_MASK, NVTE_CAUSAL_BOTTOM_RIGHT_MASK, NVTE_PADDING_MASK}) {
    Case c = make_case(kNVTEFloat32, NVTE_BSHD, mask, 11, 7);
    if (is_padding(mask)) {
      c.len_q = {11, 4};
      c.len_kv = {3, 7};
    }
    Problem p = make_problem(c);
    auto t = make_tensors(p);
    const Call call(p, *t);
    ASSERT_NVTE_OK(call.fwd());
    ASSERT_NVTE_OK(call.bwd());
    auto t2 = make_tensors(p);
    Call huge(p, *t2);
    huge.left = std::numeric_limits<int64_t>::max();
    huge.right = is_causal(mask) ? 0 : std::numeric_limits<int64_t>::max();
    ASSERT_NVTE_OK(huge.fwd());
    ASSERT_NVTE_OK(huge.bwd());
    for (auto [a, b] : {std::pair{&t->o, &t2->o}, {&t->lse, &t2->lse}, {&t->dq, &t2->dq},
                        {&t->dk, &t2->dk}, {&t->dv, &t2->dv}})
      EXPECT_TRUE(test::same_bytes(b->bytes(), a->bytes(), a->buffer().bytes.size()))
          << nvte_mask_type_name(mask);
  }
}

// Fuzzing finding (fuzz_attn): a padded sequence with no keys (length 0 in cu_seqlens_kv) made the
// backward form pointers into its empty dK / dV accumulators (null + offset, undefined behaviour).
// Its dK and dV rows are 0, and everything matches the reference.
TEST(FusedAttnEdge, BackwardWithAnEmptyKeySequence) {
  for (NVTE_Mask_Type mask : {NVTE_PADDING_MASK, NVTE_PADDING_CAUSAL_BOTTOM_RIGHT_MASK}) {
    Case c = make_case(kNVTEBFloat16, NVTE_BSHD, mask, 9, 6);
    c.len_q = {9, 5};
    c.len_kv = {0, 6};
    Problem p = make_problem(c);
    auto t = make_tensors(p);
    const Call call(p, *t);
    ASSERT_NVTE_OK(call.fwd());
    ASSERT_NVTE_OK(call.bwd());
    size_t nonzero = 0;
    for (size_t j = 0; j < c.s_kv; ++j)
      for (size_t g = 0; g < c.h_kv; ++g)
        for (size_t d = 0; d < c.d_qk; ++d)
          nonzero += t->dk.get(p.ik(0, j, g, d)) != 0.0 || t->dv.get(p.iv(0, j, g, d)) != 0.0;
    EXPECT_EQ(nonzero, 0u) << nvte_mask_type_name(mask);
    expect_matches(p, *t, reference(p));
  }
}

// ------------------------------------------------------------------ thd == per-sequence bshd
// Same kernel, same math: a thd call gives, bit for bit, what one bshd call per sequence gives.
class FusedAttnThd : public ::testing::TestWithParam<std::tuple<NVTEDType, NVTE_Mask_Type, int>> {};

TEST_P(FusedAttnThd, EqualsPerSequenceBshd) {
  const auto [dt, mask, variant] = GetParam();
  Case c = make_case(dt, NVTE_THD, mask, 70, 70);
  c.b = 3;
  c.len_q = {17, 1, 70};
  c.len_kv = {40, 9, 70};
  if (variant == 1) c.bias = NVTE_ALIBI;
  if (variant == 2) c.left = 6;
  Problem p = make_problem(c);
  auto t = make_tensors(p);
  const Call call(p, *t);
  ASSERT_NVTE_OK(call.fwd());
  ASSERT_NVTE_OK(call.bwd());
  const size_t es = nvte_dtype_size(dt);
  for (size_t bi = 0; bi < c.b; ++bi) {
    Case cb = c;
    cb.fmt = NVTE_BSHD;
    cb.b = 1;
    cb.s_q = static_cast<size_t>(p.lq[bi]);
    cb.s_kv = static_cast<size_t>(p.lkv[bi]);
    cb.len_q.clear();
    cb.len_kv.clear();
    cb.mask = mask == NVTE_PADDING_MASK                       ? NVTE_NO_MASK
              : mask == NVTE_PADDING_CAUSAL_MASK              ? NVTE_CAUSAL_MASK
              : mask == NVTE_PADDING_CAUSAL_BOTTOM_RIGHT_MASK ? NVTE_CAUSAL_BOTTOM_RIGHT_MASK
                                                              : mask;
    Problem pb = make_problem(cb);
    for (size_t i = 0; i < cb.s_q; ++i)
      for (size_t hd = 0; hd < c.h; ++hd) {
        for (size_t d = 0; d < c.d_qk; ++d) pb.q[pb.iq(0, i, hd, d)] = p.q[p.iq(bi, i, hd, d)];
        for (size_t d = 0; d < c.d_v; ++d) pb.d_o[pb.io(0, i, hd, d)] = p.d_o[p.io(bi, i, hd, d)];
      }
    for (size_t j = 0; j < cb.s_kv; ++j)
      for (size_t g = 0; g < c.h_kv; ++g) {
        for (size_t d = 0; d < c.d_qk; ++d) pb.k[pb.ik(0, j, g, d)] = p.k[p.ik(bi, j, g, d)];
        for (size_t d = 0; d < c.d_v; ++d) pb.v[pb.iv(0, j, g, d)] = p.v[p.iv(bi, j, g, d)];
      }
    auto tb = make_tensors(pb);
    const Call cbc(pb, *tb);
    ASSERT_NVTE_OK(cbc.fwd());
    ASSERT_NVTE_OK(cbc.bwd());
    auto same_rows = [&](const TestTensor &a, const TestTensor &b, size_t first_row, size_t n,
                         size_t row_elems, const char *what) {
      EXPECT_TRUE(test::same_bytes(a.buffer().bytes.data() + first_row * row_elems * es,
                                   b.buffer().bytes.data(), n * row_elems * es))
          << what << " of sequence " << bi;
    };
    same_rows(t->o, tb->o, p.cu_q[bi], cb.s_q, c.h * c.d_v, "O");
    same_rows(t->dq, tb->dq, p.cu_q[bi], cb.s_q, c.h * c.d_qk, "dQ");
    same_rows(t->dk, tb->dk, p.cu_kv[bi], cb.s_kv, c.h_kv * c.d_qk, "dK");
    same_rows(t->dv, tb->dv, p.cu_kv[bi], cb.s_kv, c.h_kv * c.d_v, "dV");
    for (size_t hd = 0; hd < c.h; ++hd)
      EXPECT_TRUE(test::same_bytes(t->lse.bytes() + 4 * p.ils(bi, hd, 0),
                                   tb->lse.bytes() + 4 * pb.ils(0, hd, 0), 4 * cb.s_q))
          << "LSE of sequence " << bi << " head " << hd;
  }
}

std::string thd_name(const ::testing::TestParamInfo<FusedAttnThd::ParamType> &info) {
  static const char *variants[] = {"plain", "alibi", "window"};
  return test::dtype_tag(std::get<0>(info.param)) + "_" +
         nvte_mask_type_name(std::get<1>(info.param)) + "_" + variants[std::get<2>(info.param)];
}

INSTANTIATE_TEST_SUITE_P(
    Masks, FusedAttnThd,
    ::testing::Combine(::testing::Values(kNVTEFloat32, kNVTEBFloat16),
                       ::testing::Values(NVTE_PADDING_MASK, NVTE_CAUSAL_MASK,
                                         NVTE_PADDING_CAUSAL_MASK,
                                         NVTE_PADDING_CAUSAL_BOTTOM_RIGHT_MASK),
                       ::testing::Values(0, 1, 2)),
    thd_name);

// ------------------------------------------------------------------ packed layouts
// Q/K/V (or K/V) interleaved in one buffer: the same results, bit for bit, as the dense tensors,
// through nvte_fused_attn_fwd/_bwd with pointers into the buffer and through the packed entry
// points (gradients written into a packed dQKV / dKV). A pointer the layout does not describe is an
// error.
class FusedAttnPacked : public ::testing::TestWithParam<NVTE_QKV_Layout> {};

TEST_P(FusedAttnPacked, EqualsUnpacked) {
  const NVTE_QKV_Layout L = GetParam();
  const NVTE_QKV_Layout_Group grp = nvte_get_qkv_layout_group(L);
  const NVTE_QKV_Format fmt = nvte_get_qkv_format(L);
  const bool qkv = grp == NVTE_3HD || grp == NVTE_H3D, hnd = grp == NVTE_H3D || grp == NVTE_HD_H2D;
  const NVTEDType dt = kDtypes[static_cast<int>(L) % 3];
  const bool thd = fmt == NVTE_THD;
  Case c =
      qkv ? make_case(dt, fmt, thd ? NVTE_PADDING_CAUSAL_MASK : NVTE_CAUSAL_MASK, 40, 40)
          : make_case(dt, fmt,
                      thd ? NVTE_PADDING_CAUSAL_BOTTOM_RIGHT_MASK : NVTE_CAUSAL_BOTTOM_RIGHT_MASK);
  c.d_qk = c.d_v = 24;
  if (qkv) c.h = c.h_kv = 3;
  if (thd) c.len_q = qkv ? std::vector<int32_t>{40, 23} : std::vector<int32_t>{20, 29};
  if (thd) c.len_kv = qkv ? c.len_q : std::vector<int32_t>{37, 25};
  Problem p = make_problem(c);
  auto t = make_tensors(p);
  const Call call(p, *t);
  ASSERT_NVTE_OK(call.fwd());
  ASSERT_NVTE_OK(call.bwd());

  const size_t n_slots = qkv ? 3 : 2, H = c.h_kv, D = c.d_qk, es = nvte_dtype_size(dt);
  const std::vector<size_t> ushape = t->k.buffer().shape;
  std::vector<size_t> pshape = ushape;
  pshape.insert(pshape.begin() + static_cast<long>(ushape.size() - (hnd ? 1 : 2)), n_slots);
  const size_t R = p.rows(false);
  auto at = [&](size_t r, size_t hd, size_t n) {
    return (hnd ? ((r * H + hd) * n_slots + n) * D : ((r * n_slots + n) * H + hd) * D) * es;
  };
  const std::vector<TestTensor *> src = qkv ? std::vector<TestTensor *>{&t->q, &t->k, &t->v}
                                            : std::vector<TestTensor *>{&t->k, &t->v};
  const std::vector<TestTensor *> grads = qkv ? std::vector<TestTensor *>{&t->dq, &t->dk, &t->dv}
                                              : std::vector<TestTensor *>{&t->dk, &t->dv};
  TestTensor packed(pshape, dt);
  for (size_t n = 0; n < n_slots; ++n)
    for (size_t r = 0; r < R; ++r)
      for (size_t hd = 0; hd < H; ++hd)
        std::memcpy(packed.bytes() + at(r, hd, n), src[n]->bytes() + (r * H + hd) * D * es, D * es);
  auto slots_equal = [&](TestTensor &pk, const char *what) {
    for (size_t n = 0; n < n_slots; ++n) {
      size_t bad = 0;
      for (size_t r = 0; r < R; ++r)
        for (size_t hd = 0; hd < H; ++hd)
          bad += std::memcmp(pk.bytes() + at(r, hd, n), grads[n]->bytes() + (r * H + hd) * D * es,
                             D * es) != 0;
      EXPECT_EQ(bad, 0u) << what << ": slot " << n << " differs from the unpacked gradient";
    }
  };
  auto same = [](TestTensor &a, TestTensor &b) {
    return test::same_bytes(a.bytes(), b.bytes(), a.buffer().bytes.size());
  };
  auto fresh = [](const TestTensor &like) {
    TestTensor x(like.buffer().shape, like.buffer().dtype);
    fill_sentinel(x);
    return x;
  };
  std::vector<std::unique_ptr<View>> views;
  for (size_t n = 0; n < n_slots; ++n)
    views.push_back(std::make_unique<View>(packed.bytes() + at(0, 0, n), ushape, dt));

  // (a) nvte_fused_attn_fwd / _bwd with views: dense gradients.
  Call pc = call;
  pc.layout = L;
  (qkv ? pc.q : pc.k) = *views[0];
  (qkv ? pc.k : pc.v) = *views[1];
  if (qkv) pc.v = *views[2];
  TestTensor o2 = fresh(t->o), lse2 = fresh(t->lse), dq2 = fresh(t->dq), dk2 = fresh(t->dk),
             dv2 = fresh(t->dv);
  pc.o = o2, pc.lse = lse2;
  ASSERT_NVTE_OK(pc.fwd());
  EXPECT_TRUE(same(o2, t->o));
  EXPECT_TRUE(same(lse2, t->lse));
  pc.o = t->o, pc.lse = t->lse, pc.dq = dq2, pc.dk = dk2, pc.dv = dv2;
  ASSERT_NVTE_OK(pc.bwd());
  EXPECT_TRUE(same(dq2, t->dq));
  EXPECT_TRUE(same(dk2, t->dk));
  EXPECT_TRUE(same(dv2, t->dv));

  // (b) the packed entry points.
  TestTensor o3 = fresh(t->o), lse3 = fresh(t->lse), dq3 = fresh(t->dq), dpacked(pshape, dt);
  fill_sentinel(dpacked);
  const float sc = static_cast<float>(p.scale);
  if (qkv) {
    ASSERT_NVTE_OK(nvte_fused_attn_fwd_qkvpacked(packed, nullptr, o3, lse3, t->cu_q, nullptr, c.s_q,
                                                 true, sc, 0.0f, L, NVTE_NO_BIAS, c.mask, -1, -1,
                                                 nullptr, nullptr));
    ASSERT_NVTE_OK(nvte_fused_attn_bwd_qkvpacked(
        packed, t->o, t->d_o, t->lse, nullptr, dpacked, nullptr, t->cu_q, nullptr, c.s_q, sc, 0.0f,
        L, NVTE_NO_BIAS, c.mask, -1, -1, true, nullptr, nullptr));
  } else {
    ASSERT_NVTE_OK(nvte_fused_attn_fwd_kvpacked(t->q, packed, nullptr, o3, lse3, t->cu_q, t->cu_kv,
                                                nullptr, c.s_q, c.s_kv, true, sc, 0.0f, L,
                                                NVTE_NO_BIAS, c.mask, -1, -1, nullptr, nullptr));
    ASSERT_NVTE_OK(nvte_fused_attn_bwd_kvpacked(
        t->q, packed, t->o, t->d_o, t->lse, nullptr, dq3, dpacked, nullptr, t->cu_q, t->cu_kv,
        nullptr, c.s_q, c.s_kv, sc, 0.0f, L, NVTE_NO_BIAS, c.mask, -1, -1, true, nullptr, nullptr));
    EXPECT_TRUE(same(dq3, t->dq));
  }
  EXPECT_TRUE(same(o3, t->o));
  EXPECT_TRUE(same(lse3, t->lse));
  slots_equal(dpacked, "packed API");

  // (c) mislabelled pointers: separate buffers, or two slots swapped, under a packed layout.
  TestTensor o4 = fresh(t->o), lse4 = fresh(t->lse);
  Call bad = call;
  bad.layout = L, bad.o = o4, bad.lse = lse4;
  const char *culprit = qkv ? "'K'" : "'V'";
  EXPECT_NVTE_ERROR(bad.fwd(), NVTE_ERROR_INVALID_ARGUMENT, culprit, nvte_qkv_layout_name(L));
  bad.k = *views[qkv ? 2 : 1];
  bad.v = *views[qkv ? 1 : 0];
  if (qkv) bad.q = *views[0];
  EXPECT_NVTE_ERROR(bad.fwd(), NVTE_ERROR_INVALID_ARGUMENT, culprit);
  EXPECT_TRUE(is_sentinel(o4) && is_sentinel(lse4));
}

INSTANTIATE_TEST_SUITE_P(Layouts, FusedAttnPacked,
                         ::testing::Values(NVTE_SB3HD, NVTE_SBH3D, NVTE_SBHD_SB2HD, NVTE_SBHD_SBH2D,
                                           NVTE_BS3HD, NVTE_BSH3D, NVTE_BSHD_BS2HD, NVTE_BSHD_BSH2D,
                                           NVTE_T3HD, NVTE_TH3D, NVTE_THD_T2HD, NVTE_THD_TH2D),
                         [](const auto &info) {
                           return std::string(nvte_qkv_layout_name(info.param));
                         });

// ------------------------------------------------------------------ dropout
std::vector<uint8_t> dropout_mask(int64_t seed, int64_t offset, float p,
                                  std::vector<size_t> shape) {
  TestTensor rng({2}, kNVTEInt64), mask(shape, kNVTEByte);
  const int64_t st[2] = {seed, offset};
  std::memcpy(rng.bytes(), st, sizeof(st));
  EXPECT_EQ(nvte_fused_attn_dropout_mask(rng, p, mask, nullptr), NVTE_SUCCESS)
      << nvte_get_last_error();
  return mask.buffer().bytes;
}

TEST(FusedAttnDropout, MaskIsAFunctionOfSeedAndOffset) {
  const std::vector<size_t> shape = {2, 3, 33, 70};
  const std::vector<uint8_t> a = dropout_mask(11, 5, 0.3f, shape);
  ASSERT_EQ(a, dropout_mask(11, 5, 0.3f, shape));
  auto differing = [&](const std::vector<uint8_t> &b) {
    size_t n = 0;
    for (size_t i = 0; i < a.size(); ++i) n += a[i] != b[i];
    return static_cast<double>(n) / static_cast<double>(a.size());
  };
  // Independent masks of keep rate 0.7 differ in 2 * 0.3 * 0.7 = 42% of the positions.
  EXPECT_GT(differing(dropout_mask(12, 5, 0.3f, shape)), 0.35);
  EXPECT_GT(differing(dropout_mask(11, 6, 0.3f, shape)), 0.35);
  const int64_t high_seed = 11 + (int64_t{1} << 40);  // the seed's upper 32 bits count too
  EXPECT_GT(differing(dropout_mask(high_seed, 5, 0.3f, shape)), 0.35);
  for (uint8_t v : a) ASSERT_TRUE(v == 0 || v == 1);
  for (uint8_t v : dropout_mask(11, 5, 0.0f, shape)) ASSERT_EQ(v, 1);
}

TEST(FusedAttnDropout, KeepRateWithinFiveSigma) {
  for (float p : {0.1f, 0.5f, 0.9f}) {
    const std::vector<uint8_t> m = dropout_mask(2024, 3, p, {2, 4, 256, 256});
    double kept = 0;
    for (uint8_t v : m) kept += v;
    const double n = static_cast<double>(m.size()), rate = kept / n;
    EXPECT_NEAR(rate, 1.0 - p, 5.0 * std::sqrt(p * (1.0 - p) / n)) << "dropout " << p;
  }
}

// Same seed: bit-identical forward and backward across calls and across OpenMP thread counts.
TEST(FusedAttnDropout, DeterministicAcrossCallsAndThreads) {
  Case c = make_case(kNVTEBFloat16, NVTE_BSHD, NVTE_CAUSAL_BOTTOM_RIGHT_MASK, 97, 130);
  c.dropout = 0.3f;
  c.bias = NVTE_POST_SCALE_BIAS;
  c.bias_shape = {1, 4, 97, 130};
  auto run = [&](int threads) {
    return test::with_threads(threads, [&] {
      Problem p = make_problem(c);
      auto t = make_tensors(p);
      const Call call(p, *t);
      EXPECT_EQ(call.fwd(), NVTE_SUCCESS) << nvte_get_last_error();
      EXPECT_EQ(call.bwd(), NVTE_SUCCESS) << nvte_get_last_error();
      std::vector<std::vector<uint8_t>> out;
      for (TestTensor *x : {&t->o, &t->lse, &t->dq, &t->dk, &t->dv, &t->dbias})
        out.push_back(x->buffer().bytes);
      return out;
    });
  };
  const auto a = run(2), b = run(2), one = run(1);
  const char *names[] = {"O", "LSE", "dQ", "dK", "dV", "dBias"};
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(a[i] == b[i]) << names[i] << " differs between two calls";
    EXPECT_TRUE(a[i] == one[i]) << names[i] << " differs between 2 threads and 1";
  }
}

// The forward's work items: one per (sequence, kv head), split into query slices when there are
// fewer than two per thread, each packing the key blocks it needs into its thread's buffer; the key
// blocks of a tile's diagonal computed only up to each 16-row chunk's last kept key. With one kv
// head (MQA) and 4 query tiles, 1, 2 and 3 threads split the work into 2, 4 and 4 slices: the
// outputs match the reference and are bit-identical across the splits.
TEST(FusedAttnFwd, SlicedWorkBitIdenticalAcrossThreadCounts) {
  for (NVTEDType dt : {kNVTEFloat32, kNVTEBFloat16})
    for (NVTE_Mask_Type mask : {NVTE_CAUSAL_MASK, NVTE_CAUSAL_BOTTOM_RIGHT_MASK}) {
      Case c = make_case(dt, NVTE_BSHD, mask, 200, 300);
      c.b = 1;
      c.h = 3;
      c.h_kv = 1;
      c.d_qk = c.d_v = 64;
      auto run = [&](int threads) {
        return test::with_threads(threads, [&] {
          Problem p = make_problem(c);
          auto t = make_tensors(p);
          const Call call(p, *t);
          EXPECT_EQ(call.fwd(), NVTE_SUCCESS) << nvte_get_last_error();
          EXPECT_EQ(call.bwd(), NVTE_SUCCESS) << nvte_get_last_error();
          if (threads == 1) expect_matches(p, *t, reference(p));
          return std::make_pair(t->o.buffer().bytes, t->lse.buffer().bytes);
        });
      };
      const auto one = run(1), two = run(2), three = run(3);
      EXPECT_TRUE(one == two) << c.name() << ": 2 threads differ from 1";
      EXPECT_TRUE(one == three) << c.name() << ": 3 threads differ from 1";
    }
}

}  // namespace
