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
// (0.68-0.75x bf16 dense against 1.7-2.3x, scripts/probe_fp8.py, 2026-11-24) and is not built. Tile K 256
// (cooperative 256x128 / 128x256, pingpong 128x128) compiled, passed the GPU tests and was not faster on the
// LLaMA-7B step's GEMMs (scripts/probe_fp8.py --step llama-7b): not built either.
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
struct SparseGemmFp8Config;

// The configuration whose compressed layout every fp8 configuration (and the compressors) share.
using ReferenceFp8Config = SparseGemmFp8Config<Shape<_128, _128, _128>, Shape<_1, _2, _1>, pingpong_fastaccum>;

// Run by RunGemm (spmm_cutlass_gemm.cuh) like the 16-bit configurations, with GemmCall::alpha set.
template <class TileShape, class ClusterShape, class Schedule>
struct SparseGemmFp8Config {
  using ElementA = cutlass::float_e4m3_t;
  using ElementB = cutlass::float_e4m3_t;
  using ElementD = cutlass::bfloat16_t;
  using LayoutReference = ReferenceFp8Config;
  static constexpr const char* kKind = "fp8 ";
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

}  // namespace spmm
}  // namespace jax_sparse24

#define SP24_FP8_CFG_T(SCHED, TM, TN, TK, CM, CN)                                                        \
  ::jax_sparse24::spmm::SparseGemmFp8Config<::cute::Shape<::cute::Int<TM>, ::cute::Int<TN>, ::cute::Int<TK>>, \
                                            ::cute::Shape<::cute::Int<CM>, ::cute::Int<CN>, ::cute::_1>,          \
                                            ::jax_sparse24::spmm::SCHED>
#define SP24_FP8_INST(PREFIX, SCHED, TM, TN, TK, CM, CN)                                                  \
  namespace jax_sparse24 {                                                                               \
  namespace spmm {                                                                                       \
  PREFIX template ffi::Error RunGemm<SP24_FP8_CFG_T(SCHED, TM, TN, TK, CM, CN)>(const GemmCall&);     \
  }                                                                                                      \
  }
#define SP24_INSTANTIATE_FP8(SCHED, TM, TN, TK, CM, CN) SP24_FP8_INST(, SCHED, TM, TN, TK, CM, CN)
#define SP24_EXTERN_FP8(SCHED, TM, TN, TK, CM, CN) SP24_FP8_INST(extern, SCHED, TM, TN, TK, CM, CN)
