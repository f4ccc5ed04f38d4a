// Fused fp8 quantize + 2:4 mask + compress: read a dense (R, C) bf16/fp16/fp32 array and its mask
// once and write the CUTLASS SM90 compressed fp8 (e4m3) operand of the fp8 sparse GEMM
// (spmm_cutlass_fp8.cu): values + metadata.
//
//   Sparse24Fp8MaskCompress: x (R, C), mask (R, C) bool, scale () f32 -> values (M, K/2) e4m3, meta u8
//                            attr transposed: A = x^T (M = C, K = R) if true, else A = x (M = R, K = C).
//   Sparse24Fp8PackedCompress: values (R/2, C), bits (R/8, C) u8, scale () f32 -> values, meta as
//                            Sparse24Fp8MaskCompress of the weight (R, C) that packed24's encoding holds
//                            (kept values + mask bits, groups of 4 along R): an FSDP weight gathered packed
//                            goes to the fp8 GEMM's operand without being unpacked in memory.
//   Sparse24Fp8Mvue24Compress: key (n,) u32, g (R, C), scale () f32 -> values (M, K/2) e4m3, meta u8 of
//                            A = q(MVUE(g))^T (M = C, K = R): the unbiased MVUE 2:4 sample of g with its
//                            groups of 4 along g's rows (the token axis of dy), drawn with the element-wise
//                            MVUE kernel's Philox stream and group numbering (mvue_rng.cuh), each kept
//                            value rounded to g's dtype (as that kernel writes it), then quantized.
//   Sparse24Fp8QuantizeTranspose: x (R, C), scale () f32 -> q(x)^T (C, R) e4m3, dense: the K-major dense
//                            operand of the sparse fp8 weight-gradient GEMM (q(x)^T, K = tokens), which
//                            XLA's own transpose fusions wrote at a fraction of memory speed.
//
// Math (the reference is jax_sparse24/_src/fp8_math.py): q = e4m3(saturate(x * (1 / scale))) where mask is
// set, else 0, rounded to nearest even; 1 / scale is the correctly rounded float32 reciprocal. The
// output equals CUTLASS's compressor (+ the all-zero-group fix-up, spmm_cutlass.cu) applied to the
// dense quantized A: the GPU tests check it bit for bit. The MVUE one equals
// Sparse24Fp8MaskCompress(Sparse24Mvue24(key, g, axis 0), all-true mask, scale, transposed) bit for bit.
//
// Layout of the fp8 operand (Sm90GemmSparseConfig with 8-bit A, tile K >= 128; checked against CuTe's
// fill_layoutE): values row-major (M, K/2), the two kept bytes of each group of 4 in order; metadata
// one nibble per group (low nibble: the even group of a byte), M padded to 64 rows and K to 128
// columns, in blocks of 128 columns: byte (m, k) at (k / 128) * M_al * 16 + m * 16 + (k % 128) / 8.
// Padding is written as all-zero groups (nibble 0x4).
//
// Kernel: one CTA (256 threads) per 64 (m) x 128 (k) tile of A; each thread owns 8 consecutive k of
// one row m (one metadata byte, 4 value bytes) four times. Direct (A = x): the thread loads its 8
// elements with 16-byte loads and compresses them from registers. Transposed (A = x^T): the tile of x
// (128 rows x 64 columns) is loaded row-wise (16-byte loads along x's rows), quantized, and staged as
// bytes in shared memory (row pitch 65 bytes: the column reads of the second phase hit distinct banks).
// MVUE (transposed only): its own kernel (Fp8Mvue24CompressKernel) on 128 x 128 tiles of g, as the
// 16-bit MVUE compressor: each thread draws and compresses its 16 groups in registers and stages only
// the compressed bytes; a group's nibble comes from the draw unless a kept value quantizes to +-0.
// 2.7 TB/s at 16384 x 22016 on the H200 (it staged the dense quantized tile before: 1.5 TB/s).
// Command-buffer compatible: no allocation, no synchronisation; the scale and key are read on the device.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "compress_layout.h"
#include "ffi_common.h"
#include "mvue_rng.cuh"
#include "spmm_cutlass.h"

namespace jax_sparse24 {
namespace fp8 {
namespace {

using mask_kernels::After;
using mask_kernels::LoadGlobal;

constexpr int kThreads = 256;
constexpr int kTileM = 64;
constexpr int kTileK = 128;
constexpr int kPitch = kTileM + 1;  // bytes per staged x row (transposed path)

template <typename T>
struct Load8;  // 8 consecutive elements -> float[8]

template <>
struct Load8<float> {
  static SP24_HD void Run(const float* p, float* v) {
    const float4 a = reinterpret_cast<const float4*>(p)[0];
    const float4 b = reinterpret_cast<const float4*>(p)[1];
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
    v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
  }
};

template <>
struct Load8<__nv_bfloat16> {
  static SP24_HD void Run(const __nv_bfloat16* p, float* v) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __bfloat1622float2(h[i]);
      v[2 * i] = f.x;
      v[2 * i + 1] = f.y;
    }
  }
};

template <>
struct Load8<__half> {
  static SP24_HD void Run(const __half* p, float* v) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const __half2* h = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __half22float2(h[i]);
      v[2 * i] = f.x;
      v[2 * i + 1] = f.y;
    }
  }
};

template <typename T>
SP24_HD float ToFloat(T v);
template <>
SP24_HD float ToFloat<float>(float v) { return v; }
template <>
SP24_HD float ToFloat<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <>
SP24_HD float ToFloat<__half>(__half v) { return __half2float(v); }

SP24_HD uint8_t Quantize(float v, float inv) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v * inv, __NV_SATFINITE, __NV_E4M3));
}

