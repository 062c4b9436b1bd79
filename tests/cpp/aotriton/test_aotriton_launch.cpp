// The AOTriton glue (common/fused_attn_rocm) run against a stand-in driver (fake_gpu_driver.cpp),
// on a host without a GPU: every launch's module image, entry name, grid, block, shared memory and
// packed argument block is recorded and compared with the build's index (the generated
// aotriton_index.cpp) and with values this test derives on its own from the problem. Also: the
// image-arch rule, that the index holds a variant for every head dim and dtype the selection rules
// accept, module caching per device, the >48 KiB shared-memory opt-in, and driver errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "fake_gpu_driver.h"
#include "fused_attn_rocm/aotriton_driver.h"
#include "fused_attn_rocm/fused_attn_aotriton.h"
#include "util/error.h"

// The glue is built into this test alone (no library): the one library function it needs.
namespace nvte {
namespace detail {
void throw_error(NVTEStatus status, const char *file, int line, const char *cond,
                 const std::string &msg) {
  throw Error(status, concat(file, ":", line, " (", cond, "): ", msg));
}
}  // namespace detail
}  // namespace nvte

namespace {

using nvte::AttnParams;
using nvte::aotriton::KernelImage;
using nvte::aotriton::kKernelCount;
using nvte::aotriton::kKernels;

struct Launch {
  const KernelImage *k = nullptr;
  std::string entry;
  unsigned grid[3], block[3], shared;
  void *stream;
  std::map<std::string, uint64_t> args;  // by parameter name, zero-extended
  size_t nargs = 0;
};

struct Recorder {
  std::vector<const void *> loads;
  std::vector<std::pair<int, int>> attributes;  // (attribute, value)
  std::vector<Launch> launches;
  int fail_launch = 0;  // status the next launch returns
};
Recorder rec;

// Handles: a module is the KernelImage its image belongs to; a function is that + its name.
struct Function {
  const KernelImage *k;
  std::string name;
};
std::vector<Function *> functions;

const KernelImage *image_owner(const void *image) {
  for (size_t i = 0; i < kKernelCount; ++i)
    if (kKernels[i].image == image) return &kKernels[i];
  return nullptr;
}

std::vector<std::pair<std::string, std::string>> params_of(const KernelImage &k) {
  std::vector<std::pair<std::string, std::string>> out;
  std::string s = k.params;
  for (size_t start = 0; start < s.size();) {
    size_t end = s.find(',', start);
    if (end == std::string::npos) end = s.size();
    const std::string p = s.substr(start, end - start);
    out.emplace_back(p.substr(0, p.find(':')), p.substr(p.find(':') + 1));
    start = end + 1;
  }
  return out;
}

int fake_load(void **module, const void *image) {
  rec.loads.push_back(image);
  *module = const_cast<KernelImage *>(image_owner(image));
  return *module ? 0 : 1;
}
int fake_get_function(void **function, void *module, const char *name) {
  auto *f = new Function{static_cast<const KernelImage *>(module), name};
  functions.push_back(f);
  *function = f;
  return 0;
}
int fake_set_attribute(void *, int attribute, int value) {
  rec.attributes.emplace_back(attribute, value);
  return 0;
}
int fake_launch(void *function, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                unsigned bz, unsigned shared, void *stream, void **params, void **extra) {
  if (rec.fail_launch) return rec.fail_launch;
  const auto *f = static_cast<const Function *>(function);
  Launch l;
  l.k = f->k;
  l.entry = f->name;
  l.grid[0] = gx, l.grid[1] = gy, l.grid[2] = gz;
  l.block[0] = bx, l.block[1] = by, l.block[2] = bz;
  l.shared = shared;
  l.stream = stream;
  EXPECT_EQ(extra, nullptr);
  // The driver reads each parameter with the size the kernel declares: so does this.
  for (const auto &[name, type] : params_of(*f->k)) {
    const bool four = type == "i32" || type == "u32" || type == "fp32";
    uint64_t v = 0;
    std::memcpy(&v, params[l.nargs++], four ? 4 : 8);
    l.args[name] = v;
  }
  rec.launches.push_back(l);
  return 0;
}

struct Problem {
  NVTEDType dtype = kNVTEBFloat16;
  int64_t b = 2, h = 4, h_kv = 2, s_q = 100, s_kv = 130, d = 64;
  bool thd = false;
  float dropout = 0.0f;
};

// Fake device addresses: the driver never dereferences them.
void *addr(uintptr_t a) { return reinterpret_cast<void *>(a); }

AttnParams make(const Problem &pr) {
  AttnParams p;
  p.b = pr.b, p.h = pr.h, p.h_kv = pr.h_kv, p.s_q = pr.s_q, p.s_kv = pr.s_kv;
  p.d_qk = p.d_v = pr.d;
  p.dtype = pr.dtype;
  p.format = pr.thd ? NVTE_THD : NVTE_BSHD;
  p.q = addr(0x10000), p.k = addr(0x20000), p.v = addr(0x30000), p.o = addr(0x40000);
  p.lse = static_cast<float *>(addr(0x50000));
  p.d_o = addr(0x60000), p.dq = addr(0x70000), p.dk = addr(0x80000), p.dv = addr(0x90000);
  // bshd dense: token stride h*d, head d, batch s*h*d (different per tensor to catch mix-ups).
  const auto st = [&](int64_t heads, int64_t s) {
    return nvte::AttnStrides{heads * pr.d, pr.thd ? 0 : s * heads * pr.d, pr.d};
  };
  p.sq_ = st(pr.h, pr.s_q), p.so_ = p.sdo_ = p.sdq_ = p.sq_;
  p.sk_ = p.sv_ = p.sdk_ = p.sdv_ = st(pr.h_kv, pr.s_kv);
  p.sv_.tok += 1;  // a packed-like V stride
  if (pr.thd) {
    p.cu_q = static_cast<const int32_t *>(addr(0xA0000));
    p.cu_kv = static_cast<const int32_t *>(addr(0xB0000));
  }
  p.bottom_right = false;
  p.win_left = -1, p.win_right = 0;
  p.scale = 0.125f;
  p.dropout = pr.dropout;
  if (pr.dropout > 0) {
    p.dropout_thresh = nvte::dropout_threshold(pr.dropout);
    p.rng_state = static_cast<const int64_t *>(addr(0xC0000));
  }
  return p;
}

uint64_t fbits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// What each ABI name must hold for p, written out independently of the glue's table.
std::map<std::string, uint64_t> expected(const AttnParams &p, uintptr_t delta) {
  const auto ptr = [](const void *x) { return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(x)); };
  const auto u32 = [](int64_t x) { return static_cast<uint64_t>(static_cast<uint32_t>(x)); };
  std::map<std::string, uint64_t> e = {
      {"Q", ptr(p.q)}, {"K", ptr(p.k)}, {"V", ptr(p.v)}, {"Out", ptr(p.o)}, {"dO", ptr(p.d_o)},
      {"LSE", ptr(p.lse)}, {"Delta", delta}, {"dQ", ptr(p.dq)}, {"dK", ptr(p.dk)},
      {"dV", ptr(p.dv)}, {"CuSeqlensQ", ptr(p.cu_q)}, {"CuSeqlensKV", ptr(p.cu_kv)},
      {"RngState", ptr(p.rng_state)}, {"global_scratch", 0}, {"profile_scratch", 0},
      {"sm_scale", fbits(p.scale)},
      {"keep_scale", fbits(p.dropout > 0 ? 1.0f / (1.0f - p.dropout) : 1.0f)},
      {"dropout_threshold", p.dropout_thresh}, {"num_heads", u32(p.h)},
      {"num_heads_kv", u32(p.h_kv)}, {"max_seqlen_q", u32(p.s_q)},
      {"max_seqlen_kv", u32(p.s_kv)}, {"head_dim", u32(p.d_qk)},
      {"varlen", p.cu_q ? 1u : 0u}, {"is_thd", p.format == NVTE_THD ? 1u : 0u},
      {"window_left", u32(std::min<int64_t>(p.win_left, INT32_MAX))},
      {"window_right", u32(std::min<int64_t>(p.win_right, INT32_MAX))},
      {"bottom_right", p.bottom_right ? 1u : 0u}};
  const std::pair<const char *, const nvte::AttnStrides *> strides[] = {
      {"q", &p.sq_}, {"k", &p.sk_}, {"v", &p.sv_}, {"o", &p.so_},
      {"do", &p.sdo_}, {"dq", &p.sdq_}, {"dk", &p.sdk_}, {"dv", &p.sdv_}};
  for (const auto &[t, s] : strides) {
    e[std::string("stride_") + t + "_b"] = static_cast<uint64_t>(s->batch);
    e[std::string("stride_") + t + "_h"] = static_cast<uint64_t>(s->head);
    e[std::string("stride_") + t + "_s"] = static_cast<uint64_t>(s->tok);
  }
  return e;
}

