// CUTLASS 3.x SM90 2:4 sparse GEMM and its compressor as XLA FFI handlers: the registry TU.
//
// Formulation (DESIGN.md, "Consequences" 6): D(M x N) = A(M x K, 2:4 along K) * B(K x N) with
//   A  row-major M x K (K-major), stored compressed: values + metadata (CUTLASS SM90 layout),
//   B  stored as an N x K row-major array (column-major K x N, K-major),
//   D  stored as an N x M row-major array (column-major M x N).
// For a layer y = x * W~ (x: T x I, W~: I x O): M = O, N = T, K = I, A = W~^T, B = x, D = y; for the
// input gradient dx = dy * W~^T: A = W~ (2:4 along O), B = dy, D = dx. Nothing is transposed.
//
// The GEMM template lives in spmm_cutlass_gemm.cuh; each configuration is instantiated (bf16 +
// fp16) in its own TU, xla_ffi/spmm_cfg_<name>.cu, so the build compiles them in parallel. This TU
// only declares them `extern` and holds the table, the compressor, validation and the handlers.
//
// Kernels: bf16 / fp16 operands and output, fp32 accumulation, alpha = 1, beta = 0, no C operand
// (void C: the epilogue never reads memory for C). Configurations come from the schedule sweep in
// DESIGN.md; CutlassDefaultConfig() holds the measured table.
//
// Handlers (both command-buffer compatible: no host<->device sync, no allocation, no stream query):
//   Sparse24CutlassCompress: a (M, K) already 2:4 along K -> values, meta.
//   Sparse24CutlassSpmm:     values, meta, b (N, K) -> d (N, M); attrs m, n, k, config, raster, swizzle
//                            (the persistent scheduler's tile order; CUTLASS's defaults are 0, 1).
#include "spmm_cutlass_gemm.cuh"  // first: defines NDEBUG before any CUTLASS header
#include "spmm_cutlass_fp8.cuh"   // the fp8 operand's layout (ReferenceFp8Config)

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "cutlass/transform/device/transform_universal_adapter.hpp"
#include "cutlass/transform/kernel/sparse_gemm_compressor.hpp"

#include "ffi_common.h"
#include "spmm_cutlass.h"
#include "spmm_validation.h"

// The configurations are compiled in their own TUs (spmm_cfg_*.cu): declare them here.
SP24_NK_CONFIGS(SP24_EXTERN_NK)
SP24_KN_CONFIGS(SP24_EXTERN_KN)