// Quantize(lo, inv) | Quantize(hi, inv) << 8 with one paired conversion (the same rounding).
SP24_HD uint32_t Quantize2(float lo, float hi, float inv) {
  return static_cast<uint32_t>(__nv_cvt_float2_to_fp8x2(make_float2(lo * inv, hi * inv), __NV_SATFINITE, __NV_E4M3));
}

SP24_HD bool Nonzero(uint32_t b) { return (b & 0x7Fu) != 0; }  // +-0 count as zero

// One group of 4 quantized bytes (b0 lowest) -> nibble, and the two stored bytes (slot 0 low).
SP24_HD uint32_t CompressGroup(uint32_t g, uint32_t* vals) {
  uint32_t p = 0;
#pragma unroll
  for (int e = 0; e < 4; ++e) p |= uint32_t(Nonzero((g >> (8 * e)) & 0xFFu)) << e;
  const uint32_t nib = uint32_t(compress::kNibbleTable >> (4 * p)) & 0xFu;
  const uint32_t i0 = nib & 3u, i1 = nib >> 2;
  const uint32_t v0 = ((p >> i0) & 1u) ? ((g >> (8 * i0)) & 0xFFu) : 0u;
  const uint32_t v1 = ((p >> i1) & 1u) ? ((g >> (8 * i1)) & 0xFFu) : 0u;
  *vals = v0 | (v1 << 8);
  return nib;
}

// 8 quantized bytes along k (lo: k..k+3, hi: k+4..k+7) -> 4 value bytes and the metadata byte.
SP24_HD void CompressChunk(uint32_t lo, uint32_t hi, uint32_t* values4, uint8_t* meta) {
  uint32_t v_lo, v_hi;
  const uint32_t n_lo = CompressGroup(lo, &v_lo);
  const uint32_t n_hi = CompressGroup(hi, &v_hi);
  *values4 = v_lo | (v_hi << 16);
  *meta = static_cast<uint8_t>(n_lo | (n_hi << 4));
}

SP24_HD int64_t MetaOffset(int64_t m, int64_t k, int64_t m_al) {
  return (k >> 7) * m_al * 16 + m * 16 + ((k & 127) >> 3);
}

// What the masked compressor reads: 8 consecutive elements (r, c .. c + 7) of x and whether each is kept
// (Chunk, c + 8 <= C), or one (One).
template <typename T>
struct DenseSource {  // x (R, C) and its bool mask
  const T* x;
  const bool* mask;
  int64_t C;
  SP24_HD void Chunk(int64_t r, int64_t c, float* v, bool* keep) const {
    Load8<T>::Run(x + r * C + c, v);
    const uint2 mk = *reinterpret_cast<const uint2*>(mask + r * C + c);
    const uint8_t* mb = reinterpret_cast<const uint8_t*>(&mk);
#pragma unroll
    for (int e = 0; e < 8; ++e) keep[e] = mb[e] != 0;
  }
  SP24_HD void One(int64_t r, int64_t c, float* v, bool* keep) const {
    *v = ToFloat<T>(x[r * C + c]);
    *keep = mask[r * C + c];
  }
};

// packed24's encoding of a weight (R, C): values (R / 2, C) -- row 2 g + j holds the (j+1)-th kept element
// of row group g (rows 4 g .. 4 g + 3) -- and bits (R / 8, C) (bit i of byte row b: row 8 b + i kept). An
// element is kept when its bit is set and it is its group's first or second kept one (unpack24: a third
// or fourth kept element is zero).
template <typename T>
struct PackedSource {
  const T* values;
  const uint8_t* bits;
  int64_t C;
  // whether row r's element with mask-bit byte `byte` is kept, and which value row of its group it is in (0, 1)
  static SP24_HD bool Kept(uint32_t byte, int64_t r, int* slot) {
    const uint32_t nib = (byte >> (4 * ((r >> 2) & 1))) & 0xFu;
    const int q = static_cast<int>(r & 3);
    int rank = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) rank += (j <= q) ? static_cast<int>((nib >> j) & 1u) : 0;
    *slot = rank == 2 ? 1 : 0;
    return ((nib >> q) & 1u) != 0 && rank <= 2;
  }
  SP24_HD void Chunk(int64_t r, int64_t c, float* v, bool* keep) const {
    const int64_t g = r >> 2;
    float first[8], second[8];
    Load8<T>::Run(values + (2 * g) * C + c, first);
    Load8<T>::Run(values + (2 * g + 1) * C + c, second);
    const uint2 bw = *reinterpret_cast<const uint2*>(bits + (r >> 3) * C + c);
    const uint8_t* bb = reinterpret_cast<const uint8_t*>(&bw);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      int slot;
      keep[e] = Kept(bb[e], r, &slot);
      v[e] = slot ? second[e] : first[e];
    }
  }
  SP24_HD void One(int64_t r, int64_t c, float* v, bool* keep) const {
    int slot;
    *keep = Kept(bits[(r >> 3) * C + c], r, &slot);
    *v = ToFloat<T>(values[(2 * (r >> 2) + slot) * C + c]);
  }
};

// Phase 2 of the transposed kernels: the staged tile (128 k-rows x 64 m-columns of quantized bytes)
// -> values and metadata of A's rows m0 .. m0+63, columns k0 .. k0+127. Thread t: chunk c = t & 15
// (8 k), rows (t >> 4) + 16 pass.
SP24_HD void StoreStagedTile(const uint8_t* staged, int t, int64_t m0, int64_t k0, uint8_t* __restrict__ values,
                             uint8_t* __restrict__ meta, int64_t M, int64_t K, int64_t m_al) {
  const int c = t & 15, r = t >> 4;
#pragma unroll
  for (int pass = 0; pass < 4; ++pass) {
    const int lm = pass * 16 + r;
    const int64_t m = m0 + lm;
    const int64_t k = k0 + 8 * c;
    uint32_t lo = 0, hi = 0;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      lo |= uint32_t(staged[(8 * c + e) * kPitch + lm]) << (8 * e);
      hi |= uint32_t(staged[(8 * c + 4 + e) * kPitch + lm]) << (8 * e);
    }
    uint32_t vals;
    uint8_t mbyte;
    CompressChunk(lo, hi, &vals, &mbyte);
    if (m < m_al) meta[MetaOffset(m, k, m_al)] = mbyte;  // padding rows / columns too
    if (m < M && k < K) *reinterpret_cast<uint32_t*>(values + m * (K / 2) + k / 2) = vals;
  }
}

