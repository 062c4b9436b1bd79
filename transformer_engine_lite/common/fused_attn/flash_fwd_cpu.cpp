// CPU flash-attention forward (FlashAttention-2 schedule): K and V of every (sequence, kv head) are
// packed once into GEMM panels, then each task (sequence, head, tile of 64 query rows) walks the key
// blocks its rows may see, keeping a running max and sum per row (online softmax) and an fp32 output
// accumulator. Extra memory: the packed K/V copy (the size of K and V) plus per-thread tile buffers;
// no S x S matrix exists at any point.
#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "../util/dtype_dispatch.h"
#include "../util/env.h"
#include "../util/math.h"
#include "../util/parallel.h"
#include "flash_cpu_common.h"
#include "fused_attn_cpu.h"

namespace nvte {
namespace flash_cpu {

namespace {

// Logits of one row, x = scale s + bias, masked to the kept range [lo, hi) with -inf, written back
// over s; returns the row max. W-lane vectors of the clone (NVTE_CPU_DISPATCH_LANES); the bias add
// and the mask are compiled in or out per row (a row that keeps all 64 columns, every row of a tile
// below the causal diagonal, needs no mask). Without bias the former `x + 0` is gone: it changed only
// a -0 logit (scale s underflowing from below) into +0, and a zero's sign reaches no output but the
// sign of an LSE that is exactly 0; every clone drops it alike.
template <int W, bool kBias, bool kMask>
NVTE_CPU_KERNEL float logits_row(float *s, const float *bias, float scale, int lo, int hi) {
  using V = typename Lanes<W>::f;
  constexpr int kG = 16 / W;  // native vectors per 16-lane group
  V gmax[kG];
  for (int u = 0; u < kG; ++u) gmax[u] = kNegInf - V{};
  for (int c16 = 0; c16 < kBlockKV; c16 += 16)
    for (int u = 0; u < kG; ++u) {
      const int c0 = c16 + u * W;
      V x;
      std::memcpy(&x, s + c0, sizeof(x));
      x = x * scale;
      if constexpr (kBias) {
        V bv;
        std::memcpy(&bv, bias + c0, sizeof(bv));
        x = x + bv;
      }
      if constexpr (kMask) mask_outside<W>(x, c0, lo, hi);
      std::memcpy(s + c0, &x, sizeof(x));
      gmax[u] = x > gmax[u] ? x : gmax[u];
    }
  return hmax_group<W>(gmax);
}

// Online-softmax step of a tile, in three passes so that nothing runs scalar per element:
//  1. per row: logits x = scale s + bias, masked to the kept range [a[r], b[r]) (relative to j0) with
//     -inf, and the block's row max;
//  2. over rows (vectorized across rows): the new running max and corr = exp(m_old - m_new), the
//     factor that rescales the output accumulator and the running sum;
//  3. per row: e = exp(x - m_new), its sum into l, P = e (x dropout keep-scale) in the compute type,
//     and the accumulator row rescaled by corr.
// Reductions are fixed trees over 16 lanes (hmax_group/hsum_group), so the result does not depend
// on the ISA clone. A row whose logits are all masked (or -inf) keeps m, l and its accumulator, and
// gets P = 0.
template <int W, typename E>
NVTE_CPU_KERNEL void softmax_step(int rows, float *S, const float *bias, const int *a, const int *b,
                                  float scale, const float *keep, float *m, float *l, float *mx,
                                  float *corr, E *P, float *O, int ldo, int dv) {
  using V = typename Lanes<W>::f;
  constexpr int kG = 16 / W;
  for (int r = 0; r < rows; ++r) {
    float *s = S + r * kBlockKV;
    const int lo = a[r], hi = b[r];
    const bool mask = lo > 0 || hi < kBlockKV;
    if (bias) {
      const float *bb = bias + r * kBlockKV;
      mx[r] = mask ? logits_row<W, true, true>(s, bb, scale, lo, hi)
                   : logits_row<W, true, false>(s, bb, scale, lo, hi);
    } else {
      mx[r] = mask ? logits_row<W, false, true>(s, nullptr, scale, lo, hi)
                   : logits_row<W, false, false>(s, nullptr, scale, lo, hi);
    }
  }
  for (int r = 0; r < rows; ++r) {  // vectorized across rows
    const float m_new = mx[r] > m[r] ? mx[r] : m[r];
    const float c = exp_softmax_f32(m[r] - m_new);
    corr[r] = m[r] == kNegInf ? 0.0f : c;  // (-inf) - (-inf) would be NaN
    mx[r] = m_new;
  }
  for (int r = 0; r < rows; ++r) {
    float *s = S + r * kBlockKV;
    E *pr = P + r * kBlockKV;
    const float m_new = mx[r];
    if (m_new == kNegInf) {  // nothing kept so far: m, l and the accumulator stay 0 / -inf
      for (int c = 0; c < kBlockKV; ++c) pr[c] = Compute<E>::from_f32(0.0f);
      continue;
    }
    // e = exp(x - m_new), straight into P where P is fp32 and nothing is dropped (no copy), else
    // over the logits for the conversion. A plain loop: GCC vectorizes exp_softmax_f32 at each
    // clone's width (an explicit vector exp with FMA as inline assembly measured 1-2% slower).
    float *e = s;
    if constexpr (std::is_same<E, float>::value) {
      if (!keep) e = pr;
    }
    for (int c = 0; c < kBlockKV; ++c) e[c] = exp_softmax_f32(s[c] - m_new);  // masked: 0
    V gsum[kG];
    for (int u = 0; u < kG; ++u) gsum[u] = V{};
    for (int c16 = 0; c16 < kBlockKV; c16 += 16)
      for (int u = 0; u < kG; ++u) {
        V x;
        std::memcpy(&x, e + c16 + u * W, sizeof(x));
        gsum[u] += x;
      }
    if (keep) {
      const float *kr = keep + r * kBlockKV;
      for (int c = 0; c < kBlockKV; ++c) pr[c] = Compute<E>::from_f32(e[c] * kr[c]);
    } else if constexpr (!std::is_same<E, float>::value) {
      for (int c = 0; c < kBlockKV; ++c) pr[c] = Compute<E>::from_f32(e[c]);
    }
    l[r] = l[r] * corr[r] + hsum_group<W>(gsum);
    m[r] = m_new;
    if (corr[r] != 1.0f) {
      float *o = O + static_cast<size_t>(r) * ldo;
      for (int d = 0; d < dv; ++d) o[d] *= corr[r];
    }
  }
}

// Packed K (B of S = Q.K^T: one panel of Dqk_pad x 64 per key block) and V (B of O = P.V: per key
// block ceil(Dv/64) panels of 64 x 64) of every (sequence, kv head).
template <typename E>
struct PackedKV {
  int64_t kpad = 0, k_block = 0, v_block = 0;
  std::vector<int64_t> first_block;  // per sequence: index of its first block (x h_kv heads)
  std::vector<int64_t> nblocks;      // per sequence
  // Not value-initialized (std::vector would zero ~the size of K and V first): every block is
  // written in full by the packing, padding included.
  std::unique_ptr<E[]> k, v;