namespace jax_sparse24 {
namespace {

using namespace cute;
using spmm::GemmCall;
using spmm::kAlignK;
using spmm::kAlignM;
using spmm::kAlignN;
using spmm::kInt32Max;
using spmm::ProblemShape;
using spmm::RunFn;
using spmm::StatusStr;

// The SparseConfig (compressed layout) of an operand dtype: bf16/fp16 from the 16-bit GEMMs, fp8 e4m3
// from the fp8 GEMMs (spmm_cutlass_fp8.cuh).
template <class T>
struct LayoutOf {
  using SparseConfig = typename spmm::ReferenceConfig<T>::SparseConfig;
};
template <>
struct LayoutOf<cutlass::float_e4m3_t> {
  using SparseConfig = typename spmm::ReferenceFp8Config::SparseConfig;
};

template <class T>
struct Compressor {
  using SparseConfig = typename LayoutOf<T>::SparseConfig;
  using LayoutTag = cutlass::layout::RowMajor;
  using StrideA = cutlass::gemm::TagToStrideA_t<LayoutTag>;
  using Utility =
      cutlass::transform::kernel::StructuredSparseCompressorUtility<ProblemShape, T, LayoutTag, SparseConfig>;
  using Kernel = cutlass::transform::kernel::StructuredSparseCompressor<ProblemShape, T, LayoutTag, SparseConfig,
                                                                         cutlass::arch::Sm90>;
  using Adapter = cutlass::transform::device::TransformUniversalAdapter<Kernel>;
};

// ------------------------------------------------------------------------------------------------
// Per-device hardware info, queried once (the persistent tile scheduler sizes its grid from it).

// ------------------------------------------------------------------------------------------------
// Configuration registry: one line per configuration, id = position. Names follow
// "<schedule>_<tile M>x<tile N>x<tile K>_c<cluster M>x<cluster N>" with M = O, N = T, K = I.
struct ConfigEntry {
  const char* name;
  RunFn run[2];  // [bfloat16, float16]; nullptr where not compiled
};

#if SP24_MINIMAL
#define SP24_F16_RUN(LAYOUT_B, SCHED, TM, TN, TK, CM, CN) nullptr
#else
#define SP24_F16_RUN(LAYOUT_B, SCHED, TM, TN, TK, CM, CN) \
  &spmm::RunGemm<SP24_CFG_T(cutlass::half_t, LAYOUT_B, SCHED, TM, TN, TK, CM, CN)>
#endif
#define SP24_CONFIG_ENTRY(LAYOUT_B, SCHED, TM, TN, TK, CM, CN)                                  \
  ConfigEntry{#SCHED "_" #TM "x" #TN "x" #TK "_c" #CM "x" #CN,                                  \
              {&spmm::RunGemm<SP24_CFG_T(cutlass::bfloat16_t, LAYOUT_B, SCHED, TM, TN, TK, CM, CN)>, \
               SP24_F16_RUN(LAYOUT_B, SCHED, TM, TN, TK, CM, CN)}},
#define SP24_NK_ENTRY(SCHED, TM, TN, TK, CM, CN) SP24_CONFIG_ENTRY(SP24_LAYOUT_NK, SCHED, TM, TN, TK, CM, CN)

#define SP24_KN_ENTRY(SCHED, TM, TN, TK, CM, CN) SP24_CONFIG_ENTRY(SP24_LAYOUT_KN, SCHED, TM, TN, TK, CM, CN)

// "nk" (B stored N x K). Minimal (CI) build: one ping-pong and one cooperative configuration, bf16.
const ConfigEntry kConfigs[] = {SP24_NK_CONFIGS(SP24_NK_ENTRY)};
constexpr int kNumConfigs = static_cast<int>(sizeof(kConfigs) / sizeof(kConfigs[0]));
// "kn" (B stored K x N; weight gradient). None in the minimal build (the sentinel keeps the array
// non-empty).
const ConfigEntry kKnConfigs[] = {SP24_KN_CONFIGS(SP24_KN_ENTRY) ConfigEntry{nullptr, {nullptr, nullptr}}};
constexpr int kNumKnConfigs = static_cast<int>(sizeof(kKnConfigs) / sizeof(kKnConfigs[0])) - 1;

int ConfigId(const char* name) {
  for (int i = 0; i < kNumConfigs; ++i) {
    if (std::string(kConfigs[i].name) == name) return i;
  }
  return -1;
}

int KnConfigId(const char* name) {
  for (int i = 0; i < kNumKnConfigs; ++i) {
    if (std::string(kKnConfigs[i].name) == name) return i;
  }
  return -1;
}

// ------------------------------------------------------------------------------------------------
// Metadata fix-up. CUTLASS's compressor writes metadata nibble 0b0000 (index pair (0, 0)) for a
// group of 4 with no nonzero (all-zero groups, and the zero padding of K and M). Hopper's sparse
// MMA only defines the pairs (0,1)=0x4 (0,2)=0x8 (0,3)=0xC (1,2)=0x9 (1,3)=0xD (2,3)=0xE, so we
// rewrite 0x0 to 0x4: the two stored values of such a group are zero, so the product is the same.
// The metadata is 1/16 of the dense operand's bytes; this pass reads and writes it once.
__device__ __forceinline__ uint32_t FixNibbles(uint32_t w) {
  uint32_t t = w | (w >> 1);
  t |= t >> 2;                                         // bit 0 of each nibble: nibble != 0
  const uint32_t zero = ~t & 0x11111111u;              // bit 0 of each nibble: nibble == 0
  return w | (zero << 2);                              // 0x0 -> 0x4
}

__global__ void FixMetadataKernel(uint4* __restrict__ meta, size_t n_vec) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n_vec; i += size_t(gridDim.x) * blockDim.x) {
    uint4 v = meta[i];
    v.x = FixNibbles(v.x);
    v.y = FixNibbles(v.y);
    v.z = FixNibbles(v.z);
    v.w = FixNibbles(v.w);
    meta[i] = v;
  }
}