// Tile block() = (bx, by) of A by thread t of its CTA (`staged`: kTileK * kPitch bytes of shared memory,
// TRANS only): the kernel's body, which the host emulation (tests/cpp/fp8_compress_emulation.cu) runs with
// 256 host threads and a barrier as `sync`.
template <bool TRANS, class Src, class Block, class Sync>
SP24_HD void Fp8MaskTile(const Src& src, const float* __restrict__ scale, int64_t R, int64_t C, uint8_t* __restrict__ values, uint8_t* __restrict__ meta, int64_t M,
                         int64_t K, int64_t m_al, int t, Block&& block, uint8_t* staged, Sync&& sync) {
  const float inv = 1.0f / LoadGlobal(scale);
  const uint2 b = block();
  const int64_t m0 = int64_t(b.x) * kTileM;
  const int64_t k0 = int64_t(b.y) * kTileK;

  if constexpr (TRANS) {
    // x rows k0 .. k0+127, columns m0 .. m0+63: 8 chunks of 8 columns per row, 1024 chunks.
#pragma unroll
    for (int pass = 0; pass < 4; ++pass) {
      const int idx = pass * kThreads + t;
      const int row = idx >> 3, col = (idx & 7) * 8;
      const int64_t gr = k0 + row, gc = m0 + col;
      float v[8];
      bool keep[8];
      if (gr < R && gc + 8 <= C) {
        src.Chunk(gr, gc, v, keep);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          v[e] = 0.0f;
          keep[e] = false;
          if (gr < R && gc + e < C) src.One(gr, gc + e, &v[e], &keep[e]);
        }
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) staged[row * kPitch + col + e] = keep[e] ? Quantize(v[e], inv) : uint8_t(0);
    }
    sync();
    StoreStagedTile(staged, t, m0, k0, values, meta, M, K, m_al);
  } else {
    const int c = t & 15;  // chunk of 8 along k
    const int r = t >> 4;  // row within a pass of 16 rows
#pragma unroll
    for (int pass = 0; pass < 4; ++pass) {
      const int64_t m = m0 + pass * 16 + r;
      const int64_t k = k0 + 8 * c;
      uint32_t lo = 0, hi = 0;
      if (m < M && k < K) {  // K % 32 == 0: a chunk is entirely inside or outside
        float v[8];
        bool keep[8];
        src.Chunk(m, k, v, keep);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          lo |= uint32_t(keep[e] ? Quantize(v[e], inv) : 0) << (8 * e);
          hi |= uint32_t(keep[4 + e] ? Quantize(v[4 + e], inv) : 0) << (8 * e);
        }
      }
      uint32_t vals;
      uint8_t mbyte;
      CompressChunk(lo, hi, &vals, &mbyte);
      if (m < m_al) meta[MetaOffset(m, k, m_al)] = mbyte;  // padding rows / columns too
      if (m < M && k < K) *reinterpret_cast<uint32_t*>(values + m * (K / 2) + k / 2) = vals;
    }
  }
}

template <bool TRANS, class Src>
__global__ void __launch_bounds__(kThreads) Fp8MaskCompressKernel(const Src src, const float* __restrict__ scale,
                                                                  int64_t R, int64_t C, uint8_t* __restrict__ values,
                                                                  uint8_t* __restrict__ meta, int64_t M, int64_t K,
                                                                  int64_t m_al) {
  __shared__ uint8_t staged[TRANS ? kTileK * kPitch : 1];
  Fp8MaskTile<TRANS>(src, scale, R, C, values, meta, M, K, m_al, static_cast<int>(threadIdx.x),
                     []() { return make_uint2(blockIdx.x, blockIdx.y); }, staged, []() { __syncthreads(); });
}

// float -> T -> float: the rounding of the element-wise MVUE kernel's output to g's dtype.
template <typename T>
SP24_HD float RoundTo(float v);
template <>
SP24_HD float RoundTo<float>(float v) { return v; }
template <>
SP24_HD float RoundTo<__nv_bfloat16>(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }
template <>
SP24_HD float RoundTo<__half>(float v) { return __half2float(__float2half_rn(v)); }

// The raw bits of 8 consecutive elements of one row of g (16-byte loads: one of 16-bit g, two of
// float32), read as floats.
template <typename T>
struct Row8 {
  static constexpr int kWords = 2 * static_cast<int>(sizeof(T));  // 8 elements in 32-bit words
  uint32_t w[kWords];
  SP24_HD void Load(const T* p) {
#pragma unroll
    for (int q = 0; q < kWords / 4; ++q) {
      const uint4 v = LoadGlobal(reinterpret_cast<const uint4*>(p) + q);
      w[4 * q] = v.x, w[4 * q + 1] = v.y, w[4 * q + 2] = v.z, w[4 * q + 3] = v.w;
    }
  }
  SP24_HD void Zero() {
#pragma unroll
    for (int e = 0; e < kWords; ++e) w[e] = 0u;
  }
  SP24_HD float Get(int j) const;  // element j (0..7)
};
template <>
SP24_HD float Row8<__nv_bfloat16>::Get(int j) const {
  return mask_kernels::BitsFloat((j & 1) ? (w[j >> 1] & 0xFFFF0000u) : (w[j >> 1] << 16));
}
template <>
SP24_HD float Row8<__half>::Get(int j) const {
  return __half2float(__ushort_as_half(static_cast<unsigned short>((w[j >> 1] >> (16 * (j & 1))) & 0xFFFFu)));
}
template <>
SP24_HD float Row8<float>::Get(int j) const { return mask_kernels::BitsFloat(w[j]); }

