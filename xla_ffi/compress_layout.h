// CUTLASS SM90 2:4 compressed layout (16-bit elements, A K-major, tile K 128), in closed form, for
// the fused compressors (compress_kernels.cu). The GEMM (spmm_cutlass_gemm.cuh) reads exactly this:
//
//   values: M x K/2 row-major (the two kept elements of each group of 4, in order);
//   meta:   a 4-bit index pair per group (low nibble = even group), in 64 x 128 atoms
//           (M padded to 64 rows, K to 128 columns); inside an atom the 16-bit layout of
//           Sm90GemmSparseConfig::TensorEAtom_16bit with NumK = 4:
//             shape  ((8, 2, 4), (16, 2, 4)) logical elements, order (3,1,5 | 0,4,2)
//           atoms go along M first (1024 bytes each), then along K (M_aligned * 16 bytes).
// tests: /tmp layout test compares MetaByteOffset against cute's fill_layoutE for many shapes
// (see tests/test_gpu_compress.py for the bit-exact GPU comparison with CUTLASS's compressor).
#pragma once

#include <cstdint>

namespace jax_sparse24 {
namespace compress {

// Byte offset, in the metadata tensor of an operand with m_aligned64 = round_up(M, 64) rows, of
// the byte holding the nibble of the group that starts at logical (m, k) (k % 4 == 0). The nibble
// is the low one for (k >> 2) even.
__host__ __device__ __forceinline__ int64_t MetaByteOffset(int64_t m, int64_t k, int64_t m_aligned64) {
  return (k >> 7) * m_aligned64 * 16 + (m >> 4) * 256 + ((k >> 4) & 1) * 128 + (m & 7) * 16 +
         ((k >> 5) & 3) * 4 + ((m >> 3) & 1) * 2 + ((k >> 3) & 1);
}

// A 16-row x 128-column block of the operand (rows m0..m0+15, m0 % 16 == 0; columns k0..k0+127,
// k0 % 128 == 0) owns 256 contiguous metadata bytes starting here.
__host__ __device__ __forceinline__ int64_t MetaBlockOffset(int64_t m0, int64_t k0, int64_t m_aligned64) {
  return (k0 >> 7) * m_aligned64 * 16 + (m0 >> 4) * 256;
}

// Byte offset inside that 256-byte block of the byte of local row r (0..15) and local byte column
// kb = (k - k0) / 8 (0..15).
__host__ __device__ __forceinline__ int MetaInBlock(int r, int kb) {
  return ((kb >> 1) & 1) * 128 + (r & 7) * 16 + (kb >> 2) * 4 + ((r >> 3) & 1) * 2 + (kb & 1);
}

// cuSPARSELt's compressed A for 16-bit types with A stored (m, k) row-major, m % 64 == 0, k % 32 == 0
// (not documented by NVIDIA; read off cusparseLtSpMMACompress on the H100 with
// scripts/probe_cusparselt.py, bf16 and fp16, both A orientations, and checked again at run time
// before our compressors are used for it: jax_sparse24/_src/cuda_compress_ops.py):
//
//   one buffer: values (m, k/2) row-major (as CUTLASS), then the metadata, m * k / 8 bytes, the
//   same nibble per group as CUTLASS (nibble i | j << 2), in pieces of 256 bytes = 64 rows x 32
//   columns; piece (row block m / 64, column block k / 32) at 256 * (k / 32 + (K / 32) * (m / 64)).
//   Inside a piece, row r = r0 + 8 r1 + 16 r2 (r0 < 8, r1 < 2, r2 < 4) and group c = c0 + 4 c1
//   (c0 < 4, c1 < 2) of the piece: byte c1 + 2 c0 + 8 r0 + 64 r2, low nibble for r1 = 0.
__host__ __device__ __forceinline__ int64_t LtMetaPieceOffset(int64_t m, int64_t k, int64_t K) {
  return 256 * ((k >> 5) + (K >> 5) * (m >> 6));
}

// Nibble index (byte * 2 + high) of the group at logical (m, k) (k % 4 == 0) in the metadata.
__host__ __device__ __forceinline__ int64_t LtMetaNibble(int64_t m, int64_t k, int64_t K) {
  const int64_t r = m & 63, c = (k >> 2) & 7;
  const int64_t byte = (c >> 2) + 2 * (c & 3) + 8 * (r & 7) + 64 * (r >> 4);
  return 2 * (LtMetaPieceOffset(m, k, K) + byte) + ((r >> 3) & 1);
}

// cuSPARSELt's compressed A for 8-bit types (float8_e4m3fn; read off cusparseLtSpMMACompress 0.8.0 on the
// H100 with scripts/probe_fp8.py's cusparselt_fp8_format.npz, A stored (m, k), m and k multiples of 64; not
// written by our compressors yet; tests/test_compress_emulation.py checks this formula against the library's
// bytes): values (m, k/2) row-major as CUTLASS, then the metadata, m * k / 8 bytes, one byte per 8 columns
// (two groups, the even group in the low nibble, as CUTLASS's fp8 layout), in pieces of 512 bytes = 64 rows x
// 64 columns; piece (m / 64, k / 64) at 512 * (k / 64 + (K / 64) * (m / 64)). Inside a piece, row r (0..63)
// and byte column c = (k % 64) / 8 (0..7) give the byte whose bits, low to high, are r3 c2 c0 c1 r0 r1 r2 r4 r5.
__host__ __device__ __forceinline__ int64_t LtMetaByte8(int64_t m, int64_t k, int64_t K) {
  const int64_t r = m & 63, c = (k >> 3) & 7;
  const int64_t in_piece = ((r >> 3) & 1) | (((c >> 2) & 1) << 1) | ((c & 1) << 2) | (((c >> 1) & 1) << 3) |
                           ((r & 7) << 4) | (((r >> 4) & 3) << 7);
  return 512 * ((k >> 6) + (K >> 6) * (m >> 6)) + in_piece;
}

// Hopper's sparse MMA accepts 6 index pairs per group: (0,1)=0x4 (0,2)=0x8 (0,3)=0xC (1,2)=0x9
// (1,3)=0xD (2,3)=0xE. Compression of a group whose nonzero pattern is p (bit i: element i is
// nonzero, +-0 counts as zero) follows CUTLASS's compressor (transform/kernel/
// sm90_sparse_gemm_compressor.hpp) plus the repo's all-zero fix-up (0x0 -> 0x4):
//   two nonzeros i < j       -> values (x_i, x_j), nibble i | j << 2
//   one nonzero i < 3        -> values (x_i, 0),   nibble i | 3 << 2
//   one nonzero at 3         -> values (0, x_3),   nibble 0 | 3 << 2
//   none                     -> values (0, 0),     nibble 0x4
//   three or four (not 2:4)  -> the first two      (CUTLASS: undefined)
// With nibble = i0 | i1 << 2, value slot s holds x_{i_s} when element i_s is nonzero, else 0.
constexpr uint32_t NibbleForPattern(uint32_t p) {
  if (p == 0) return 0x4;
  uint32_t i = 0;
  while (!((p >> i) & 1)) ++i;
  const uint32_t rest = p & ~(1u << i);
  if (rest == 0) return i < 3 ? (i | (3u << 2)) : (3u << 2);
  uint32_t j = 0;
  while (!((rest >> j) & 1)) ++j;
  return i | (j << 2);
}

constexpr uint64_t MakeNibbleTable() {
  uint64_t t = 0;
  for (uint32_t p = 0; p < 16; ++p) t |= uint64_t(NibbleForPattern(p)) << (4 * p);
  return t;
}

constexpr uint64_t kNibbleTable = MakeNibbleTable();
static_assert(NibbleForPattern(0x3) == 0x4 && NibbleForPattern(0x5) == 0x8 && NibbleForPattern(0x9) == 0xC &&
                  NibbleForPattern(0x6) == 0x9 && NibbleForPattern(0xA) == 0xD && NibbleForPattern(0xC) == 0xE,
              "two nonzeros: index pair (i, j)");
static_assert(NibbleForPattern(0x1) == 0xC && NibbleForPattern(0x2) == 0xD && NibbleForPattern(0x4) == 0xE &&
                  NibbleForPattern(0x8) == 0xC && NibbleForPattern(0x0) == 0x4,
              "CUTLASS's single-nonzero corner cases and the all-zero fix-up");

}  // namespace compress
}  // namespace jax_sparse24
