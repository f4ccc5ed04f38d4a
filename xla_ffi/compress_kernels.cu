// Fused 2:4 compressors: read a dense (R, C) row-major bf16/fp16 array once and write the CUTLASS
// SM90 compressed operand (values + metadata, compress_layout.h) of the sparse GEMM directly.
//
//   Sparse24MaskCompress       (b) x * mask + compress (one direction)
//   Sparse24MaskCompressBoth   (b) x * mask + compress of BOTH x^T and x in one pass (transposable mask)
//   Sparse24Mvue24Compress     (c) MVUE 2:4 (same Philox draws as Sparse24Mvue24) + compress
//   Sparse24MaskCompressMany   (b) for up to 64 (x, mask) pairs of one dtype in one launch (one
//                              direction or both): the prepared weights of a whole model per step
//   Sparse24PackedCompress     (e) a weight in the packed encoding (jax_sparse24/_src/packed24.py:
//                              kept values + one mask bit per element, groups along rows) unpacked
//                              and compressed in one pass: an FSDP weight gathered packed goes
//                              straight to the GEMM's operand, never unpacked in memory
//
// Direction ("transposed" attribute): the compressed operand A is
//   transposed = false: A = x   (M = R, K = C; groups of 4 along x's columns, axis 1),
//   transposed = true:  A = x^T (M = C, K = R; groups of 4 along x's rows, axis 0) -- e.g. W (I, O)
//                       -> W~^T (O, I) for the forward GEMM, or dy (T, O) -> MVUE(dy)^T (O, T) for
//                       the weight gradient -- read in x's natural layout, nothing transposed in memory.
//
// Bit-exactness: every output equals CUTLASS's compressor (+ the all-zero-group fix-up of
// spmm_cutlass.cu) applied to the dense result of the op rounded to x's dtype, i.e.
// cutlass_compress(op(x)) -- the GPU tests check this bit for bit. MVUE uses the element-wise
// kernel's generator and formula (mvue_rng.cuh) with the same group numbering, so
// Sparse24Mvue24Compress(key, g) == compress(Sparse24Mvue24(key, g along that axis)).
//
// Kernel: one CTA (256 threads) per 128 x 128 tile of x; thread (cc = t % 16, gp = t / 16) loads
// the 8 x 8 patch at rows 8 gp.., columns 8 cc.. with 16-byte loads (a warp reads 2 rows x 256 B).
// Groups along rows (transposed A) are formed in registers; their values and metadata are staged in
// (swizzled) shared memory and written with 16-byte stores: the tile's metadata is 2 KB contiguous
// in the output (8 blocks of 16 rows x 128 columns), the values 128 B per output row. Groups along
// columns (direct A) write their values straight from registers (8 bytes per thread, 128 B per
// half-warp) and stage only the metadata. Padding of the metadata (M to 64 rows, K to 128 columns)
// is written from zero-filled out-of-range patches (nibble 0x4, as CUTLASS + fix-up).
//
// All handlers are command-buffer compatible (no allocation, no synchronisation; the MVUE key is
// read on the device).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>

#include "compress_layout.h"
#include "ffi_common.h"
#include "mvue_rng.cuh"
#include "spmm_cutlass.h"