// The MVUE kernel's tile: 128 rows (k) x 128 columns (m) of g, A-rows c0 .. c0+127, k r0 .. r0+127.
constexpr int kMvTile = 128;
constexpr int kMvMetaStride = 272;  // staged metadata: blocks of 16 A-rows x 16 bytes, 16 bytes apart
// Registers: the 8 x 8 patch is 32 words of 16-bit g (3 CTAs per SM, <= 80 registers, as the 16-bit
// MVUE compressor), 64 of float32 g (2 CTAs per SM).
template <typename T>
constexpr int MvueMinBlocks() {
  return sizeof(T) == 4 ? 2 : 3;
}

// A = q(MVUE(g))^T, g (R, C) = (K, M): groups of 4 along g's rows; group (row group gr, column c) has
// index gr * C + c in the Philox stream (the element-wise kernel's numbering along axis 0).
// Thread t = (gp = t / 16, cc = t % 16) loads the 8 x 8 patch at g rows r0 + 8 gp.., columns c0 + 8 cc..
// (16-byte loads; a warp reads 2 rows x 256 bytes of bfloat16), draws its 16 groups (two Philox calls)
// and compresses each one as it is drawn: column j of the patch is A-row a = 8 cc + j, k-chunk gp --
// 4 value bytes and one metadata byte, staged in shared memory (values: 64 bytes per A-row, its four
// 16-byte chunks XOR-swizzled by (a / 8) % 4; metadata: 16 bytes per A-row, kMvMetaStride per 16
// rows), then written with 16-byte stores: 64 contiguous value bytes per A-row, the tile's 2 KB of
// metadata contiguous (one 128-column block of the layout).
// Fp8MvueTile is tile block() = (bx, by) by thread t of its CTA, staging in s_val (kMvTile x 64 bytes) and
// s_meta (8 x kMvMetaStride bytes): the kernel's body, which the host emulation
// (tests/cpp/fp8_compress_emulation.cu) runs with 256 host threads and a barrier as `sync`.
template <typename T, class Block, class Sync>
SP24_HD void Fp8MvueTile(const uint32_t* __restrict__ key, int nkw, const T* __restrict__ g,
                         const float* __restrict__ scale, int64_t R, int64_t C, uint8_t* __restrict__ values,
                         uint8_t* __restrict__ meta, int64_t M, int64_t K, int64_t m_al, int t, Block&& block,
                         uint8_t* s_val, uint8_t* s_meta, Sync&& sync) {
  namespace mk = mask_kernels;
  const float inv = 1.0f / LoadGlobal(scale);
  const mk::KeyWords kw = mk::MakeKey(LoadGlobal(key), nkw > 1 ? LoadGlobal(key + 1) : 0u,
                                      nkw > 2 ? LoadGlobal(key + 2) : 0u, nkw > 3 ? LoadGlobal(key + 3) : 0u);
  const uint2 b = block();
  const int64_t c0 = int64_t(b.x) * kMvTile;  // A-rows (g columns)
  const int64_t r0 = int64_t(b.y) * kMvTile;  // k (g rows)
  const int cc = t & 15, gp = t >> 4;
  const int64_t rb = r0 + 8 * gp, cb = c0 + 8 * cc;
  const bool in = rb < R && cb < C;  // R % 8 == 0 (K % 32), C % 8 == 0: the patch is all in or all out

  Row8<T> x[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    if (in) x[i].Load(g + (rb + i) * C + cb);
    else x[i].Zero();  // zero groups: all-zero values, nibble 0x4 (the layout's padding)
  }
  uint32_t bits[2][8];
#pragma unroll
  for (int h = 0; h < 2; ++h) mk::GroupBitsRun<8>(kw, (rb / 4 + h) * C + cb, bits[h]);  // cb % 8 == 0: one octet

  uint32_t prev = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    uint32_t vals4 = 0, mbyte = 0;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float v[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        v[q] = x[4 * h + q].Get(j);
        if (j + h > 0) After(v[q], prev);
      }
      const mk::Mvue24Kept2 kept = mk::Mvue24Pick(v, bits[h][j]);
      // q(lo) | q(hi) << 8: the two kept values rounded to g's dtype, then quantized (one conversion).
      uint32_t pair = Quantize2(RoundTo<T>(kept.v_lo), RoundTo<T>(kept.v_hi), inv);
      uint32_t nib = kept.nib;  // CUTLASS's rule for a group of two nonzeros at lo < hi
      if ((pair & 0x007Fu) == 0u || (pair & 0x7F00u) == 0u) {
        // a kept value quantized to +-0 (g == 0, or below e4m3's range): CUTLASS's rule on the dense group
        nib = CompressGroup(((pair & 0xFFu) << (8 * kept.lo())) | ((pair >> 8) << (8 * kept.hi())), &pair);
      }
      vals4 |= pair << (16 * h);
      mbyte |= nib << (4 * h);
      prev = nib;
    }
    const int a = 8 * cc + j;
    *reinterpret_cast<uint32_t*>(s_val + a * 64 + (((gp >> 2) ^ (cc & 3)) << 4) + ((gp & 3) << 2)) = vals4;
    s_meta[(a >> 4) * kMvMetaStride + (a & 15) * 16 + gp] = static_cast<uint8_t>(mbyte);
  }
  sync();

  // Values: A-row a's 64 bytes (k r0 .. r0+127) as four 16-byte chunks; K % 32 == 0: a chunk is all
  // in or all out.
