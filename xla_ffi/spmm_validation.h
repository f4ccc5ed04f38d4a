// Checks shared by the sparse-GEMM handlers (spmm_cutlass.cu, spmm_cutlass_fp8.cu).
#pragma once

#include <cstdint>
#include <string>

#include "ffi_common.h"
#include "spmm_cutlass.h"

namespace jax_sparse24 {

// `values` and `meta` must have the compressed shapes (CutlassCompressedShapes) of an (m, k) 2:4
// operand of dtype code `dtype`; otherwise an InvalidArgument naming `op`.
inline ffi::Error CheckCompressedOperand(const std::string& op, int64_t m, int64_t k, int dtype,
                                         ffi::AnyBuffer::Dimensions values, ffi::AnyBuffer::Dimensions meta) {
  CompressedShapes s;
  std::string error;
  if (!CutlassCompressedShapes(m, k, dtype, &s, &error)) return InvalidArgument(op + ": " + error);
  if (!Is2D(values, s.values_rows, s.values_cols)) {
    return InvalidArgument(op + ": values must have the compressed shape " + Shape2(s.values_rows, s.values_cols) +
                           " for m=" + std::to_string(m) + " k=" + std::to_string(k) + ", got " +
                           DimsString(values));
  }
  if (!Is2D(meta, s.meta_rows, s.meta_cols)) {
    return InvalidArgument(op + ": meta must have the compressed shape " + Shape2(s.meta_rows, s.meta_cols) +
                           " for m=" + std::to_string(m) + " k=" + std::to_string(k) + ", got " +
                           DimsString(meta));
  }
  return ffi::Error::Success();
}

}  // namespace jax_sparse24