// ------------------------------------------------------------------------------------------------
// Shapes and validation shared by the handlers.
// Operand dtype codes (also the `dtype` argument of cutlass_compressed_shapes): 0 bfloat16,
// 1 float16, 2 float8_e4m3fn (the fp8 GEMMs' operands; the compressor and shapes only here).
int DtypeIndex(ffi::DataType t) {
  if (t == ffi::DataType::BF16) return 0;
  if (t == ffi::DataType::F16) return 1;
  return -1;
}

int CompressDtypeIndex(ffi::DataType t) {
  if (t == ffi::DataType::F8E4M3FN) return 2;
  return DtypeIndex(t);
}

bool DtypeCompiled(int dtype) {
  if (dtype == 0 || dtype == 2) return true;
  return dtype == 1 && !SP24_MINIMAL;
}

template <class T>
CompressedShapes ShapesFor(int64_t m, int64_t k) {
  const ProblemShape problem{static_cast<int>(m), 1, static_cast<int>(k), 1};
  const typename Compressor<T>::StrideA stride_a =
      cutlass::make_cute_packed_stride(typename Compressor<T>::StrideA{}, cute::make_shape(int(m), int(k), 1));
  typename Compressor<T>::Utility util(problem, stride_a);
  CompressedShapes s;
  s.values_rows = util.get_tensorA_m_physical();
  s.values_cols = util.get_tensorA_k_physical();
  s.meta_rows = util.get_metadata_m_physical();
  s.meta_cols = util.get_metadata_k_physical();
  return s;
}


std::string AlignmentString() {
  return "m % " + std::to_string(kAlignM) + " == 0, n % " + std::to_string(kAlignN) + " == 0, k % " +
         std::to_string(kAlignK) + " == 0";
}

// ------------------------------------------------------------------------------------------------
template <class T>
ffi::Error RunCompress(cudaStream_t stream, int device, int sm_count, const void* a, void* values, void* meta,
                       int m, int k, size_t meta_bytes) {
  using C = Compressor<T>;
  const ProblemShape problem{m, 1, k, 1};
  const typename C::StrideA stride_a =
      cutlass::make_cute_packed_stride(typename C::StrideA{}, cute::make_shape(m, k, 1));
  cutlass::KernelHardwareInfo hw_info;
  hw_info.device_id = device;
  hw_info.sm_count = sm_count;
  typename C::Adapter::Arguments args{problem, {a, stride_a, values, meta}, hw_info};

  typename C::Adapter op;
  cutlass::Status st = op.can_implement(args);
  if (st != cutlass::Status::kSuccess) {
    return InvalidArgument("CUTLASS sparse compressor cannot implement m=" + std::to_string(m) +
                           " k=" + std::to_string(k) + " (can_implement: " + StatusStr(st) + ")");
  }
  // The compressor needs no device workspace: its get_workspace_size() reports the size of its
  // shared-memory staging buffer for backward compatibility with the host compressor, and the
  // kernel never reads Params::workspace (transform/kernel/sm90_sparse_gemm_compressor.hpp). So no
  // scratch allocation: that keeps this handler allocation-free (command-buffer compatible).
  st = op.initialize(args, /*workspace=*/nullptr, stream);
  if (st != cutlass::Status::kSuccess) {
    return Internal("CUTLASS TransformUniversalAdapter::initialize (sparse compressor) failed: " + StatusStr(st));
  }
  st = op.run(stream);
  if (st != cutlass::Status::kSuccess) {
    cudaError_t err = cudaGetLastError();
    return Internal("CUTLASS TransformUniversalAdapter::run (sparse compressor) failed: " + StatusStr(st) +
                    " (last CUDA error: " + cudaGetErrorName(err) + ")");
  }
  SP24_CHECK_LAUNCH("the CUTLASS sparse compressor kernel");

  // Every byte of both outputs is written by the compressor (it covers the padded metadata atoms
  // and the K padding of the values), so no memset is needed; then fix the all-zero-group nibbles.
  const size_t n_vec = meta_bytes / sizeof(uint4);
  if (n_vec > 0) {
    constexpr int kThreads = 256;
    const size_t want = (n_vec + kThreads - 1) / kThreads;
    const int blocks = static_cast<int>(std::min<size_t>(want, size_t(sm_count) * 16));
    FixMetadataKernel<<<blocks, kThreads, 0, stream>>>(static_cast<uint4*>(meta), n_vec);
    SP24_CHECK_LAUNCH("FixMetadataKernel");
  }
  return ffi::Error::Success();
}

