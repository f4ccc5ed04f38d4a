// Shared aliases and error helpers for the jax_sparse24 XLA FFI handlers.
//
// Every CUDA call and every kernel launch is checked; a failure becomes an ffi::Error whose
// message names the call, so JAX raises it as a Python exception (never a crash).
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <string>

// CUTLASS's cute/atom/mma_traits_sm100.hpp turns -Wmissing-field-initializers into an error for
// the rest of the translation unit, and newer jaxlib FFI headers (0.11) leave a struct member
// to its default initializer: compile the FFI headers with that warning off whatever came first.
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#endif
#include "xla/ffi/api/ffi.h"
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

namespace jax_sparse24 {

namespace ffi = xla::ffi;

inline ffi::Error InvalidArgument(const std::string& msg) {
  return ffi::Error(ffi::ErrorCode::kInvalidArgument, "jax_sparse24: " + msg);
}

inline ffi::Error Internal(const std::string& msg) {
  return ffi::Error(ffi::ErrorCode::kInternal, "jax_sparse24: " + msg);
}

inline ffi::Error CudaFailure(cudaError_t err, const char* what) {
  return Internal(std::string(what) + " failed: " + cudaGetErrorName(err) + " (" +
                  cudaGetErrorString(err) + ")");
}

// Returns an ffi::Error from the enclosing handler if a CUDA runtime call fails.
#define SP24_CUDA_CHECK(expr)                                        \
  do {                                                               \
    cudaError_t sp24_err_ = (expr);                                  \
    if (sp24_err_ != cudaSuccess) return ::jax_sparse24::CudaFailure(sp24_err_, #expr); \
  } while (0)

// Call right after a <<<...>>> launch: reports launch-configuration errors with the kernel name.
#define SP24_CHECK_LAUNCH(kernel_name)                                             \
  do {                                                                             \
    cudaError_t sp24_err_ = cudaGetLastError();                                   \
    if (sp24_err_ != cudaSuccess)                                                  \
      return ::jax_sparse24::CudaFailure(sp24_err_, "launch of " kernel_name);     \
  } while (0)

// Propagates an ffi::Error returned by a helper.
#define SP24_RETURN_IF_ERROR(expr)                   \
  do {                                               \
    ::xla::ffi::Error sp24_status_ = (expr);         \
    if (sp24_status_.failure()) return sp24_status_; \
  } while (0)

inline const char* DataTypeName(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::F64: return "float64";
    case ffi::DataType::F32: return "float32";
    case ffi::DataType::F16: return "float16";
    case ffi::DataType::BF16: return "bfloat16";
    case ffi::DataType::PRED: return "bool";
    case ffi::DataType::U8: return "uint8";
    case ffi::DataType::U16: return "uint16";
    case ffi::DataType::U32: return "uint32";
    case ffi::DataType::U64: return "uint64";
    case ffi::DataType::S8: return "int8";
    case ffi::DataType::S16: return "int16";
    case ffi::DataType::S32: return "int32";
    case ffi::DataType::S64: return "int64";
    default: return "unsupported dtype";
  }
}

// "(a, b, c)", "(a,)" — a shape for error messages.
inline std::string DimsString(ffi::AnyBuffer::Dimensions d) {
  std::string s = "(";
  for (size_t i = 0; i < d.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(d[i]);
  }
  if (d.size() == 1) s += ",";
  return s + ")";
}

inline std::string Shape2(int64_t rows, int64_t cols) {
  return "(" + std::to_string(rows) + ", " + std::to_string(cols) + ")";
}

// True when `dims` is exactly (rows, cols).
inline bool Is2D(ffi::AnyBuffer::Dimensions dims, int64_t rows, int64_t cols) {
  return dims.size() == 2 && dims[0] == rows && dims[1] == cols;
}

inline bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Multiprocessor count of a device, queried once per device and cached (persistent grids size
// themselves from it). One cache for the whole extension (inline: one instance across files).
inline ffi::Error SmCount(int device, int* out) {
  constexpr int kMaxDevices = 64;
  static std::array<std::atomic<int>, kMaxDevices> sm_count{};
  if (device < 0 || device >= kMaxDevices) {
    return Internal("device ordinal " + std::to_string(device) + " out of range");
  }
  int n = sm_count[device].load(std::memory_order_relaxed);
  if (n <= 0) {
    SP24_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
    sm_count[device].store(n, std::memory_order_relaxed);
  }
  *out = n;
  return ffi::Error::Success();
}

}  // namespace jax_sparse24
