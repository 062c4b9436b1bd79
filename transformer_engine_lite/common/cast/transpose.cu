// GPU transposes: nvte_transpose of a 2-D buffer of any element width (moved as bytes, tiled
// through shared memory), and nvte_cast_transpose, the per-tensor quantize with a transposed copy.
#include <algorithm>
#include <cstdint>

#include "../platform/device.h"
#include "../platform/runtime.h"
#include "quantize_gpu.h"

namespace nvte {
namespace gpu {

namespace {

constexpr int kThreads = 256;
constexpr int kTile = 32;                    // square tile edge
constexpr int kTileRows = kThreads / kTile;  // tile rows covered per step of a block (8)
// Grid-stride over tiles; 64K blocks fill any current GPU many times over.
constexpr size_t kMaxBlocks = 65536;

struct TransposeParams {
  const void *in = nullptr;  // [rows, cols] of T
  void *out = nullptr;       // [cols, rows] of T
  size_t rows = 0, cols = 0;
};

__host__ __device__ __forceinline__ size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

// Each 32x32 tile is read row by row (coalesced) into shared memory and written out row by row of
// the output (coalesced), instead of a strided store per element. T is the element width as an
// unsigned integer: the values are only moved, so NaN payloads survive.
template <typename T>
__global__ void __launch_bounds__(kThreads) transpose_kernel(const TransposeParams p) {
  __shared__ T tile[kTile][kTile + 1];  // +1: column reads hit distinct banks
  const T *in = static_cast<const T *>(p.in);
  T *out = static_cast<T *>(p.out);
  const size_t rows = p.rows, cols = p.cols;
  const size_t col_tiles = ceil_div(cols, kTile), ntiles = ceil_div(rows, kTile) * col_tiles;
  const int tx = threadIdx.x % kTile, ty = threadIdx.x / kTile;
  // Every thread of the block runs every tile: the loop holds barriers.
  for (size_t t = blockIdx.x; t < ntiles; t += gridDim.x) {
    const size_t r0 = (t / col_tiles) * kTile, c0 = (t % col_tiles) * kTile;
    for (int i = ty; i < kTile; i += kTileRows) {
      const size_t r = r0 + i, c = c0 + tx;
      if (r < rows && c < cols) tile[i][tx] = in[r * cols + c];
    }
    __syncthreads();
    for (int j = ty; j < kTile; j += kTileRows) {  // output row c0 + j = input column c0 + j
      const size_t c = c0 + j, r = r0 + tx;
      if (c < cols && r < rows) out[c * rows + r] = tile[tx][j];
    }
    __syncthreads();  // the tile is rewritten by the next iteration
  }
}

template <typename T>
void launch_typed(const TransposeParams &p, cudaStream_t stream) {
  const size_t tiles = ceil_div(p.rows, kTile) * ceil_div(p.cols, kTile);
  const unsigned grid = static_cast<unsigned>(std::min(tiles, kMaxBlocks));
  transpose_kernel<T><<<grid, kThreads, 0, stream>>>(p);
  NVTE_CHECK_LAUNCH();
}

}  // namespace

void launch_transpose(const Tensor &in, const Tensor &out, void *stream) {
  TransposeParams p;
  p.in = in.data.dptr;
  p.out = out.data.dptr;
  p.rows = in.data.shape[0];
  p.cols = in.data.shape[1];
  if (p.rows == 0 || p.cols == 0) return;  // nothing to move (and a grid of 0 blocks is invalid)
  const cudaStream_t s = as_stream(stream);
  // Layout-only: dispatch on the element width, not the numeric type (as the CPU kernel).
  switch (dtype_size(in.data.dtype)) {
    case 1: launch_typed<uint8_t>(p, s); break;
    case 2: launch_typed<uint16_t>(p, s); break;
    case 4: launch_typed<uint32_t>(p, s); break;
    case 8: launch_typed<uint64_t>(p, s); break;
    default:
      NVTE_ERROR("argument 'input': expected an element width of 1, 2, 4 or 8 bytes, got ",
                 dtype_size(in.data.dtype), " (", dtype_name(in.data.dtype), ")");
  }
}

// The fused cast-transpose is the per-tensor quantize with both copies: its tiled kernel
// (quantize.cu) encodes each element once and writes the row-wise and transposed bytes together.
void launch_cast_transpose(const Tensor &in, const Tensor &out, const OutputSpec &spec,
                           void *stream) {
  launch_quantize(in, out, spec, stream);
}

}  // namespace gpu
}  // namespace nvte
