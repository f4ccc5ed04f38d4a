// CUTLASS SM90 fp8 (e4m3) 2:4 sparse GEMM configuration cooperative_fastaccum_256x128x256_c2x1. One configuration per TU so the build
// compiles them in parallel; the registry (spmm_cutlass_fp8.cu) declares it extern. See spmm_cutlass_fp8.cuh.
#include "spmm_cutlass_fp8.cuh"

SP24_INSTANTIATE_FP8(cooperative_fastaccum, 256, 128, 256, 2, 1)
