// Output side of every CPU kernel that produces values in fp32 and may store them as FP8: validates
// the output tensor once, then writes blocks of fp32 rows into it in any output dtype and scaling mode
// (plain fp32/fp16/bf16; per-tensor FP8 with amax, scale_inv and an optional transposed copy; MXFP8
// row-wise and/or column-wise). Norms, activations, GEMM epilogues and quantize all use it, so the
// FP8 bytes come from one place.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "../platform/host_device.h"
#include "../util/dtype_dispatch.h"
#include "../util/tensor.h"
#include "output_spec.h"

namespace nvte {

// Max |v| over a row with NaN propagation (vectorizable: a NaN flag instead of a branchy max).
struct AbsMax {
  float m = 0.0f;
  bool nan = false;
  void merge(const AbsMax &o) {
    m = o.m > m ? o.m : m;
    nan = nan || o.nan;
  }
  float value() const { return nan ? NAN : m; }
};

// Converts n values of storage type T into fp32.
template <typename T>
void load_row(const T *src, float *dst, size_t n);
// Converts n fp32 values into storage type T (plain types; FP8 goes through the emitter).
template <typename T>
void store_row(const float *src, T *dst, size_t n);

class OutputEmitter {
 public:
  // Row granularity of MXFP8 column-wise blocks; callers pass row blocks aligned to it.
  static constexpr size_t kBlock = OutputSpec::kBlock;
  // fp32 values per row block that fit comfortably in L1 (16 KiB).
  static constexpr size_t kL1Floats = 4096;

  // `out` must describe a [rows, cols] result (`shape` is the expected row-wise shape; leading dims
  // flatten into rows). Raises an error naming `arg` if its buffers do not fit (validate_output).
  OutputEmitter(const Tensor &out, const char *arg, const std::vector<size_t> &shape);
  // From an already validated spec (reads the per-tensor scale: host memory only).
  OutputEmitter(const Tensor &out, const OutputSpec &spec);

  // Rows per block a kernel should produce before calling emit (a multiple of kBlock when a
  // column-wise copy is written, for contiguous transposed stores). Otherwise sized so the fp32
  // block stays in L1 between being produced and being stored: 16 KiB blocks quantize bf16
  // 8192x4096 in 6.1 ms on one core, 128 KiB blocks (8 rows of 4096) in 9.6 ms.
  size_t block_rows() const {
    if (colwise_) return kBlock;
    return std::min<size_t>(64, std::max<size_t>(1, kL1Floats / std::max<size_t>(cols_, 1)));
  }

  // Stores rows [row0, row0 + nrows) given as fp32 values (row stride `cols`), row0 % block_rows() == 0
  // unless it is the last block. Safe to call concurrently for disjoint blocks.
  // Returns max |v| over the block (taken before scaling), for the amax of per-tensor outputs.
  AbsMax emit(const float *vals, size_t row0, size_t nrows) const;

  // After every block: writes the reduced amax (if the output has an amax buffer) and, for per-tensor
  // FP8, scale_inv = 1 / scale.
  void finish(const AbsMax &amax) const;

  bool is_fp8() const { return fp8_; }
  bool is_mxfp8() const { return mx_; }
  size_t rows() const { return rows_; }
  size_t cols() const { return cols_; }

 private:
  const Tensor &out_;
  size_t rows_, cols_;
  bool fp8_ = false, mx_ = false, rowwise_ = false, colwise_ = false;
  float scale_ = 1.0f;
};

// Runs produce(row0, nrows, float* vals) over all row blocks in parallel, emits each block, reduces
// the amax and finishes the output. The common driver of row-wise kernels.
template <typename Produce>
void emit_rows(const OutputEmitter &em, Produce &&produce);

}  // namespace nvte

#include "emit_cpu_impl.h"
