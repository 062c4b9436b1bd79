// The handler side shared by every te_lite XLA FFI family file: where a handler runs (Device),
// AnyBuffer -> NVTETensor wrapping, workspaces, the guarded() boundary and TE_LITE_FFI_HANDLERS,
// which binds one impl as a CPU and a GPU handler.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <new>
#include <stdexcept>
#include <utility>

#include "../../common/platform/cpu_fpenv.h"
#include "common.h"

namespace te_lite {

// ------------------------------------------------------------------------------------ devices
// Where a handler runs: the CPU handler has no context; the GPU one gets XLA's stream and scratch
// allocator (valid only during the call).
struct Device {
  NVTEDevice kind;
  NVTEStream stream;               // nullptr on the CPU
  ffi::ScratchAllocator *scratch;  // nullptr on the CPU

  bool is_gpu() const { return kind == kNVTEDeviceGPU; }
};

// Memory for a workspace: the host heap on the CPU (freed with this object), XLA's scratch
// allocator on the GPU (freed when the handler returns; stream-ordered like XLA's own buffers).
class Scratch {
 public:
  // 256 bytes: cuBLASLt's workspace alignment, and a multiple of every CPU vector width.
  static constexpr size_t kAlign = 256;
  static constexpr size_t kXlaAlign = 16;  // the most XLA_FFI_DeviceMemory_Allocate accepts

  // nullptr when the allocation fails.
  void *allocate(const Device &dev, size_t bytes) {
    bytes = std::max<size_t>(bytes, 1);  // a workspace with no data pointer means "query"
    if (dev.is_gpu()) {
      // XLA's scratch allocator refuses alignments above 16 ("Unsupported alignment": every GPU
      // workspace failed on an H200), so ask for the slack and align the pointer here.
      void *raw = dev.scratch->Allocate(bytes + kAlign - kXlaAlign, kXlaAlign).value_or(nullptr);
      if (raw == nullptr) return nullptr;
      const uintptr_t p = reinterpret_cast<uintptr_t>(raw);
      return reinterpret_cast<void *>((p + kAlign - 1) / kAlign * kAlign);
    }
    host_.reset(::operator new(bytes, std::align_val_t{kAlign}, std::nothrow));
    return host_.get();
  }

