// Host-side interface of the CUTLASS SM90 2:4 sparse GEMM (implemented in spmm_cutlass.cu).
#pragma once

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

namespace jax_sparse24 {

// Shapes of the CUTLASS SM90 compressed form of an m x k row-major (K-major) 2:4 operand:
// the values tensor (operand dtype) and the metadata tensor (uint8), both row-major 2-D.
struct CompressedShapes {
  int64_t values_rows = 0, values_cols = 0;
  int64_t meta_rows = 0, meta_cols = 0;
};

// dtype: 0 = bfloat16, 1 = float16, 2 = float8_e4m3fn (the fp8 GEMMs' layout). Returns false and fills
// *error when the shape is unsupported.
bool CutlassCompressedShapes(int64_t m, int64_t k, int dtype, CompressedShapes* out, std::string* error);

// Names of the compiled kernel configurations; the index is the `config` attribute of the spmm handler.
std::vector<std::string> CutlassConfigNames();

// The configuration the measured table chooses for D(m x n) = A(m x k, 2:4) * B(k x n).
int CutlassDefaultConfig(int64_t m, int64_t n, int64_t k);

// The "kn" formulation (B stored as a K x N row-major array; the weight gradient): names of the
// compiled configurations (empty in the minimal build) and the default for (m, n, k) (-1: none).
std::vector<std::string> CutlassConfigNamesKN();
int CutlassDefaultConfigKN(int64_t m, int64_t n, int64_t k);

// (m, n, k) alignment the kernels require.
std::tuple<int64_t, int64_t, int64_t> CutlassAlignment();

// The fp8 (e4m3 x e4m3 -> bf16) sparse GEMM (spmm_cutlass_fp8.cu): names of the compiled
// configurations (empty in the minimal build), the default for (m, n, k), and its (m, n, k) alignment.
std::vector<std::string> CutlassConfigNamesFp8();
int CutlassDefaultConfigFp8(int64_t m, int64_t n, int64_t k);
std::tuple<int64_t, int64_t, int64_t> CutlassAlignmentFp8();

}  // namespace jax_sparse24
