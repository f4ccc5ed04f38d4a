// The CUTLASS 3.x SM90 fp8 2:4 sparse GEMM configuration template, shared by the fp8 registry TU
// (spmm_cutlass_fp8.cu, which declares the instantiations `extern`) and the per-configuration TUs
// (spmm_fp8_cfg_*.cu), so a build compiles the configurations in parallel.
//
// Formulation: the "nk" one of the bf16 kernels (spmm_cutlass_gemm.cuh): D(M x N) = alpha * A(M x K,
// 2:4 along K) * B(K x N) with A row-major (K-major) compressed, B stored as an N x K row-major array
// (K-major; Hopper's fp8 wgmma reads only K-major operands) and D stored as an N x M row-major array.
// A and B are float8_e4m3fn, accumulation fp32, D bfloat16. alpha (the product of the two operands'
// per-tensor scales) is read from device memory by the epilogue (alpha_ptr), so the scales never
// cross to the host and the handler stays command-buffer compatible.
//
// The compressed fp8 operand's layout depends only on min(tile K, 128) (Sm90GemmSparseConfig): every
// configuration has tile K >= 128, so one layout (written by fp8_compress_kernels.cu and by CUTLASS's
// compressor) serves them all.
#pragma once

#ifndef NDEBUG
#define NDEBUG 1  // see spmm_cutlass_gemm.cuh: CuTe's device asserts serialise the wgmma pipeline
#endif

#include "spmm_cutlass_gemm.cuh"  // GemmCall, ProblemShape, StatusStr, schedules

#if defined(JAX_SPARSE24_MINIMAL_CONFIGS) && JAX_SPARSE24_MINIMAL_CONFIGS
#define SP24_FP8_CONFIGS(X)
#else
// X(SCHED, TM, TN, TK, CM, CN). Names "<schedule>_<TM>x<TN>x<TK>_c<CM>x<CN>"; each line needs its TU
// xla_ffi/spmm_fp8_cfg_<name>.cu (listed in CMakeLists.txt). All use the "fastaccum" schedules: the
// wgmma accumulates without CUTLASS's periodic promotion to separate fp32 registers (the usual choice
// for fp8 training GEMMs). The promoting cooperative 256x128 schedule ran 3x slower on the H100
// (0.68-0.75x bf16 dense against 1.7-2.3x, scripts/probe_fp8.py, 2026-11-24) and is not built.
#define SP24_FP8_CONFIGS(X)                      \
  X(cooperative_fastaccum, 256, 128, 128, 2, 1)  \
  X(cooperative_fastaccum, 128, 256, 128, 1, 2)  \
  X(pingpong_fastaccum, 128, 128, 128, 1, 2)
#endif

