// CPU flash-attention forward (FlashAttention-2 schedule): each work item (a sequence's kv head, or a
// slice of its query tiles) runs the tiles of 64 query rows of every head sharing that kv head; a
// tile walks the key blocks its rows may see, keeping a running max and sum per row (online softmax)
// and an fp32 output accumulator, with K and V packed into GEMM panels in the thread's buffer the
// first time a tile needs a block. Extra memory per thread: the panels of one sequence's K and V
// head (fp32: 1 MiB at S = 2048, D = 64) and the tile buffers; no S x S matrix exists at any point.
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

// K and V of one (sequence, kv head) as GEMM panels, in a buffer of the thread: K as B of S = Q.K^T
// (one panel of Dqk_pad x 64 per key block), V as B of O = P.V (per key block ceil(Dv/64) panels of
// 64 x 64). A block is packed when a tile of the thread first needs it, so a work item packs only
// the keys its rows keep. The panels of a sequence's kv head stay in the thread's L2 / L3 while
// every query tile of the heads sharing it runs; packing all of K and V up front into one buffer (the
// size of K and V in fp32, 33 MiB for B=2 H=16 S=2048 D=64) cost its page faults on every call and
// had the tiles read it back from L3 / DRAM. The trade: with fewer (sequence, kv head) pairs than
// threads (MQA, batch 1), each thread packs the blocks of its own slices, so up to threads x one
// head's K/V are resident at once where the up-front copy held every head once.
template <typename E>
struct KVPanels {
  int64_t kpad = 0, k_block = 0, v_block = 0;
  int64_t bi = -1, g = -1;  // the (sequence, kv head) packed, -1: none
  // Not value-initialized: every block is written in full by the packing, padding included.
  std::unique_ptr<E[]> k, v;
  std::vector<uint8_t> packed;  // per key block of (bi, g): written yet

  KVPanels(const AttnParams &p, int64_t max_blocks) {
    kpad = round_up(p.d_qk, Compute<E>::kKAlign);
    k_block = kpad * tile::kPanel;
    v_block = ceil_div(p.d_v, tile::kPanel) * kBlockKV * tile::kPanel;
    k.reset(new E[static_cast<size_t>(max_blocks * k_block)]);
    v.reset(new E[static_cast<size_t>(max_blocks * v_block)]);
    packed.assign(static_cast<size_t>(max_blocks), 0);
  }

  void select(int64_t bi_, int64_t g_) {
    if (bi_ == bi && g_ == g) return;
    bi = bi_;
    g = g_;
    std::fill(packed.begin(), packed.end(), 0);
  }

  // Key block blk of the selected (sequence, kv head), packed on first use.
  template <typename T>
  void need(const AttnParams &p, int64_t blk) {
    if (packed[blk]) return;
    const int n = static_cast<int>(std::min<int64_t>(kBlockKV, p.len_kv(bi) - blk * kBlockKV));
    int64_t koff[kBlockKV], voff[kBlockKV];
    token_offsets_kv(p, p.sk_, bi, g, blk * kBlockKV, n, koff);
    token_offsets_kv(p, p.sv_, bi, g, blk * kBlockKV, n, voff);
    pack_b_rows_as_columns<E, T>(k.get() + blk * k_block, static_cast<int>(kpad),
                                 static_cast<const T *>(p.k), koff, n, static_cast<int>(p.d_qk));
    pack_b_rows_as_k<E, T>(v.get() + blk * v_block, kBlockKV, static_cast<const T *>(p.v), voff, n,
                           static_cast<int>(p.d_v));
    packed[blk] = 1;
    // The next block's rows start loading a block's compute before they are packed.
    const int64_t nb = blk + 1;
    if (nb * kBlockKV < p.len_kv(bi) && !packed[nb]) {
      const int nn = static_cast<int>(std::min<int64_t>(kBlockKV, p.len_kv(bi) - nb * kBlockKV));
      token_offsets_kv(p, p.sk_, bi, g, nb * kBlockKV, nn, koff);
      token_offsets_kv(p, p.sv_, bi, g, nb * kBlockKV, nn, voff);
      prefetch_rows(static_cast<const T *>(p.k), koff, nn, p.d_qk * sizeof(T), false);
      prefetch_rows(static_cast<const T *>(p.v), voff, nn, p.d_v * sizeof(T), false);
    }
  }
  const E *k_at(int64_t blk) const { return k.get() + blk * k_block; }
  const E *v_at(int64_t blk) const { return v.get() + blk * v_block; }
};