namespace jax_sparse24 {
namespace compress {
namespace {

using mask_kernels::After;
using mask_kernels::GroupBitsRun;
using mask_kernels::KeyWords;
using mask_kernels::LoadGlobal;
using mask_kernels::MakeKey;
using mask_kernels::Mvue24Kept2;
using mask_kernels::Mvue24Pick;

enum class Op { kMask, kMvue, kPacked };

constexpr int kThreads = 256;
constexpr int kTile = 128;  // rows and columns of x per CTA
// CTAs per SM the register budget must allow. Nsight Compute on the H100 (d = 1280 FFN weights,
// 400 tiles) with 2 for every kernel: 25% occupancy, 1.5 waves, DRAM at 42% of peak. 3 (<= 80
// registers) for the one-direction compressors, spill-free or nearly (the MVUE one since it
// compresses each group as it is drawn, MvueCompressGroup: 128 -> 80 registers, 16 -> 24 warps per
// SM); the both-directions kernel would spill at 80 registers and keeps 2.
template <Op OP, bool DIRECT, bool TRANS>
constexpr int MinBlocks() {
  return (DIRECT && TRANS) ? 2 : 3;
}

// ------------------------------------------------------------------------------------------------
// 16-bit element <-> float (exact up-conversion, round-to-nearest-even down-conversion: the same
// rounding as the element-wise kernels' stores).
template <typename T>
struct Elem16;
template <>
struct Elem16<__nv_bfloat16> {
  SP24_HD static float ToFloat(uint32_t bits) { return mask_kernels::BitsFloat(bits << 16); }
  SP24_HD static uint32_t FromFloat(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }
  // FromFloat(lo) | FromFloat(hi) << 16 (one conversion instruction on the device).
  SP24_HD static uint32_t Pack2(float lo, float hi) {
#ifdef __CUDA_ARCH__
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
#else
    return FromFloat(lo) | (FromFloat(hi) << 16);
#endif
  }
};
template <>
struct Elem16<__half> {
  SP24_HD static float ToFloat(uint32_t bits) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
  }
  SP24_HD static uint32_t FromFloat(float f) { return __half_as_ushort(__float2half_rn(f)); }
  SP24_HD static uint32_t Pack2(float lo, float hi) {
#ifdef __CUDA_ARCH__
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
#else
    return FromFloat(lo) | (FromFloat(hi) << 16);
#endif
  }
};

// Read-only global loads of 16 and 8 bytes (mask_kernels::LoadGlobal).
SP24_HD uint4 Load16(const void* ptr) { return LoadGlobal(static_cast<const uint4*>(ptr)); }
SP24_HD uint2 Load8(const void* ptr) { return LoadGlobal(static_cast<const uint2*>(ptr)); }

// Element (i, j) of the 8 x 8 patch packed as 8 rows x 4 words (2 elements per word, low half first).
SP24_HD uint32_t Get(const uint32_t (&w)[8][4], int i, int j) {
  return (w[i][j >> 1] >> (16 * (j & 1))) & 0xFFFFu;
}
SP24_HD void Set(uint32_t (&w)[8][4], int i, int j, uint32_t v) {
  const int sh = 16 * (j & 1);
  w[i][j >> 1] = (w[i][j >> 1] & ~(0xFFFFu << sh)) | (v << sh);
}

// Compress one group (4 element bit patterns, at most 2 nonzero): *pair = v0 | v1 << 16, returns
// the nibble. CUTLASS's rule (compress_layout.h).
SP24_HD uint32_t CompressGroup(uint32_t b0, uint32_t b1, uint32_t b2, uint32_t b3,
                                                  uint32_t* pair) {
  const uint32_t p = ((b0 & 0x7FFFu) != 0) | (((b1 & 0x7FFFu) != 0) << 1) | (((b2 & 0x7FFFu) != 0) << 2) |
                     (((b3 & 0x7FFFu) != 0) << 3);
  const uint32_t nib = static_cast<uint32_t>(kNibbleTable >> (4 * p)) & 0xFu;
  const uint32_t i0 = nib & 3u, i1 = nib >> 2;
  const uint64_t packed = uint64_t(b0) | (uint64_t(b1) << 16) | (uint64_t(b2) << 32) | (uint64_t(b3) << 48);
  const uint32_t v0 = ((p >> i0) & 1u) ? static_cast<uint32_t>(packed >> (16 * i0)) & 0xFFFFu : 0u;
  const uint32_t v1 = ((p >> i1) & 1u) ? static_cast<uint32_t>(packed >> (16 * i1)) & 0xFFFFu : 0u;
  *pair = v0 | (v1 << 16);
  return nib;
}

// MVUE 2:4 of one group + compression: the two drawn lanes lo < hi scaled, rounded and packed,
// *pair = v_lo | v_hi << 16; returns the nibble lo | hi << 2. That is CompressGroup of the dense
// result (CUTLASS's rule for two nonzeros) unless a drawn lane's g is zero (its value is then +0,
// bits 0x0000; a nonzero g gives a nonzero value: |g / p| >= |g|): those groups are found after the
// fact (Min3U16x2 of the pairs) and fixed by CompressDrawn.
template <class E>
SP24_HD uint32_t MvueCompressGroup(const float (&g)[4], uint32_t bits, uint32_t* pair) {
  const Mvue24Kept2 r = Mvue24Pick(g, bits);
  *pair = E::Pack2(r.v_lo, r.v_hi);
  return r.nib;
}

// CompressGroup's result for a group whose only possible nonzeros are the two drawn lanes lo < hi
// (nib = lo | hi << 2, *pair = v_lo | v_hi << 16, a zero value being 0x0000): unchanged when both
// are nonzero; v_lo alone -> lanes (lo, 3) (lo <= 2); v_hi alone -> (0, 3) with (0, v_hi) when
// hi == 3, else (hi, 3) with (v_hi, 0); none -> (0, 1), nibble 0x4. The host test checks it against
// CompressGroup for every case.
SP24_HD uint32_t CompressDrawn(uint32_t nib, uint32_t* pair) {
  const bool lo_nz = (*pair & 0xFFFFu) != 0u, hi_nz = (*pair >> 16) != 0u;
  const uint32_t hi = nib >> 2;
  if (!lo_nz && hi_nz && hi != 3u) *pair >>= 16;
  return lo_nz ? (hi_nz ? nib : (nib & 3u) | 12u) : (hi_nz ? (hi == 3u ? 12u : hi | 12u) : 4u);
}

// Whether a 16-bit half of x is zero.
SP24_HD bool HasZeroHalf(uint32_t x) { return (x & 0xFFFFu) == 0u || (x >> 16) == 0u; }

// Per 16-bit half: min(a, b, c) (unsigned).
SP24_HD uint32_t Min3U16x2(uint32_t a, uint32_t b, uint32_t c) {
#ifdef __CUDA_ARCH__
  return __vimin3_u16x2(a, b, c);
#else
  auto m = [](uint32_t x, uint32_t y) { return x < y ? x : y; };
  const uint32_t lo = m(m(a & 0xFFFFu, b & 0xFFFFu), c & 0xFFFFu), hi = m(m(a >> 16, b >> 16), c >> 16);
  return lo | (hi << 16);
#endif
}

// Shared-memory metadata staging: 8 blocks (16 operand rows each) of 256 bytes laid out as in the
// output (compress_layout.h MetaInBlock), kMetaSmemStride apart: the 16 bytes of padding per block
// spread the eight blocks over the banks (the byte stores of a warp are conflict-free), and a
// thread's eight stores are one base address plus immediate offsets (16 bytes per row).
constexpr int kMetaSmemStride = 272;
SP24_HD int MetaSmemOffset(int a, int kb) { return (a >> 4) * kMetaSmemStride + MetaInBlock(a & 15, kb); }

SP24_HD uint32_t BytePerm(uint32_t x, uint32_t y, uint32_t s) {
#ifdef __CUDA_ARCH__
  return __byte_perm(x, y, s);
#else
  const uint64_t v = uint64_t(x) | (uint64_t(y) << 32);
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= static_cast<uint32_t>((v >> (8 * ((s >> (4 * i)) & 7))) & 0xFFu) << (8 * i);
  return r;
#endif
}

// Writes one 16-byte chunk of a staged tile's metadata (MetaSmemOffset; tile rows m0.., columns
// k0.. of the operand (M, K)) in cuSPARSELt's layout, for thread u < 128 of the write-out: the
// tile's metadata is 8 pieces of 256 bytes (64-row half h, 32-column block b: piece 4 h + b =
// u / 16), chunk q = u % 16 of a piece covers rows 2 (q % 4) + e + 8 r1 + 16 (q / 4) (e, r1 < 2)
// and the piece's 8 groups. A staged row holds groups c = 0..7 of block b in two 16-bit halves
// (nibble c at bit 4 c of S below).
SP24_HD void StoreLtMetaChunk(const uint8_t* s_meta, uint8_t* meta, int u, int64_t m0, int64_t k0, int64_t M,
                              int64_t K) {
  const int blk = u >> 4, q = u & 15, h = blk >> 2, b = blk & 3;
  const int64_t gm = m0 + 64 * h, gk = k0 + 32 * b;
  if (gm >= M || gk >= K) return;
  uint32_t w[4];
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    uint32_t S[2];
#pragma unroll
    for (int r1 = 0; r1 < 2; ++r1) {
      const int a = 64 * h + 2 * (q & 3) + e + 8 * r1 + 16 * (q >> 2);
      const uint32_t lo = *reinterpret_cast<const uint16_t*>(s_meta + MetaSmemOffset(a, 4 * b));
      const uint32_t hi = *reinterpret_cast<const uint16_t*>(s_meta + MetaSmemOffset(a, 4 * b + 2));
      S[r1] = lo | (hi << 16);
    }
    // byte i of E: groups 2 i of rows r1 = 0 (low nibble) and 1; of O: groups 2 i + 1.
    const uint32_t E = (S[0] & 0x0F0F0F0Fu) | ((S[1] << 4) & 0xF0F0F0F0u);
    const uint32_t O = ((S[0] >> 4) & 0x0F0F0F0Fu) | (S[1] & 0xF0F0F0F0u);
    // output bytes c1 + 2 c0 (group c0 + 4 c1): groups 0, 4, 1, 5 | 2, 6, 3, 7
    w[2 * e] = BytePerm(E, O, 0x6420u);
    w[2 * e + 1] = BytePerm(E, O, 0x7531u);
  }
  *reinterpret_cast<uint4*>(meta + LtMetaPieceOffset(gm, gk, K) + 16 * q) = make_uint4(w[0], w[1], w[2], w[3]);
}

struct TileParams {
  const void* x;       // (rows, cols) row-major; kPacked: packed24's values (rows / 2, cols)
  int64_t rows, cols;  // of the (unpacked) x
  const uint8_t* mask;  // kMask: (rows, cols) bool; kPacked: packed24's bits (rows / 8, cols)
  const uint32_t* key;  // kMvue: key words
  int nkw;
  void* d_values;  // direct A = x: (rows, cols / 2)
  uint8_t* d_meta;
  int64_t d_meta_rows;  // round_up(rows, 64)
  void* t_values;  // transposed A = x^T: (cols, rows / 2)
  uint8_t* t_meta;
  int64_t t_meta_rows;  // round_up(cols, 64)
  bool lt;  // metadata in cuSPARSELt's layout (compress_layout.h LtMetaNibble), values + meta one buffer
  int64_t col_tiles, tiles;
};

// p's tile grid: kTile x kTile tiles of x, row-major.
SP24_HD void SetTiles(TileParams& p) {
  p.col_tiles = (p.cols + kTile - 1) / kTile;
  p.tiles = ((p.rows + kTile - 1) / kTile) * p.col_tiles;
}

// Shared-memory staging of one CTA.
template <bool DIRECT, bool TRANS>
struct alignas(16) TileSmem {
  uint8_t tval[TRANS ? kTile * 128 : 16];  // transposed values: 128 A-rows x 64 values (swizzled)
  uint8_t tmeta[TRANS ? 8 * kMetaSmemStride : 16];   // transposed metadata (MetaSmemOffset)
  uint8_t dmeta[DIRECT ? 8 * kMetaSmemStride : 16];  // direct metadata
};

// One 128 x 128 tile of x (`tile`: row-major index over p's tile grid) by thread t of a CTA: the
// body shared by the one-tensor kernel (CompressTileKernel, TileLoop) and the many-tensor one
// (CompressManyKernel, ManyTileLoop), so both write the same bits. `sync()` is the CTA barrier
// (__syncthreads on the device, a std::barrier in the host emulation); key is kMvue's, loaded once
// per CTA. OP's groups run along rows (TRANS) or along columns (DIRECT);
// kMask may produce both.
template <typename T, Op OP, bool DIRECT, bool TRANS, class Sync>
SP24_HD void CompressTile(const TileParams& p, int t, int64_t tile, const KeyWords& key,
                          TileSmem<DIRECT, TRANS>& sm, Sync&& sync) {
  static_assert(DIRECT || TRANS, "at least one output");
  static_assert(OP == Op::kMask || (DIRECT != TRANS), "MVUE / packed choose one output");
  using E = Elem16<T>;
  uint8_t* s_tval = sm.tval;
  uint8_t* s_tmeta = sm.tmeta;
  uint8_t* s_dmeta = sm.dmeta;

  const int cc = t & 15, gp = t >> 4;
  const int64_t R = p.rows, C = p.cols;

  // (32-bit division where the tile count allows: always, for any array that fits in memory)
  const int64_t tr = p.tiles <= int64_t{0xFFFFFFFF}
                         ? int64_t{static_cast<uint32_t>(tile) / static_cast<uint32_t>(p.col_tiles)}
                         : tile / p.col_tiles;
  const int64_t r0 = tr * kTile, c0 = (tile - tr * p.col_tiles) * kTile;
  const int64_t rb = r0 + 8 * gp, cb = c0 + 8 * cc;
  const bool in = rb < R && cb < C;  // rows % 8 == 0 and cols % 8 == 0: the patch is all in or all out

  // ---- load the 8 x 8 patch (and its mask) ----
  uint32_t w[8][4];
  uint32_t mk[8][2];
  if constexpr (OP == Op::kPacked) {
    // The patch's two row groups (4 h .. 4 h + 3, h = 0, 1) packed: values rows rb / 2 + 2 h (each
    // group's first kept element) and rb / 2 + 2 h + 1 (its second), one 16-byte load each; the mask
    // bits of rows rb .. rb + 7 are byte rb / 8 of each column (bit i: row rb + i), 8 bytes. The
    // patch is rebuilt as unpack24 rebuilds it: the first kept row of a group gets the first value,
    // the second kept row the second, every other row (a third or fourth kept one included) zero.
    uint32_t v[4][4];
    const T* v_row = static_cast<const T*>(p.x) + (rb / 2) * C + cb;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      uint4 u = make_uint4(0u, 0u, 0u, 0u);
      if (in) u = Load16(v_row);
      v_row += C;
      v[i][0] = u.x;
      v[i][1] = u.y;
      v[i][2] = u.z;
      v[i][3] = u.w;
    }
    uint2 bits = make_uint2(0u, 0u);
    if (in) bits = Load8(p.mask + (rb / 8) * C + cb);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint32_t byte = ((j < 4 ? bits.x : bits.y) >> (8 * (j & 3))) & 0xFFu;
      const uint32_t sh = 16 * (j & 1);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t first = (v[2 * h][j >> 1] >> sh) & 0xFFFFu, second = (v[2 * h + 1][j >> 1] >> sh) & 0xFFFFu;
        uint32_t rank = 0;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const uint32_t kept = (byte >> (4 * h + q)) & 1u;
          rank += kept;
          Set(w, 4 * h + q, j, kept ? (rank == 1 ? first : rank == 2 ? second : 0u) : 0u);
        }
      }
    }
  } else {
    const T* x_row = static_cast<const T*>(p.x) + rb * C + cb;  // row rb + i below
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      uint4 v = make_uint4(0u, 0u, 0u, 0u);
      if (in) v = Load16(x_row);
      x_row += C;
      w[i][0] = v.x;
      w[i][1] = v.y;
      w[i][2] = v.z;
      w[i][3] = v.w;
    }
    if constexpr (OP == Op::kMask) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        uint2 m = make_uint2(0u, 0u);
        if (in) m = Load8(p.mask + (rb + i) * C + cb);  // (the mask's compressors are not MVUE's)
        mk[i][0] = m.x;
        mk[i][1] = m.y;
      }
    }
  }

  // Staging of one line's two compressed groups (pairs pr0, pr1; nibbles in one byte nb). TRANS
  // line j = operand row a = 8 cc + j (x column) within the tile. Values: 8-byte slot gp of row a
  // (16 slots of 4 values), slot index XOR 2 * ((a >> 3) & 7) = 2 * (cc & 7): row a's slot is
  // t_val0 + 128 j. Metadata: MetaSmemOffset(8 cc + j, gp) = t_meta0 + 16 j. DIRECT line i = x row
  // rb + i: values straight to global (stage_d is called for i = 0, 1, ..., 7 in this order),
  // metadata to shared memory.
  const int t_val0 = 8 * cc * 128 + (gp ^ (2 * (cc & 7))) * 8, t_meta0 = MetaSmemOffset(8 * cc, gp);
  auto stage_t = [&](int j, uint32_t pr0, uint32_t pr1, uint32_t nb) {
    *reinterpret_cast<uint2*>(s_tval + t_val0 + 128 * j) = make_uint2(pr0, pr1);
    s_tmeta[t_meta0 + 16 * j] = static_cast<uint8_t>(nb);
  };
  T* dv_row = DIRECT ? static_cast<T*>(p.d_values) + rb * (C / 2) + cb / 2 : nullptr;  // row rb + i
  auto stage_d = [&](int i, uint32_t pr0, uint32_t pr1, uint32_t nb) {
    if (in) *reinterpret_cast<uint2*>(dv_row) = make_uint2(pr0, pr1);
    dv_row += C / 2;
    s_dmeta[MetaSmemOffset(8 * gp, cc) + 16 * i] = static_cast<uint8_t>(nb);
  };

  // ---- the op, in place: w becomes the dense result (x's dtype); kMvue compresses and stages
  // each group right away ----
  uint32_t mv_pair[2], mv_nib[2];    // kMvue: the current line's two groups
  uint32_t mv_zmin = 0xFFFFFFFFu;    // kMvue TRANS: per half, the least staged value (0: a zero)
  if constexpr (OP == Op::kMask) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const bool keep = (mk[i][j >> 2] >> (8 * (j & 3))) & 0xFFu;
        if (!keep) Set(w, i, j, 0u);
      }
    }
  } else if constexpr (OP == Op::kPacked) {
    (void)mk;  // unpacked at the load: w is the dense weight already
  } else {
    // 16 groups: TRANS: column j, rows 4h..4h+3; DIRECT: row i, columns 4h..4h+3.
    uint32_t rb32[8][2];  // MVUE: the random word of the group (line, h)
    if constexpr (OP == Op::kMvue) {
      if constexpr (TRANS) {
        // group (row group gr, column c): index gr * C + c; columns cb .. cb + 7 (cb % 8 == 0,
        // C % 8 == 0) are one Philox octet.
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          uint32_t b8[8];
          GroupBitsRun<8>(key, (rb / 4 + h) * C + cb, b8);
#pragma unroll
          for (int c = 0; c < 8; ++c) rb32[c][h] = b8[c];
        }
      } else {
        // group (row r, column group gc): index r * (C / 4) + gc; gc = cb / 4 + h with cb / 4 even:
        // this thread's pair of an octet (the rest is its neighbours').
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          uint32_t b2[2];
          GroupBitsRun<2>(key, (rb + i) * (C / 4) + cb / 4, b2);
          rb32[i][0] = b2[0];
          rb32[i][1] = b2[1];
        }
      }
    }
