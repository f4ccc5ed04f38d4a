// CUTLASS SM90 sparse GEMM configuration cooperative_streamk_128x128x128_c1x1 ("nk": B stored N x K),
// bf16 + fp16: the cooperative kernel with CUTLASS's stream-K tile scheduler (for small-K shapes).
// One configuration per TU so the build compiles them in parallel; the registry (spmm_cutlass.cu)
// declares these instantiations extern. See spmm_cutlass_gemm.cuh.
#include "spmm_cutlass_gemm.cuh"

SP24_INSTANTIATE_NK(cooperative_streamk, 128, 128, 128, 1, 1)