namespace jax_sparse24 {
namespace spmm {

struct cooperative_fastaccum {
  using Kernel = cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8FastAccum;
  using Epilogue = cutlass::epilogue::TmaWarpSpecializedCooperative;
  using Scheduler = void;
};
struct pingpong_fastaccum {
  using Kernel = cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8FastAccum;
  using Epilogue = cutlass::epilogue::TmaWarpSpecialized;
  using Scheduler = void;
};

// fp8 alignment (elements): A's compressed K/2 columns need 16 bytes (K % 32), B's K columns 16
// bytes (K % 16), D (bf16, column-major M x N) 16 bytes (M % 8); N is an outer dimension (16 as in
// CUTLASS's own sparse tests).
constexpr int64_t kFp8AlignM = 8;
constexpr int64_t kFp8AlignN = 16;
constexpr int64_t kFp8AlignK = 32;

template <class TileShape, class ClusterShape, class Schedule>
struct SparseGemmFp8Config {
  using ElementA = cutlass::float_e4m3_t;
  using ElementB = cutlass::float_e4m3_t;
  using ElementD = cutlass::bfloat16_t;
  using LayoutA = cutlass::layout::RowMajor;     // M x K, K-major (compressed)
  using LayoutB = cutlass::layout::ColumnMajor;  // K x N column-major == N x K row-major
  using LayoutD = cutlass::layout::ColumnMajor;  // M x N column-major == N x M row-major

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto,
      float, float,                 // accumulator, epilogue compute
      void, LayoutD, 8,             // no C operand
      ElementD, LayoutD, 8,         // D (bf16, 16 bytes)
      typename Schedule::Epilogue>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassSparseTensorOp,
      ElementA, LayoutA, 32,        // compressed: 16 bytes of K/2
      ElementB, LayoutB, 16,
      float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<
          static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
      typename Schedule::Kernel>::CollectiveOp;

  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue,
                                                          typename Schedule::Scheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;
  using SparseConfig = typename CollectiveMainloop::SparseConfig;
};

// The configuration whose compressed layout every fp8 configuration (and the compressors) share.
using ReferenceFp8Config = SparseGemmFp8Config<Shape<_128, _128, _128>, Shape<_1, _2, _1>, pingpong_fastaccum>;

// One fp8 GEMM launch: GemmCall's fields plus the device pointer of alpha (float32).
struct GemmFp8Call {
  GemmCall base;
  const float* alpha;
};

using RunFp8Fn = ffi::Error (*)(const GemmFp8Call&);

template <class Cfg>
ffi::Error RunGemmFp8(const GemmFp8Call& call) {
  using Gemm = typename Cfg::Gemm;
  using GemmKernel = typename Cfg::GemmKernel;
  static_assert(std::is_same_v<typename Cfg::SparseConfig, typename ReferenceFp8Config::SparseConfig>,
                "every fp8 configuration must share the compressor's layout (tile K >= 128)");
  using StrideB = typename GemmKernel::StrideB;
  using StrideC = typename GemmKernel::StrideC;
  using StrideD = typename GemmKernel::StrideD;
  using SparseConfig = typename Cfg::SparseConfig;
  const GemmCall& c = call.base;

  const ProblemShape problem{c.m, c.n, c.k, 1};
  const auto layout_a = SparseConfig::fill_layoutA(problem);
  const auto layout_e = SparseConfig::fill_layoutE(problem);
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
  args.epilogue.thread.alpha = 1.0f;  // ignored: alpha_ptr is set
  args.epilogue.thread.alpha_ptr = call.alpha;
  args.epilogue.thread.beta = 0.0f;
  args.scheduler.max_swizzle_size = c.swizzle;
  args.scheduler.raster_order = static_cast<cutlass::gemm::kernel::detail::RasterOrderOptions>(c.raster);

  return LaunchGemm<Gemm>(args, c, "fp8 ");
}

}  // namespace spmm
}  // namespace jax_sparse24

#define SP24_FP8_CFG_T(SCHED, TM, TN, TK, CM, CN)                                                        \
  ::jax_sparse24::spmm::SparseGemmFp8Config<::cute::Shape<::cute::Int<TM>, ::cute::Int<TN>, ::cute::Int<TK>>, \
                                            ::cute::Shape<::cute::Int<CM>, ::cute::Int<CN>, ::cute::_1>,          \
                                            ::jax_sparse24::spmm::SCHED>
#define SP24_FP8_INST(PREFIX, SCHED, TM, TN, TK, CM, CN)                                                  \
  namespace jax_sparse24 {                                                                               \
  namespace spmm {                                                                                       \
  PREFIX template ffi::Error RunGemmFp8<SP24_FP8_CFG_T(SCHED, TM, TN, TK, CM, CN)>(const GemmFp8Call&); \
  }                                                                                                      \
  }
#define SP24_INSTANTIATE_FP8(SCHED, TM, TN, TK, CM, CN) SP24_FP8_INST(, SCHED, TM, TN, TK, CM, CN)
#define SP24_EXTERN_FP8(SCHED, TM, TN, TK, CM, CN) SP24_FP8_INST(extern, SCHED, TM, TN, TK, CM, CN)