#pragma unroll
    for (int line = 0; line < 8; ++line) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float v[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int i = TRANS ? 4 * h + q : line, j = TRANS ? line : 4 * h + q;
          v[q] = E::ToFloat(Get(w, i, j));
        }
        // kMvue: drawn, scaled and compressed in one step (w is not rewritten)
        if (line + h > 0) {
#pragma unroll
          for (int q = 0; q < 4; ++q) After(v[q], mv_nib[1 - h]);
        }
        mv_nib[h] = MvueCompressGroup<E>(v, rb32[line][h], &mv_pair[h]);
      }
      if constexpr (OP == Op::kMvue) {
        // A drawn lane with g == 0 (a value half 0x0000) needs CompressDrawn: TRANS fixes the
        // staged groups after the loop if any needs it, DIRECT this line's before it is stored.
        if constexpr (TRANS) {
          mv_zmin = Min3U16x2(mv_zmin, mv_pair[0], mv_pair[1]);
        } else if (HasZeroHalf(Min3U16x2(mv_pair[0], mv_pair[1], 0xFFFFFFFFu))) {
          mv_nib[0] = CompressDrawn(mv_nib[0], &mv_pair[0]);
          mv_nib[1] = CompressDrawn(mv_nib[1], &mv_pair[1]);
        }
        const uint32_t nb = mv_nib[0] | (mv_nib[1] << 4);
        if constexpr (TRANS) stage_t(line, mv_pair[0], mv_pair[1], nb);
        else stage_d(line, mv_pair[0], mv_pair[1], nb);
      }
    }
    if constexpr (OP == Op::kMvue && TRANS) {
      if (HasZeroHalf(mv_zmin)) {  // fix this thread's staged groups in place
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          uint2* v = reinterpret_cast<uint2*>(s_tval + t_val0 + 128 * j);
          uint32_t pr[2] = {v->x, v->y};
          const uint32_t nb = s_tmeta[t_meta0 + 16 * j];
          const uint32_t n0 = CompressDrawn(nb & 15u, &pr[0]), n1 = CompressDrawn(nb >> 4, &pr[1]);
          stage_t(j, pr[0], pr[1], n0 | (n1 << 4));
        }
      }
    }
  }

  // ---- compress (kMvue: done above): transposed A (groups along rows) -> shared memory; direct A
  // (groups along columns) -> values to global, metadata to shared memory ----
  if constexpr (TRANS && OP != Op::kMvue) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      uint32_t pr[2], nib[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        nib[h] = CompressGroup(Get(w, 4 * h, j), Get(w, 4 * h + 1, j), Get(w, 4 * h + 2, j), Get(w, 4 * h + 3, j),
                               &pr[h]);
      }
      stage_t(j, pr[0], pr[1], nib[0] | (nib[1] << 4));
    }
  }
  if constexpr (DIRECT && OP != Op::kMvue) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      uint32_t pr[2], nib[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        nib[h] = CompressGroup(Get(w, i, 4 * h), Get(w, i, 4 * h + 1), Get(w, i, 4 * h + 2), Get(w, i, 4 * h + 3),
                               &pr[h]);
      }
      stage_d(i, pr[0], pr[1], nib[0] | (nib[1] << 4));
    }
  }
  sync();

  // ---- write the staged tiles with 16-byte stores ----
  if constexpr (TRANS) {
    // piece t + 256 q of 128 rows x 8 pieces of 16 bytes: row a = t / 8 + 32 q, piece s = t % 8
    const int64_t ga0 = c0 + (t >> 3), gk = r0 + 16 * (t & 7);
    T* tv = static_cast<T*>(p.t_values) + ga0 * (R / 2) + gk / 2;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int a = (t >> 3) + 32 * q, s = t & 7;
      if (ga0 + 32 * q < C && gk < R) {
        const uint4 v = *reinterpret_cast<const uint4*>(s_tval + a * 128 + ((s ^ ((a >> 3) & 7)) << 4));
        *reinterpret_cast<uint4*>(tv) = v;
      }
      tv += 32 * (R / 2);
    }
    if (t < 128 && p.lt) {
      StoreLtMetaChunk(s_tmeta, p.t_meta, t, c0, r0, C, R);
    } else if (t < 128) {
      const int blk = t >> 4, chunk = t & 15;
      const int64_t m0 = c0 + 16 * blk;
      if (m0 < p.t_meta_rows) {
        const uint4 v = *reinterpret_cast<const uint4*>(s_tmeta + blk * kMetaSmemStride + chunk * 16);
        *reinterpret_cast<uint4*>(p.t_meta + MetaBlockOffset(m0, r0, p.t_meta_rows) + chunk * 16) = v;
      }
    }
  }
  if constexpr (DIRECT) {
    const int u = TRANS ? t - 128 : t;
    if (u >= 0 && u < 128 && p.lt) {
      StoreLtMetaChunk(s_dmeta, p.d_meta, u, r0, c0, R, C);
    } else if (u >= 0 && u < 128) {
      const int blk = u >> 4, chunk = u & 15;
      const int64_t m0 = r0 + 16 * blk;
      if (m0 < p.d_meta_rows) {
        const uint4 v = *reinterpret_cast<const uint4*>(s_dmeta + blk * kMetaSmemStride + chunk * 16);
        *reinterpret_cast<uint4*>(p.d_meta + MetaBlockOffset(m0, c0, p.d_meta_rows) + chunk * 16) = v;
      }
    }
  }
  sync();  // the staging buffers are reused by the next tile
}