  int64_t block_index(const AttnParams &p, int64_t bi, int64_t g) const {
    return first_block[bi] * p.h_kv + g * nblocks[bi];
  }
  const E *k_at(const AttnParams &p, int64_t bi, int64_t g, int64_t blk) const {
    return k.get() + (block_index(p, bi, g) + blk) * k_block;
  }
  const E *v_at(const AttnParams &p, int64_t bi, int64_t g, int64_t blk) const {
    return v.get() + (block_index(p, bi, g) + blk) * v_block;
  }
};

template <typename E, typename T>
PackedKV<E> pack_kv(const AttnParams &p) {
  PackedKV<E> kv;
  kv.kpad = round_up(p.d_qk, Compute<E>::kKAlign);
  kv.k_block = kv.kpad * tile::kPanel;
  kv.v_block = ceil_div(p.d_v, tile::kPanel) * kBlockKV * tile::kPanel;
  kv.first_block.resize(p.b);
  kv.nblocks.resize(p.b);
  int64_t total = 0;
  for (int64_t bi = 0; bi < p.b; ++bi) {
    kv.first_block[bi] = total;
    kv.nblocks[bi] = ceil_div(p.len_kv(bi), kBlockKV);
    total += kv.nblocks[bi];
  }
  kv.k.reset(new E[static_cast<size_t>(total * p.h_kv * kv.k_block)]);
  kv.v.reset(new E[static_cast<size_t>(total * p.h_kv * kv.v_block)]);
  const T *K = static_cast<const T *>(p.k);
  const T *V = static_cast<const T *>(p.v);
  parallel_for(static_cast<size_t>(p.b * p.h_kv), 1, [&](size_t begin, size_t end) {
    int64_t koff[kBlockKV], voff[kBlockKV];
    for (size_t task = begin; task < end; ++task) {
      const int64_t bi = static_cast<int64_t>(task) / p.h_kv, g = static_cast<int64_t>(task) % p.h_kv;
      const int64_t skv = p.len_kv(bi);
      for (int64_t blk = 0; blk < kv.nblocks[bi]; ++blk) {
        const int n = static_cast<int>(std::min<int64_t>(kBlockKV, skv - blk * kBlockKV));
        token_offsets_kv(p, p.sk_, bi, g, blk * kBlockKV, n, koff);
        token_offsets_kv(p, p.sv_, bi, g, blk * kBlockKV, n, voff);
        const int64_t idx = kv.block_index(p, bi, g) + blk;
        pack_b_rows_as_columns<E, T>(kv.k.get() + idx * kv.k_block, static_cast<int>(kv.kpad), K,
                                     koff, n, static_cast<int>(p.d_qk));
        pack_b_rows_as_k<E, T>(kv.v.get() + idx * kv.v_block, kBlockKV, V, voff, n,
                               static_cast<int>(p.d_v));
      }
    }
  });
  return kv;
}

struct Task {
  int64_t bi, hi, q0;
};

// The GEMMs of a key block skip the keys no row of a 16-row chunk keeps past its last kept one: the
// fully masked part of a block on the causal diagonal (a tile's last block: row r keeps keys <= r,
// so chunk c needs the first 16 (c + 1) keys, 10 of 16 column groups instead of 16) and the padding
// past the last key of a sequence. QK^T then computes only those columns of S (the rest of the
// chunk's rows hold stale logits, which the softmax masks to -inf: their keys lie past every row's
// kept range), and P.V sums only over those keys, whose P is exactly 0 otherwise. Leaving a +0
// product out of a sum changes no bit (the accumulator starts at +0 and never becomes -0), so the
// results are those of the untrimmed GEMMs, except that a masked key's inf or NaN value no longer
// reaches the output as 0 x inf = NaN. Chunks in a row with the same key count form one span (one
// GEMM call); a chunk keeping no key of the block gets none.
constexpr int kSpanRows = 16;
struct Span {
  int r0, rows, keys;  // rows [r0, r0 + rows), keys [0, keys) of the block; keys a multiple of 16
};

inline int key_spans(int rows, const int *b, Span *spans) {
  int n = 0;
  for (int r0 = 0; r0 < rows; r0 += kSpanRows) {
    const int rc = std::min(kSpanRows, rows - r0);
    int hi = 0;
    for (int r = r0; r < r0 + rc; ++r) hi = std::max(hi, b[r]);
    const int keys = static_cast<int>(round_up(hi, 16));
    if (keys == 0) continue;
    if (n > 0 && spans[n - 1].keys == keys && spans[n - 1].r0 + spans[n - 1].rows == r0)
      spans[n - 1].rows += rc;
    else
      spans[n++] = {r0, rc, keys};
  }
  return n;
}

template <typename E, typename T>
void fwd(const AttnParams &p) {
  const PackedKV<E> kv = pack_kv<E, T>(p);
  std::vector<Task> tasks;
  for (int64_t bi = 0; bi < p.b; ++bi)
    for (int64_t hi = 0; hi < p.h; ++hi)
      for (int64_t q0 = 0; q0 < p.len_q(bi); q0 += kBlockQ) tasks.push_back({bi, hi, q0});
  const int ldq = static_cast<int>(kv.kpad);
  const int ldo = static_cast<int>(round_up(p.d_v, 16));
  const int64_t group = p.h / p.h_kv;
  const T *Q = static_cast<const T *>(p.q);
  T *O = static_cast<T *>(p.o);
  const bool has_bias = p.bias_type == NVTE_POST_SCALE_BIAS || p.bias_type == NVTE_ALIBI;

#pragma omp parallel
  {
    std::vector<E> qa(static_cast<size_t>(kBlockQ) * ldq), pbuf(kBlockQ * kBlockKV);
    std::vector<float> S(kBlockQ * kBlockKV), bias(has_bias ? kBlockQ * kBlockKV : 0),
        keep(p.dropout > 0 ? kBlockQ * kBlockKV : 0), acc(static_cast<size_t>(kBlockQ) * ldo);
    float m[kBlockQ], l[kBlockQ], mx[kBlockQ], corr[kBlockQ];
    int64_t off[kBlockQ], lo[kBlockQ], hi[kBlockQ];
    int a[kBlockQ], b[kBlockQ];
    Span spans[kBlockQ / kSpanRows];
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < static_cast<int64_t>(tasks.size()); ++t) {
      const Task &tk = tasks[t];
      const int64_t sq = p.len_q(tk.bi), skv = p.len_kv(tk.bi), g = tk.hi / group;
      const int rows = static_cast<int>(std::min<int64_t>(kBlockQ, sq - tk.q0));
      token_offsets_q(p, p.sq_, tk.bi, tk.hi, tk.q0, rows, off);
      pack_a<E, T>(qa.data(), ldq, Q, off, rows, rows, static_cast<int>(p.d_qk));
      int64_t ulo, uhi;
      tile_key_ranges(p, tk.q0, rows, sq, skv, lo, hi, &ulo, &uhi);
      // A sink (off-by-one / learnable softmax) is one more logit with no value row: the running
      // max and sum start from it (l = exp(sink - sink) = 1) and every block rescales it as usual.
      const bool sink = p.has_sink();
      const float sink_logit = sink ? p.sink(tk.hi) : 0.0f;
      for (int r = 0; r < rows; ++r) {
        m[r] = sink ? sink_logit : kNegInf;
        l[r] = sink ? 1.0f : 0.0f;
      }
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t blk = ulo / kBlockKV; blk * kBlockKV < uhi; ++blk) {
        const int64_t j0 = blk * kBlockKV;
        for (int r = 0; r < rows; ++r) {
          a[r] = static_cast<int>(std::clamp<int64_t>(lo[r] - j0, 0, kBlockKV));
          b[r] = static_cast<int>(std::clamp<int64_t>(hi[r] - j0, 0, kBlockKV));
        }
        const int nspans = key_spans(rows, b, spans);
        for (int sp = 0; sp < nspans; ++sp) {
          const Span &z = spans[sp];
          Compute<E>::gemm(z.rows, z.keys, ldq, qa.data() + static_cast<size_t>(z.r0) * ldq, ldq,
                           kv.k_at(p, tk.bi, g, blk), static_cast<size_t>(kv.k_block),
                           S.data() + z.r0 * kBlockKV, kBlockKV, false);
        }
        const bool hb = has_bias && load_bias_tile<T>(p, tk.bi, tk.hi, tk.q0, rows, j0, sq, skv,
                                                      bias.data());
        if (p.dropout > 0) dropout_tile(p, tk.bi, tk.hi, tk.q0, rows, j0, keep.data());
        NVTE_CPU_DISPATCH_LANES(
            L, softmax_step<decltype(L)::value, E>(
                   rows, S.data(), hb ? bias.data() : nullptr, a, b, p.scale,
                   p.dropout > 0 ? keep.data() : nullptr, m, l, mx, corr, pbuf.data(), acc.data(),
                   ldo, static_cast<int>(p.d_v)));
        for (int sp = 0; sp < nspans; ++sp) {
          const Span &z = spans[sp];
          Compute<E>::gemm(z.rows, static_cast<int>(p.d_v), z.keys,
                           pbuf.data() + z.r0 * kBlockKV, kBlockKV, kv.v_at(p, tk.bi, g, blk),
                           static_cast<size_t>(kBlockKV * tile::kPanel),
                           acc.data() + static_cast<size_t>(z.r0) * ldo, ldo, true);
        }
      }
      // Normalize and store; a row with no kept key gets O = 0 and LSE = -inf (the sink's logit
      // with a sink: all its mass on the sink).
      token_offsets_q(p, p.so_, tk.bi, tk.hi, tk.q0, rows, off);
      for (int r = 0; r < rows; ++r) {
        const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
        T *o = O + off[r];
        const float *ar = acc.data() + static_cast<size_t>(r) * ldo;
        for (int d = 0; d < p.d_v; ++d) o[d] = from_float<T>(ar[d] * inv);
        if (p.lse)
          p.lse[(tk.bi * p.h + tk.hi) * p.s_q + tk.q0 + r] =
              l[r] > 0.0f ? m[r] + std::log(l[r]) : kNegInf;
      }
    }
  }
  // Rows past a sequence's length (padding): O = 0 (bshd/sbhd; thd has no such rows), LSE = -inf.
  parallel_for(static_cast<size_t>(p.b * p.h), 1, [&](size_t begin, size_t end) {
    for (size_t task = begin; task < end; ++task) {
      const int64_t bi = static_cast<int64_t>(task) / p.h, hd = static_cast<int64_t>(task) % p.h;
      for (int64_t i = p.len_q(bi); i < p.s_q; ++i) {
        if (p.format != NVTE_THD) {
          T *o = O + p.token_q(p.so_, bi, i) + hd * p.so_.head;
          for (int64_t d = 0; d < p.d_v; ++d) o[d] = from_float<T>(0.0f);
        }
        if (p.lse) p.lse[(bi * p.h + hd) * p.s_q + i] = kNegInf;
      }
    }
  });
}

}  // namespace

