// nanobind module `jax_sparse24._sparse24_ffi`: hands the XLA FFI handlers to Python as capsules
// (registered by jax_sparse24/_src/ffi.py with jax.ffi.register_ffi_target(platform="CUDA")) and
// exposes the host-side helpers Python needs at trace time (compressed sizes, configurations).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "spmm_cusparselt.h"
#include "spmm_cutlass.h"
#include "xla/ffi/api/c_api.h"

namespace nb = nanobind;

// Handlers defined with XLA_FFI_DEFINE_HANDLER_SYMBOL in the .cu files.
extern "C" {
// mask_kernels.cu
XLA_FFI_Error* Sparse24Mask24(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* Sparse24TransposableMask24(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* Sparse24SoftThreshold24(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* Sparse24Mvue24(XLA_FFI_CallFrame* call_frame);
// spmm_cutlass.cu
XLA_FFI_Error* Sparse24CutlassCompress(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* Sparse24CutlassSpmm(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* Sparse24CutlassSpmmKN(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* Sparse24CutlassSpmmFp8(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* Sparse24Fp8MaskCompress(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* Sparse24Fp8PackedCompress(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* Sparse24Fp8Mvue24Compress(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* Sparse24Fp8QuantizeTranspose(XLA_FFI_CallFrame* call_frame);
// spmm_cusparselt.cu
XLA_FFI_Error* Sparse24CusparseltCompress(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* Sparse24CusparseltSpmm(XLA_FFI_CallFrame* call_frame);
// compress_kernels.cu
XLA_FFI_Error* Sparse24MaskCompress(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* Sparse24MaskCompressBoth(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* Sparse24PackedCompress(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* Sparse24PackedCompressLt(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* Sparse24Mvue24Compress(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* Sparse24MaskCompressLt(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* Sparse24MaskCompressBothLt(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* Sparse24Mvue24CompressLt(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* Sparse24MaskCompressMany(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* Sparse24MaskCompressManyLt(XLA_FFI_CallFrame* call_frame);
}

namespace {

template <typename Fn>
nb::capsule Capsule(Fn* fn) {
  static_assert(std::is_invocable_r_v<XLA_FFI_Error*, Fn, XLA_FFI_CallFrame*>,
                "an XLA FFI handler must take an XLA_FFI_CallFrame*");
  return nb::capsule(reinterpret_cast<void*>(fn));
}

}  // namespace

NB_MODULE(_sparse24_ffi, m) {
  m.doc() = "jax_sparse24 CUDA kernels as XLA FFI handlers (built for sm_90a).";

  m.def("registrations", []() {
    nb::dict d;
    d["jax_sparse24_mask24"] = Capsule(Sparse24Mask24);
    d["jax_sparse24_transposable_mask24"] = Capsule(Sparse24TransposableMask24);
    d["jax_sparse24_soft_threshold24"] = Capsule(Sparse24SoftThreshold24);
    d["jax_sparse24_mvue24"] = Capsule(Sparse24Mvue24);
    d["jax_sparse24_cutlass_compress"] = Capsule(Sparse24CutlassCompress);
    d["jax_sparse24_cutlass_spmm"] = Capsule(Sparse24CutlassSpmm);
    d["jax_sparse24_cutlass_spmm_kn"] = Capsule(Sparse24CutlassSpmmKN);
    d["jax_sparse24_cutlass_spmm_fp8"] = Capsule(Sparse24CutlassSpmmFp8);
    d["jax_sparse24_fp8_masked_compress"] = Capsule(Sparse24Fp8MaskCompress);
    d["jax_sparse24_fp8_packed_compress"] = Capsule(Sparse24Fp8PackedCompress);
    d["jax_sparse24_fp8_mvue24_compress"] = Capsule(Sparse24Fp8Mvue24Compress);
    d["jax_sparse24_fp8_quantize_transpose"] = Capsule(Sparse24Fp8QuantizeTranspose);
    d["jax_sparse24_cusparselt_compress"] = Capsule(Sparse24CusparseltCompress);
    d["jax_sparse24_cusparselt_spmm"] = Capsule(Sparse24CusparseltSpmm);
    d["jax_sparse24_masked_compress"] = Capsule(Sparse24MaskCompress);
    d["jax_sparse24_masked_compress_both"] = Capsule(Sparse24MaskCompressBoth);
    d["jax_sparse24_packed_compress"] = Capsule(Sparse24PackedCompress);
    d["jax_sparse24_packed_compress_lt"] = Capsule(Sparse24PackedCompressLt);
    d["jax_sparse24_mvue24_compress"] = Capsule(Sparse24Mvue24Compress);
    d["jax_sparse24_masked_compress_lt"] = Capsule(Sparse24MaskCompressLt);
    d["jax_sparse24_masked_compress_both_lt"] = Capsule(Sparse24MaskCompressBothLt);
    d["jax_sparse24_mvue24_compress_lt"] = Capsule(Sparse24Mvue24CompressLt);
    d["jax_sparse24_masked_compress_many"] = Capsule(Sparse24MaskCompressMany);
    d["jax_sparse24_masked_compress_many_lt"] = Capsule(Sparse24MaskCompressManyLt);
    return d;
  });

  m.def(
      "cutlass_compressed_shapes",
      [](int64_t m_rows, int64_t k_cols, int dtype) {
        jax_sparse24::CompressedShapes s;
        std::string error;
        if (!jax_sparse24::CutlassCompressedShapes(m_rows, k_cols, dtype, &s, &error)) {
          throw nb::value_error(error.c_str());
        }
        return std::make_tuple(std::make_tuple(s.values_rows, s.values_cols),
                               std::make_tuple(s.meta_rows, s.meta_cols));
      },
      nb::arg("m"), nb::arg("k"), nb::arg("dtype"),
      "Shapes (values, metadata) of the CUTLASS SM90 compressed form of an m x k (K-major) 2:4 "
      "operand; dtype 0 = bfloat16, 1 = float16, 2 = float8_e4m3fn (the fp8 GEMM's layout). Values have "
      "the operand's dtype, metadata is uint8.");

  m.def("cutlass_configs", []() { return jax_sparse24::CutlassConfigNames(); },
        "Names of the compiled CUTLASS sparse GEMM configurations, indexed by config id.");

  m.def("cutlass_default_config",
        [](int64_t m_rows, int64_t n_cols, int64_t k_cols) {
          return jax_sparse24::CutlassDefaultConfig(m_rows, n_cols, k_cols);
        },
        nb::arg("m"), nb::arg("n"), nb::arg("k"),
        "Config id the measured table picks for an (m, n, k) sparse GEMM.");

  m.def("cutlass_configs_kn", []() { return jax_sparse24::CutlassConfigNamesKN(); },
        "Names of the compiled \"kn\" (B stored K x N row-major: weight gradient) configurations.");

  m.def("cutlass_default_config_kn",
        [](int64_t m_rows, int64_t n_cols, int64_t k_cols) {
          return jax_sparse24::CutlassDefaultConfigKN(m_rows, n_cols, k_cols);
        },
        nb::arg("m"), nb::arg("n"), nb::arg("k"),
        "Default \"kn\" config id for an (m, n, k) sparse GEMM (-1 when none is compiled).");

  m.def(
      "cusparselt_load",
      [](const std::string& hint) {
        std::string message;
        const bool ok = jax_sparse24::CusparseltLoad(hint, &message);
        return std::make_tuple(ok, message);
      },
      nb::arg("hint") = "",
      "Load libcusparseLt (hint: its directory or path, may be empty): (ok, path loaded or why not).");

  m.def(
      "cusparselt_compressed_size",
      [](int device, int64_t m_rows, int64_t n_cols, int64_t k_cols, int dtype, int a_layout, int b_layout) {
        int64_t size = 0;
        std::string error;
        if (!jax_sparse24::CusparseltCompressedSize(device, m_rows, n_cols, k_cols, dtype, a_layout, b_layout, &size,
                                                    &error)) {
          throw nb::value_error(error.c_str());
        }
        return size;
      },
      nb::arg("device"), nb::arg("m"), nb::arg("n"), nb::arg("k"), nb::arg("dtype"), nb::arg("a_layout"),
      nb::arg("b_layout"),
      "Bytes of cuSPARSELt's compressed A for the plan (creates and caches the plan on `device`).");

  m.def("cusparselt_plans", []() { return jax_sparse24::CusparseltPlans(); },
        "Cached cuSPARSELt plans: (device, m, n, k, dtype, a_layout, b_layout, searched, alg_config_id).");

  m.def("cusparselt_version", []() { return jax_sparse24::CusparseltVersion(); },
        "cusparseLtGetVersion of the loaded library (0 before its first handle).");

  m.def("cutlass_alignment", []() { return jax_sparse24::CutlassAlignment(); },
        "(m, n, k) divisibility the CUTLASS sparse GEMM requires.");

  m.def("cutlass_configs_fp8", []() { return jax_sparse24::CutlassConfigNamesFp8(); },
        "Names of the compiled fp8 (e4m3 -> bf16) sparse GEMM configurations (empty in the minimal build).");

  m.def("cutlass_default_config_fp8",
        [](int64_t m_rows, int64_t n_cols, int64_t k_cols) {
          return jax_sparse24::CutlassDefaultConfigFp8(m_rows, n_cols, k_cols);
        },
        nb::arg("m"), nb::arg("n"), nb::arg("k"),
        "Default fp8 config id for an (m, n, k) sparse GEMM (-1 when none is compiled).");

  m.def("cutlass_alignment_fp8", []() { return jax_sparse24::CutlassAlignmentFp8(); },
        "(m, n, k) divisibility the fp8 sparse GEMM requires.");
}