ffi::Error CompressImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer a, ffi::Result<ffi::AnyBuffer> values,
                        ffi::Result<ffi::AnyBuffer> meta) {
  const int dtype = CompressDtypeIndex(a.element_type());
  if (dtype < 0) {
    return InvalidArgument(std::string("cutlass_compress: a must be bfloat16, float16 or float8_e4m3fn, got ") +
                           DataTypeName(a.element_type()));
  }
  if (values->element_type() != a.element_type()) {
    return InvalidArgument(std::string("cutlass_compress: values must have a's dtype ") +
                           DataTypeName(a.element_type()) + ", got " + DataTypeName(values->element_type()));
  }
  if (meta->element_type() != ffi::DataType::U8) {
    return InvalidArgument(std::string("cutlass_compress: meta must be uint8, got ") +
                           DataTypeName(meta->element_type()));
  }
  const auto dims = a.dimensions();
  if (dims.size() != 2) {
    return InvalidArgument("cutlass_compress: a must be 2-D (m, k), got shape " + DimsString(dims));
  }
  const int64_t m = dims[0], k = dims[1];
  CompressedShapes s;
  std::string error;
  if (!CutlassCompressedShapes(m, k, dtype, &s, &error)) return InvalidArgument("cutlass_compress: " + error);
  if (!Is2D(values->dimensions(), s.values_rows, s.values_cols)) {
    return InvalidArgument("cutlass_compress: values must have shape " + Shape2(s.values_rows, s.values_cols) +
                           ", got " + DimsString(values->dimensions()));
  }
  if (!Is2D(meta->dimensions(), s.meta_rows, s.meta_cols)) {
    return InvalidArgument("cutlass_compress: meta must have shape " + Shape2(s.meta_rows, s.meta_cols) +
                           ", got " + DimsString(meta->dimensions()));
  }
  if (!Aligned16(a.untyped_data()) || !Aligned16(values->untyped_data()) || !Aligned16(meta->untyped_data())) {
    return InvalidArgument("cutlass_compress: buffers must be 16-byte aligned");
  }
  int sm_count = 0;
  SP24_RETURN_IF_ERROR(SmCount(device, &sm_count));
  const size_t meta_bytes = size_t(s.meta_rows) * size_t(s.meta_cols);
  if (dtype == 0) {
    return RunCompress<cutlass::bfloat16_t>(stream, device, sm_count, a.untyped_data(), values->untyped_data(),
                                            meta->untyped_data(), int(m), int(k), meta_bytes);
  }
  if (dtype == 2) {
    return RunCompress<cutlass::float_e4m3_t>(stream, device, sm_count, a.untyped_data(), values->untyped_data(),
                                              meta->untyped_data(), int(m), int(k), meta_bytes);
  }
#if !SP24_MINIMAL
  return RunCompress<cutlass::half_t>(stream, device, sm_count, a.untyped_data(), values->untyped_data(),
                                      meta->untyped_data(), int(m), int(k), meta_bytes);
#else
  return InvalidArgument("cutlass_compress: float16 kernels are not compiled in this (minimal) build");
#endif
}

int CutlassDefaultConfigAny(bool kn, int64_t m, int64_t n, int64_t k);