// The work of thread t of CTA `block` (of `grid`) on one tensor: every tile block, block + grid, ...
template <typename T, Op OP, bool DIRECT, bool TRANS, class Sync>
SP24_HD void TileLoop(const TileParams& p, int t, int64_t block, int64_t grid, TileSmem<DIRECT, TRANS>& sm,
                      Sync&& sync) {
  KeyWords key;
  if constexpr (OP == Op::kMvue) {
    key = MakeKey(LoadGlobal(p.key), p.nkw > 1 ? LoadGlobal(p.key + 1) : 0u, p.nkw > 2 ? LoadGlobal(p.key + 2) : 0u,
                  p.nkw > 3 ? LoadGlobal(p.key + 3) : 0u);
  }
  for (int64_t tile = block; tile < p.tiles; tile += grid) {
    CompressTile<T, OP, DIRECT, TRANS>(p, t, tile, key, sm, sync);
  }
}

template <typename T, Op OP, bool DIRECT, bool TRANS>
__global__ void __launch_bounds__(kThreads, MinBlocks<OP, DIRECT, TRANS>()) CompressTileKernel(const TileParams p) {
  __shared__ TileSmem<DIRECT, TRANS> sm;
  TileLoop<T, OP, DIRECT, TRANS>(p, static_cast<int>(threadIdx.x), blockIdx.x, gridDim.x, sm,
                                 []() { __syncthreads(); });
}

// ------------------------------------------------------------------------------------------------
// Many tensors in one launch (Sparse24MaskCompressMany*): the masked compressor of up to kMaxMany
// (x, mask) pairs of one dtype and one output kind. Their tiles are numbered one tensor after the
// other -- tensor i owns the tiles tile_start[i] .. tile_start[i + 1] - 1 -- and every tile runs
// CompressTile with the TileParams the one-tensor handler builds for that tensor, so each output
// is bit for bit the one-tensor kernel's. The table is the kernel's parameter (under the classic
// 4 KB: 56 bytes per tensor), so a launch needs no device memory of its own (command buffers).
constexpr int kMaxMany = 64;

struct ManyTensor {
  const void* x;
  const uint8_t* mask;
  void* d_values;  // direct A = x * mask (CUTLASS values, or cuSPARSELt's buffer); unused without DIRECT
  uint8_t* d_meta;
  void* t_values;  // transposed A = (x * mask)^T; unused without TRANS
  uint8_t* t_meta;
  int32_t rows, cols;
};

struct ManyParams {
  int32_t tile_start[kMaxMany + 1];  // tile_start[n]: all tiles
  int32_t n;
  bool lt;
  ManyTensor t[kMaxMany];
};
static_assert(sizeof(ManyParams) <= 4096, "the tile table must fit the classic 4 KB of kernel parameters");