// A work item: query tiles [t0, t1) of sequence bi for every head sharing kv head g (tile-major, so
// consecutive tiles reuse the same key blocks). One item per (sequence, kv head) when there are
// enough of them to keep the threads busy; otherwise each one's tiles are split into contiguous
// slices (each slice packs the blocks it needs: a causal slice the blocks up to its last row).
struct Task {
  int64_t bi, hi, q0;
};

struct WorkItem {
  int64_t bi, g, t0, t1;
};

inline std::vector<WorkItem> work_items(const AttnParams &p) {
  const int64_t units = p.b * p.h_kv;
  const int64_t want = 2 * static_cast<int64_t>(max_threads());  // items per thread, at least 2
  const int64_t slices = units >= want ? 1 : ceil_div(want, std::max<int64_t>(units, 1));
  std::vector<WorkItem> items;
  for (int64_t bi = 0; bi < p.b; ++bi) {
    const int64_t tiles = ceil_div(p.len_q(bi), kBlockQ);
    const int64_t ns = std::min(slices, tiles);
    for (int64_t g = 0; g < p.h_kv; ++g)
      for (int64_t s = ns - 1; s >= 0; --s)  // a causal unit's heaviest slice first
        items.push_back({bi, g, tiles * s / ns, tiles * (s + 1) / ns});
  }
  return items;
}

// The GEMMs of a key block skip the keys no row of a 16-row chunk keeps past its last kept one: the
// fully masked part of a block on the causal diagonal (a tile's last block: row r keeps keys <= r,
// so chunk c needs the first 16 (c + 1) keys, 10 of 16 column groups instead of 16) and the padding
// past the last key of a sequence. QK^T then computes only those columns of S (the rest of the
// chunk's rows hold stale logits, which the softmax masks to -inf: their keys lie past every row's
// kept range), and P.V sums only over those keys, whose P is exactly 0 otherwise. Leaving a +0
// product out of a sum changes no bit (the accumulator starts at +0 and never becomes -0), so the
// results are those of the untrimmed GEMMs for finite V (an inf or NaN in a masked key's V, which
// 0 x inf spread as NaN over the whole tile, now reaches only the chunks that still compute that
// key). Chunks in a row with the same key count form one span (one GEMM call); a chunk keeping no
// key of the block gets none.
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
  const std::vector<WorkItem> items = work_items(p);
  int64_t max_blocks = 0;
  for (int64_t bi = 0; bi < p.b; ++bi)
    max_blocks = std::max(max_blocks, ceil_div(p.len_kv(bi), kBlockKV));
  const int ldq = static_cast<int>(round_up(p.d_qk, Compute<E>::kKAlign));
  const int ldo = static_cast<int>(round_up(p.d_v, 16));
  const int64_t group = p.h / p.h_kv;
  const T *Q = static_cast<const T *>(p.q);
  T *O = static_cast<T *>(p.o);
  const bool has_bias = p.bias_type == NVTE_POST_SCALE_BIAS || p.bias_type == NVTE_ALIBI;

