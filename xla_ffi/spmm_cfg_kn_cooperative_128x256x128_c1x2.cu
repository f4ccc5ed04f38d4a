// CUTLASS SM90 sparse GEMM configuration cooperative_128x256x128_c1x2, "kn" formulation (B stored K x N row-major,
// N-major: the weight gradient dW = x^T MVUE(dy) with B = x (T, I) read in place), bf16 + fp16.
// One configuration per TU; the registry (spmm_cutlass.cu) declares these extern. See
// spmm_cutlass_gemm.cuh.
#include "spmm_cutlass_gemm.cuh"

SP24_INSTANTIATE_KN(cooperative, 128, 256, 128, 1, 2)
