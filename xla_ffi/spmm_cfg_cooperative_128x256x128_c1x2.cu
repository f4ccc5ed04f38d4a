// CUTLASS SM90 sparse GEMM configuration cooperative_128x256x128_c1x2 ("nk": B stored N x K), bf16 + fp16 (bf16 only in
// the minimal build). One configuration per TU so the build compiles them in parallel; the registry
// (spmm_cutlass.cu) declares these instantiations extern. See spmm_cutlass_gemm.cuh.
#include "spmm_cutlass_gemm.cuh"

SP24_INSTANTIATE_NK(cooperative, 128, 256, 128, 1, 2)