#pragma omp parallel
  {
    const tile::AmxScope amx(uses_amx<E>());  // the tiles configured once per thread
    KVPanels<E> kv(p, max_blocks);
    std::vector<E> qa(static_cast<size_t>(kBlockQ) * ldq), pbuf(kBlockQ * kBlockKV);
    std::vector<float> S(kBlockQ * kBlockKV), bias(has_bias ? kBlockQ * kBlockKV : 0),
        keep(p.dropout > 0 ? kBlockQ * kBlockKV : 0), acc(static_cast<size_t>(kBlockQ) * ldo);
    float m[kBlockQ], l[kBlockQ], mx[kBlockQ], corr[kBlockQ];
    int64_t off[kBlockQ], lo[kBlockQ], hi[kBlockQ];
    int a[kBlockQ], b[kBlockQ];
    Span spans[kBlockQ / kSpanRows];
    // One tile: query rows [q0, q0 + 64) of sequence bi, head hi; K/V of kv.select()'s head.
    auto run_tile = [&](const Task &tk, const Task *next) {
      const int64_t sq = p.len_q(tk.bi), skv = p.len_kv(tk.bi);
      const int rows = static_cast<int>(std::min<int64_t>(kBlockQ, sq - tk.q0));
      token_offsets_q(p, p.sq_, tk.bi, tk.hi, tk.q0, rows, off);
      pack_a<E, T>(qa.data(), ldq, Q, off, rows, rows, static_cast<int>(p.d_qk));
      // This tile's output rows (written last) and the next tile's Q rows start loading now.
      token_offsets_q(p, p.so_, tk.bi, tk.hi, tk.q0, rows, off);
      prefetch_rows(O, off, rows, p.d_v * sizeof(T), true);
      if (next) {
        const int nrows = static_cast<int>(std::min<int64_t>(kBlockQ, sq - next->q0));
        token_offsets_q(p, p.sq_, next->bi, next->hi, next->q0, nrows, off);
        prefetch_rows(Q, off, nrows, p.d_qk * sizeof(T), false);
      }
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
        kv.template need<T>(p, blk);
        for (int r = 0; r < rows; ++r) {
          a[r] = static_cast<int>(std::clamp<int64_t>(lo[r] - j0, 0, kBlockKV));
          b[r] = static_cast<int>(std::clamp<int64_t>(hi[r] - j0, 0, kBlockKV));
        }
        const int nspans = key_spans(rows, b, spans);
        for (int sp = 0; sp < nspans; ++sp) {
          const Span &z = spans[sp];
          Compute<E>::gemm(z.rows, z.keys, ldq, qa.data() + static_cast<size_t>(z.r0) * ldq, ldq,
                           kv.k_at(blk), static_cast<size_t>(kv.k_block),
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
                           pbuf.data() + z.r0 * kBlockKV, kBlockKV, kv.v_at(blk),
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
    };
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < static_cast<int64_t>(items.size()); ++it) {
      const WorkItem &w = items[it];
      kv.select(w.bi, w.g);
      const int64_t h0 = w.g * group, h1 = h0 + group;
      for (int64_t qt = w.t0; qt < w.t1; ++qt)
        for (int64_t hq = h0; hq < h1; ++hq) {
          const Task next = hq + 1 < h1 ? Task{w.bi, hq + 1, qt * kBlockQ}
                                        : Task{w.bi, h0, (qt + 1) * kBlockQ};
          run_tile({w.bi, hq, qt * kBlockQ}, hq + 1 < h1 || qt + 1 < w.t1 ? &next : nullptr);
        }
    }
  }
  // Rows past a sequence's length (padding): O = 0 (bshd/sbhd; thd has no such rows), LSE = -inf.
  // thd without an LSE has nothing to write there, and its max_seqlen_q (the loop's bound) is only
  // a caller's hint, not a tensor dimension: 2^40 is a valid value (a fuzzer's input looped for
  // minutes here).
  if (p.format == NVTE_THD && p.lse == nullptr) return;
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

// bf16 operands where they are the CPU's fastest exact path, the GEMM's rule (cpu_matmul_path):
// AMX tiles, and AVX-512 BF16 dot products on AMD. Intel cores without AMX issue vdpbf16ps at half
// their FMA rate, and there the fp32 tiles (FMA) won, measured on a Xeon capped at avx512_core_fp16
// (bench_pytorch, B2 H16 S2048 D64 causal): forward 78.6 vs 146.6 ms, forward + backward 380 vs
// 492 ms. NVTE_CPU_GEMM_COMPUTE=native keeps bf16 wherever the CPU has it, fp32 never uses it.
bool use_bf16_compute(NVTEDType dtype) {
  if (dtype != kNVTEBFloat16 || !tile::has_bf16_dot()) return false;
  const std::string mode = cpu_compute_mode();
  if (mode == "fp32") return false;
  return mode == "native" || cpu_matmul_path() != MatmulPath::kF32;
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