 private:
  struct AlignedDelete {
    void operator()(void *p) const { ::operator delete(p, std::align_val_t{kAlign}); }
  };
  std::unique_ptr<void, AlignedDelete> host_;
};

// ------------------------------------------------------------------------------------ tensors
// Address given to empty buffers (XLA may pass null for them, which the core reads as "absent");
// never read or written.
inline void *empty_tensor_address() {
  alignas(64) static unsigned char dummy[64];
  return dummy;
}

// RAII NVTETensor over XLA buffers (which outlive it), tagged with the call's device. Failures here
// are library bugs (dtypes and ranks are checked before wrapping), so they throw, and guarded()
// reports them as INTERNAL.
class TensorWrapper {
 public:
  explicit TensorWrapper(const Device &dev, NVTEScalingMode mode = NVTE_DELAYED_TENSOR_SCALING)
      : handle_(nvte_create_tensor(mode)) {
    if (handle_ == nullptr) throw std::bad_alloc();
    expect(nvte_set_tensor_device(handle_, dev.kind));
  }
  ~TensorWrapper() { nvte_destroy_tensor(handle_); }
  TensorWrapper(const TensorWrapper &) = delete;
  TensorWrapper &operator=(const TensorWrapper &) = delete;
  TensorWrapper(TensorWrapper &&other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  TensorWrapper &operator=(TensorWrapper &&) = delete;

  TensorWrapper &data(const Buffer &b) { return set(kNVTERowwiseData, b); }
  // Row-wise data described as 1-D [numel] (norm statistics: the JAX front end keeps them shaped
  // like x's leading dims so they shard with x; the core takes them flat).
  TensorWrapper &data_flat(const Buffer &b) {
    NVTEBasicTensor bt{};
    bt.data_ptr = b.element_count() == 0 ? empty_tensor_address() : b.untyped_data();
    bt.dtype = kNVTEFloat32;
    bt.shape.ndim = 1;
    bt.shape.data[0] = static_cast<size_t>(b.element_count());
    return set(kNVTERowwiseData, bt);
  }
  TensorWrapper &columnwise_data(const Buffer &b) { return set(kNVTEColumnwiseData, b); }
  TensorWrapper &scale(const Buffer &b) { return set(kNVTEScale, b); }
  TensorWrapper &amax(const Buffer &b) { return set(kNVTEAmax, b); }
  // Per-tensor: fp32 scalar. MXFP8 (uint8 E8M0 bytes): pass kNVTEFloat8E8M0.
  TensorWrapper &scale_inv(const Buffer &b, std::optional<NVTEDType> as = std::nullopt) {
    return set(kNVTERowwiseScaleInv, b, as);
  }
  TensorWrapper &columnwise_scale_inv(const Buffer &b, std::optional<NVTEDType> as = std::nullopt) {
    return set(kNVTEColumnwiseScaleInv, b, as);
  }
  // Row-wise description without memory: tells the core which dtype an output is meant to hold
  // (nvte_compute_scale_from_amax takes fp8_max from it).
  TensorWrapper &declare_dtype(NVTEDType dtype) {
    NVTEBasicTensor bt{};
    bt.dtype = dtype;
    bt.shape.ndim = 1;
    return set(kNVTERowwiseData, bt);
  }

  // `as` overrides the NVTE dtype (E8M0 bytes).
  TensorWrapper &set(NVTETensorParam param, const Buffer &b,
                     std::optional<NVTEDType> as = std::nullopt) {
    const std::optional<NVTEDType> dtype = as ? as : nvte_dtype_of(b.element_type());
    if (!dtype) {
      throw std::logic_error(cat("dtype ", dtype_name(b.element_type()),
                                 " reached the wrapper unchecked (no NVTE equivalent)"));
    }
    NVTEBasicTensor bt{};
    // A present but empty buffer gets an address that is never dereferenced.
    bt.data_ptr = b.element_count() == 0 ? empty_tensor_address() : b.untyped_data();
    bt.dtype = *dtype;
    // A 0-dim buffer (a scalar) is described as [1]; more than NVTE_MAX_NDIM dims is refused by
    // guarded() before any impl runs.
    const auto dims = b.dimensions();
    bt.shape.ndim = dims.size() == 0 ? 1 : dims.size();
    bt.shape.data[0] = 1;
    for (size_t i = 0; i < dims.size(); ++i) bt.shape.data[i] = static_cast<size_t>(dims[i]);
    return set(param, bt);
  }
  TensorWrapper &set(NVTETensorParam param, const NVTEBasicTensor &bt) {
    expect(nvte_set_tensor_param(&handle_, param, &bt));
    return *this;
  }

  NVTETensor get() const { return handle_; }

 private:
  static void expect(NVTEStatus status) {
    if (status != NVTE_SUCCESS) throw std::runtime_error(nvte_get_last_error());
  }
  NVTETensor handle_;
};

// An optional tensor for the core: a handle with data only when the buffer has elements.
inline TensorWrapper optional_tensor(const Device &dev, const Buffer &b) {
  TensorWrapper w(dev);
  if (present(b)) w.data(b);
  return w;
}

// TE's workspace protocol: `call(workspace)` once with a handle without data. Either the core sets
// the shape and dtype it needs (norms always; the attention backward on the GPU): allocate that and
// call again; or it leaves no size (unset or [0]: the attention backward on the CPU), which means
// the first call needed no workspace and has run.
template <typename Call>
ffi::Error with_workspace(const char *op, const Device &dev, Call &&call) {
  TensorWrapper query(dev);
  TE_LITE_TRY(check_nvte(op, call(query.get())));
  NVTEBasicTensor bt = nvte_get_tensor_param(query.get(), kNVTERowwiseData);
  size_t bytes = bt.shape.ndim > 0 ? nvte_dtype_size(bt.dtype) : 0;
  for (size_t i = 0; i < bt.shape.ndim; ++i) bytes *= bt.shape.data[i];
  if (bytes == 0) return ffi::Error::Success();  // the first call ran
  Scratch scratch;
  bt.data_ptr = scratch.allocate(dev, bytes);
  if (bt.data_ptr == nullptr) {
    return ffi::Error(ffi::ErrorCode::kResourceExhausted,
                      cat(op, ": cannot allocate a workspace of ", bytes, " bytes"));
  }
  TensorWrapper workspace(dev);
  workspace.set(kNVTERowwiseData, bt);
  return check_nvte(op, call(workspace.get()));
}

// ------------------------------------------------------------------------------------ handlers
namespace detail {
inline ffi::Error check_rank(const char *op, const Buffer &b) {
  TE_LITE_CHECK(b.dimensions().size() <= NVTE_MAX_NDIM, op, ": expected at most ", NVTE_MAX_NDIM,
                " dims, got shape ", shape_str(b));
  return ffi::Error::Success();
}
inline ffi::Error check_rank(const char *op, ffi::Result<Buffer> r) { return check_rank(op, *r); }
template <typename T>
ffi::Error check_rank(const char *, const T &) {  // attributes
  return ffi::Error::Success();
}

// Impls see results as plain buffers.
inline Buffer unwrap(ffi::Result<Buffer> r) { return *r; }
template <typename T>
T unwrap(T value) {
  return value;
}
}  // namespace detail

// The boundary: ranks checked, then `impl(dev, args...)`; nothing thrown escapes.
template <typename Impl, typename... Args>
ffi::Error guarded(const char *op, Impl impl, const Device &dev, Args... args) {
  // XLA's CPU threads flush denormals; the core computes with IEEE denormals on every thread (as
  // from PyTorch), see platform/cpu_fpenv.h. Restored when the handler returns.
  const nvte::platform::IeeeDenormalsScope ieee_denormals;
  try {
    ffi::Error error;
    ((error = detail::check_rank(op, args), error.success()) && ...);
    if (error.failure()) return error;
    return impl(dev, detail::unwrap(args)...);
  } catch (const std::bad_alloc &) {
    return ffi::Error(ffi::ErrorCode::kResourceExhausted, cat(op, ": out of host memory"));
  } catch (const std::exception &e) {
    return ffi::Error::Internal(cat(op, ": internal error: ", e.what()));
  } catch (...) {
    return ffi::Error::Internal(cat(op, ": internal error (unknown exception)"));
  }
}

// Defines the extern "C" handlers te_lite_<op>_ffi_cpu and te_lite_<op>_ffi_gpu (listed in
// registrations.cpp) over one impl
//     ffi::Error impl(const Device &, <.Arg and .Ret buffers as Buffer>..., <.Attr values>...)
// `binding` is the .Arg/.Ret/.Attr chain, shared by both; the GPU handler also takes XLA's stream
// and scratch allocator (first, so the impl's parameters line up for both).
#define TE_LITE_FFI_HANDLERS(op, impl, binding)                                                 \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(                                                                \
      te_lite_##op##_ffi_cpu, ([](auto... args) {                                               \
        return ::te_lite::guarded("te_lite::" #op, impl,                                        \
                                  ::te_lite::Device{kNVTEDeviceCPU, nullptr, nullptr}, args...); \
      }),                                                                                       \
      ::xla::ffi::Ffi::Bind() binding);                                                         \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(                                                                \
      te_lite_##op##_ffi_gpu,                                                                   \
      ([](void *stream, ::xla::ffi::ScratchAllocator scratch, auto... args) {                   \
        return ::te_lite::guarded("te_lite::" #op, impl,                                        \
                                  ::te_lite::Device{kNVTEDeviceGPU, stream, &scratch}, args...); \
      }),                                                                                       \
      ::xla::ffi::Ffi::Bind()                                                                   \
          .Ctx<::xla::ffi::PlatformStream<void *>>()                                            \
          .Ctx<::xla::ffi::ScratchAllocator>() binding)

}  // namespace te_lite
