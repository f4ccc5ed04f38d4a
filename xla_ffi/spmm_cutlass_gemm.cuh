// The CUTLASS 3.x SM90 2:4 sparse GEMM configuration template, shared by the registry TU
// (spmm_cutlass.cu, which only declares the instantiations `extern`) and the per-configuration TUs
// (spmm_cfg_*.cu, one per configuration, bf16 + fp16), so a build compiles the configurations in
// parallel.
//
// Formulations (D is always stored as an N x M row-major array = column-major M x N):
//   "nk": B stored as an N x K row-major array (column-major K x N, K-major). Forward y = x W~
//         (A = W~^T (O, I), B = x (T, I), D = y (T, O)) and input grad dx = dy W~^T (A = W~, B = dy).
//   "kn": B stored as a K x N row-major array (N-major, "MN-major" for TMA/GMMA). Weight grad
//         dW (I, O) = x^T MVUE(dy): A = MVUE(dy)^T (O, T) compressed, B = x (T, I), D = dW (I, O).
// A is row-major M x K (K-major), compressed (values + metadata in CUTLASS's SM90 layout).
//
// Kernels: bf16 / fp16 operands and output, fp32 accumulation, alpha = 1, beta = 0, no C operand.
#pragma once

// Device-side asserts in CUTLASS/CuTe are calls: inside the GMMA mainloop they make ptxas serialise
// the wgmma pipeline (warning C7510, seen compiling without NDEBUG). CMake Release builds pass
// -DNDEBUG; these files must not depend on the build type, so the header defines it itself.
#ifndef NDEBUG
#define NDEBUG 1
#endif

#include <cuda_runtime.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/kernel_hardware_info.h"
#include "cutlass/util/packed_stride.hpp"

#include "ffi_common.h"

#if !defined(CUTLASS_ARCH_MMA_SPARSE_SM90_SUPPORTED)
#error "the CUTLASS SM90 sparse GEMM needs nvcc >= 12.2 (CUTLASS_ARCH_MMA_SPARSE_SM90_SUPPORTED)"
#endif

#if defined(JAX_SPARSE24_MINIMAL_CONFIGS) && JAX_SPARSE24_MINIMAL_CONFIGS
#define SP24_MINIMAL 1
#else
#define SP24_MINIMAL 0
#endif

// ------------------------------------------------------------------------------------------------
// The configurations. X(SCHED, TM, TN, TK, CM, CN); names "<schedule>_<TM>x<TN>x<TK>_c<CM>x<CN>"
// (tile M x N x K of the sparse GEMM, cluster M x N). Each line needs its TU: xla_ffi/spmm_cfg_<name>.cu
// ("nk") or xla_ffi/spmm_cfg_kn_<name>.cu ("kn"), listed in CMakeLists.txt. The minimal (CI) build
// compiles the two "nk" bf16 configurations of SP24_NK_CONFIGS_MINIMAL and no "kn" configuration.
#define SP24_NK_CONFIGS_MINIMAL(X) \
  X(pingpong, 128, 128, 128, 1, 2)  \
  X(cooperative, 256, 128, 128, 2, 1)

#define SP24_NK_CONFIGS_ALL(X)       \
  X(pingpong, 128, 128, 128, 1, 2)    \
  X(cooperative, 128, 128, 128, 2, 1) \
  X(cooperative, 256, 128, 128, 2, 1) \
  X(cooperative, 256, 128, 128, 1, 1) \
  X(cooperative, 128, 256, 128, 1, 2) \
  X(cooperative_streamk, 128, 128, 128, 1, 1)

// Weight-gradient formulation (M = O, N = I, K = T: long K). Untuned first set: the shapes of the
// forward sweep's winners.
#define SP24_KN_CONFIGS_ALL(X)       \
  X(pingpong, 128, 128, 128, 1, 2)    \
  X(cooperative, 256, 128, 128, 2, 1) \
  X(cooperative, 128, 256, 128, 1, 2)

#if SP24_MINIMAL
#define SP24_NK_CONFIGS(X) SP24_NK_CONFIGS_MINIMAL(X)
#define SP24_KN_CONFIGS(X)
#else
#define SP24_NK_CONFIGS(X) SP24_NK_CONFIGS_ALL(X)
#define SP24_KN_CONFIGS(X) SP24_KN_CONFIGS_ALL(X)
#endif