SP24_HD int64_t RoundUp64(int64_t v) { return (v + 63) / 64 * 64; }

// The TileParams of table entry e: the one-tensor handler's (Validate), metadata rows from the
// shapes -- M padded to 64 in CUTLASS's layout (CutlassCompressedShapes; the handler checks it), M
// itself in cuSPARSELt's.
SP24_HD TileParams ManyEntryParams(const ManyTensor& e, bool lt) {
  TileParams p{};
  p.x = e.x;
  p.rows = e.rows;
  p.cols = e.cols;
  p.mask = e.mask;
  p.d_values = e.d_values;
  p.d_meta = e.d_meta;
  p.d_meta_rows = lt ? int64_t{e.rows} : RoundUp64(e.rows);
  p.t_values = e.t_values;
  p.t_meta = e.t_meta;
  p.t_meta_rows = lt ? int64_t{e.cols} : RoundUp64(e.cols);
  p.lt = lt;
  SetTiles(p);
  return p;
}

// The work of thread t of CTA `block` (of `grid`) on a table: every tile block, block + grid, ... of
// all tensors. A CTA's tiles increase, so its tensor index only moves forward (uniform over the
// CTA: the lookup reads the parameter bank, no memory).
template <typename T, bool DIRECT, bool TRANS, class Sync>
SP24_HD void ManyTileLoop(const ManyParams& mp, int t, int64_t block, int64_t grid, TileSmem<DIRECT, TRANS>& sm,
                          Sync&& sync) {
  const KeyWords key{};  // the masked compressor draws nothing
  const int64_t total = mp.tile_start[mp.n];
  int i = 0;
  for (int64_t g = block; g < total; g += grid) {
    while (g >= mp.tile_start[i + 1]) ++i;
    const TileParams p = ManyEntryParams(mp.t[i], mp.lt);
    CompressTile<T, Op::kMask, DIRECT, TRANS>(p, t, g - mp.tile_start[i], key, sm, sync);
  }
}

template <typename T, bool DIRECT, bool TRANS>
__global__ void __launch_bounds__(kThreads, MinBlocks<Op::kMask, DIRECT, TRANS>())
    CompressManyKernel(const __grid_constant__ ManyParams p) {
  __shared__ TileSmem<DIRECT, TRANS> sm;
  ManyTileLoop<T, DIRECT, TRANS>(p, static_cast<int>(threadIdx.x), blockIdx.x, gridDim.x, sm,
                                 []() { __syncthreads(); });
}

// ------------------------------------------------------------------------------------------------
// Host side.




bool Aligned(const void* ptr, uintptr_t n) { return (reinterpret_cast<uintptr_t>(ptr) % n) == 0; }

// Checks one compressed output pair (values, meta) for the operand A (m x k) of dtype `dt`.
ffi::Error CheckOutputs(const std::string& op, const char* which, ffi::DataType dt, int64_t m, int64_t k,
                        ffi::AnyBuffer& values, ffi::AnyBuffer& meta) {
  const int code = dt == ffi::DataType::BF16 ? 0 : 1;
  CompressedShapes s;
  std::string error;
  if (!CutlassCompressedShapes(m, k, code, &s, &error)) {
    return InvalidArgument(op + ": the " + which + " operand (m=" + std::to_string(m) + ", k=" + std::to_string(k) +
                           "): " + error);
  }
  if (values.element_type() != dt) {
    return InvalidArgument(op + ": " + which + " values must have x's dtype " + DataTypeName(dt) + ", got " +
                           DataTypeName(values.element_type()));
  }
  if (meta.element_type() != ffi::DataType::U8) {
    return InvalidArgument(op + ": " + which + " meta must be uint8, got " + DataTypeName(meta.element_type()));
  }
  if (!Is2D(values.dimensions(), s.values_rows, s.values_cols)) {
    return InvalidArgument(op + ": " + which + " values must have shape " + Shape2(s.values_rows, s.values_cols) +
                           ", got " + DimsString(values.dimensions()));
  }
  if (!Is2D(meta.dimensions(), s.meta_rows, s.meta_cols)) {
    return InvalidArgument(op + ": " + which + " meta must have shape " + Shape2(s.meta_rows, s.meta_cols) + ", got " +
                           DimsString(meta.dimensions()));
  }
  if (!Aligned(values.untyped_data(), 16) || !Aligned(meta.untyped_data(), 16)) {
    return InvalidArgument(op + ": " + which + " outputs must be 16-byte aligned");
  }
  return ffi::Error::Success();
}

// Checks one output buffer in cuSPARSELt's layout (values then metadata, compress_layout.h) for the
// operand A (m x k) of a 16-bit dtype.
ffi::Error CheckLtOutput(const std::string& op, const char* which, int64_t m, int64_t k, ffi::AnyBuffer& out) {
  if (m % 64 != 0 || k % 32 != 0) {
    return InvalidArgument(op + ": cuSPARSELt layout of the " + which + " operand needs m % 64 == 0 and k % 32 == 0, " +
                           "got m=" + std::to_string(m) + ", k=" + std::to_string(k));
  }
  const int64_t bytes = m * k + m * k / 8;
  const auto d = out.dimensions();
  if (out.element_type() != ffi::DataType::U8 || d.size() != 1 || d[0] != bytes) {
    return InvalidArgument(op + ": " + which + " output (cuSPARSELt layout) must be uint8 of shape (" +
                           std::to_string(bytes) + ",), got " + DataTypeName(out.element_type()) + " " +
                           DimsString(d));
  }
  if (!Aligned(out.untyped_data(), 16)) return InvalidArgument(op + ": " + which + " output must be 16-byte aligned");
  return ffi::Error::Success();
}

// CTAs of a launch over `tiles` tiles: one per tile, at most 16 per SM (then grid-stride).
unsigned GridSize(int sm_count, int64_t tiles) {
  const int64_t max_blocks = int64_t(sm_count) * 16;
  return static_cast<unsigned>(tiles < max_blocks ? tiles : max_blocks);
}

template <typename T, Op OP, bool DIRECT, bool TRANS>
ffi::Error Launch(cudaStream_t stream, int sm_count, const TileParams& p) {
  if (p.tiles == 0) return ffi::Error::Success();
  const unsigned blocks = GridSize(sm_count, p.tiles);
  CompressTileKernel<T, OP, DIRECT, TRANS><<<blocks, kThreads, 0, stream>>>(p);
  SP24_CHECK_LAUNCH("CompressTileKernel");
  return ffi::Error::Success();
}

template <Op OP, bool DIRECT, bool TRANS>
ffi::Error LaunchTyped(cudaStream_t stream, int sm_count, ffi::DataType dt, const TileParams& p) {
  if (dt == ffi::DataType::BF16) return Launch<__nv_bfloat16, OP, DIRECT, TRANS>(stream, sm_count, p);
  return Launch<__half, OP, DIRECT, TRANS>(stream, sm_count, p);
}

struct Extra {
  const ffi::AnyBuffer* mask = nullptr;  // kMask: the mask; kPacked: the mask bits
  const ffi::AnyBuffer* key = nullptr;
};

