// CUTLASS SM90 fp8 2:4 sparse GEMM as an XLA FFI handler: the registry TU.
//
//   Sparse24CutlassSpmmFp8: values (M, K/2) e4m3, meta (uint8), b (N, K) e4m3, alpha () float32
//                           -> d (N, M) bfloat16 = alpha * (b @ A^T), fp32 accumulation;
//                           attrs m, n, k, config (-1: the default for the shape).
//
// The configurations are compiled in their own TUs (spmm_fp8_cfg_*.cu; none in the minimal build)
// from spmm_cutlass_fp8.cuh. The compressed operand comes from fp8_compress_kernels.cu (quantize +
// mask + compress in one pass) or CUTLASS's compressor (spmm_cutlass.cu, dtype code 2).
// Command-buffer compatible: no allocation besides XLA's scratch, no synchronisation, alpha read on
// the device.
#include "spmm_cutlass_fp8.cuh"  // first: defines NDEBUG before any CUTLASS header

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "ffi_common.h"
#include "spmm_cutlass.h"
#include "spmm_validation.h"

SP24_FP8_CONFIGS(SP24_EXTERN_FP8)

namespace jax_sparse24 {
namespace {

using spmm::GemmCall;
using spmm::kFp8AlignK;
using spmm::kFp8AlignM;
using spmm::kFp8AlignN;
using spmm::kInt32Max;
using spmm::RunFn;

struct Fp8ConfigEntry {
  const char* name;
  RunFn run;
};

#define SP24_FP8_ENTRY(SCHED, TM, TN, TK, CM, CN) \
  Fp8ConfigEntry{#SCHED "_" #TM "x" #TN "x" #TK "_c" #CM "x" #CN, &spmm::RunGemm<SP24_FP8_CFG_T(SCHED, TM, TN, TK, CM, CN)>},

// The sentinel keeps the array non-empty in the minimal build (no fp8 configuration compiled).
const Fp8ConfigEntry kFp8Configs[] = {SP24_FP8_CONFIGS(SP24_FP8_ENTRY) Fp8ConfigEntry{nullptr, nullptr}};
constexpr int kNumFp8Configs = static_cast<int>(sizeof(kFp8Configs) / sizeof(kFp8Configs[0])) - 1;

int Fp8ConfigId(const char* name) {
  for (int i = 0; i < kNumFp8Configs; ++i) {
    if (std::string(kFp8Configs[i].name) == name) return i;
  }
  return -1;
}

const char* Fp8Name(ffi::DataType t) {
  if (t == ffi::DataType::F8E4M3FN) return "float8_e4m3fn";
  if (t == ffi::DataType::F8E5M2) return "float8_e5m2";
  return DataTypeName(t);
}

ffi::Error SpmmFp8Impl(cudaStream_t stream, ffi::ScratchAllocator scratch, int32_t device, ffi::AnyBuffer values,
                       ffi::AnyBuffer meta, ffi::AnyBuffer b, ffi::AnyBuffer alpha, ffi::Result<ffi::AnyBuffer> d,
                       int64_t m, int64_t n, int64_t k, int64_t config) {
  const std::string op = "cutlass_spmm_fp8";
  if (values.element_type() != ffi::DataType::F8E4M3FN || b.element_type() != ffi::DataType::F8E4M3FN) {
    return InvalidArgument(op + ": values and b must be float8_e4m3fn, got values " +
                           Fp8Name(values.element_type()) + ", b " + Fp8Name(b.element_type()));
  }
  if (meta.element_type() != ffi::DataType::U8) {
    return InvalidArgument(op + ": meta must be uint8, got " + DataTypeName(meta.element_type()));
  }
  if (alpha.element_type() != ffi::DataType::F32 || alpha.element_count() != 1) {
    return InvalidArgument(op + ": alpha must be one float32, got " + DataTypeName(alpha.element_type()) +
                           " of shape " + DimsString(alpha.dimensions()));
  }
  if (d->element_type() != ffi::DataType::BF16) {
    return InvalidArgument(op + ": d must be bfloat16, got " + DataTypeName(d->element_type()));
  }
  if (m <= 0 || n <= 0 || k <= 0 || m > kInt32Max - 256 || n > kInt32Max || k > kInt32Max - 256) {
    return InvalidArgument(op + ": m, n, k must be positive and fit 32-bit layouts, got m=" + std::to_string(m) +
                           " n=" + std::to_string(n) + " k=" + std::to_string(k));
  }
  if (m % kFp8AlignM || n % kFp8AlignN || k % kFp8AlignK) {
    return InvalidArgument(op + ": the fp8 sparse GEMM needs m % " + std::to_string(kFp8AlignM) + " == 0, n % " +
                           std::to_string(kFp8AlignN) + " == 0, k % " + std::to_string(kFp8AlignK) +
                           " == 0, got m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" +
                           std::to_string(k));
  }
  if (!Is2D(b.dimensions(), n, k)) {
    return InvalidArgument(op + ": b must have shape (n, k) = " + Shape2(n, k) + ", got " +
                           DimsString(b.dimensions()));
  }
  if (!Is2D(d->dimensions(), n, m)) {
    return InvalidArgument(op + ": d must have shape (n, m) = " + Shape2(n, m) + ", got " +
                           DimsString(d->dimensions()));
  }
  SP24_RETURN_IF_ERROR(CheckCompressedOperand(op, m, k, 2, values.dimensions(), meta.dimensions()));
  if (kNumFp8Configs == 0) {
    return InvalidArgument(op + ": no fp8 configuration is compiled in this (minimal) build; build with "
                                "JAX_SPARSE24_CUTLASS_CONFIGS=all");
  }
  if (config < -1 || config >= kNumFp8Configs) {
    return InvalidArgument(op + ": config must be -1 (default) or in [0, " + std::to_string(kNumFp8Configs) +
                           "), got " + std::to_string(config));
  }
  const int cfg = config == -1 ? CutlassDefaultConfigFp8(m, n, k) : static_cast<int>(config);
  if (cfg < 0 || cfg >= kNumFp8Configs) return Internal("fp8 default configuration out of range");
  if (!Aligned16(values.untyped_data()) || !Aligned16(meta.untyped_data()) || !Aligned16(b.untyped_data()) ||
      !Aligned16(d->untyped_data()) || (reinterpret_cast<uintptr_t>(alpha.untyped_data()) & 3u)) {
    return InvalidArgument(op + ": buffers must be 16-byte aligned (alpha 4-byte)");
  }
  GemmCall call;
  call.stream = stream;
  call.scratch = &scratch;
  call.device = device;
  SP24_RETURN_IF_ERROR(SmCount(device, &call.sm_count));
  call.values = values.untyped_data();
  call.meta = meta.untyped_data();
  call.b = b.untyped_data();
  call.d = d->untyped_data();
  call.m = static_cast<int>(m);
  call.n = static_cast<int>(n);
  call.k = static_cast<int>(k);
  call.config_name = kFp8Configs[cfg].name;
  call.alpha = static_cast<const float*>(alpha.untyped_data());
  return kFp8Configs[cfg].run(call);
}

}  // namespace

std::vector<std::string> CutlassConfigNamesFp8() {
  std::vector<std::string> names;
  for (int i = 0; i < kNumFp8Configs; ++i) names.emplace_back(kFp8Configs[i].name);
  return names;
}

// From scripts/probe_fp8.py on the H100 (2026-11-24, GEMM only, (T, I, O) = (n, k, m)): ping-pong
// 128x128 was fastest at K = 768 (16384 x 768 x 3072: 0.078 ms against 0.086); at K >= 2048 the two
// cooperative tiles were within 3% of each other except at 16384 x 4096 x 11008, where 256x128 ran
// 0.998 ms against 1.151 (128x256): ping-pong up to K = 1024, cooperative 256x128 above.
int CutlassDefaultConfigFp8(int64_t m, int64_t n, int64_t k) {
  (void)m;
  (void)n;
  if (kNumFp8Configs == 0) return -1;
  int id = Fp8ConfigId(k <= 1024 ? "pingpong_fastaccum_128x128x128_c1x2" : "cooperative_fastaccum_256x128x128_c2x1");
  return id < 0 ? 0 : id;
}

std::tuple<int64_t, int64_t, int64_t> CutlassAlignmentFp8() { return {kFp8AlignM, kFp8AlignN, kFp8AlignK}; }

}  // namespace jax_sparse24

XLA_FFI_DEFINE_HANDLER_SYMBOL(Sparse24CutlassSpmmFp8, jax_sparse24::SpmmFp8Impl,
                              ::xla::ffi::Ffi::Bind()
                                  .Ctx<::xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<::xla::ffi::ScratchAllocator>()
                                  .Ctx<::xla::ffi::DeviceOrdinal>()
                                  .Arg<::xla::ffi::AnyBuffer>()  // values (m, k/2) e4m3
                                  .Arg<::xla::ffi::AnyBuffer>()  // meta
                                  .Arg<::xla::ffi::AnyBuffer>()  // b (n, k) e4m3
                                  .Arg<::xla::ffi::AnyBuffer>()  // alpha () f32
                                  .Ret<::xla::ffi::AnyBuffer>()  // d (n, m) bf16
                                  .Attr<int64_t>("m")
                                  .Attr<int64_t>("n")
                                  .Attr<int64_t>("k")
                                  .Attr<int64_t>("config"),
                              {::xla::ffi::Traits::kCmdBufferCompatible});