// kn = false: b is (n, k) row-major ("nk"); kn = true: b is (k, n) row-major ("kn").
ffi::Error SpmmAny(bool kn, cudaStream_t stream, ffi::ScratchAllocator& scratch, int32_t device,
                   const ffi::AnyBuffer& values, const ffi::AnyBuffer& meta, const ffi::AnyBuffer& b,
                   ffi::AnyBuffer& d, int64_t m, int64_t n, int64_t k, int64_t config, int64_t raster,
                   int64_t swizzle) {
  const std::string op = kn ? "cutlass_spmm_kn" : "cutlass_spmm";
  const ConfigEntry* table = kn ? kKnConfigs : kConfigs;
  const int num_configs = kn ? kNumKnConfigs : kNumConfigs;
  const int dtype = DtypeIndex(b.element_type());
  if (dtype < 0) {
    return InvalidArgument(op + ": b must be bfloat16 or float16, got " + DataTypeName(b.element_type()));
  }
  if (values.element_type() != b.element_type() || d.element_type() != b.element_type()) {
    return InvalidArgument(op + ": values, b and d must have one dtype, got values " +
                           DataTypeName(values.element_type()) + ", b " + DataTypeName(b.element_type()) + ", d " +
                           DataTypeName(d.element_type()));
  }
  if (meta.element_type() != ffi::DataType::U8) {
    return InvalidArgument(op + ": meta must be uint8, got " + DataTypeName(meta.element_type()));
  }
  if (m <= 0 || n <= 0 || k <= 0 || m > kInt32Max || n > kInt32Max || k > kInt32Max) {
    return InvalidArgument(op + ": m, n, k must be in [1, 2^31), got m=" + std::to_string(m) +
                           " n=" + std::to_string(n) + " k=" + std::to_string(k));
  }
  if (m % kAlignM || n % kAlignN || k % kAlignK) {
    return InvalidArgument(op + ": the CUTLASS sparse GEMM needs " + AlignmentString() + ", got m=" +
                           std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k));
  }
  if (kn ? !Is2D(b.dimensions(), k, n) : !Is2D(b.dimensions(), n, k)) {
    return InvalidArgument(op + (kn ? ": b must have shape (k, n) = " + Shape2(k, n)
                                    : ": b must have shape (n, k) = " + Shape2(n, k)) +
                           ", got " + DimsString(b.dimensions()));
  }
  if (!Is2D(d.dimensions(), n, m)) {
    return InvalidArgument(op + ": d must have shape (n, m) = " + Shape2(n, m) + ", got " +
                           DimsString(d.dimensions()));
  }
  SP24_RETURN_IF_ERROR(CheckCompressedOperand(op, m, k, dtype, values.dimensions(), meta.dimensions()));
  if (num_configs == 0) {
    return InvalidArgument(op + ": no configuration of this formulation is compiled in this (minimal) build");
  }
  if (config < -1 || config >= num_configs) {
    return InvalidArgument(op + ": config must be -1 (default) or in [0, " + std::to_string(num_configs) +
                           "), got " + std::to_string(config));
  }
  if (raster < 0 || raster > 2) {
    return InvalidArgument(op + ": raster must be 0 (heuristic), 1 (along m) or 2 (along n), got " +
                           std::to_string(raster));
  }
  if (swizzle != 1 && swizzle != 2 && swizzle != 4 && swizzle != 8) {
    return InvalidArgument(op + ": swizzle must be 1, 2, 4 or 8, got " + std::to_string(swizzle));
  }
  const int cfg = config == -1 ? CutlassDefaultConfigAny(kn, m, n, k) : static_cast<int>(config);
  if (cfg < 0 || cfg >= num_configs) return Internal("default configuration out of range");
  const RunFn run = table[cfg].run[dtype];
  if (run == nullptr) {
    return InvalidArgument(op + ": config " + std::to_string(cfg) + " '" + table[cfg].name +
                           "' is not compiled for " + DataTypeName(b.element_type()) + " in this build");
  }
  if (!Aligned16(values.untyped_data()) || !Aligned16(meta.untyped_data()) || !Aligned16(b.untyped_data()) ||
      !Aligned16(d.untyped_data())) {
    return InvalidArgument(op + ": buffers must be 16-byte aligned");
  }
  GemmCall call;
  call.stream = stream;
  call.scratch = &scratch;
  call.device = device;
  SP24_RETURN_IF_ERROR(SmCount(device, &call.sm_count));
  call.values = values.untyped_data();
  call.meta = meta.untyped_data();
  call.b = b.untyped_data();
  call.d = d.untyped_data();
  call.m = static_cast<int>(m);
  call.n = static_cast<int>(n);
  call.k = static_cast<int>(k);
  call.config_name = table[cfg].name;
  call.raster = static_cast<int>(raster);
  call.swizzle = static_cast<int>(swizzle);
  return run(call);
}