// bf16 dot products wherever the CPU has them, unless NVTE_CPU_GEMM_COMPUTE=fp32. Unlike the GEMM
// (cpu_matmul_path), the tiles do not widen on Intel CPUs without AMX: the fp32 kernel's FMA does 16
// products per instruction where vdpbf16ps does 32, a tie at Intel's half rate, and bf16 operands
// halve the packing and the tiles' memory traffic (not re-measured on Intel since the fp32 tiles
// took FMA).
bool use_bf16_compute(NVTEDType dtype) {
  if (dtype != kNVTEBFloat16 || !tile::has_bf16_dot()) return false;
  return cpu_compute_mode() != "fp32";
}

}  // namespace flash_cpu

void flash_attn_fwd_cpu(const AttnParams &p) {
  dispatch_dtype<TypeList<float, fp16, bf16>>(p.dtype, "Q", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same<T, bf16>::value) {
      if (flash_cpu::use_bf16_compute(p.dtype)) return flash_cpu::fwd<uint16_t, T>(p);
    }
    flash_cpu::fwd<float, T>(p);
  });
}

void dropout_mask_cpu(const AttnParams &p, uint8_t *mask) {
  const int64_t rows = p.b * p.h * p.s_q;
  parallel_for(static_cast<size_t>(rows), 16, [&](size_t begin, size_t end) {
    for (size_t row = begin; row < end; ++row) {
      const uint64_t base = static_cast<uint64_t>(row) * p.s_kv;
      for (int64_t j = 0; j < p.s_kv; ++j)
        mask[base + j] = dropout_keep(p.seed, p.offset, base + j, p.dropout_thresh) ? 1 : 0;
    }
  });
}

}  // namespace nvte