#pragma unroll
  for (int pass = 0; pass < 2; ++pass) {
    const int idx = pass * kThreads + t, a = idx >> 2, s = idx & 3;
    const int64_t m = c0 + a, k = r0 + 32 * s;
    if (m < M && k < K) {
      const uint4 v = *reinterpret_cast<const uint4*>(s_val + a * 64 + ((s ^ ((a >> 3) & 3)) << 4));
      *reinterpret_cast<uint4*>(values + m * (K / 2) + k / 2) = v;
    }
  }
  // Metadata: 16 bytes per A-row, padding rows (M .. m_al) and columns (K .. round_up(K, 128)) too.
  if (t < kMvTile) {
    const int64_t m = c0 + t;
    if (m < m_al) {
      const uint4 v = *reinterpret_cast<const uint4*>(s_meta + (t >> 4) * kMvMetaStride + (t & 15) * 16);
      *reinterpret_cast<uint4*>(meta + MetaOffset(m, r0, m_al)) = v;
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads, MvueMinBlocks<T>())
    Fp8Mvue24CompressKernel(const uint32_t* __restrict__ key, int nkw, const T* __restrict__ g,
                            const float* __restrict__ scale, int64_t R, int64_t C, uint8_t* __restrict__ values,
                            uint8_t* __restrict__ meta, int64_t M, int64_t K, int64_t m_al) {
  __shared__ alignas(16) uint8_t s_val[kMvTile * 64];
  __shared__ alignas(16) uint8_t s_meta[8 * kMvMetaStride];
  Fp8MvueTile<T>(key, nkw, g, scale, R, C, values, meta, M, K, m_al, static_cast<int>(threadIdx.x),
                 []() { return make_uint2(blockIdx.x, blockIdx.y); }, s_val, s_meta, []() { __syncthreads(); });
}

// q(x)^T: one CTA (256 threads) per 64 x 64 tile of x. Each thread loads 8 consecutive elements of a
// row (two passes), quantizes them into shared memory (row pitch 68 bytes), then writes 16
// consecutive bytes of one output row (an x column) with one 16-byte store.
constexpr int kQtTile = 64;
constexpr int kQtPitch = kQtTile + 4;

// Tile block() = (bx, by) by thread t of its CTA (`tile`: kQtTile * kQtPitch bytes of shared memory): the
// kernel's body, which the host emulation (tests/cpp/fp8_compress_emulation.cu) runs with 256 host threads
// and a barrier as `sync`.
template <typename T, class Block, class Sync>
SP24_HD void Fp8QuantizeTransposeTile(const T* __restrict__ x, const float* __restrict__ scale, int64_t R, int64_t C,
                                      uint8_t* __restrict__ out, int t, Block&& block, uint8_t* tile, Sync&& sync) {
  const float inv = 1.0f / LoadGlobal(scale);
  const uint2 b = block();
  const int64_t c0 = int64_t(b.x) * kQtTile, r0 = int64_t(b.y) * kQtTile;
#pragma unroll
  for (int pass = 0; pass < 2; ++pass) {
    const int idx = pass * kThreads + t;
    const int row = idx >> 3, col = (idx & 7) * 8;
    const int64_t gr = r0 + row, gc = c0 + col;
    float v[8];
    if (gr < R && gc < C) {  // C % 8 == 0: a chunk is all in or all out
      Load8<T>::Run(x + gr * C + gc, v);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = 0.0f;
    }
    uint32_t lo = 0, hi = 0;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      lo |= uint32_t(Quantize(v[e], inv)) << (8 * e);
      hi |= uint32_t(Quantize(v[4 + e], inv)) << (8 * e);
    }
    uint32_t* dst = reinterpret_cast<uint32_t*>(tile + row * kQtPitch + col);  // kQtPitch % 4 == 0
    dst[0] = lo;
    dst[1] = hi;
  }
  sync();
  // out row oc = c0 + (t >> 2), bytes r0 + 16 (t & 3) .. + 15
  const int lc = t >> 2, lr = (t & 3) * 16;
  const int64_t oc = c0 + lc, orow = r0 + lr;
  if (oc < C && orow < R) {  // R % 16 == 0
    uint32_t w[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      w[q] = 0;
#pragma unroll
      for (int e = 0; e < 4; ++e) w[q] |= uint32_t(tile[(lr + 4 * q + e) * kQtPitch + lc]) << (8 * e);
    }
    *reinterpret_cast<uint4*>(out + oc * R + orow) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) Fp8QuantizeTransposeKernel(const T* __restrict__ x,
                                                                       const float* __restrict__ scale, int64_t R,
                                                                       int64_t C, uint8_t* __restrict__ out) {
  __shared__ uint8_t tile[kQtTile * kQtPitch];
  Fp8QuantizeTransposeTile<T>(x, scale, R, C, out, static_cast<int>(threadIdx.x),
                              []() { return make_uint2(blockIdx.x, blockIdx.y); }, tile, []() { __syncthreads(); });
}

const char* Name(ffi::DataType t) {
  if (t == ffi::DataType::F8E4M3FN) return "float8_e4m3fn";
  return DataTypeName(t);
}

// The checked operand of one fp8 compressor call: x (R, C), A = x^T or x, the kernel's grid.
struct Operand {
  int64_t R = 0, C = 0, M = 0, K = 0, m_al = 0, k_al = 0;
  const float* scale = nullptr;
  uint8_t* values = nullptr;
  uint8_t* meta = nullptr;
  dim3 grid() const { return dim3(static_cast<unsigned>(m_al / kTileM), static_cast<unsigned>(k_al / kTileK)); }
};

// The dtype of the tensor every fp8 kernel quantizes, and its float32 scale.
ffi::Error CheckInputAndScale(const std::string& op, const ffi::AnyBuffer& x, const ffi::AnyBuffer& scale) {
  const ffi::DataType xt = x.element_type();
  if (xt != ffi::DataType::BF16 && xt != ffi::DataType::F16 && xt != ffi::DataType::F32) {
    return InvalidArgument(op + ": x must be bfloat16, float16 or float32, got " + Name(xt));
  }
  if (scale.element_type() != ffi::DataType::F32 || scale.element_count() != 1) {
    return InvalidArgument(op + ": scale must be one float32, got " + Name(scale.element_type()) + " of shape " +
                           DimsString(scale.dimensions()));
  }
  return ffi::Error::Success();
}

// Checks shared by both compressors (dtypes, shapes, CUTLASS's fp8 layout, grid, alignment).
// `rows` >= 0: the operand's x has that many rows, not x's own (packed values: half the weight's rows).
ffi::Error CheckOperand(const std::string& op, const ffi::AnyBuffer& x, const ffi::AnyBuffer& scale,
                        ffi::AnyBuffer& values, ffi::AnyBuffer& meta, bool transposed, Operand* out,
                        int64_t rows = -1) {
  if (ffi::Error e = CheckInputAndScale(op, x, scale); e.failure()) return e;
  if (values.element_type() != ffi::DataType::F8E4M3FN || meta.element_type() != ffi::DataType::U8) {
    return InvalidArgument(op + ": values must be float8_e4m3fn and meta uint8, got " + Name(values.element_type()) +
                           " and " + Name(meta.element_type()));
  }
  const auto dims = x.dimensions();
  if (dims.size() != 2) return InvalidArgument(op + ": x must be 2-D, got shape " + DimsString(dims));
  Operand o;
  o.R = rows >= 0 ? rows : dims[0];
  o.C = dims[1];
  o.M = transposed ? o.C : o.R;
  o.K = transposed ? o.R : o.C;
  CompressedShapes s;
  std::string error;
  if (!CutlassCompressedShapes(o.M, o.K, 2, &s, &error)) return InvalidArgument(op + ": " + error);
  if (!Is2D(values.dimensions(), s.values_rows, s.values_cols)) {
    return InvalidArgument(op + ": values must have shape " + Shape2(s.values_rows, s.values_cols) + ", got " +
                           DimsString(values.dimensions()));
  }
  if (!Is2D(meta.dimensions(), s.meta_rows, s.meta_cols)) {
    return InvalidArgument(op + ": meta must have shape " + Shape2(s.meta_rows, s.meta_cols) + ", got " +
                           DimsString(meta.dimensions()));
  }
  // The kernels' closed-form layout: values exactly (M, K/2), metadata (round_up(M, 64), round_up(K, 128) / 8).
  o.m_al = (o.M + kTileM - 1) / kTileM * kTileM;
  o.k_al = (o.K + kTileK - 1) / kTileK * kTileK;
  if (s.values_rows != o.M || s.values_cols != o.K / 2 || s.meta_rows != o.m_al || s.meta_cols != o.k_al / 8) {
    return Internal(op + ": CUTLASS's fp8 compressed shapes differ from the kernel's layout");
  }
  if (o.m_al / kTileM > 0x7FFFFFFF || o.k_al / kTileK > 65535) {
    return InvalidArgument(op + ": operand too large for the kernel's grid: M=" + std::to_string(o.M) +
                           " K=" + std::to_string(o.K));
  }
  const uintptr_t align = reinterpret_cast<uintptr_t>(x.untyped_data()) |
                          reinterpret_cast<uintptr_t>(values.untyped_data()) |
                          reinterpret_cast<uintptr_t>(meta.untyped_data());
  if (align & 15u) return InvalidArgument(op + ": buffers must be 16-byte aligned");
  // 16-byte row loads: rows of x must keep 16-byte alignment (C % 8 elements; 8-byte mask loads).
  if (o.C % 8) return InvalidArgument(op + ": x's last axis must be a multiple of 8, got " + std::to_string(o.C));
  o.scale = static_cast<const float*>(scale.untyped_data());
  o.values = static_cast<uint8_t*>(values.untyped_data());
  o.meta = static_cast<uint8_t*>(meta.untyped_data());
  *out = o;
  return ffi::Error::Success();
}

template <class Src>
ffi::Error LaunchMask(cudaStream_t stream, bool transposed, const Src& src, const Operand& o) {
  if (transposed) {
    Fp8MaskCompressKernel<true><<<o.grid(), kThreads, 0, stream>>>(src, o.scale, o.R, o.C, o.values, o.meta, o.M, o.K,
                                                                    o.m_al);
  } else {
    Fp8MaskCompressKernel<false><<<o.grid(), kThreads, 0, stream>>>(src, o.scale, o.R, o.C, o.values, o.meta, o.M, o.K,
                                                                     o.m_al);
  }
  SP24_CHECK_LAUNCH("Fp8MaskCompressKernel");
  return ffi::Error::Success();
}

template <typename T>
ffi::Error LaunchMaskDense(cudaStream_t stream, bool transposed, const void* x, const bool* mask, const Operand& o) {
  return LaunchMask(stream, transposed, DenseSource<T>{static_cast<const T*>(x), mask, o.C}, o);
}

template <typename T>
ffi::Error LaunchMaskPacked(cudaStream_t stream, bool transposed, const void* v, const uint8_t* bits, const Operand& o) {
  return LaunchMask(stream, transposed, PackedSource<T>{static_cast<const T*>(v), bits, o.C}, o);
}

ffi::Error Fp8MaskCompressImpl(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer mask, ffi::AnyBuffer scale,
                               ffi::Result<ffi::AnyBuffer> values, ffi::Result<ffi::AnyBuffer> meta, bool transposed) {
  const std::string op = "fp8_masked_compress";
  if (mask.element_type() != ffi::DataType::PRED) {
    return InvalidArgument(op + ": mask must be bool, got " + Name(mask.element_type()));
  }
  const auto dims = x.dimensions(), mdims = mask.dimensions();
  if (mdims.size() != dims.size() || (dims.size() == 2 && (mdims[0] != dims[0] || mdims[1] != dims[1]))) {
    return InvalidArgument(op + ": mask must have x's shape " + DimsString(dims) + ", got " + DimsString(mdims));
  }
  if (reinterpret_cast<uintptr_t>(mask.untyped_data()) & 15u) {
    return InvalidArgument(op + ": buffers must be 16-byte aligned");
  }
  Operand o;
  if (ffi::Error e = CheckOperand(op, x, scale, *values, *meta, transposed, &o); e.failure()) return e;
  const bool* mp = static_cast<const bool*>(mask.untyped_data());
  switch (x.element_type()) {
    case ffi::DataType::BF16: return LaunchMaskDense<__nv_bfloat16>(stream, transposed, x.untyped_data(), mp, o);
    case ffi::DataType::F16: return LaunchMaskDense<__half>(stream, transposed, x.untyped_data(), mp, o);
    default: return LaunchMaskDense<float>(stream, transposed, x.untyped_data(), mp, o);
  }
}

ffi::Error Fp8PackedCompressImpl(cudaStream_t stream, ffi::AnyBuffer values_in, ffi::AnyBuffer bits,
                                 ffi::AnyBuffer scale, ffi::Result<ffi::AnyBuffer> values,
                                 ffi::Result<ffi::AnyBuffer> meta, bool transposed) {
  const std::string op = "fp8_packed_compress";
  const auto vd = values_in.dimensions(), bd = bits.dimensions();
  if (vd.size() != 2) return InvalidArgument(op + ": values must be 2-D, got shape " + DimsString(vd));
  const int64_t R = 2 * vd[0], C = vd[1];
  if (R % 8 != 0) {
    return InvalidArgument(op + ": the weight's rows (2 x values' rows) must be a multiple of 8, got values of shape " +
                           DimsString(vd));
  }
  if (bits.element_type() != ffi::DataType::U8 || !Is2D(bd, R / 8, C)) {
    return InvalidArgument(op + ": bits must be uint8 of shape " + Shape2(R / 8, C) + ", got " +
                           Name(bits.element_type()) + " " + DimsString(bd));
  }
  if ((reinterpret_cast<uintptr_t>(bits.untyped_data()) | reinterpret_cast<uintptr_t>(values_in.untyped_data())) & 15u) {
    return InvalidArgument(op + ": buffers must be 16-byte aligned");
  }
  Operand o;
  if (ffi::Error e = CheckOperand(op, values_in, scale, *values, *meta, transposed, &o, R); e.failure()) return e;
  const uint8_t* bp = static_cast<const uint8_t*>(bits.untyped_data());
  switch (values_in.element_type()) {
    case ffi::DataType::BF16: return LaunchMaskPacked<__nv_bfloat16>(stream, transposed, values_in.untyped_data(), bp, o);
    case ffi::DataType::F16: return LaunchMaskPacked<__half>(stream, transposed, values_in.untyped_data(), bp, o);
    default: return LaunchMaskPacked<float>(stream, transposed, values_in.untyped_data(), bp, o);
  }
}

template <typename T>
ffi::Error LaunchMvue(cudaStream_t stream, const uint32_t* key, int nkw, const void* g, const Operand& o) {
  const dim3 grid(static_cast<unsigned>((o.M + kMvTile - 1) / kMvTile), static_cast<unsigned>((o.K + kMvTile - 1) / kMvTile));
  Fp8Mvue24CompressKernel<T><<<grid, kThreads, 0, stream>>>(key, nkw, static_cast<const T*>(g), o.scale, o.R, o.C,
                                                            o.values, o.meta, o.M, o.K, o.m_al);
  SP24_CHECK_LAUNCH("Fp8Mvue24CompressKernel");
  return ffi::Error::Success();
}

ffi::Error Fp8Mvue24CompressImpl(cudaStream_t stream, ffi::AnyBuffer key, ffi::AnyBuffer g, ffi::AnyBuffer scale,
                                 ffi::Result<ffi::AnyBuffer> values, ffi::Result<ffi::AnyBuffer> meta) {
  const std::string op = "fp8_mvue24_compress";
  const auto kd = key.dimensions();
  if (key.element_type() != ffi::DataType::U32 || kd.size() != 1 || kd[0] < 1 || kd[0] > 4) {
    return InvalidArgument(op + ": key must be uint32 key data of shape (n,), 1 <= n <= 4, got " +
                           Name(key.element_type()) + " of shape " + DimsString(kd));
  }
  Operand o;
  if (ffi::Error e = CheckOperand(op, g, scale, *values, *meta, /*transposed=*/true, &o); e.failure()) return e;
  const uint32_t* kp = static_cast<const uint32_t*>(key.untyped_data());
  const int nkw = static_cast<int>(kd[0]);
  switch (g.element_type()) {
    case ffi::DataType::BF16: return LaunchMvue<__nv_bfloat16>(stream, kp, nkw, g.untyped_data(), o);
    case ffi::DataType::F16: return LaunchMvue<__half>(stream, kp, nkw, g.untyped_data(), o);
    default: return LaunchMvue<float>(stream, kp, nkw, g.untyped_data(), o);
  }
}

template <typename T>
ffi::Error LaunchQt(cudaStream_t stream, const void* x, const float* scale, int64_t R, int64_t C, uint8_t* out) {
  const dim3 grid(static_cast<unsigned>((C + kQtTile - 1) / kQtTile), static_cast<unsigned>((R + kQtTile - 1) / kQtTile));
  Fp8QuantizeTransposeKernel<T><<<grid, kThreads, 0, stream>>>(static_cast<const T*>(x), scale, R, C, out);
  SP24_CHECK_LAUNCH("Fp8QuantizeTransposeKernel");
  return ffi::Error::Success();
}

ffi::Error Fp8QuantizeTransposeImpl(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer scale,
                                    ffi::Result<ffi::AnyBuffer> out) {
  const std::string op = "fp8_quantize_transpose";
  if (ffi::Error e = CheckInputAndScale(op, x, scale); e.failure()) return e;
  const auto dims = x.dimensions();
  if (dims.size() != 2) return InvalidArgument(op + ": x must be 2-D, got shape " + DimsString(dims));
  const int64_t R = dims[0], C = dims[1];
  if (out->element_type() != ffi::DataType::F8E4M3FN || !Is2D(out->dimensions(), C, R)) {
    return InvalidArgument(op + ": out must be float8_e4m3fn of shape " + Shape2(C, R) + ", got " +
                           Name(out->element_type()) + " " + DimsString(out->dimensions()));
  }
  if (R % 16 || C % 8) {
    return InvalidArgument(op + ": x needs rows % 16 == 0 and columns % 8 == 0, got " + DimsString(dims));
  }
  if ((C + kQtTile - 1) / kQtTile > 0x7FFFFFFF || (R + kQtTile - 1) / kQtTile > 65535) {
    return InvalidArgument(op + ": x too large for the kernel's grid: " + DimsString(dims));
  }
  if ((reinterpret_cast<uintptr_t>(x.untyped_data()) | reinterpret_cast<uintptr_t>(out->untyped_data())) & 15u) {
    return InvalidArgument(op + ": buffers must be 16-byte aligned");
  }
  if (R == 0 || C == 0) return ffi::Error::Success();
  const float* sp = static_cast<const float*>(scale.untyped_data());
  uint8_t* op_ = static_cast<uint8_t*>(out->untyped_data());
  switch (x.element_type()) {
    case ffi::DataType::BF16: return LaunchQt<__nv_bfloat16>(stream, x.untyped_data(), sp, R, C, op_);
    case ffi::DataType::F16: return LaunchQt<__half>(stream, x.untyped_data(), sp, R, C, op_);
    default: return LaunchQt<float>(stream, x.untyped_data(), sp, R, C, op_);
  }
}

}  // namespace
}  // namespace fp8
}  // namespace jax_sparse24