namespace jax_sparse24 {
namespace spmm {

using namespace cute;

// ------------------------------------------------------------------------------------------------
// Alignment. CUTLASS's can_implement for these kernels needs (TMA: 16-byte aligned strides):
//   k % 16: the compressed A has K/2 columns (16 bytes = 8 elements), an "nk" B has K columns;
//   m % 8:  D is column-major M x N (stored N x M), its leading dimension M needs 16 bytes;
//   n % 8:  a "kn" B is N-major (leading dimension N); for "nk" N is only an outer dimension
//           (conservative: CUTLASS's own sparse tests use multiples of 16; relax after a GPU test).
// Residues (M, N not multiples of the tile, K not a multiple of 128) are handled by TMA
// out-of-bounds zero fill and clipped stores.
constexpr int64_t kAlignM = 8;
constexpr int64_t kAlignN = 8;
constexpr int64_t kAlignK = 16;
// Operand alignments as CUTLASS template parameters (elements): A's 16 mirrors the compressed
// K/2 stride rule above (CUTLASS's sparse unit tests use 16 too).
constexpr int kAlignmentA = 16;
constexpr int kAlignmentB = 8;
constexpr int kAlignmentD = 8;

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

// Schedules. The token is used for the configuration name ("pingpong_128x128x128_c1x2").
struct pingpong {
  using Kernel = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
  using Epilogue = cutlass::epilogue::TmaWarpSpecialized;
  using Scheduler = void;  // CUTLASS's default persistent tile scheduler
};
struct cooperative {
  using Kernel = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
  using Epilogue = cutlass::epilogue::TmaWarpSpecializedCooperative;
  using Scheduler = void;
};
// Stream-K: work units split along K across CTAs (partial tiles reduced through a workspace), for
// the wave quantisation of small-K GEMMs (GPT-2 FFN shapes: K = 768..1280, ~10 K-blocks per tile).
struct cooperative_streamk {
  using Kernel = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
  using Epilogue = cutlass::epilogue::TmaWarpSpecializedCooperative;
  using Scheduler = cutlass::gemm::StreamKScheduler;
};

using ProblemShape = Shape<int, int, int, int>;  // (M, N, K, L)

// LayoutB: ColumnMajor = "nk" (B stored N x K row-major), RowMajor = "kn" (B stored K x N row-major).
template <class T, class TileShape, class ClusterShape, class Schedule, class LayoutB_ = cutlass::layout::ColumnMajor>
struct SparseGemmConfig;

// The compressed layout depends only on the element type, A's majorness (K) and min(tile K, 128);
// every configuration has tile K = 128, so one compressor per dtype serves them all
// (static_assert'ed per configuration in RunGemm).
template <class T>
using ReferenceConfig = SparseGemmConfig<T, Shape<_128, _128, _128>, Shape<_1, _2, _1>, pingpong>;

// What RunGemm reads of a configuration: ElementA/B/D, Gemm, GemmKernel, SparseConfig,
// LayoutReference (the configuration whose compressed layout it must share) and kKind (in errors).
template <class T, class TileShape, class ClusterShape, class Schedule, class LayoutB_>
struct SparseGemmConfig {
  using ElementA = T;
  using ElementB = T;
  using ElementD = T;
  using LayoutReference = ReferenceConfig<T>;
  static constexpr const char* kKind = "";
  using LayoutA = cutlass::layout::RowMajor;     // M x K, K-major (compressed by CUTLASS's layout)
  using LayoutB = LayoutB_;
  using LayoutD = cutlass::layout::ColumnMajor;  // M x N column-major == N x M row-major

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto,
      float, float,                   // accumulator, epilogue compute
      void, LayoutD, kAlignmentD,     // no C operand
      T, LayoutD, kAlignmentD,        // D
      typename Schedule::Epilogue>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassSparseTensorOp,
      T, LayoutA, kAlignmentA,
      T, LayoutB, kAlignmentB,
      float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<
          static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
      typename Schedule::Kernel>::CollectiveOp;

  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue,
                                                          typename Schedule::Scheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;
  using SparseConfig = typename CollectiveMainloop::SparseConfig;
};

// ------------------------------------------------------------------------------------------------
// GEMM launch.
struct GemmCall {
  cudaStream_t stream;
  ffi::ScratchAllocator* scratch;
  int device;
  int sm_count;
  const void* values;
  const void* meta;
  const void* b;
  void* d;
  int m, n, k;
  const char* config_name;
  // Tile order of the persistent scheduler (both schedulers take it): raster 0 = CUTLASS's
  // heuristic, 1 = along M, 2 = along N; swizzle = 1, 2, 4 or 8 tiles per swizzle band. Validated
  // by the handler.
  int raster = 0;
  int swizzle = 1;
  // Device pointer of the epilogue's alpha (float32; the fp8 GEMM's product of scales), or nullptr
  // for alpha = 1.
  const float* alpha = nullptr;
};

using RunFn = ffi::Error (*)(const GemmCall&);

inline std::string StatusStr(cutlass::Status s) { return cutlassGetStatusString(s); }

template <class Cfg>
ffi::Error RunGemm(const GemmCall& c) {
  using Gemm = typename Cfg::Gemm;
  using GemmKernel = typename Cfg::GemmKernel;
  static_assert(std::is_same_v<typename Cfg::SparseConfig, typename Cfg::LayoutReference::SparseConfig>,
                "every configuration must share its compressor's layout (tile K >= 128)");
  using StrideB = typename GemmKernel::StrideB;
  using StrideC = typename GemmKernel::StrideC;
  using StrideD = typename GemmKernel::StrideD;
  using SparseConfig = typename Cfg::SparseConfig;

  const ProblemShape problem{c.m, c.n, c.k, 1};
  const auto layout_a = SparseConfig::fill_layoutA(problem);
  const auto layout_e = SparseConfig::fill_layoutE(problem);
  // B is (N, K, L) in CuTe's convention; the packed stride follows LayoutB (K- or N-major).
  const StrideB stride_b = cutlass::make_cute_packed_stride(StrideB{}, cute::make_shape(c.n, c.k, 1));
  const StrideC stride_c = cutlass::make_cute_packed_stride(StrideC{}, cute::make_shape(c.m, c.n, 1));
  const StrideD stride_d = cutlass::make_cute_packed_stride(StrideD{}, cute::make_shape(c.m, c.n, 1));

  cutlass::KernelHardwareInfo hw_info;
  hw_info.device_id = c.device;
  hw_info.sm_count = c.sm_count;

  typename Gemm::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm,
      problem,
      {static_cast<const typename Cfg::ElementA*>(c.values), layout_a,
       static_cast<const typename Cfg::ElementB*>(c.b), stride_b,
       static_cast<const typename GemmKernel::CollectiveMainloop::ElementE*>(c.meta), layout_e},
      {{}, nullptr, stride_c, static_cast<typename Cfg::ElementD*>(c.d), stride_d},
      hw_info};
  args.epilogue.thread.alpha = 1.0f;
  args.epilogue.thread.alpha_ptr = c.alpha;  // read on the device when set (alpha is then ignored)
  args.epilogue.thread.beta = 0.0f;
  args.scheduler.max_swizzle_size = c.swizzle;
  args.scheduler.raster_order = static_cast<cutlass::gemm::kernel::detail::RasterOrderOptions>(c.raster);
  static_assert(static_cast<int>(cutlass::gemm::kernel::detail::RasterOrderOptions::Heuristic) == 0 &&
                    static_cast<int>(cutlass::gemm::kernel::detail::RasterOrderOptions::AlongM) == 1 &&
                    static_cast<int>(cutlass::gemm::kernel::detail::RasterOrderOptions::AlongN) == 2,
                "GemmCall::raster encodes CUTLASS's RasterOrderOptions by value");