// Validates x / the extra inputs / the outputs and fills *out (tile grid included). Outputs: direct
// pair and/or transposed pair (CUTLASS layout), or with `lt` one buffer per direction in `*_values`
// (cuSPARSELt layout, `*_meta` unused). Errors start with `op` (the op's name, and for the
// many-tensor handler the tensor's index). kPacked: x is the packed values (R / 2, C) of the weight
// (R, C) the outputs compress, ex.mask its bits (R / 8, C).
template <Op OP>
ffi::Error Validate(const std::string& op, const ffi::AnyBuffer& x, const Extra& ex, ffi::AnyBuffer* d_values,
                    ffi::AnyBuffer* d_meta, ffi::AnyBuffer* t_values, ffi::AnyBuffer* t_meta, bool lt,
                    TileParams* out) {
  const ffi::DataType dt = x.element_type();
  if (dt != ffi::DataType::BF16 && dt != ffi::DataType::F16) {
    return InvalidArgument(op + ": x must be bfloat16 or float16, got " + DataTypeName(dt));
  }
  const auto dims = x.dimensions();
  constexpr bool kPackedIn = OP == Op::kPacked;
  const char* x_name = kPackedIn ? "values" : "x";
  if (dims.size() != 2) {
    return InvalidArgument(op + ": " + x_name + " must be 2-D, got shape " + DimsString(dims));
  }
  const int64_t R = kPackedIn ? 2 * dims[0] : dims[0], C = dims[1];
  if (R % 8 != 0 || C % 8 != 0) {
    if (kPackedIn) {
      return InvalidArgument(op + ": the weight (2 * values rows, cols) must have rows and cols that are multiples "
                             "of 8, got values of shape " + DimsString(dims));
    }
    return InvalidArgument(op + ": x's rows and cols must be multiples of 8, got shape " + DimsString(dims));
  }
  if (!Aligned(x.untyped_data(), 16)) return InvalidArgument(op + ": " + x_name + " must be 16-byte aligned");
  // Direct A = x is (m = R, k = C); transposed A = x^T is (m = C, k = R). CutlassCompressedShapes
  // checks the GEMM's constraints (k % 16, m % 8, sizes below 2^31).
  if (lt) {
    if (d_values != nullptr) SP24_RETURN_IF_ERROR(CheckLtOutput(op, "direct (A = x)", R, C, *d_values));
    if (t_values != nullptr) SP24_RETURN_IF_ERROR(CheckLtOutput(op, "transposed (A = x^T)", C, R, *t_values));
  } else {
    if (d_values != nullptr) SP24_RETURN_IF_ERROR(CheckOutputs(op, "direct (A = x)", dt, R, C, *d_values, *d_meta));
    if (t_values != nullptr) {
      SP24_RETURN_IF_ERROR(CheckOutputs(op, "transposed (A = x^T)", dt, C, R, *t_values, *t_meta));
    }
  }

  TileParams p{};
  p.x = x.untyped_data();
  p.rows = R;
  p.cols = C;
  if constexpr (OP == Op::kMask) {
    const ffi::AnyBuffer& m = *ex.mask;
    if (m.element_type() != ffi::DataType::PRED && m.element_type() != ffi::DataType::U8) {
      return InvalidArgument(op + ": mask must be bool, got " + DataTypeName(m.element_type()));
    }
    if (!Is2D(m.dimensions(), R, C)) {
      return InvalidArgument(op + ": mask must have x's shape " + Shape2(R, C) + ", got " + DimsString(m.dimensions()));
    }
    if (!Aligned(m.untyped_data(), 8)) return InvalidArgument(op + ": mask must be 8-byte aligned");
    p.mask = static_cast<const uint8_t*>(m.untyped_data());
  }
  if constexpr (OP == Op::kPacked) {
    const ffi::AnyBuffer& m = *ex.mask;
    if (m.element_type() != ffi::DataType::U8) {
      return InvalidArgument(op + ": bits must be uint8, got " + DataTypeName(m.element_type()));
    }
    if (!Is2D(m.dimensions(), R / 8, C)) {
      return InvalidArgument(op + ": bits must have shape " + Shape2(R / 8, C) + " for values of shape " +
                             DimsString(dims) + ", got " + DimsString(m.dimensions()));
    }
    if (!Aligned(m.untyped_data(), 8)) return InvalidArgument(op + ": bits must be 8-byte aligned");
    p.mask = static_cast<const uint8_t*>(m.untyped_data());
  }
  if constexpr (OP == Op::kMvue) {
    const ffi::AnyBuffer& k = *ex.key;
    const auto kd = k.dimensions();
    if (k.element_type() != ffi::DataType::U32 || kd.size() != 1 || kd[0] < 1 || kd[0] > 4) {
      return InvalidArgument(op + ": key must be uint32 key data of shape (n,), 1 <= n <= 4, got " +
                             DataTypeName(k.element_type()) + " of shape " + DimsString(kd));
    }
    p.key = static_cast<const uint32_t*>(k.untyped_data());
    p.nkw = static_cast<int>(kd[0]);
  }
  p.lt = lt;
  if (d_values != nullptr) {
    p.d_values = d_values->untyped_data();
    p.d_meta = lt ? static_cast<uint8_t*>(d_values->untyped_data()) + R * C : static_cast<uint8_t*>(d_meta->untyped_data());
    p.d_meta_rows = lt ? R : d_meta->dimensions()[0];
  }
  if (t_values != nullptr) {
    p.t_values = t_values->untyped_data();
    p.t_meta = lt ? static_cast<uint8_t*>(t_values->untyped_data()) + R * C : static_cast<uint8_t*>(t_meta->untyped_data());
    p.t_meta_rows = lt ? C : t_meta->dimensions()[0];
  }
  SetTiles(p);
  *out = p;
  return ffi::Error::Success();
}

// Validates (Validate) and launches the one-tensor kernel.
template <Op OP>
ffi::Error Run(const char* op_name, cudaStream_t stream, int32_t device, const ffi::AnyBuffer& x, const Extra& ex,
               ffi::AnyBuffer* d_values, ffi::AnyBuffer* d_meta, ffi::AnyBuffer* t_values, ffi::AnyBuffer* t_meta,
               bool lt = false) {
  const std::string op = op_name;
  TileParams p{};
  SP24_RETURN_IF_ERROR(Validate<OP>(op, x, ex, d_values, d_meta, t_values, t_meta, lt, &p));
  const ffi::DataType dt = x.element_type();
  int sm_count = 0;
  SP24_RETURN_IF_ERROR(SmCount(device, &sm_count));
  if (d_values != nullptr && t_values != nullptr) {
    if constexpr (OP == Op::kMask) return LaunchTyped<OP, true, true>(stream, sm_count, dt, p);
    return Internal(op + ": both directions need a given mask");
  }
  if (t_values != nullptr) return LaunchTyped<OP, false, true>(stream, sm_count, dt, p);
  return LaunchTyped<OP, true, false>(stream, sm_count, dt, p);
}

// Handlers with one output pair: `transposed` picks A = x^T (true) or A = x (false).
template <Op OP>
ffi::Error RunOne(const char* name, cudaStream_t stream, int32_t device, const ffi::AnyBuffer& x, const Extra& ex,
                  ffi::AnyBuffer& values, ffi::AnyBuffer& meta, bool transposed) {
  if (transposed) return Run<OP>(name, stream, device, x, ex, nullptr, nullptr, &values, &meta);
  return Run<OP>(name, stream, device, x, ex, &values, &meta, nullptr, nullptr);
}

// The same with one output buffer in cuSPARSELt's layout.
template <Op OP>
ffi::Error RunOneLt(const char* name, cudaStream_t stream, int32_t device, const ffi::AnyBuffer& x, const Extra& ex,
                    ffi::AnyBuffer& out, bool transposed) {
  if (transposed) return Run<OP>(name, stream, device, x, ex, nullptr, nullptr, &out, nullptr, true);
  return Run<OP>(name, stream, device, x, ex, &out, nullptr, nullptr, nullptr, true);
}

ffi::Error MaskCompressImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer x, ffi::AnyBuffer mask,
                            ffi::Result<ffi::AnyBuffer> values, ffi::Result<ffi::AnyBuffer> meta, int64_t transposed) {
  Extra ex;
  ex.mask = &mask;
  return RunOne<Op::kMask>("masked_compress", stream, device, x, ex, *values, *meta, transposed);
}

