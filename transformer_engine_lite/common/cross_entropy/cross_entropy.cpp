// C API of the cross entropy family (cross_entropy.h): argument checks, device routing, CPU/GPU
// launch.
#include "transformer_engine_lite/cross_entropy.h"

#include <cmath>
#include <vector>

#include "../util/api.h"
#include "cross_entropy_cpu.h"
#ifdef NVTE_WITH_GPU
#include "cross_entropy_gpu.h"
#endif

namespace nvte {
namespace {

using Shape = std::vector<size_t>;

constexpr std::initializer_list<DType> kHp = {kNVTEFloat32, kNVTEFloat16, kNVTEBFloat16};

// logits [rows, V] (V >= 1) and target [rows]; returns the params they fix.
CrossEntropyParams check_inputs(const Tensor &logits, const Tensor &target, int rank,
                                int world_size, int64_t ignore_idx) {
  check_dtype(logits.data, "logits", kHp);
  check_ndim(logits.data, "logits", 2);
  check_dtype(target.data, "target", {kNVTEInt32, kNVTEInt64});
  check_ndim(target.data, "target", 1);
  NVTE_CHECK(target.data.shape[0] == logits.data.shape[0], "argument 'target': expected ",
             logits.data.shape[0], " elements (one per row of logits ", logits.data.describe(),
             "), got ", target.data.describe());
  NVTE_CHECK(logits.data.shape[1] >= 1, "argument 'logits': expected at least one vocab column, "
             "got ", logits.data.describe());
  NVTE_CHECK(world_size >= 1, "argument 'world_size': expected >= 1, got ", world_size);
  NVTE_CHECK(rank >= 0 && rank < world_size, "argument 'rank': expected 0 <= rank < world_size (",
             world_size, "), got ", rank);
  CrossEntropyParams p;
  p.rows = logits.data.shape[0];
  p.vocab = logits.data.shape[1];
  p.rank = rank;
  p.world_size = world_size;
  p.ignore_idx = ignore_idx;
  return p;
}

void row_stats(const char *op, const NVTETensor logits_h, const NVTETensor target_h, int rank,
               int world_size, int64_t ignore_idx, NVTETensor stats_h, NVTEStream stream) {
  const Tensor &logits = as_tensor(logits_h, "logits");
  const Tensor &target = as_tensor(target_h, "target");
  const Tensor &stats = as_tensor(stats_h, "stats");
  const CrossEntropyParams p = check_inputs(logits, target, rank, world_size, ignore_idx);
  check_dtype(stats.data, "stats", {kNVTEFloat32});
  check_shape(stats.data, "stats", Shape{p.rows, static_cast<size_t>(kNumStats)});
  const NVTEDevice device = check_same_device(
      {{&logits, "logits"}, {&target, "target"}, {&stats, "stats"}});
  const bool gpu = use_gpu(device, op);
  check_no_overlap(logits.data, "logits", stats.data, "stats");
  check_no_overlap(target.data, "target", stats.data, "stats");
  if (p.rows == 0) return;
  check_has_data(logits, "logits");
  check_has_data(target, "target");
  check_has_data(stats, "stats");
  if (gpu) {
#ifdef NVTE_WITH_GPU
    gpu::launch_cross_entropy_stats(p, logits.data.dtype, logits.data.dptr, target.data.dtype,
                                    target.data.dptr, stats.data.ptr<float>(), stream);
#endif
    return;
  }
  (void)stream;
  launch_cross_entropy_stats(p, logits.data.dtype, logits.data.dptr, target.data.dtype,
                             target.data.dptr, stats.data.ptr<float>());
}

void forward(const char *op, const NVTETensor logits_h, const NVTETensor target_h,
             const NVTETensor stats_h, int rank, int64_t ignore_idx, float label_smoothing,
             int reduce_loss, NVTETensor loss_h, NVTETensor grad_h, NVTEStream stream) {
  const Tensor &logits = as_tensor(logits_h, "logits");
  const Tensor &target = as_tensor(target_h, "target");
  const Tensor &stats = as_tensor(stats_h, "stats");
  const Tensor &loss = as_tensor(loss_h, "loss");
  const Tensor &grad = as_tensor(grad_h, "grad");
  check_dtype(stats.data, "stats", {kNVTEFloat32});
  check_ndim(stats.data, "stats", 3);
  NVTE_CHECK(stats.data.shape[0] >= 1 && stats.data.shape[0] <= 1u << 20,
             "argument 'stats': expected [world_size >= 1, rows, ", kNumStats, "], got ",
             stats.data.describe());
  const int world_size = static_cast<int>(stats.data.shape[0]);
  CrossEntropyParams p = check_inputs(logits, target, rank, world_size, ignore_idx);
  check_shape(stats.data, "stats",
              Shape{stats.data.shape[0], p.rows, static_cast<size_t>(kNumStats)});
  NVTE_CHECK(label_smoothing >= 0.0f && label_smoothing <= 1.0f,
             "argument 'label_smoothing': expected a value in [0, 1], got ", label_smoothing);
  p.label_smoothing = label_smoothing;
  p.grad_scale = reduce_loss != 0 && p.rows > 0 ? 1.0f / static_cast<float>(p.rows) : 1.0f;
  check_dtype(loss.data, "loss", {kNVTEFloat32});
  check_shape(loss.data, "loss", Shape{p.rows});
  check_dtype(grad.data, "grad", {logits.data.dtype});
  check_shape(grad.data, "grad", logits.data.shape);
  const NVTEDevice device =
      check_same_device({{&logits, "logits"}, {&target, "target"}, {&stats, "stats"},
                         {&loss, "loss"}, {&grad, "grad"}});
  const bool gpu = use_gpu(device, op);
  for (const auto &in : {std::make_pair(&logits, "logits"), std::make_pair(&target, "target"),
                         std::make_pair(&stats, "stats")}) {
    check_no_overlap(in.first->data, in.second, loss.data, "loss");
    check_no_overlap(in.first->data, in.second, grad.data, "grad");
  }
  check_no_overlap(loss.data, "loss", grad.data, "grad");
  if (p.rows == 0) return;
  for (const auto &t : {std::make_pair(&logits, "logits"), std::make_pair(&target, "target"),
                        std::make_pair(&stats, "stats"), std::make_pair(&loss, "loss"),
                        std::make_pair(&grad, "grad")}) {
    check_has_data(*t.first, t.second);
  }
  p.stats = stats.data.ptr<const float>();
  if (gpu) {
#ifdef NVTE_WITH_GPU
    gpu::launch_cross_entropy_fwd(p, logits.data.dtype, logits.data.dptr, target.data.dtype,
                                  target.data.dptr, loss.data.ptr<float>(), grad.data.dptr,
                                  stream);
#endif
    return;
  }
  (void)stream;
  launch_cross_entropy_fwd(p, logits.data.dtype, logits.data.dptr, target.data.dtype,
                           target.data.dptr, loss.data.ptr<float>(), grad.data.dptr);
}

void backward(const char *op, const NVTETensor grad_h, const NVTETensor go_h, NVTETensor dx_h,
              NVTEStream stream) {
  const Tensor &grad = as_tensor(grad_h, "grad");
  const Tensor &go = as_tensor(go_h, "grad_output");
  const Tensor &dx = as_tensor(dx_h, "dx");
  check_dtype(grad.data, "grad", kHp);
  check_ndim(grad.data, "grad", 2);
  const size_t rows = grad.data.shape[0], vocab = grad.data.shape[1];
  check_dtype(go.data, "grad_output", {kNVTEFloat32});
  const size_t gn = go.data.numel();
  NVTE_CHECK(gn == 1 || gn == rows, "argument 'grad_output': expected 1 or ", rows,
             " (rows of grad) elements, got ", go.data.describe());
  check_dtype(dx.data, "dx", {grad.data.dtype});
  check_shape(dx.data, "dx", grad.data.shape);
  const NVTEDevice device =
      check_same_device({{&grad, "grad"}, {&go, "grad_output"}, {&dx, "dx"}});
  const bool gpu = use_gpu(device, op);
  check_no_overlap(go.data, "grad_output", dx.data, "dx");
  // dx may be grad itself (each element read, then written); a partial overlap may not.
  NVTE_CHECK(dx.data.dptr == grad.data.dptr || !overlaps(grad.data, dx.data),
             "argument 'dx': expected grad itself or a buffer apart from it, got a partial "
             "overlap");
  if (rows * vocab == 0) return;
  check_has_data(grad, "grad");
  check_has_data(go, "grad_output");
  check_has_data(dx, "dx");
  const bool per_row = gn == rows;
  if (gpu) {
#ifdef NVTE_WITH_GPU
    gpu::launch_cross_entropy_bwd(rows, vocab, grad.data.dtype, grad.data.dptr,
                                  go.data.ptr<const float>(), per_row, dx.data.dptr, stream);
#endif
    return;
  }
  (void)stream;
  launch_cross_entropy_bwd(rows, vocab, grad.data.dtype, grad.data.dptr,
                           go.data.ptr<const float>(), per_row, dx.data.dptr);
}

}  // namespace
}  // namespace nvte