  Gemm gemm;
  cutlass::Status st = gemm.can_implement(args);
  if (st != cutlass::Status::kSuccess) {
    return InvalidArgument(std::string("CUTLASS ") + Cfg::kKind + "sparse GEMM config '" + c.config_name +
                           "' cannot implement m=" + std::to_string(c.m) + " n=" + std::to_string(c.n) +
                           " k=" + std::to_string(c.k) + " (can_implement: " + StatusStr(st) + ")");
  }
  // Zero for the persistent-scheduler configurations; the stream-K one reduces partial tiles (and
  // keeps its locks) in this workspace, which CUTLASS's initialize() clears on the stream.
  const size_t workspace_bytes = Gemm::get_workspace_size(args);
  void* workspace = nullptr;
  if (workspace_bytes > 0) {
    // XLA's FFI scratch allocator rejects alignments above 16 bytes.
    std::optional<void*> ws = c.scratch->Allocate(workspace_bytes, 16);
    if (!ws.has_value() || *ws == nullptr) {
      return Internal("could not allocate " + std::to_string(workspace_bytes) +
                      " bytes of CUTLASS workspace from the XLA scratch allocator");
    }
    workspace = *ws;
  }
  st = gemm.initialize(args, workspace, c.stream);
  if (st != cutlass::Status::kSuccess) {
    return Internal(std::string("CUTLASS GemmUniversalAdapter::initialize (") + Cfg::kKind + "config '" + c.config_name +
                    "') failed: " + StatusStr(st));
  }
  st = gemm.run(c.stream);
  if (st != cutlass::Status::kSuccess) {
    cudaError_t err = cudaGetLastError();
    return Internal(std::string("CUTLASS GemmUniversalAdapter::run (") + Cfg::kKind + "config '" + c.config_name +
                    "') failed: " + StatusStr(st) + " (last CUDA error: " + cudaGetErrorName(err) + ")");
  }
  SP24_CHECK_LAUNCH("the CUTLASS sparse GEMM kernel");
  return ffi::Error::Success();
}

}  // namespace spmm
}  // namespace jax_sparse24

