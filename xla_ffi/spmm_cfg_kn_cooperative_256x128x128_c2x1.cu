// CUTLASS SM90 sparse GEMM configuration cooperative_256x128x128_c2x1, "kn" formulation (B stored K x N row-major,
// N-major: the weight gradient dW = x^T MVUE(dy) with B = x (T, I) read in place), bf16 + fp16.
// One configuration per TU; the registry (spmm_cutlass.cu) declares these extern. See
// spmm_cutlass_gemm.cuh.
#include "spmm_cutlass_gemm.cuh"

SP24_INSTANTIATE_KN(cooperative, 256, 128, 128, 2, 1)
