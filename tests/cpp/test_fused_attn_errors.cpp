// Rejected arguments of the fused-attention C API: each call fails with the documented status, its
// message names the op and the argument, and no output is written (every output starts as a 0xFF
// sentinel and must still hold it).
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "fused_attn_reference.h"

namespace {

using namespace attn_test;

constexpr NVTEStatus kInvalid = NVTE_ERROR_INVALID_ARGUMENT;
constexpr NVTEStatus kUnsupported = NVTE_ERROR_UNSUPPORTED;

// A small valid problem (b 2, h 4, h_kv 2, s 5 x 7, d 8) and its tensors.
struct Fx {
  Problem p;
  std::unique_ptr<Tensors> t;
  explicit Fx(NVTE_QKV_Format fmt = NVTE_BSHD, NVTE_Mask_Type mask = NVTE_NO_MASK,
              NVTE_Bias_Type bias = NVTE_NO_BIAS, size_t d = 8) {
    Case c = make_case(kNVTEFloat32, fmt, mask, 5, 7);
    c.d_qk = c.d_v = d;
    c.bias = bias;
    if (bias == NVTE_POST_SCALE_BIAS) c.bias_shape = {1, 4, 5, 7};
    if (fmt == NVTE_THD || is_padding(mask)) {
      c.len_q = {3, 5};
      c.len_kv = {7, 4};
    }
    p = make_problem(c);
    t = make_tensors(p);
  }
  Call call() const { return Call(p, *t); }
  bool untouched() const {
    for (const TestTensor *x : {&t->o, &t->lse, &t->dq, &t->dk, &t->dv, &t->dbias})
      if (!is_sentinel(*x)) return false;
    return true;
  }
};

#define EXPECT_FWD_ERROR(fx, call, status, ...)                                  \
  do {                                                                           \
    EXPECT_NVTE_ERROR((call).fwd(), status, "nvte_fused_attn_fwd", __VA_ARGS__); \
    EXPECT_TRUE((fx).untouched()) << "an output was written by a rejected call"; \
  } while (0)
#define EXPECT_BWD_ERROR(fx, call, status, ...)                                  \
  do {                                                                           \
    EXPECT_NVTE_ERROR((call).bwd(), status, "nvte_fused_attn_bwd", __VA_ARGS__); \
    EXPECT_TRUE((fx).untouched()) << "an output was written by a rejected call"; \
  } while (0)

TEST(FusedAttnErrors, NullsAndDtypes) {
  Fx f;
  Call c = f.call();
  c.q = nullptr;
  EXPECT_FWD_ERROR(f, c, kInvalid, "'Q'");
  EXPECT_BWD_ERROR(f, c, kInvalid, "'Q'");
  c = f.call(), c.o = nullptr;
  EXPECT_FWD_ERROR(f, c, kInvalid, "'O'");
  c = f.call(), c.d_o = nullptr;
  EXPECT_BWD_ERROR(f, c, kInvalid, "'dO'");
  c = f.call(), c.dk = nullptr;
  EXPECT_BWD_ERROR(f, c, kInvalid, "'dK'");
  TestTensor k16(f.t->k.buffer().shape, kNVTEFloat16);
  c = f.call(), c.k = k16;
  EXPECT_FWD_ERROR(f, c, kInvalid, "'K'", "dtype");
  TestTensor o16(f.t->o.buffer().shape, kNVTEFloat16), dq16(f.t->dq.buffer().shape, kNVTEFloat16);
  c = f.call(), c.o = o16;
  EXPECT_FWD_ERROR(f, c, kInvalid, "'O'", "dtype");
  c = f.call(), c.dq = dq16;
  EXPECT_BWD_ERROR(f, c, kInvalid, "'dQ'", "dtype");
  TestTensor q8(f.t->q.buffer().shape, kNVTEFloat8E4M3), k8(f.t->k.buffer().shape, kNVTEFloat8E4M3),
      v8(f.t->v.buffer().shape, kNVTEFloat8E4M3);
  c = f.call(), c.q = q8, c.k = k8, c.v = v8;
  EXPECT_FWD_ERROR(f, c, kInvalid, "'Q'", "dtype");
  TestTensor lse16({2, 4, 5}, kNVTEFloat16);
  c = f.call(), c.lse = lse16;
  EXPECT_FWD_ERROR(f, c, kInvalid, "'softmax_lse'");
}

TEST(FusedAttnErrors, Shapes) {
  Fx f;
  Call c = f.call();
  TestTensor q3({10, 4, 8}, kNVTEFloat32);
  c.q = q3;
  EXPECT_FWD_ERROR(f, c, kInvalid, "'Q'", "4-D");
  TestTensor k3h({2, 7, 3, 8}, kNVTEFloat32), v3h({2, 7, 3, 8}, kNVTEFloat32);
  c = f.call(), c.k = k3h, c.v = v3h;
  EXPECT_FWD_ERROR(f, c, kInvalid, "'K'", "multiple");
  TestTensor k16d({2, 7, 2, 16}, kNVTEFloat32);
  c = f.call(), c.k = k16d;
  EXPECT_FWD_ERROR(f, c, kInvalid, "'K'", "head dim");
  TestTensor v1h({2, 7, 1, 8}, kNVTEFloat32), kb({3, 7, 2, 8}, kNVTEFloat32);
  c = f.call(), c.v = v1h;
  EXPECT_FWD_ERROR(f, c, kInvalid, "'V'");
  c = f.call(), c.k = kb;
  EXPECT_FWD_ERROR(f, c, kInvalid, "'K'", "batch");
  c = f.call(), c.max_q = 6;
  EXPECT_FWD_ERROR(f, c, kInvalid, "'max_seqlen_q'");
  EXPECT_BWD_ERROR(f, c, kInvalid, "'max_seqlen_q'");
  TestTensor o9({2, 5, 4, 9}, kNVTEFloat32), lse6({2, 4, 6}, kNVTEFloat32),
      dk9({2, 7, 2, 9}, kNVTEFloat32);
  c = f.call(), c.o = o9;
  EXPECT_FWD_ERROR(f, c, kInvalid, "'O'", "shape");
  c = f.call(), c.lse = nullptr;
  EXPECT_FWD_ERROR(f, c, kInvalid, "'softmax_lse'");
  EXPECT_BWD_ERROR(f, c, kInvalid, "'softmax_lse'");
  c = f.call(), c.lse = lse6;
  EXPECT_FWD_ERROR(f, c, kInvalid, "'softmax_lse'", "shape");
  c = f.call(), c.dk = dk9;
  EXPECT_BWD_ERROR(f, c, kInvalid, "'dK'", "shape");
  Fx big(NVTE_BSHD, NVTE_NO_MASK, NVTE_NO_BIAS, 300);  // beyond the flash kernel's head dims
  EXPECT_FWD_ERROR(big, big.call(), kUnsupported, "flash", "300");
}

TEST(FusedAttnErrors, SequenceLengths) {
  Fx thd(NVTE_THD, NVTE_PADDING_MASK);
  Call c = thd.call();
  c.cu_q = nullptr;
  EXPECT_FWD_ERROR(thd, c, kInvalid, "'cu_seqlens_q'", "thd");
  Fx pad(NVTE_BSHD, NVTE_PADDING_CAUSAL_MASK);
  c = pad.call(), c.cu_kv = nullptr;
  EXPECT_FWD_ERROR(pad, c, kInvalid, "'cu_seqlens_kv'", "padding_causal");
  auto cu = [](std::vector<int32_t> v) {
    TestTensor x({v.size()}, kNVTEInt32);
    std::memcpy(x.bytes(), v.data(), 4 * v.size());
    return x;
  };
  TestTensor decreasing = cu({0, 3, 2}), too_long = cu({0, 8, 10}), past_end = cu({0, 4, 9}),
             nonzero = cu({1, 3, 8}), three = cu({0, 3, 5, 8});
  TestTensor i64({3}, kNVTEInt64);
  c = thd.call(), c.cu_q = decreasing;
  EXPECT_FWD_ERROR(thd, c, kInvalid, "'cu_seqlens_q'", "non-decreasing");
  c = pad.call(), c.cu_kv = too_long;  // a sequence of 8 keys with max_seqlen_kv 7
  EXPECT_FWD_ERROR(pad, c, kInvalid, "'cu_seqlens_kv'", "maximum");
  EXPECT_BWD_ERROR(pad, c, kInvalid, "'cu_seqlens_kv'", "maximum");
  c = thd.call(), c.cu_q = past_end;  // lengths 4 and 5 fit max_seqlen 5, but Q holds 8 tokens
  EXPECT_FWD_ERROR(thd, c, kInvalid, "'cu_seqlens_q'", "exceeds");
  c = thd.call(), c.cu_q = nonzero;
  EXPECT_FWD_ERROR(thd, c, kInvalid, "'cu_seqlens_q'");
  c = pad.call(), c.cu_q = three;  // b + 2 entries
  EXPECT_FWD_ERROR(pad, c, kInvalid, "'cu_seqlens_q'");
  c = pad.call(), c.cu_q = i64;
  EXPECT_FWD_ERROR(pad, c, kInvalid, "'cu_seqlens_q'", "dtype");
}

TEST(FusedAttnErrors, Bias) {
  Fx f(NVTE_BSHD, NVTE_NO_MASK, NVTE_POST_SCALE_BIAS);
  Call c = f.call();
  c.bias = nullptr;
  EXPECT_FWD_ERROR(f, c, kInvalid, "'Bias'", "post_scale_bias");
  TestTensor wrong_s({1, 4, 5, 8}, kNVTEFloat32), wrong_b({3, 4, 5, 7}, kNVTEFloat32),
      wrong_h({1, 2, 5, 7}, kNVTEFloat32), three_d({4, 5, 7}, kNVTEFloat32),
      f16({1, 4, 5, 7}, kNVTEFloat16);
  for (TestTensor *b : {&wrong_s, &wrong_b, &wrong_h, &three_d, &f16}) {
    c = f.call(), c.bias = *b;
    EXPECT_FWD_ERROR(f, c, kInvalid, "'Bias'");
  }
  TestTensor db_wrong({1, 1, 5, 7}, kNVTEFloat32);
  c = f.call(), c.dbias = db_wrong;
  EXPECT_BWD_ERROR(f, c, kInvalid, "'dBias'");
  c = f.call(), c.bias_type = NVTE_PRE_SCALE_BIAS;
  EXPECT_FWD_ERROR(f, c, kUnsupported, "flash", "pre_scale_bias");
  EXPECT_BWD_ERROR(f, c, kUnsupported, "flash", "pre_scale_bias");
  c = f.call(), c.bias_type = NVTE_NO_BIAS;
  EXPECT_FWD_ERROR(f, c, kInvalid, "'Bias'", "no_bias");
  c = f.call(), c.bias_type = NVTE_NO_BIAS, c.bias = nullptr;  // dBias but no bias
  EXPECT_BWD_ERROR(f, c, kInvalid, "'dBias'", "post_scale_bias");
  c = f.call(), c.bias_type = NVTE_ALIBI, c.bias = nullptr;
  EXPECT_BWD_ERROR(f, c, kInvalid, "'dBias'", "alibi");
  // ALiBi slopes: fp32 [h] or [b, h].
  Fx a(NVTE_BSHD, NVTE_NO_MASK, NVTE_ALIBI);
  TestTensor h5({5}, kNVTEFloat32), b3({3, 4}, kNVTEFloat32), s16({4}, kNVTEFloat16),
      s3d({1, 2, 4}, kNVTEFloat32);
  for (TestTensor *s : {&h5, &b3, &s16, &s3d}) {
    c = a.call(), c.bias = *s;
    EXPECT_FWD_ERROR(a, c, kInvalid, "'Bias'");
  }
}

TEST(FusedAttnErrors, ScalarsWindowsAndEnums) {
  Fx f(NVTE_BSHD, NVTE_CAUSAL_MASK);
  Call c = f.call();
  for (float p : {1.0f, 1.5f, -0.1f, std::numeric_limits<float>::quiet_NaN()}) {
    c = f.call(), c.dropout = p;
    EXPECT_FWD_ERROR(f, c, kInvalid, "'dropout'");
    EXPECT_BWD_ERROR(f, c, kInvalid, "'dropout'");
  }
  c = f.call(), c.dropout = 0.1f;  // no rng_state
  EXPECT_FWD_ERROR(f, c, kInvalid, "'rng_state'");
  EXPECT_BWD_ERROR(f, c, kInvalid, "'rng_state'");
  TestTensor rng32({2}, kNVTEInt32), rng3({3}, kNVTEInt64);
  c.rng = rng32;
  EXPECT_FWD_ERROR(f, c, kInvalid, "'rng_state'");
  c.rng = rng3;
  EXPECT_FWD_ERROR(f, c, kInvalid, "'rng_state'");
  for (float s :
       {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    c = f.call(), c.scale = s;
    EXPECT_FWD_ERROR(f, c, kInvalid, "'attn_scale'");
  }
  c = f.call(), c.left = -2;
  EXPECT_FWD_ERROR(f, c, kInvalid, "'window_size_left'");
  c = f.call(), c.mask = NVTE_NO_MASK, c.right = -3;
  EXPECT_FWD_ERROR(f, c, kInvalid, "'window_size_right'");
  for (NVTE_Mask_Type m : {NVTE_CAUSAL_MASK, NVTE_CAUSAL_BOTTOM_RIGHT_MASK}) {
    c = f.call(), c.mask = m, c.right = 1;
    EXPECT_FWD_ERROR(f, c, kInvalid, "'window_size_right'", nvte_mask_type_name(m));
    EXPECT_BWD_ERROR(f, c, kInvalid, "'window_size_right'");
  }
  for (int v : {-1, 15}) {
    c = f.call(), c.layout = static_cast<NVTE_QKV_Layout>(v);
    EXPECT_FWD_ERROR(f, c, kInvalid, "'qkv_layout'");
  }
  c = f.call(), c.bias_type = static_cast<NVTE_Bias_Type>(4);
  EXPECT_FWD_ERROR(f, c, kInvalid, "'bias_type'");
  c = f.call(), c.mask = static_cast<NVTE_Mask_Type>(6);
  EXPECT_FWD_ERROR(f, c, kInvalid, "'attn_mask_type'");
  EXPECT_BWD_ERROR(f, c, kInvalid, "'attn_mask_type'");
}

TEST(FusedAttnErrors, OverlapsAndDevices) {
  Fx f;
  const std::vector<uint8_t> q_before = f.t->q.buffer().bytes;
  View o_on_q(f.t->q.bytes(), f.t->o.buffer().shape, kNVTEFloat32);  // d_v == d_qk: Q's shape
  Call c = f.call();
  c.o = o_on_q;
  EXPECT_FWD_ERROR(f, c, kInvalid, "'O'", "'Q'");
  EXPECT_EQ(f.t->q.buffer().bytes, q_before);
  View lse_on_o(f.t->o.bytes(), {2, 4, 5}, kNVTEFloat32);
  c = f.call(), c.lse = lse_on_o;
  EXPECT_FWD_ERROR(f, c, kInvalid, "'softmax_lse'", "'O'");
  View dk_in_dq(f.t->dq.bytes(), f.t->dk.buffer().shape, kNVTEFloat32);  // 112 of dQ's 320 elements
  c = f.call(), c.dk = dk_in_dq;
  EXPECT_BWD_ERROR(f, c, kInvalid, "'dK'", "'dQ'");
  View dv_on_k(f.t->k.bytes(), f.t->dv.buffer().shape, kNVTEFloat32);
  c = f.call(), c.dv = dv_on_k;
  EXPECT_BWD_ERROR(f, c, kInvalid, "'dV'", "'K'");
  // Mixed devices are an argument error; GPU tensors in this CPU-only test build are unsupported.
  ASSERT_EQ(nvte_set_tensor_device(f.t->k, kNVTEDeviceGPU), NVTE_SUCCESS);
  EXPECT_FWD_ERROR(f, f.call(), kInvalid, "'K'", "device");
  ASSERT_EQ(nvte_set_tensor_device(f.t->k, kNVTEDeviceCPU), NVTE_SUCCESS);
  ASSERT_EQ(nvte_set_tensor_device(f.t->o, kNVTEDeviceGPU), NVTE_SUCCESS);
  EXPECT_FWD_ERROR(f, f.call(), kInvalid, "'O'", "device");
}

// Fuzzing finding (fuzz_attn): outputs were checked against Q, K, V (and O, dO, softmax_lse
// backward) but not against the other buffers the kernels read. softmax_lse laid over cu_seqlens was
// accepted, the forward overwrote the offsets while reading them, and its padding pass then wrote at
// a negative index (heap corruption). Every output must now be disjoint from cu_seqlens, Bias (or
// the ALiBi slopes) and rng_state too; here each of those lives inside an output's buffer.
TEST(FusedAttnErrors, OutputsOverCuSeqlensBiasOrRngState) {
  Fx f(NVTE_BSHD, NVTE_PADDING_MASK, NVTE_POST_SCALE_BIAS);
  auto inside = [](TestTensor &host, const TestTensor &like) {  // `like`'s bytes at host's start
    std::memcpy(host.bytes(), like.buffer().bytes.data(), like.buffer().bytes.size());
    return std::make_unique<View>(host.bytes(), like.buffer().shape, like.buffer().dtype);
  };
  auto expect_rejected = [&](const Call &c, bool bwd, const char *out, const char *in) {
    const std::vector<std::vector<uint8_t>> before = {f.t->o.buffer().bytes, f.t->lse.buffer().bytes,
                                                     f.t->dq.buffer().bytes, f.t->dk.buffer().bytes,
                                                     f.t->dv.buffer().bytes, f.t->dbias.buffer().bytes};
    if (bwd) EXPECT_NVTE_ERROR(c.bwd(), kInvalid, "nvte_fused_attn_bwd", out, in, "overlapping");
    else EXPECT_NVTE_ERROR(c.fwd(), kInvalid, "nvte_fused_attn_fwd", out, in, "overlapping");
    const std::vector<std::vector<uint8_t>> after = {f.t->o.buffer().bytes, f.t->lse.buffer().bytes,
                                                    f.t->dq.buffer().bytes, f.t->dk.buffer().bytes,
                                                    f.t->dv.buffer().bytes, f.t->dbias.buffer().bytes};
    EXPECT_EQ(before, after) << "a rejected call wrote an output";
  };
  Call c = f.call();
  auto cu_in_lse = inside(f.t->lse, f.t->cu_q);
  c.cu_q = *cu_in_lse;
  expect_rejected(c, false, "'softmax_lse'", "'cu_seqlens_q'");
  auto cu_in_o = inside(f.t->o, f.t->cu_kv);
  c = f.call(), c.cu_kv = *cu_in_o;
  expect_rejected(c, false, "'O'", "'cu_seqlens_kv'");
  auto bias_in_o = inside(f.t->o, f.t->bias);  // [1, 4, 5, 7] in O's [2, 5, 4, 8]
  c = f.call(), c.bias = *bias_in_o;
  expect_rejected(c, false, "'O'", "'Bias'");
  auto cu_in_dq = inside(f.t->dq, f.t->cu_q);
  c = f.call(), c.cu_q = *cu_in_dq;
  expect_rejected(c, true, "'dQ'", "'cu_seqlens_q'");
  auto bias_in_dk = inside(f.t->dk, f.t->bias);  // [1, 4, 5, 7] in dK's [2, 7, 2, 8]
  c = f.call(), c.bias = *bias_in_dk;
  expect_rejected(c, true, "'dK'", "'Bias'");
  TestTensor rng({2}, kNVTEInt64);
  auto rng_in_dv = inside(f.t->dv, rng);
  c = f.call(), c.dropout = 0.1f, c.rng = *rng_in_dv;
  expect_rejected(c, true, "'dV'", "'rng_state'");
  for (TestTensor *x : {&f.t->o, &f.t->lse, &f.t->dq, &f.t->dk, &f.t->dv}) fill_sentinel(*x);
  ASSERT_NVTE_OK(f.call().fwd());  // the same tensors, apart: accepted
  ASSERT_NVTE_OK(f.call().bwd());
}

// Fuzzing finding (fuzz_attn): an empty Q / K / V may declare any other dims, and huge heads made
// the int64 stride products overflow (undefined behaviour; a packed QKV view's pointer likewise).
// Dims whose product (0 counted as 1) leaves no room for the kernels' 64-bit offsets are refused.
TEST(FusedAttnErrors, EmptyTensorsWithHugeDims) {
  Fx f;
  const size_t huge = (size_t{1} << 62) + 3;
  View q(f.t->q.bytes(), {0, 5, huge, 8}, kNVTEFloat32), k(f.t->k.bytes(), {0, 7, huge, 8}, kNVTEFloat32),
      v(f.t->v.bytes(), {0, 7, huge, 8}, kNVTEFloat32);
  Call c = f.call();
  c.q = q, c.k = k, c.v = v;
  EXPECT_FWD_ERROR(f, c, kInvalid, "'Q'", "64-bit");
  EXPECT_BWD_ERROR(f, c, kInvalid, "'Q'", "64-bit");
  View qkv(f.t->q.bytes(), {0, 5, 3, huge, 8}, kNVTEFloat32);
  EXPECT_NVTE_ERROR(nvte_fused_attn_fwd_qkvpacked(qkv, nullptr, f.t->o, f.t->lse, nullptr, nullptr,
                                                  5, true, 0.35f, 0.0f, NVTE_BS3HD, NVTE_NO_BIAS,
                                                  NVTE_NO_MASK, -1, -1, nullptr, nullptr),
                    kInvalid, "'QKV'", "64-bit");
  EXPECT_TRUE(f.untouched());
  // Fuzzing finding (fuzz_attn): an empty batch of any size (b = 2^40, s = 0) made the kernels loop
  // over b * h empty tasks (a hang). Nothing to write: the calls return at once.
  const size_t b = size_t{1} << 40;
  View qb(f.t->q.bytes(), {b, 0, 4, 8}, kNVTEFloat32), kb(f.t->k.bytes(), {b, 0, 2, 8}, kNVTEFloat32),
      vb(f.t->v.bytes(), {b, 0, 2, 8}, kNVTEFloat32), ob(f.t->o.bytes(), {b, 0, 4, 8}, kNVTEFloat32),
      lseb(f.t->lse.bytes(), {b, 4, 0}, kNVTEFloat32), dqb(f.t->dq.bytes(), {b, 0, 4, 8}, kNVTEFloat32),
      dkb(f.t->dk.bytes(), {b, 0, 2, 8}, kNVTEFloat32), dvb(f.t->dv.bytes(), {b, 0, 2, 8}, kNVTEFloat32);
  c = f.call();
  c.q = qb, c.k = kb, c.v = vb, c.o = ob, c.lse = lseb, c.d_o = ob, c.dq = dqb, c.dk = dkb, c.dv = dvb;
  c.max_q = c.max_kv = 0;
  ASSERT_NVTE_OK(c.fwd());
  ASSERT_NVTE_OK(c.bwd());
  EXPECT_TRUE(f.untouched());
  // Large but representable dims of an empty batch still run (nothing to compute).
  View q0(f.t->q.bytes(), {0, 5, 4, 8}, kNVTEFloat32), k0(f.t->k.bytes(), {0, 7, 2, 8}, kNVTEFloat32),
      v0(f.t->v.bytes(), {0, 7, 2, 8}, kNVTEFloat32), o0(f.t->o.bytes(), {0, 5, 4, 8}, kNVTEFloat32),
      lse0(f.t->lse.bytes(), {0, 4, 5}, kNVTEFloat32);
  c = f.call();
  c.q = q0, c.k = k0, c.v = v0, c.o = o0, c.lse = lse0;
  ASSERT_NVTE_OK(c.fwd());
  EXPECT_TRUE(f.untouched());
}

// Fuzzing finding (fuzz_attn, regression F12): thd's max_seqlen_q is a hint, not a tensor
// dimension, and 2^40 is valid; an inference call without LSE looped to it over the padding rows
// (thd has none to write) for minutes. It returns at once, with the output of the tight bound.
TEST(FusedAttnErrors, ThdHugeMaxSeqlenWithoutLse) {
  Fx f(NVTE_THD, NVTE_PADDING_MASK);
  Call c = f.call();
  c.training = false;
  c.lse = nullptr;
  ASSERT_NVTE_OK(c.fwd());
  const std::vector<double> tight = f.t->o.to_double();
  c.max_q = size_t{1} << 40;
  ASSERT_NVTE_OK(c.fwd());
  EXPECT_EQ(f.t->o.to_double(), tight);
}

// Shapes a packed layout rules out, through nvte_fused_attn_fwd (checked before the pointers).
TEST(FusedAttnErrors, PackedLayoutShapes) {
  Fx f;  // h 4, h_kv 2, s 5 x 7: Q, K, V cannot be one [b, s, 3, h, d] buffer
  Call c = f.call();
  c.layout = NVTE_BS3HD;
  EXPECT_FWD_ERROR(f, c, kInvalid, "bs3hd", "h=4 h_kv=2");
  TestTensor v16({2, 7, 2, 16}, kNVTEFloat32), o16({2, 5, 4, 16}, kNVTEFloat32);
  fill_sentinel(o16);
  c = f.call(), c.layout = NVTE_BSHD_BSH2D, c.v = v16, c.o = o16;
  EXPECT_FWD_ERROR(f, c, kInvalid, "bshd_bsh2d", "head dims");
  EXPECT_TRUE(is_sentinel(o16));
}

TEST(FusedAttnErrors, PackedEntryPoints) {
  Fx f;
  TestTensor qkv({2, 5, 3, 4, 8}, kNVTEFloat32), qkv2({2, 5, 2, 4, 8}, kNVTEFloat32),
      kv({2, 7, 2, 2, 8}, kNVTEFloat32), dkv_wrong({2, 7, 2, 2, 9}, kNVTEFloat32),
      dqkv_wrong({2, 5, 3, 4, 9}, kNVTEFloat32), o({2, 5, 4, 8}, kNVTEFloat32);
  fill_sentinel(o);
  const float sc = 0.35f;
  auto fwd_qkv = [&](NVTETensor x, NVTE_QKV_Layout l) {
    return nvte_fused_attn_fwd_qkvpacked(x, nullptr, o, f.t->lse, nullptr, nullptr, 5, true, sc,
                                         0.0f, l, NVTE_NO_BIAS, NVTE_NO_MASK, -1, -1, nullptr,
                                         nullptr);
  };
  EXPECT_NVTE_ERROR(fwd_qkv(qkv, NVTE_BSHD_BS2HD), kInvalid, "'qkv_layout'", "bshd_bs2hd");
  EXPECT_NVTE_ERROR(fwd_qkv(nullptr, NVTE_BS3HD), kInvalid, "'QKV'");
  EXPECT_NVTE_ERROR(fwd_qkv(qkv2, NVTE_BS3HD), kInvalid, "'QKV'");
  EXPECT_NVTE_ERROR(fwd_qkv(qkv, NVTE_BSH3D), kInvalid,
                    "'QKV'");  // [.., 3, h, d] read as [.., h, 3, d]
  EXPECT_NVTE_ERROR(
      nvte_fused_attn_bwd_qkvpacked(qkv, f.t->o, f.t->d_o, f.t->lse, nullptr, dqkv_wrong, nullptr,
                                    nullptr, nullptr, 5, sc, 0.0f, NVTE_BS3HD, NVTE_NO_BIAS,
                                    NVTE_NO_MASK, -1, -1, true, nullptr, nullptr),
      kInvalid, "'dQKV'");
  EXPECT_NVTE_ERROR(nvte_fused_attn_fwd_kvpacked(
                        f.t->q, kv, nullptr, o, f.t->lse, nullptr, nullptr, nullptr, 5, 7, true, sc,
                        0.0f, NVTE_BS3HD, NVTE_NO_BIAS, NVTE_NO_MASK, -1, -1, nullptr, nullptr),
                    kInvalid, "'qkv_layout'", "bs3hd");
  EXPECT_NVTE_ERROR(nvte_fused_attn_bwd_kvpacked(
                        f.t->q, kv, f.t->o, f.t->d_o, f.t->lse, nullptr, f.t->dq, dkv_wrong,
                        nullptr, nullptr, nullptr, nullptr, 5, 7, sc, 0.0f, NVTE_BSHD_BS2HD,
                        NVTE_NO_BIAS, NVTE_NO_MASK, -1, -1, true, nullptr, nullptr),
                    kInvalid, "'dKV'");
  EXPECT_TRUE(is_sentinel(o));
  EXPECT_TRUE(f.untouched());
}

// Fuzzing finding (fuzz_attn, CI): the packed entry points checked their outputs through the Q/K/V
// views, whose extents cover only a dense-sized part of the packed buffer. cu_seqlens lying in the
// rest of dQKV was accepted; the backward wrote dK/dV over the offsets while reading them (a
// negative sequence length, then a 2^60-element allocation). The whole packed buffers are checked.
TEST(FusedAttnErrors, PackedBuffersOverSideInputs) {
  TestTensor qkv({2, 5, 3, 4, 8}, kNVTEFloat32), dqkv({2, 5, 3, 4, 8}, kNVTEFloat32),
      o({2, 5, 4, 8}, kNVTEFloat32), d_o({2, 5, 4, 8}, kNVTEFloat32), lse({2, 4, 5}, kNVTEFloat32),
      cu({3}, kNVTEInt32);
  for (size_t i = 0; i < qkv.numel(); ++i) qkv.f32(kNVTERowwiseData)[i] = 0.01f * (i % 17);
  for (size_t i = 0; i < d_o.numel(); ++i) d_o.f32(kNVTERowwiseData)[i] = 0.02f * (i % 5);
  const int32_t offsets[3] = {0, 4, 9};
  std::memcpy(cu.bytes(), offsets, sizeof(offsets));
  // Float 900 of 960: past the dense extent of each view (dV's ends at float 384).
  uint8_t *dqkv_tail = dqkv.bytes() + 900 * sizeof(float);
  uint8_t *qkv_tail = qkv.bytes() + 900 * sizeof(float);
  View cu_in_dqkv(dqkv_tail, {3}, kNVTEInt32), lse_in_qkv(qkv_tail, {2, 4, 5}, kNVTEFloat32);
  auto fwd = [&](NVTETensor l) {
    return nvte_fused_attn_fwd_qkvpacked(qkv, nullptr, o, l, cu, nullptr, 5, true, 0.35f, 0.0f,
                                         NVTE_BS3HD, NVTE_NO_BIAS, NVTE_PADDING_MASK, -1, -1,
                                         nullptr, nullptr);
  };
  auto bwd = [&](NVTETensor c) {
    return nvte_fused_attn_bwd_qkvpacked(qkv, o, d_o, lse, nullptr, dqkv, nullptr, c, nullptr, 5,
                                         0.35f, 0.0f, NVTE_BS3HD, NVTE_NO_BIAS, NVTE_PADDING_MASK,
                                         -1, -1, true, nullptr, nullptr);
  };
  EXPECT_NVTE_ERROR(fwd(lse_in_qkv), kInvalid, "'softmax_lse'", "'QKV'", "overlapping");
  ASSERT_NVTE_OK(fwd(lse));
  std::memcpy(dqkv_tail, offsets, sizeof(offsets));
  const std::vector<uint8_t> before = dqkv.buffer().bytes;
  EXPECT_NVTE_ERROR(bwd(cu_in_dqkv), kInvalid, "'dQKV'", "'cu_seqlens_q'", "overlapping");
  EXPECT_EQ(dqkv.buffer().bytes, before) << "a rejected call wrote dQKV";
  ASSERT_NVTE_OK(bwd(cu));  // the same call with the offsets elsewhere: accepted
}

TEST(FusedAttnErrors, DropoutMask) {
  TestTensor rng({2}, kNVTEInt64), mask({1, 2, 3, 4}, kNVTEByte),
      mask_f32({1, 2, 3, 4}, kNVTEFloat32), mask3({2, 3, 4}, kNVTEByte), rng1({1}, kNVTEInt64);
  fill_sentinel(mask);
  EXPECT_NVTE_ERROR(nvte_fused_attn_dropout_mask(nullptr, 0.1f, mask, nullptr), kInvalid,
                    "nvte_fused_attn_dropout_mask", "'rng_state'");
  EXPECT_NVTE_ERROR(nvte_fused_attn_dropout_mask(rng1, 0.1f, mask, nullptr), kInvalid,
                    "'rng_state'");
  EXPECT_NVTE_ERROR(nvte_fused_attn_dropout_mask(rng, 1.0f, mask, nullptr), kInvalid, "'dropout'");
  EXPECT_NVTE_ERROR(nvte_fused_attn_dropout_mask(rng, -0.5f, mask, nullptr), kInvalid, "'dropout'");
  EXPECT_TRUE(is_sentinel(mask));
  EXPECT_NVTE_ERROR(nvte_fused_attn_dropout_mask(rng, 0.1f, mask_f32, nullptr), kInvalid, "'mask'");
  EXPECT_NVTE_ERROR(nvte_fused_attn_dropout_mask(rng, 0.1f, mask3, nullptr), kInvalid, "'mask'",
                    "4-D");
  EXPECT_NVTE_ERROR(nvte_fused_attn_dropout_mask(rng, 0.1f, nullptr, nullptr), kInvalid, "'mask'");
  // Fuzzing finding (fuzz_attn): an empty mask may declare any other dims; the kernel looped over
  // b * h * s_q rows of nothing (2^60 here: a hang) or overflowed that int64 product. Now a no-op.
  for (const std::vector<size_t> &shape :
       {std::vector<size_t>{size_t{1} << 20, size_t{1} << 20, size_t{1} << 20, 0},
        std::vector<size_t>{size_t{1} << 40, size_t{1} << 40, 3, 0}}) {
    View empty(mask.bytes(), shape, kNVTEByte);
    ASSERT_NVTE_OK(nvte_fused_attn_dropout_mask(rng, 0.1f, empty, nullptr));
  }
  EXPECT_TRUE(is_sentinel(mask));
}

}  // namespace
