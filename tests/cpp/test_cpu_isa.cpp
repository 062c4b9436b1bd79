// The CPU matmul-path rule (platform/cpu_isa.h matmul_path_for): which exact path the GEMM and the
// flash-attention tiles take per CPU level and vendor. The rule is measured (benchmarks/README.md);
// this pins it so a change is deliberate.
#include <gtest/gtest.h>

#include "platform/cpu_isa.h"

namespace nvte {
namespace {

struct RuleCase {
  CpuIsa level;
  bool amd;
  MatmulPath want;
};

TEST(CpuMatmulPath, RulePerLevelAndVendor) {
  const RuleCase cases[] = {
      // No bf16 arithmetic below AVX-512 BF16: widened fp32 on every vendor.
      {CpuIsa::kBaseline, false, MatmulPath::kF32},
      {CpuIsa::kBaseline, true, MatmulPath::kF32},
      {CpuIsa::kAvx2, false, MatmulPath::kF32},
      {CpuIsa::kAvx2, true, MatmulPath::kF32},
      {CpuIsa::kAvx512Core, false, MatmulPath::kF32},
      {CpuIsa::kAvx512Core, true, MatmulPath::kF32},
      // AVX-512 BF16 without tiles: AMD (Zen 4) dot products at the FMA rate win; Intel's run at
      // half of it, so fp32 FMAs win.
      {CpuIsa::kAvx512CoreBf16, true, MatmulPath::kBf16Dot},
      {CpuIsa::kAvx512CoreBf16, false, MatmulPath::kF32},
      {CpuIsa::kAvx512CoreFp16, true, MatmulPath::kBf16Dot},
      {CpuIsa::kAvx512CoreFp16, false, MatmulPath::kF32},
      // AMX tiles win everywhere.
      {CpuIsa::kAvx512CoreAmx, false, MatmulPath::kBf16Tiles},
      {CpuIsa::kAvx512CoreAmx, true, MatmulPath::kBf16Tiles},
  };
  for (const RuleCase &c : cases) {
    EXPECT_EQ(matmul_path_for(c.level, c.amd), c.want)
        << "level " << static_cast<int>(c.level) << (c.amd ? " amd" : " intel");
  }
}

}  // namespace
}  // namespace nvte