ffi::Error MaskCompressBothImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer x, ffi::AnyBuffer mask,
                                ffi::Result<ffi::AnyBuffer> t_values, ffi::Result<ffi::AnyBuffer> t_meta,
                                ffi::Result<ffi::AnyBuffer> d_values, ffi::Result<ffi::AnyBuffer> d_meta) {
  Extra ex;
  ex.mask = &mask;
  return Run<Op::kMask>("masked_compress_both", stream, device, x, ex, &(*d_values), &(*d_meta), &(*t_values),
                        &(*t_meta));
}

ffi::Error PackedCompressImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer values, ffi::AnyBuffer bits,
                              ffi::Result<ffi::AnyBuffer> out_values, ffi::Result<ffi::AnyBuffer> out_meta,
                              int64_t transposed) {
  Extra ex;
  ex.mask = &bits;
  return RunOne<Op::kPacked>("packed_compress", stream, device, values, ex, *out_values, *out_meta, transposed);
}

ffi::Error Mvue24CompressImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer key, ffi::AnyBuffer x,
                              ffi::Result<ffi::AnyBuffer> values, ffi::Result<ffi::AnyBuffer> meta, int64_t transposed) {
  Extra ex;
  ex.key = &key;
  return RunOne<Op::kMvue>("mvue24_compress", stream, device, x, ex, *values, *meta, transposed);
}

ffi::Error MaskCompressLtImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer x, ffi::AnyBuffer mask,
                              ffi::Result<ffi::AnyBuffer> out, int64_t transposed) {
  Extra ex;
  ex.mask = &mask;
  return RunOneLt<Op::kMask>("masked_compress", stream, device, x, ex, *out, transposed);
}

ffi::Error MaskCompressBothLtImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer x, ffi::AnyBuffer mask,
                                  ffi::Result<ffi::AnyBuffer> t_out, ffi::Result<ffi::AnyBuffer> d_out) {
  Extra ex;
  ex.mask = &mask;
  return Run<Op::kMask>("masked_compress_both", stream, device, x, ex, &(*d_out), nullptr, &(*t_out), nullptr, true);
}

ffi::Error PackedCompressLtImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer values, ffi::AnyBuffer bits,
                                ffi::Result<ffi::AnyBuffer> out, int64_t transposed) {
  Extra ex;
  ex.mask = &bits;
  return RunOneLt<Op::kPacked>("packed_compress", stream, device, values, ex, *out, transposed);
}

ffi::Error Mvue24CompressLtImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer key, ffi::AnyBuffer x,
                                ffi::Result<ffi::AnyBuffer> out, int64_t transposed) {
  Extra ex;
  ex.key = &key;
  return RunOneLt<Op::kMvue>("mvue24_compress", stream, device, x, ex, *out, transposed);
}

// ---- many tensors in one launch ----

template <typename T, bool DIRECT, bool TRANS>
ffi::Error LaunchMany(cudaStream_t stream, int sm_count, const ManyParams& mp) {
  const int64_t tiles = mp.tile_start[mp.n];
  if (tiles == 0) return ffi::Error::Success();
  CompressManyKernel<T, DIRECT, TRANS><<<GridSize(sm_count, tiles), kThreads, 0, stream>>>(mp);
  SP24_CHECK_LAUNCH("CompressManyKernel");
  return ffi::Error::Success();
}

template <bool DIRECT, bool TRANS>
ffi::Error LaunchManyTyped(cudaStream_t stream, int sm_count, ffi::DataType dt, const ManyParams& mp) {
  if (dt == ffi::DataType::BF16) return LaunchMany<__nv_bfloat16, DIRECT, TRANS>(stream, sm_count, mp);
  return LaunchMany<__half, DIRECT, TRANS>(stream, sm_count, mp);
}

// Operands x_0, mask_0, x_1, mask_1, ...; the results of tensor i in the order of the one-tensor
// handler of the same kind: both directions: transposed values, meta, direct values, meta
// (MaskCompressBothImpl), one direction: values, meta (MaskCompressImpl); in cuSPARSELt's layout one
// buffer per direction (transposed first). Every tensor is validated as the one-tensor handler
// validates it (Validate), and all must share one dtype.
ffi::Error RunMany(cudaStream_t stream, int32_t device, ffi::RemainingArgs args, ffi::RemainingRets rets, bool direct,
                   bool transposed, bool lt) {
  const std::string op = lt ? "masked_compress_many (cuSPARSELt layout)" : "masked_compress_many";
  if (!direct && !transposed) return InvalidArgument(op + ": needs the direct or the transposed output (or both)");
  if (args.size() % 2 != 0) {
    return InvalidArgument(op + ": operands must be (x, mask) pairs, got " + std::to_string(args.size()) +
                           " operands");
  }
  const size_t n = args.size() / 2;
  if (n < 1 || n > size_t{kMaxMany}) {
    return InvalidArgument(op + ": takes 1 to " + std::to_string(kMaxMany) + " tensors per call, got " +
                           std::to_string(n));
  }
  const size_t per_dir = lt ? 1 : 2;
  const size_t per = per_dir * (size_t{direct} + size_t{transposed});
  if (rets.size() != n * per) {
    return InvalidArgument(op + ": " + std::to_string(n) + " tensors need " + std::to_string(n * per) +
                           " results, got " + std::to_string(rets.size()));
  }
  ManyParams mp{};
  mp.n = static_cast<int32_t>(n);
  mp.lt = lt;
  ffi::DataType dt = ffi::DataType::BF16;
  int64_t total = 0;
  for (size_t i = 0; i < n; ++i) {
    const std::string opi = op + ": tensor " + std::to_string(i);
    ffi::ErrorOr<ffi::AnyBuffer> x = args.get<ffi::AnyBuffer>(2 * i);
    ffi::ErrorOr<ffi::AnyBuffer> m = args.get<ffi::AnyBuffer>(2 * i + 1);
    if (x.has_error()) return x.error();
    if (m.has_error()) return m.error();
    if (i == 0) {
      dt = x->element_type();
    } else if (x->element_type() != dt) {
      return InvalidArgument(opi + ": all x must have one dtype, tensor 0's is " + DataTypeName(dt) + ", this one's " +
                             DataTypeName(x->element_type()));
    }
    // slots: transposed values, meta, direct values, meta (cuSPARSELt's layout: no meta buffers)
    std::optional<ffi::Result<ffi::AnyBuffer>> res[4];
    ffi::AnyBuffer* out[4] = {nullptr, nullptr, nullptr, nullptr};
    size_t next = i * per;
    for (int slot = 0; slot < 4; ++slot) {
      if (!(slot < 2 ? transposed : direct) || (lt && slot % 2 == 1)) continue;
      ffi::ErrorOr<ffi::Result<ffi::AnyBuffer>> r = rets.get<ffi::AnyBuffer>(next++);
      if (r.has_error()) return r.error();
      res[slot].emplace(*r);
      out[slot] = &**res[slot];
    }
    Extra ex;
    ex.mask = &*m;
    TileParams p{};
    SP24_RETURN_IF_ERROR(Validate<Op::kMask>(opi, *x, ex, out[2], out[3], out[0], out[1], lt, &p));
    ManyTensor& e = mp.t[i];
    e.x = p.x;
    e.mask = p.mask;
    e.d_values = p.d_values;
    e.d_meta = p.d_meta;
    e.t_values = p.t_values;
    e.t_meta = p.t_meta;
    e.rows = static_cast<int32_t>(p.rows);  // < 2^31: CutlassCompressedShapes / CheckLtOutput
    e.cols = static_cast<int32_t>(p.cols);
    // The kernel rebuilds p from the entry: the same parameters, or this table is wrong.
    const TileParams q = ManyEntryParams(e, lt);
    if (q.rows != p.rows || q.cols != p.cols || q.tiles != p.tiles || q.col_tiles != p.col_tiles ||
        (direct && q.d_meta_rows != p.d_meta_rows) || (transposed && q.t_meta_rows != p.t_meta_rows)) {
      return Internal(opi + ": tile table entry does not reproduce the tensor's parameters");
    }
    mp.tile_start[i] = static_cast<int32_t>(total);
    total += p.tiles;
    if (total > int64_t{0x7FFFFFFF}) return InvalidArgument(op + ": more than 2^31 - 1 tiles in one call");
  }
  mp.tile_start[n] = static_cast<int32_t>(total);
  int sm_count = 0;
  SP24_RETURN_IF_ERROR(SmCount(device, &sm_count));
  if (direct && transposed) return LaunchManyTyped<true, true>(stream, sm_count, dt, mp);
  if (transposed) return LaunchManyTyped<false, true>(stream, sm_count, dt, mp);
  return LaunchManyTyped<true, false>(stream, sm_count, dt, mp);
}