NVTEStatus nvte_cross_entropy_row_stats(const NVTETensor logits, const NVTETensor target,
                                        int rank, int world_size, int64_t ignore_idx,
                                        NVTETensor stats, NVTEStream stream) {
  const char *op = "nvte_cross_entropy_row_stats";
  return nvte::guarded(op, [&] {
    nvte::row_stats(op, logits, target, rank, world_size, ignore_idx, stats, stream);
  });
}

NVTEStatus nvte_cross_entropy_forward(const NVTETensor logits, const NVTETensor target,
                                      const NVTETensor stats, int rank, int64_t ignore_idx,
                                      float label_smoothing, int reduce_loss, NVTETensor loss,
                                      NVTETensor grad, NVTEStream stream) {
  const char *op = "nvte_cross_entropy_forward";
  return nvte::guarded(op, [&] {
    nvte::forward(op, logits, target, stats, rank, ignore_idx, label_smoothing, reduce_loss,
                  loss, grad, stream);
  });
}

NVTEStatus nvte_cross_entropy_backward(const NVTETensor grad, const NVTETensor grad_output,
                                       NVTETensor dx, NVTEStream stream) {
  const char *op = "nvte_cross_entropy_backward";
  return nvte::guarded(op, [&] { nvte::backward(op, grad, grad_output, dx, stream); });
}