ffi::Error SpmmImpl(cudaStream_t stream, ffi::ScratchAllocator scratch, int32_t device, ffi::AnyBuffer values,
                    ffi::AnyBuffer meta, ffi::AnyBuffer b, ffi::Result<ffi::AnyBuffer> d, int64_t m, int64_t n,
                    int64_t k, int64_t config, int64_t raster, int64_t swizzle) {
  return SpmmAny(false, stream, scratch, device, values, meta, b, *d, m, n, k, config, raster, swizzle);
}

ffi::Error SpmmKnImpl(cudaStream_t stream, ffi::ScratchAllocator scratch, int32_t device, ffi::AnyBuffer values,
                      ffi::AnyBuffer meta, ffi::AnyBuffer b, ffi::Result<ffi::AnyBuffer> d, int64_t m, int64_t n,
                      int64_t k, int64_t config, int64_t raster, int64_t swizzle) {
  return SpmmAny(true, stream, scratch, device, values, meta, b, *d, m, n, k, config, raster, swizzle);
}

// ------------------------------------------------------------------------------------------------
// Default configuration: the measured table (DESIGN.md, "GPU kernels", sweep on the lent H100,
// bf16, same run as cuBLAS), keyed on (M = O, N = T, K = I) of the forward formulation.
struct MeasuredShape {
  double m, n, k;
  const char* best;       // fastest configuration
  const char* runner_up;  // used when `best` is not compiled (minimal builds)
};

const MeasuredShape kMeasured[] = {
    // bench_spmm on the H100, bf16 (benchmarks/results/spmm.md): (T, I, O) best (speedup); runner-up
    // (8192, 768, 3072): ping-pong 128x128 c1x2 1.04x; cooperative 256x128 c1x1 1.00x
    {3072, 8192, 768, "pingpong_128x128x128_c1x2", "cooperative_256x128x128_c1x1"},
    // (8192, 3072, 768): stream-K 128x128 1.16x; cooperative 128x128 c2x1 1.14x
    {768, 8192, 3072, "cooperative_streamk_128x128x128_c1x1", "cooperative_128x128x128_c2x1"},
    // (8192, 1280, 5120): cooperative 256x128 c1x1 1.12x; cooperative 256x128 c2x1 1.08x
    {5120, 8192, 1280, "cooperative_256x128x128_c1x1", "cooperative_256x128x128_c2x1"},
    // (8192, 5120, 1280): stream-K 128x128 1.23x; cooperative 128x128 c2x1 1.17x
    {1280, 8192, 5120, "cooperative_streamk_128x128x128_c1x1", "cooperative_128x128x128_c2x1"},
    // (13008, 1024, 4096): ping-pong 128x128 c1x2 1.15x; cooperative 256x128 c1x1 1.15x
    {4096, 13008, 1024, "pingpong_128x128x128_c1x2", "cooperative_256x128x128_c1x1"},
    // (8192, 2048, 8192): cooperative 256x128 c2x1 1.29x; c1x1 1.28x
    {8192, 8192, 2048, "cooperative_256x128x128_c2x1", "cooperative_256x128x128_c1x1"},
    // (8192, 8192, 2048): cooperative 256x128 c2x1 1.47x; c1x1 1.45x
    {2048, 8192, 8192, "cooperative_256x128x128_c2x1", "cooperative_256x128x128_c1x1"},
    // (8192, 4096, 16384): cooperative 256x128 c1x1 1.30x; c2x1 1.29x
    {16384, 8192, 4096, "cooperative_256x128x128_c1x1", "cooperative_256x128x128_c2x1"},
    // (8192, 16384, 4096): cooperative 256x128 c2x1 1.55x; c1x1 1.47x
    {4096, 8192, 16384, "cooperative_256x128x128_c2x1", "cooperative_256x128x128_c1x1"},
    // (16384, 4096, 11008): cooperative 256x128 c2x1 1.32x (1.39x the run before); c1x1 1.33x
    {11008, 16384, 4096, "cooperative_256x128x128_c2x1", "cooperative_256x128x128_c1x1"},
    // (8192, 8192, 8192): cooperative 256x128 c2x1 1.46x; c1x1 1.43x
    {8192, 8192, 8192, "cooperative_256x128x128_c2x1", "cooperative_256x128x128_c1x1"},
};

}  // namespace

// ------------------------------------------------------------------------------------------------
// Host interface (spmm_cutlass.h).