ffi::Error MaskCompressManyImpl(cudaStream_t stream, int32_t device, ffi::RemainingArgs args, ffi::RemainingRets rets,
                                int64_t direct, int64_t transposed) {
  return RunMany(stream, device, args, rets, direct != 0, transposed != 0, false);
}

ffi::Error MaskCompressManyLtImpl(cudaStream_t stream, int32_t device, ffi::RemainingArgs args,
                                  ffi::RemainingRets rets, int64_t direct, int64_t transposed) {
  return RunMany(stream, device, args, rets, direct != 0, transposed != 0, true);
}

}  // namespace
}  // namespace compress
}  // namespace jax_sparse24

// x (R, C), mask (R, C) bool -> values, meta of A = x * mask or (x * mask)^T.
XLA_FFI_DEFINE_HANDLER_SYMBOL(Sparse24MaskCompress, jax_sparse24::compress::MaskCompressImpl,
                              ::xla::ffi::Ffi::Bind()
                                  .Ctx<::xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<::xla::ffi::DeviceOrdinal>()
                                  .Arg<::xla::ffi::AnyBuffer>()  // x
                                  .Arg<::xla::ffi::AnyBuffer>()  // mask
                                  .Ret<::xla::ffi::AnyBuffer>()  // values
                                  .Ret<::xla::ffi::AnyBuffer>()  // meta
                                  .Attr<int64_t>("transposed"),
                              {::xla::ffi::Traits::kCmdBufferCompatible});

// x (R, C), mask (R, C) bool (2:4 along both axes) -> (x*mask)^T values, meta, then x*mask values, meta.
XLA_FFI_DEFINE_HANDLER_SYMBOL(Sparse24MaskCompressBoth, jax_sparse24::compress::MaskCompressBothImpl,
                              ::xla::ffi::Ffi::Bind()
                                  .Ctx<::xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<::xla::ffi::DeviceOrdinal>()
                                  .Arg<::xla::ffi::AnyBuffer>()   // x
                                  .Arg<::xla::ffi::AnyBuffer>()   // mask
                                  .Ret<::xla::ffi::AnyBuffer>()   // transposed values
                                  .Ret<::xla::ffi::AnyBuffer>()   // transposed meta
                                  .Ret<::xla::ffi::AnyBuffer>()   // direct values
                                  .Ret<::xla::ffi::AnyBuffer>(),  // direct meta
                              {::xla::ffi::Traits::kCmdBufferCompatible});

// values (R / 2, C), bits (R / 8, C) uint8 (packed24's encoding of a weight (R, C), groups along R) ->
// values, meta of A = W or W^T, W the unpacked weight.
XLA_FFI_DEFINE_HANDLER_SYMBOL(Sparse24PackedCompress, jax_sparse24::compress::PackedCompressImpl,
                              ::xla::ffi::Ffi::Bind()
                                  .Ctx<::xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<::xla::ffi::DeviceOrdinal>()
                                  .Arg<::xla::ffi::AnyBuffer>()  // values
                                  .Arg<::xla::ffi::AnyBuffer>()  // bits
                                  .Ret<::xla::ffi::AnyBuffer>()  // values
                                  .Ret<::xla::ffi::AnyBuffer>()  // meta
                                  .Attr<int64_t>("transposed"),
                              {::xla::ffi::Traits::kCmdBufferCompatible});

// key (n,) uint32, x (R, C) -> values, meta of MVUE(x) (groups along the compressed K axis).
XLA_FFI_DEFINE_HANDLER_SYMBOL(Sparse24Mvue24Compress, jax_sparse24::compress::Mvue24CompressImpl,
                              ::xla::ffi::Ffi::Bind()
                                  .Ctx<::xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<::xla::ffi::DeviceOrdinal>()
                                  .Arg<::xla::ffi::AnyBuffer>()  // key
                                  .Arg<::xla::ffi::AnyBuffer>()  // x
                                  .Ret<::xla::ffi::AnyBuffer>()  // values
                                  .Ret<::xla::ffi::AnyBuffer>()  // meta
                                  .Attr<int64_t>("transposed"),
                              {::xla::ffi::Traits::kCmdBufferCompatible});

// The same four compressors writing cuSPARSELt's compressed operand (compress_layout.h LtMetaNibble):
// one uint8 buffer (m * k * 9 / 8 bytes) per direction instead of the values, meta pair.
#define SP24_LT_HANDLER(NAME, IMPL, ...)                                                   \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(NAME, jax_sparse24::compress::IMPL,                        \
                                ::xla::ffi::Ffi::Bind()                                    \
                                    .Ctx<::xla::ffi::PlatformStream<cudaStream_t>>()       \
                                    .Ctx<::xla::ffi::DeviceOrdinal>() __VA_ARGS__,         \
                                {::xla::ffi::Traits::kCmdBufferCompatible});

SP24_LT_HANDLER(Sparse24MaskCompressLt, MaskCompressLtImpl,
                .Arg<::xla::ffi::AnyBuffer>().Arg<::xla::ffi::AnyBuffer>().Ret<::xla::ffi::AnyBuffer>()
                .Attr<int64_t>("transposed"))
SP24_LT_HANDLER(Sparse24MaskCompressBothLt, MaskCompressBothLtImpl,
                .Arg<::xla::ffi::AnyBuffer>().Arg<::xla::ffi::AnyBuffer>().Ret<::xla::ffi::AnyBuffer>()
                .Ret<::xla::ffi::AnyBuffer>())
SP24_LT_HANDLER(Sparse24PackedCompressLt, PackedCompressLtImpl,
                .Arg<::xla::ffi::AnyBuffer>().Arg<::xla::ffi::AnyBuffer>().Ret<::xla::ffi::AnyBuffer>()
                .Attr<int64_t>("transposed"))
SP24_LT_HANDLER(Sparse24Mvue24CompressLt, Mvue24CompressLtImpl,
                .Arg<::xla::ffi::AnyBuffer>().Arg<::xla::ffi::AnyBuffer>().Ret<::xla::ffi::AnyBuffer>()
                .Attr<int64_t>("transposed"))
#undef SP24_LT_HANDLER

// Many (x, mask) pairs of one dtype in one launch: operands x_0, mask_0, x_1, mask_1, ... (1 to 64
// pairs); per tensor the results of Sparse24MaskCompressBoth (direct = transposed = 1) or of
// Sparse24MaskCompress (one of them), in that order. The Lt variant: the buffers of the Lt handlers.
XLA_FFI_DEFINE_HANDLER_SYMBOL(Sparse24MaskCompressMany, jax_sparse24::compress::MaskCompressManyImpl,
                              ::xla::ffi::Ffi::Bind()
                                  .Ctx<::xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<::xla::ffi::DeviceOrdinal>()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attr<int64_t>("direct")
                                  .Attr<int64_t>("transposed"),
                              {::xla::ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(Sparse24MaskCompressManyLt, jax_sparse24::compress::MaskCompressManyLtImpl,
                              ::xla::ffi::Ffi::Bind()
                                  .Ctx<::xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<::xla::ffi::DeviceOrdinal>()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attr<int64_t>("direct")
                                  .Attr<int64_t>("transposed"),
                              {::xla::ffi::Traits::kCmdBufferCompatible});