std::vector<std::string> archs() {
  std::vector<std::string> out;
  std::string s = nvte::aotriton::kArchs;
  for (size_t start = 0; start < s.size();) {
    size_t end = s.find(',', start);
    if (end == std::string::npos) end = s.size();
    out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

class AotritonLaunch : public ::testing::Test {
 protected:
  void SetUp() override {
    static const FakeDriverHooks hooks{fake_load, fake_get_function, fake_set_attribute,
                                       fake_launch};
    fake_driver_set_hooks(&hooks);
    rec = Recorder{};
  }
};

// Checks one recorded launch against the index entry and the problem.
void check_launch(const Launch &l, const char *kernel, const std::string &arch, const AttnParams &p,
                  uintptr_t delta, void *stream) {
  ASSERT_NE(l.k, nullptr);
  const KernelImage &k = *l.k;
  EXPECT_STREQ(k.kernel, kernel);
  EXPECT_EQ(k.arch, arch);
  EXPECT_STREQ(k.dtype, p.dtype == kNVTEBFloat16 ? "bf16" : "fp16");
  EXPECT_GE(k.block_d, p.d_qk);
  EXPECT_TRUE(k.block_d == 64 || p.d_qk > 64) << "the smallest BLOCK_D that holds the head dim";
  // The 16-aligned-strides variant exactly when every stride allows it.
  bool aligned = true;
  for (const nvte::AttnStrides *st : {&p.sq_, &p.sk_, &p.sv_, &p.so_, &p.sdo_, &p.sdq_, &p.sdk_, &p.sdv_})
    aligned = aligned && st->batch % 16 == 0 && st->head % 16 == 0 && st->tok % 16 == 0;
  EXPECT_EQ(k.stride_align, aligned ? 16 : 1);
  EXPECT_EQ(l.entry, k.entry);
  const bool q_rows = std::string(k.grid).rfind("q_blocks", 0) == 0;
  const bool kv_heads = std::string(k.grid).find("batch_heads_kv") != std::string::npos;
  EXPECT_EQ(l.grid[0], q_rows ? (p.s_q + k.block_m - 1) / k.block_m
                              : (p.s_kv + k.block_n - 1) / k.block_n);
  EXPECT_EQ(l.grid[1], p.b * (kv_heads ? p.h_kv : p.h));
  EXPECT_EQ(l.grid[2], 1u);
  EXPECT_EQ(l.block[0], static_cast<unsigned>(k.num_warps * k.warp_size));
  EXPECT_EQ(l.block[1], 1u);
  EXPECT_EQ(l.block[2], 1u);
  EXPECT_EQ(l.shared, k.shared);
  EXPECT_EQ(l.stream, stream);
  const auto want = expected(p, delta);
  EXPECT_EQ(l.nargs, params_of(k).size());
  for (const auto &[name, type] : params_of(k)) {
    ASSERT_TRUE(want.count(name)) << "parameter " << name << " of " << kernel;
    uint64_t w = want.at(name);
    if (type == "i32" || type == "u32" || type == "fp32") w &= 0xFFFFFFFFu;
    EXPECT_EQ(l.args.at(name), w) << kernel << " parameter " << name;
  }
  // Scratch pointers last, as Triton appends them.
  const auto ps = params_of(k);
  ASSERT_GE(ps.size(), 2u);
  EXPECT_EQ(ps[ps.size() - 2].first, "global_scratch");
  EXPECT_EQ(ps.back().first, "profile_scratch");
}

TEST_F(AotritonLaunch, IndexIsComplete) {
  ASSERT_GT(kKernelCount, 0u);
  for (const std::string &arch : archs()) {
    for (NVTEDType t : {kNVTEBFloat16, kNVTEFloat16}) {
      for (int64_t d = 1; d <= 128; ++d) {
        for (const char *kernel :
             {"attn_fwd", "attn_bwd_preprocess", "attn_bwd_dkdv", "attn_bwd_dq"}) {
          for (bool s16 : {false, true}) {
            const KernelImage *k = nvte::aotriton::find_kernel(kernel, arch, t, d, s16);
            ASSERT_NE(k, nullptr) << kernel << " " << arch << " d=" << d;
            EXPECT_EQ(k->stride_align, s16 ? 16 : 1) << kernel << " " << arch << " d=" << d;
          }
        }
      }
      EXPECT_EQ(nvte::aotriton::find_kernel("attn_fwd", arch, t, 129), nullptr);
    }
    EXPECT_EQ(nvte::aotriton::find_kernel("attn_fwd", arch, kNVTEFloat32, 64), nullptr);
  }
  for (size_t i = 0; i < kKernelCount; ++i) {  // real code objects, embedded whole
    const KernelImage &k = kKernels[i];
    ASSERT_GT(k.image_size, 64u);
    EXPECT_EQ(std::memcmp(k.image, "\x7f" "ELF", 4), 0) << k.kernel << " " << k.arch;
    EXPECT_EQ(std::strlen(k.sha256), 64u);
    EXPECT_EQ(k.warp_size, std::string(k.arch).rfind("gfx", 0) == 0 ? 64 : 32);
    const uint16_t machine = static_cast<uint16_t>(k.image[18] | (k.image[19] << 8));
    EXPECT_EQ(machine, std::string(k.arch).rfind("gfx", 0) == 0 ? 224 : 190)  // EM_AMDGPU, EM_CUDA
        << k.kernel << " " << k.arch;
  }
}

TEST_F(AotritonLaunch, ImageArch) {
  using nvte::aotriton::image_arch_for;
  const std::string all = "gfx90a,gfx942,sm_80,sm_90";
  EXPECT_EQ(image_arch_for("gfx942:sramecc+:xnack-", all), "gfx942");
  EXPECT_EQ(image_arch_for("gfx90a", all), "gfx90a");
  EXPECT_EQ(image_arch_for("gfx940", all), "");
  EXPECT_EQ(image_arch_for("gfx1100", all), "");
  EXPECT_EQ(image_arch_for("sm_90", all), "sm_90");
  EXPECT_EQ(image_arch_for("sm_86", all), "sm_80");
  EXPECT_EQ(image_arch_for("sm_89", all), "sm_80");
  EXPECT_EQ(image_arch_for("sm_100", all), "");
  EXPECT_EQ(image_arch_for("sm_75", all), "");
  EXPECT_EQ(image_arch_for("sm_90", "sm_80"), "") << "sm_80 code would run, but sm_90 is Hopper";
  EXPECT_EQ(image_arch_for("", all), "");
}

TEST_F(AotritonLaunch, ForwardPerArchDtypeHeadDim) {
  int device = 0;
  for (const std::string &arch : archs()) {
    for (NVTEDType t : {kNVTEBFloat16, kNVTEFloat16}) {
      for (int64_t d : {64, 40, 128, 80}) {
        Problem pr;
        pr.dtype = t, pr.d = d;
        const AttnParams p = make(pr);
        rec.launches.clear();
        void *stream = addr(0x5000 + d);
        nvte::aotriton::run_fwd(p, device, arch, stream);
        ASSERT_EQ(rec.launches.size(), 1u);
        check_launch(rec.launches[0], "attn_fwd", arch, p, 0, stream);
        ASSERT_FALSE(HasFailure()) << arch << " d=" << d;
      }
    }
  }
  // One module load per image, whatever the call count.
  std::map<const void *, int> n;
  for (const void *img : rec.loads) ++n[img];
  for (const auto &[img, count] : n) EXPECT_EQ(count, 1);
}

TEST_F(AotritonLaunch, AlignedStridesPickTheAlignedVariant) {
  const std::string arch = archs().front();
  for (bool odd_v : {false, true}) {
    AttnParams p = make(Problem{});
    p.sv_ = p.sk_;
    if (odd_v) p.sv_.tok += 1;
    rec.launches.clear();
    nvte::aotriton::run_fwd(p, 0, arch, nullptr);
    ASSERT_EQ(rec.launches.size(), 1u);
    EXPECT_EQ(rec.launches[0].k->stride_align, odd_v ? 1 : 16);
    check_launch(rec.launches[0], "attn_fwd", arch, p, 0, nullptr);
  }
  Problem pr;
  pr.d = 40;  // head stride 40: not a multiple of 16
  rec.launches.clear();
  nvte::aotriton::run_fwd(make(pr), 0, arch, nullptr);
  ASSERT_EQ(rec.launches.size(), 1u);
  EXPECT_EQ(rec.launches[0].k->stride_align, 1);
}

TEST_F(AotritonLaunch, WindowsBeyondInt32AreClamped) {
  const std::string arch = archs().front();
  AttnParams p = make(Problem{});
  p.win_left = int64_t(1) << 40;
  p.win_right = int64_t(INT32_MAX) + 5;
  nvte::aotriton::run_fwd(p, 0, arch, nullptr);
  ASSERT_EQ(rec.launches.size(), 1u);
  EXPECT_EQ(rec.launches[0].args.at("window_left"), uint64_t(INT32_MAX));
  EXPECT_EQ(rec.launches[0].args.at("window_right"), uint64_t(INT32_MAX));
}

TEST_F(AotritonLaunch, BackwardThreeKernelsInOrder) {
  for (const std::string &arch : archs()) {
    for (bool thd : {false, true}) {
      Problem pr;
      pr.thd = thd, pr.dropout = 0.25f, pr.d = 128, pr.h_kv = 1;
      const AttnParams p = make(pr);
      EXPECT_EQ(nvte::aotriton::unsupported_reason(p, arch), "");
      EXPECT_EQ(nvte::aotriton::bwd_workspace_bytes(p), size_t(2 * 4 * 100 * 4));
      rec.launches.clear();
      const uintptr_t ws = 0xD0000;
      nvte::aotriton::run_bwd(p, 1, arch, addr(ws), addr(0x99));
      ASSERT_EQ(rec.launches.size(), 3u);
      check_launch(rec.launches[0], "attn_bwd_preprocess", arch, p, ws, addr(0x99));
      check_launch(rec.launches[1], "attn_bwd_dkdv", arch, p, ws, addr(0x99));
      check_launch(rec.launches[2], "attn_bwd_dq", arch, p, ws, addr(0x99));
    }
  }
}

TEST_F(AotritonLaunch, ModulesPerDevice) {
  const std::string arch = archs().front();
  const AttnParams p = make(Problem{});
  nvte::aotriton::run_fwd(p, 5, arch, nullptr);
  const size_t after_first = rec.loads.size();
  nvte::aotriton::run_fwd(p, 5, arch, nullptr);
  EXPECT_EQ(rec.loads.size(), after_first) << "cached on device 5";
  nvte::aotriton::run_fwd(p, 6, arch, nullptr);
  EXPECT_EQ(rec.loads.size(), after_first + 1) << "device 6 loads its own module";
}

TEST_F(AotritonLaunch, SharedMemoryOptIn) {
#ifdef NVTE_WITH_ROCM
  GTEST_SKIP() << "HIP has no dynamic shared memory opt-in (LDS <= 64 KiB)";
#else
  // Every image above 48 KiB gets CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES (8) = its size
  // before its first launch; none below does.
  for (const std::string &arch : archs()) {
    for (const char *kernel : {"attn_fwd", "attn_bwd_dkdv", "attn_bwd_dq"}) {
      for (int64_t d : {64, 128}) {
        const KernelImage *k = nvte::aotriton::find_kernel(kernel, arch, kNVTEFloat16, d);
        ASSERT_NE(k, nullptr);
        rec.attributes.clear();
        nvte::aotriton::kernel_function(*k, 42);
        if (k->shared > 48 * 1024) {
          ASSERT_EQ(rec.attributes.size(), 1u) << kernel << " " << arch << " d" << d;
          EXPECT_EQ(rec.attributes[0], std::make_pair(8, static_cast<int>(k->shared)));
        } else {
          EXPECT_TRUE(rec.attributes.empty());
        }
      }
    }
  }
#endif
}

TEST_F(AotritonLaunch, DriverErrorsAreRaised) {
  const std::string arch = archs().front();
  rec.fail_launch = 700;
  try {
    nvte::aotriton::run_fwd(make(Problem{}), 0, arch, nullptr);
    FAIL() << "expected an error";
  } catch (const nvte::Error &e) {
    EXPECT_EQ(e.status(), NVTE_ERROR_INTERNAL);
    const std::string m = e.what();
    EXPECT_NE(m.find("attn_fwd"), std::string::npos) << m;
    EXPECT_NE(m.find("700"), std::string::npos) << m;
  }
}

TEST_F(AotritonLaunch, CallsTheKernelsCannotTake) {
  const std::string arch = archs().front();
  Problem pr;
  pr.dropout = 0.1f;
  AttnParams p = make(pr);
  p.rng_state = nullptr;  // a host rng_state: the kernels read it on the device
  EXPECT_NE(nvte::aotriton::unsupported_reason(p, arch).find("host rng_state"), std::string::npos);
  p = make(Problem{});
  p.lse = nullptr;  // an inference forward: the kernel would store through it
  EXPECT_NE(nvte::aotriton::unsupported_reason(p, arch).find("softmax_lse, got none"),
            std::string::npos);
  p = make(Problem{});
  p.d_v = 32;
  EXPECT_NE(nvte::aotriton::unsupported_reason(p, arch).find("head_dim_qk == head_dim_v"),
            std::string::npos);
  EXPECT_NE(nvte::aotriton::unsupported_reason(make(Problem{}), "gfx1100").find("gfx1100"),
            std::string::npos);
  p = make(Problem{});
  p.k = addr(0x20008);  // a packed layout's K view between 16-byte boundaries
  EXPECT_NE(nvte::aotriton::unsupported_reason(p, arch).find("16-byte aligned tensors, got K"),
            std::string::npos);
  p = make(Problem{});
  p.dtype = kNVTEFloat32;
  EXPECT_NE(nvte::aotriton::unsupported_reason(p, arch), "");
  try {
    nvte::aotriton::run_fwd(p, 0, arch, nullptr);
    FAIL() << "expected an error";
  } catch (const nvte::Error &e) {
    EXPECT_EQ(e.status(), NVTE_ERROR_UNSUPPORTED);
  }
  EXPECT_TRUE(rec.launches.empty());
}

}  // namespace