XLA_FFI_DEFINE_HANDLER_SYMBOL(Sparse24Fp8MaskCompress, jax_sparse24::fp8::Fp8MaskCompressImpl,
                              ::xla::ffi::Ffi::Bind()
                                  .Ctx<::xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<::xla::ffi::AnyBuffer>()  // x (R, C)
                                  .Arg<::xla::ffi::AnyBuffer>()  // mask (R, C) bool
                                  .Arg<::xla::ffi::AnyBuffer>()  // scale () f32
                                  .Ret<::xla::ffi::AnyBuffer>()  // values (M, K/2) e4m3
                                  .Ret<::xla::ffi::AnyBuffer>()  // meta
                                  .Attr<bool>("transposed"),
                              {::xla::ffi::Traits::kCmdBufferCompatible});

// values (R/2, C), bits (R/8, C) u8 (packed24's encoding of a weight (R, C)), scale () f32 -> values, meta of
// A = q(W)^T (transposed) or q(W), W the unpacked weight.
XLA_FFI_DEFINE_HANDLER_SYMBOL(Sparse24Fp8PackedCompress, jax_sparse24::fp8::Fp8PackedCompressImpl,
                              ::xla::ffi::Ffi::Bind()
                                  .Ctx<::xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<::xla::ffi::AnyBuffer>()  // values (R/2, C)
                                  .Arg<::xla::ffi::AnyBuffer>()  // bits (R/8, C) u8
                                  .Arg<::xla::ffi::AnyBuffer>()  // scale () f32
                                  .Ret<::xla::ffi::AnyBuffer>()  // values (M, K/2) e4m3
                                  .Ret<::xla::ffi::AnyBuffer>()  // meta
                                  .Attr<bool>("transposed"),
                              {::xla::ffi::Traits::kCmdBufferCompatible});