bool CutlassCompressedShapes(int64_t m, int64_t k, int dtype, CompressedShapes* out, std::string* error) {
  if (dtype != 0 && dtype != 1 && dtype != 2) {
    *error = "dtype must be 0 (bfloat16), 1 (float16) or 2 (float8_e4m3fn), got " + std::to_string(dtype);
    return false;
  }
  if (!DtypeCompiled(dtype)) {
    *error = "float16 kernels are not compiled in this (minimal) build";
    return false;
  }
  if (m <= 0 || k <= 0 || m > kInt32Max || k > kInt32Max) {
    *error = "m and k must be in [1, 2^31), got m=" + std::to_string(m) + " k=" + std::to_string(k);
    return false;
  }
  const int64_t align_m = dtype == 2 ? spmm::kFp8AlignM : kAlignM;
  const int64_t align_k = dtype == 2 ? spmm::kFp8AlignK : kAlignK;
  if (m % align_m || k % align_k) {
    *error = std::string("the CUTLASS ") + (dtype == 2 ? "fp8 " : "") + "sparse GEMM needs m % " +
             std::to_string(align_m) + " == 0 and k % " + std::to_string(align_k) +
             " == 0 for its 2:4 operand, got m=" + std::to_string(m) + " k=" + std::to_string(k);
    return false;
  }
  // CUTLASS's layouts hold the (padded: 64 rows, 128 columns) extents as int32.
  if (m > kInt32Max - 256 || k > kInt32Max - 256) {
    *error = "operand too large for 32-bit CUTLASS layouts: m=" + std::to_string(m) + " k=" + std::to_string(k);
    return false;
  }
  *out = dtype == 0   ? ShapesFor<cutlass::bfloat16_t>(m, k)
         : dtype == 1 ? ShapesFor<cutlass::half_t>(m, k)
                      : ShapesFor<cutlass::float_e4m3_t>(m, k);
  return true;
}

std::vector<std::string> CutlassConfigNames() {
  std::vector<std::string> names;
  names.reserve(kNumConfigs);
  for (const ConfigEntry& c : kConfigs) names.emplace_back(c.name);
  return names;
}

int CutlassDefaultConfig(int64_t m, int64_t n, int64_t k) {
  // Nearest measured shape in log space. M and K (the weight's shape) decide the schedule in the
  // sweep; N (tokens) was 8192-16384 there and weighs half.
  const double lm = std::log2(double(std::max<int64_t>(m, 1)));
  const double ln = std::log2(double(std::max<int64_t>(n, 1)));
  const double lk = std::log2(double(std::max<int64_t>(k, 1)));
  const MeasuredShape* best = &kMeasured[0];
  double best_d = std::numeric_limits<double>::infinity();
  for (const MeasuredShape& s : kMeasured) {
    const double d = std::fabs(lm - std::log2(s.m)) + std::fabs(lk - std::log2(s.k)) +
                     0.5 * std::fabs(ln - std::log2(s.n));
    if (d < best_d) {
      best_d = d;
      best = &s;
    }
  }
  int id = ConfigId(best->best);
  if (id < 0) id = ConfigId(best->runner_up);
  // In a minimal build neither may be compiled: 256-row tiles where the table wants a large
  // cooperative tile, else the ping-pong 128x128 tile (always compiled, id 0).
  if (id < 0 && std::string(best->best).rfind("cooperative_256", 0) == 0) id = ConfigId("cooperative_256x128x128_c2x1");
  if (id < 0) id = 0;
  return id;
}

std::tuple<int64_t, int64_t, int64_t> CutlassAlignment() { return {kAlignM, kAlignN, kAlignK}; }

std::vector<std::string> CutlassConfigNamesKN() {
  std::vector<std::string> names;
  names.reserve(kNumKnConfigs);
  for (int i = 0; i < kNumKnConfigs; ++i) names.emplace_back(kKnConfigs[i].name);
  return names;
}

// "kn" (weight gradient: M = O, N = I, K = T, K long). Not yet measured: large outputs take the
// cooperative 256x128 tile (the forward sweep's winner at large M x N), the others ping-pong
// 128x128 (its winner at GPT-2 widths). Returns -1 when no "kn" configuration is compiled.
int CutlassDefaultConfigKN(int64_t m, int64_t n, int64_t k) {
  (void)k;
  if (kNumKnConfigs == 0) return -1;
  int id = -1;
  if (double(m) * double(n) >= 4096.0 * 4096.0) id = KnConfigId("cooperative_256x128x128_c2x1");
  if (id < 0) id = KnConfigId("pingpong_128x128x128_c1x2");
  return id < 0 ? 0 : id;
}

