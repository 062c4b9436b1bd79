// C API of fused RoPE (fused_rope.h): argument checks, device routing, CPU/GPU launch.
#include "transformer_engine_lite/fused_rope.h"

#include <string>

#include "../util/api.h"
#include "fused_rope_cpu.h"
#ifdef NVTE_WITH_GPU
#include "fused_rope_gpu.h"
#endif

namespace nvte {
namespace {

const char *format_name(NVTE_QKV_Format f) {
  switch (f) {
    case NVTE_SBHD: return "sbhd";
    case NVTE_BSHD: return "bshd";
    case NVTE_THD: return "thd";
    default: return "unknown";
  }
}

// Names of the two data arguments of one direction ("input"/"output" or the gradients).
struct RopeArgs {
  const char *src;
  const char *dst;
};

// Checks the thd offsets' values (host memory): cu[0] = 0, non-decreasing, cu[b] / cp_size <= t
// (the local tokens), with context parallelism an even local length per sequence (the two
// chunks). Returns the longest local sequence.
size_t check_cu_seqlens_values(const RopeParams &p) {
  const int32_t *cu = p.cu_seqlens;
  const size_t b = p.b;
  NVTE_CHECK(cu[0] == 0, "argument 'cu_seqlens': expected cu_seqlens[0] == 0, got ", cu[0]);
  size_t longest = 0;
  for (size_t i = 0; i < b; ++i) {
    NVTE_CHECK(cu[i + 1] >= cu[i], "argument 'cu_seqlens': expected non-decreasing offsets, got "
               "cu_seqlens[", i, "] = ", cu[i], " > cu_seqlens[", i + 1, "] = ", cu[i + 1]);
    const size_t len = static_cast<size_t>(cu[i + 1] / p.cp_size - cu[i] / p.cp_size);
    NVTE_CHECK(p.cp_size == 1 || len % 2 == 0, "argument 'cu_seqlens': with cp_size = ",
               p.cp_size, " every sequence must hold an even number of local tokens (two chunks), "
               "got ", len, " for sequence ", i, " (cu_seqlens[", i, "] = ", cu[i],
               ", cu_seqlens[", i + 1, "] = ", cu[i + 1], ")");
    longest = len > longest ? len : longest;
  }
  NVTE_CHECK(static_cast<size_t>(cu[b] / p.cp_size) <= p.tokens,
             "argument 'cu_seqlens': expected cu_seqlens[", b, "] / cp_size (", p.cp_size,
             ") <= the ", p.tokens, " tokens of the input, got ", cu[b]);
  return longest;
}

// Every sequence's rows of freqs (host memory): start_positions[i] >= 0 and
// start_positions[i] + cp_size * len <= s_max (len: its local length), TE's bound for the
// framework path, so every rank's chunks lie inside freqs.
void check_freq_rows(const RopeParams &p, const char *src) {
  for (size_t i = 0; i < p.b; ++i) {
    const int64_t start = p.start_positions != nullptr ? p.start_positions[i] : 0;
    const int64_t len = p.format == RopeFormat::kTHD
                            ? p.cu_seqlens[i + 1] / p.cp_size - p.cu_seqlens[i] / p.cp_size
                            : static_cast<int64_t>(p.s);
    const int64_t end = start + len * p.cp_size;
    NVTE_CHECK(start >= 0, "argument 'start_positions': expected offsets >= 0, got "
               "start_positions[", i, "] = ", start);
    if (p.start_positions != nullptr) {
      NVTE_CHECK(end <= static_cast<int64_t>(p.freq_positions), "argument 'start_positions': "
                 "sequence ", i, " needs rows ", start, " .. ", end - 1,
                 " of freqs (start_positions[", i, "] = ", start, ", ", len * p.cp_size,
                 " tokens), expected at most the ",
                 p.freq_positions, " positions of freqs");
    } else {
      NVTE_CHECK(end <= static_cast<int64_t>(p.freq_positions), "argument 'freqs': sequence ", i,
                 " has ", len * p.cp_size, " tokens ('", src, "' with cp_size = ", p.cp_size,
                 "), expected at most the ", p.freq_positions, " positions of freqs");
    }
  }
}

NVTEStatus fused_rope(const char *op, bool backward, RopeArgs names, const NVTETensor src_h,
                      const NVTETensor cu_seqlens, const NVTETensor freqs_h,
                      const NVTETensor start_positions, NVTETensor dst_h,
                      NVTE_QKV_Format qkv_format, bool interleaved, int cp_size, int cp_rank,
                      NVTEStream stream) {
  return guarded(op, [&] {
    const Tensor &src = as_tensor(src_h, names.src);
    const Tensor &dst = as_tensor(dst_h, names.dst);
    const Tensor &freqs = as_tensor(freqs_h, "freqs");
    const Tensor *cu = as_tensor_opt(cu_seqlens);
    if (cu != nullptr && !cu->data.has_data()) cu = nullptr;  // a handle without data is absent
    const Tensor *starts = as_tensor_opt(start_positions);
    if (starts != nullptr && !starts->data.has_data()) starts = nullptr;  // as cu_seqlens
    NVTE_CHECK(cp_size >= 1, "argument 'cp_size': expected >= 1, got ", cp_size);
    NVTE_CHECK(cp_rank >= 0 && cp_rank < cp_size, "argument 'cp_rank': expected 0 <= cp_rank < "
               "cp_size (", cp_size, "), got ", cp_rank);

    NVTE_CHECK(qkv_format == NVTE_SBHD || qkv_format == NVTE_BSHD || qkv_format == NVTE_THD,
               "argument 'qkv_format': expected NVTE_SBHD (0), NVTE_BSHD (1) or NVTE_THD (2), "
               "got ", static_cast<int>(qkv_format));
    const bool thd = qkv_format == NVTE_THD;
    const SimpleTensor &x = src.data, &y = dst.data, &f = freqs.data;
    check_dtype(x, names.src, {kNVTEFloat32, kNVTEFloat16, kNVTEBFloat16});
    check_ndim(x, names.src, thd ? 3 : 4);
    NVTE_CHECK(y.dtype == x.dtype, "argument '", names.dst, "': expected the dtype of '",
               names.src, "' (", dtype_name(x.dtype), "), got ", dtype_name(y.dtype));
    check_same_shape(x, names.src, y, names.dst);
    check_dtype(f, "freqs", {kNVTEFloat32});
    check_ndim(f, "freqs", 4);
    const size_t d = x.shape.back(), d2 = f.shape[3];
    NVTE_CHECK(f.shape[1] == 1 && f.shape[2] == 1,
               "argument 'freqs': expected shape [s_max, 1, 1, d2], got ", shape_str(f.shape));
    NVTE_CHECK(d2 >= 2 && d2 % 2 == 0 && d2 <= d,
               "argument 'freqs': expected an even rotary dim d2 with 2 <= d2 <= ", d,
               " (the head dim of '", names.src, "'), got d2 = ", d2);

    RopeParams p;
    p.format = static_cast<RopeFormat>(qkv_format);
    p.interleaved = interleaved;
    p.tokens = thd ? x.shape[0] : x.shape[0] * x.shape[1];
    p.h = x.shape[thd ? 1 : 2];
    p.d = d;
    p.d2 = d2;
    p.freq_positions = f.shape[0];
    p.cp_size = cp_size;
    p.cp_rank = cp_rank;
    if (thd) {
      NVTE_CHECK(cu != nullptr, "argument 'cu_seqlens': expected int32 [b + 1] offsets for "
                 "qkv_format thd, got none");
      check_dtype(cu->data, "cu_seqlens", {kNVTEInt32});
      check_ndim(cu->data, "cu_seqlens", 1);
      NVTE_CHECK(cu->data.shape[0] >= 1, "argument 'cu_seqlens': expected [b + 1] offsets "
                 "(at least one), got ", shape_str(cu->data.shape));
      p.b = cu->data.shape[0] - 1;
      p.cu_seqlens = cu->data.ptr<const int32_t>();
    } else {
      NVTE_CHECK(cu == nullptr, "argument 'cu_seqlens': expected none for qkv_format ",
                 format_name(qkv_format), " (offsets are only used with thd), got ",
                 cu->data.describe());
      const bool sbhd = qkv_format == NVTE_SBHD;
      p.s = x.shape[sbhd ? 0 : 1];
      p.b = x.shape[sbhd ? 1 : 0];
      // TE's bound: the full sequence (cp_size * s tokens) fits in freqs.
      NVTE_CHECK(p.s * static_cast<size_t>(cp_size) <= p.freq_positions,
                 "argument 'freqs': expected at least the ", p.s * static_cast<size_t>(cp_size),
                 " positions of '", names.src, "' ", shape_str(x.shape), " (",
                 format_name(qkv_format), ", cp_size = ", cp_size, "), got ", p.freq_positions,
                 " (", shape_str(f.shape), ")");
      NVTE_CHECK(cp_size == 1 || p.s % 2 == 0, "argument '", names.src, "': with cp_size = ",
                 cp_size, " the local sequence length must be even (two chunks), got ", p.s);
    }
    if (starts != nullptr) {
      check_dtype(starts->data, "start_positions", {kNVTEInt32});
      NVTE_CHECK(starts->data.shape.size() == 1 && starts->data.shape[0] == p.b,
                 "argument 'start_positions': expected int32 [", p.b, "] (one offset per ",
                 thd ? "sequence of cu_seqlens" : "batch entry", "), got ",
                 shape_str(starts->data.shape));
    }
    const NVTEDevice device =
        check_same_device({{&src, names.src}, {&freqs, "freqs"}, {cu, "cu_seqlens"},
                           {starts, "start_positions"}, {&dst, names.dst}});
    const bool gpu = use_gpu(device, op);
    // Each head is read whole before it is written: in place is fine, a partial overlap is not.
    if (x.dptr != y.dptr) check_no_overlap(x, names.src, y, names.dst);
    check_no_overlap(f, "freqs", y, names.dst);
    if (cu != nullptr) check_no_overlap(cu->data, "cu_seqlens", y, names.dst);
    if (starts != nullptr) {
      check_no_overlap(starts->data, "start_positions", y, names.dst);
      p.start_positions = starts->data.ptr<const int32_t>();
    }
    // On the CPU the offsets are host memory and checked here; on the GPU reading them would
    // synchronize the stream, so the kernel guards itself instead (fused_rope.h).
    if (!gpu) {
      if (thd) p.max_seqlen = check_cu_seqlens_values(p);
      check_freq_rows(p, names.src);
    }
    if (x.numel() == 0) return;  // nothing to rotate (torch gives empty tensors null pointers)
    check_has_data(src, names.src);
    check_has_data(dst, names.dst);
    check_has_data(freqs, "freqs");
    p.freqs = f.ptr<const float>();

    if (gpu) {
#ifdef NVTE_WITH_GPU
      if (backward) {
        gpu::launch_fused_rope_bwd(p, x.dtype, x.dptr, y.dptr, stream);
      } else {
        gpu::launch_fused_rope_fwd(p, x.dtype, x.dptr, y.dptr, stream);
      }
#endif
      return;
    }
    (void)stream;
    if (backward) {
      launch_fused_rope_bwd(p, x.dtype, x.dptr, y.dptr);
    } else {
      launch_fused_rope_fwd(p, x.dtype, x.dptr, y.dptr);
    }
  });
}

}  // namespace
}  // namespace nvte

NVTEStatus nvte_fused_rope_forward(const NVTETensor input, const NVTETensor cu_seqlens,
                                   const NVTETensor freqs, const NVTETensor start_positions,
                                   NVTETensor output, NVTE_QKV_Format qkv_format, bool interleaved,
                                   int cp_size, int cp_rank, NVTEStream stream) {
  return nvte::fused_rope("nvte_fused_rope_forward", false, {"input", "output"}, input, cu_seqlens,
                          freqs, start_positions, output, qkv_format, interleaved, cp_size,
                          cp_rank, stream);
}

NVTEStatus nvte_fused_rope_backward(const NVTETensor output_grads, const NVTETensor cu_seqlens,
                                    const NVTETensor freqs, const NVTETensor start_positions,
                                    NVTETensor input_grads, NVTE_QKV_Format qkv_format,
                                    bool interleaved, int cp_size, int cp_rank,
                                    NVTEStream stream) {
  return nvte::fused_rope("nvte_fused_rope_backward", true, {"output_grads", "input_grads"},
                          output_grads, cu_seqlens, freqs, start_positions, input_grads,
                          qkv_format, interleaved, cp_size, cp_rank, stream);
}