// key (n,) uint32, g (R, C), scale () f32 -> values (C, R/2) e4m3, meta of q(MVUE(g))^T.
XLA_FFI_DEFINE_HANDLER_SYMBOL(Sparse24Fp8Mvue24Compress, jax_sparse24::fp8::Fp8Mvue24CompressImpl,
                              ::xla::ffi::Ffi::Bind()
                                  .Ctx<::xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<::xla::ffi::AnyBuffer>()  // key (n,) u32
                                  .Arg<::xla::ffi::AnyBuffer>()  // g (R, C)
                                  .Arg<::xla::ffi::AnyBuffer>()  // scale () f32
                                  .Ret<::xla::ffi::AnyBuffer>()  // values (C, R/2) e4m3
                                  .Ret<::xla::ffi::AnyBuffer>(),  // meta
                              {::xla::ffi::Traits::kCmdBufferCompatible});

// x (R, C), scale () f32 -> q(x)^T (C, R) e4m3.
XLA_FFI_DEFINE_HANDLER_SYMBOL(Sparse24Fp8QuantizeTranspose, jax_sparse24::fp8::Fp8QuantizeTransposeImpl,
                              ::xla::ffi::Ffi::Bind()
                                  .Ctx<::xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<::xla::ffi::AnyBuffer>()   // x (R, C)
                                  .Arg<::xla::ffi::AnyBuffer>()   // scale () f32
                                  .Ret<::xla::ffi::AnyBuffer>(),  // q(x)^T (C, R) e4m3
                              {::xla::ffi::Traits::kCmdBufferCompatible});