namespace {
int CutlassDefaultConfigAny(bool kn, int64_t m, int64_t n, int64_t k) {
  return kn ? CutlassDefaultConfigKN(m, n, k) : CutlassDefaultConfig(m, n, k);
}
}  // namespace

}  // namespace jax_sparse24

// ------------------------------------------------------------------------------------------------
// Handler symbols (exported to Python as capsules by module.cc).

// a (m, k) bf16/f16, ALREADY 2:4 along k (each group of 4 consecutive elements along k has at most
// two nonzeros; -0.0 counts as zero) -> values (same dtype) and meta (uint8) in the layout the SM90
// sparse GEMM reads (shapes from CutlassCompressedShapes). A group with more than two nonzeros
// gives undefined values and metadata: the caller must pass W * mask.
XLA_FFI_DEFINE_HANDLER_SYMBOL(Sparse24CutlassCompress, jax_sparse24::CompressImpl,
                              ::xla::ffi::Ffi::Bind()
                                  .Ctx<::xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<::xla::ffi::DeviceOrdinal>()
                                  .Arg<::xla::ffi::AnyBuffer>()   // a
                                  .Ret<::xla::ffi::AnyBuffer>()   // values
                                  .Ret<::xla::ffi::AnyBuffer>(),  // meta
                              {::xla::ffi::Traits::kCmdBufferCompatible});

// d (n, m) = A (m x k, compressed values + meta) * B, with b stored (n, k) row-major.
XLA_FFI_DEFINE_HANDLER_SYMBOL(Sparse24CutlassSpmm, jax_sparse24::SpmmImpl,
                              ::xla::ffi::Ffi::Bind()
                                  .Ctx<::xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<::xla::ffi::ScratchAllocator>()
                                  .Ctx<::xla::ffi::DeviceOrdinal>()
                                  .Arg<::xla::ffi::AnyBuffer>()  // values
                                  .Arg<::xla::ffi::AnyBuffer>()  // meta
                                  .Arg<::xla::ffi::AnyBuffer>()  // b
                                  .Ret<::xla::ffi::AnyBuffer>()  // d
                                  .Attr<int64_t>("m")
                                  .Attr<int64_t>("n")
                                  .Attr<int64_t>("k")
                                  .Attr<int64_t>("config")
                                  .Attr<int64_t>("raster")    // tile order: 0 heuristic, 1 along m, 2 along n
                                  .Attr<int64_t>("swizzle"),  // 1, 2, 4, 8
                              {::xla::ffi::Traits::kCmdBufferCompatible});

// d (n, m) = A (m x k, compressed values + meta) * B, with b stored (k, n) row-major (N-major): the
// weight gradient dW (I, O) = x^T MVUE(dy) with A = MVUE(dy)^T (O, T), b = x (T, I).
XLA_FFI_DEFINE_HANDLER_SYMBOL(Sparse24CutlassSpmmKN, jax_sparse24::SpmmKnImpl,
                              ::xla::ffi::Ffi::Bind()
                                  .Ctx<::xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<::xla::ffi::ScratchAllocator>()
                                  .Ctx<::xla::ffi::DeviceOrdinal>()
                                  .Arg<::xla::ffi::AnyBuffer>()  // values
                                  .Arg<::xla::ffi::AnyBuffer>()  // meta
                                  .Arg<::xla::ffi::AnyBuffer>()  // b (k, n)
                                  .Ret<::xla::ffi::AnyBuffer>()  // d (n, m)
                                  .Attr<int64_t>("m")
                                  .Attr<int64_t>("n")
                                  .Attr<int64_t>("k")
                                  .Attr<int64_t>("config")
                                  .Attr<int64_t>("raster")    // tile order: 0 heuristic, 1 along m, 2 along n
                                  .Attr<int64_t>("swizzle"),  // 1, 2, 4, 8
                              {::xla::ffi::Traits::kCmdBufferCompatible});
