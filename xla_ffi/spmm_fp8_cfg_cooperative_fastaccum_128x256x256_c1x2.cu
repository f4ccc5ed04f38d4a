// CUTLASS SM90 fp8 (e4m3) 2:4 sparse GEMM configuration cooperative_fastaccum_128x256x256_c1x2. One configuration per TU so the build
// compiles them in parallel; the registry (spmm_cutlass_fp8.cu) declares it extern. See spmm_cutlass_fp8.cuh.
#include "spmm_cutlass_fp8.cuh"

SP24_INSTANTIATE_FP8(cooperative_fastaccum, 128, 256, 256, 1, 2)