// ------------------------------------------------------------------------------------------------
// Instantiation helpers. The configuration type of one (dtype, layout, line of a list above):
#define SP24_CFG_T(T, LAYOUT_B, SCHED, TM, TN, TK, CM, CN)                                          \
  ::jax_sparse24::spmm::SparseGemmConfig<T, ::cute::Shape<::cute::Int<TM>, ::cute::Int<TN>, ::cute::Int<TK>>, \
                                         ::cute::Shape<::cute::Int<CM>, ::cute::Int<CN>, ::cute::_1>,          \
                                         ::jax_sparse24::spmm::SCHED, LAYOUT_B>
#define SP24_LAYOUT_NK ::cutlass::layout::ColumnMajor
#define SP24_LAYOUT_KN ::cutlass::layout::RowMajor

// `PREFIX template ffi::Error RunGemm<Cfg>(const GemmCall&);` inside namespace jax_sparse24::spmm,
// for bf16 (and fp16 unless minimal). PREFIX is empty (definition, in spmm_cfg_*.cu) or `extern`
// (declaration, in the registry TU). Use at global scope.
#define SP24_RUNGEMM_INST_T(PREFIX, T, LAYOUT_B, SCHED, TM, TN, TK, CM, CN) \
  namespace jax_sparse24 {                                                   \
  namespace spmm {                                                           \
  PREFIX template ffi::Error RunGemm<SP24_CFG_T(T, LAYOUT_B, SCHED, TM, TN, TK, CM, CN)>(const GemmCall&); \
  }                                                                          \
  }
#if SP24_MINIMAL
#define SP24_RUNGEMM_INST(PREFIX, LAYOUT_B, SCHED, TM, TN, TK, CM, CN) \
  SP24_RUNGEMM_INST_T(PREFIX, ::cutlass::bfloat16_t, LAYOUT_B, SCHED, TM, TN, TK, CM, CN)
#else
#define SP24_RUNGEMM_INST(PREFIX, LAYOUT_B, SCHED, TM, TN, TK, CM, CN)                 \
  SP24_RUNGEMM_INST_T(PREFIX, ::cutlass::bfloat16_t, LAYOUT_B, SCHED, TM, TN, TK, CM, CN) \
  SP24_RUNGEMM_INST_T(PREFIX, ::cutlass::half_t, LAYOUT_B, SCHED, TM, TN, TK, CM, CN)
#endif

// For the per-configuration TUs:
#define SP24_INSTANTIATE_NK(SCHED, TM, TN, TK, CM, CN) SP24_RUNGEMM_INST(, SP24_LAYOUT_NK, SCHED, TM, TN, TK, CM, CN)
#define SP24_INSTANTIATE_KN(SCHED, TM, TN, TK, CM, CN) SP24_RUNGEMM_INST(, SP24_LAYOUT_KN, SCHED, TM, TN, TK, CM, CN)
// For the registry TU (applied to the lists above):
#define SP24_EXTERN_NK(SCHED, TM, TN, TK, CM, CN) SP24_RUNGEMM_INST(extern, SP24_LAYOUT_NK, SCHED, TM, TN, TK, CM, CN)
#define SP24_EXTERN_KN(SCHED, TM, TN, TK, CM, CN) SP24_RUNGEMM_INST(extern, SP24_LAYOUT_KN, SCHED, TM, TN, TK, CM, CN)
