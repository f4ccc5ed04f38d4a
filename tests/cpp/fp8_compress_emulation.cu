// Host emulation of the fp8 operand kernels (xla_ffi/fp8_compress_kernels.cu: Fp8MvueTile, Fp8MaskTile
// and Fp8QuantizeTransposeTile, the bodies of Fp8Mvue24CompressKernel, Fp8MaskCompressKernel and
// Fp8QuantizeTransposeKernel), run by tests/test_compress_emulation.py on machines without a GPU: every
// CTA of a kernel's grid runs with 256 host threads (a futex barrier as __syncthreads), outputs poisoned
// first, and every output byte -- values and metadata, padding included -- is compared with an
// independent host implementation of the op. The quantize-transpose kernel: e4m3(x / scale) transposed.
// The masked compressor (both directions: A = q(x * mask) or its transpose): e4m3(x / scale) where the
// mask is set, 0 elsewhere, then the rule below. The MVUE one:
//   * the element-wise MVUE draw (mvue_rng.cuh: Mvue24 with GroupBitsRun<1>, group (row group gr,
//     column c) numbered gr * C + c as the element-wise kernel along axis 0), each value rounded to
//     g's dtype and quantized to e4m3 (cuda_fp8.h's conversion, saturating), A = q(MVUE(g))^T;
//   * CUTLASS's compressor rule for an 8-bit A (the first two nonzero bytes of a group, +-0 counting
//     as zero; a lone nonzero at lane 3 -> lanes (0, 3), another lone one -> (i, 3); none -> 0x4);
//   * the layout of the kernels' comment: values (M, K/2) row-major, metadata byte
//     (k / 128) * m_al * 16 + m * 16 + (k % 128) / 8 (low nibble: the even group), M padded to 64 rows
//     and K to 128 columns with nibble 0x4.
// Host arithmetic differs from the device's in Recip only (exact division here), which both sides
// share: this checks the tiling, the staging and its swizzles, the fast path (the nibble from the
// draw) against the generic rule, and the padding -- not device rounding (the GPU test,
// test_fp8_mvue24_compress_bit_exact, compares with the element-wise kernel bit for bit).
// Build: nvcc -std=c++20 -I xla_ffi -I <jaxlib>/include.
#include "fp8_compress_kernels.cu"
#include "emulation_util.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

using namespace jax_sparse24::fp8;
namespace mk = jax_sparse24::mask_kernels;

static int g_fail = 0;

// The MVUE kernel's grid, one CTA after the other, 256 host threads each.
template <typename T>
void Emulate(const uint32_t* key, int nkw, const T* g, const float* scale, int64_t R, int64_t C, uint8_t* values,
             uint8_t* meta, int64_t M, int64_t K, int64_t m_al) {
  const int64_t gx = (M + kMvTile - 1) / kMvTile, gy = (K + kMvTile - 1) / kMvTile;
  for (int64_t by = 0; by < gy; ++by)
    for (int64_t bx = 0; bx < gx; ++bx) {
      alignas(16) uint8_t s_val[kMvTile * 64];
      alignas(16) uint8_t s_meta[8 * kMvMetaStride];
      std::memset(s_val, 0xAB, sizeof(s_val));
      std::memset(s_meta, 0xAB, sizeof(s_meta));
      RunCta(kThreads, [&](int t, auto& sync) {
        Fp8MvueTile<T>(key, nkw, g, scale, R, C, values, meta, M, K, m_al, t,
                       [&]() { return make_uint2(uint32_t(bx), uint32_t(by)); }, s_val, s_meta, sync);
      });
    }
}

// CUTLASS's compressor for an 8-bit A (M, K) row-major, laid out as the kernels' comment says.
void RefCompress8(const std::vector<uint8_t>& A, int64_t M, int64_t K, std::vector<uint8_t>& vals,
                  std::vector<uint8_t>& meta) {
  const auto meta_offset = [](int64_t m, int64_t k, int64_t m_al) { return (k / 128) * m_al * 16 + m * 16 + (k % 128) / 8; };
  RefCompressMatrix<uint8_t>(A, M, K, 0x7F, meta_offset, vals, meta);
}

// Compares got with want; prints one line; counts a failure.
void Check(const char* what, const std::vector<uint8_t>& vals, const std::vector<uint8_t>& want_vals,
           const std::vector<uint8_t>& meta, const std::vector<uint8_t>& want_meta) {
  int64_t bad_v = 0, bad_m = 0, first = -1;
  for (size_t i = 0; i < vals.size(); ++i)
    if (vals[i] != want_vals[i]) { ++bad_v; if (first < 0) first = int64_t(i); }
  for (size_t i = 0; i < meta.size(); ++i) bad_m += meta[i] != want_meta[i];
  const bool ok = bad_v == 0 && bad_m == 0;
  printf("%s %s\n", ok ? "ok  " : "FAIL", what);
  if (!ok) {
    printf("  %lld value bytes, %lld metadata bytes differ\n", (long long)bad_v, (long long)bad_m);
    if (first >= 0) printf("  first value byte %lld: got %02x want %02x\n", (long long)first, vals[first], want_vals[first]);
    ++g_fail;
  }
}

// The op, independently: dense q(MVUE(g))^T (M = C rows, K = R columns), then CUTLASS's compressor.
template <typename T>
void Reference(const uint32_t* key, int nkw, const std::vector<T>& g, float scale, int64_t R, int64_t C,
               std::vector<uint8_t>& vals, std::vector<uint8_t>& meta) {
  const int64_t M = C, K = R;
  const mk::KeyWords kw = mk::MakeKey(key[0], nkw > 1 ? key[1] : 0u, nkw > 2 ? key[2] : 0u, nkw > 3 ? key[3] : 0u);
  const float inv = 1.0f / scale;
  std::vector<uint8_t> A(M * K, 0);
  for (int64_t gr = 0; gr < R / 4; ++gr)
    for (int64_t c = 0; c < C; ++c) {
      float v[4], out[4];
      bool keep[4];
      for (int i = 0; i < 4; ++i) v[i] = static_cast<float>(g[(4 * gr + i) * C + c]);
      uint32_t bits[1];
      mk::GroupBitsRun<1>(kw, gr * C + c, bits);
      mk::Mvue24(v, bits[0], out, keep);
      for (int i = 0; i < 4; ++i) {
        const float rounded = static_cast<float>(T(out[i]));  // the element-wise kernel writes g's dtype
        A[c * K + 4 * gr + i] = static_cast<uint8_t>(__nv_cvt_float_to_fp8(rounded * inv, __NV_SATFINITE, __NV_E4M3));
      }
    }
  RefCompress8(A, M, K, vals, meta);
}

// g: normal values, some exact zeros, some tiny (they quantize to +-0: the generic rule's path), some
// groups of 4 all zero.
template <typename T>
std::vector<T> RandomG(std::mt19937& rng, int64_t R, int64_t C) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<T> g(R * C);
  for (int64_t i = 0; i < R * C; ++i) {
    const float p = u(rng);
    const float v = p < 0.08f ? 0.0f : (p < 0.16f ? 1e-6f * nd(rng) : nd(rng));
    g[i] = T(v);
  }
  for (int64_t gr = 0; gr < R / 4; gr += 7)
    for (int64_t c = 0; c < C; c += 5)
      for (int i = 0; i < 4; ++i) g[(4 * gr + i) * C + c] = T(0.0f);
  return g;
}

template <typename T>
void Case(const char* dtype, int64_t R, int64_t C, float scale, int nkw, uint32_t seed) {
  std::mt19937 rng(seed);
  const std::vector<T> g = RandomG<T>(rng, R, C);
  const uint32_t key[4] = {uint32_t(rng()), uint32_t(rng()), uint32_t(rng()), uint32_t(rng())};
  const int64_t M = C, K = R, m_al = (M + 63) / 64 * 64, k_al = (K + 127) / 128 * 128;
  std::vector<uint8_t> vals(M * K / 2, 0xFF), meta(m_al * k_al / 8, 0xFF);  // poisoned
  Emulate<T>(key, nkw, g.data(), &scale, R, C, vals.data(), meta.data(), M, K, m_al);
  std::vector<uint8_t> want_vals, want_meta;
  Reference<T>(key, nkw, g, scale, R, C, want_vals, want_meta);
  char what[160];
  snprintf(what, sizeof(what), "mvue %s R=%lld C=%lld scale=%g nkw=%d", dtype, (long long)R, (long long)C, scale, nkw);
  Check(what, vals, want_vals, meta, want_meta);
}

template <typename T>
void All(const char* dtype) {
  // (R, C) = (K, M): multiples of 128, and shapes off the 128 grid (padding rows and columns, partial tiles)
  const int64_t shapes[][2] = {{128, 128}, {256, 384}, {160, 224}, {96, 416}, {32, 8}, {288, 72}};
  uint32_t seed = 1;
  for (auto& s : shapes) {
    Case<T>(dtype, s[0], s[1], 0.01f, 2, seed++);   // values well inside e4m3's range (1e-6 ones quantize to 0)
    Case<T>(dtype, s[0], s[1], 300.0f, 1, seed++);  // a large scale: many kept values quantize to +-0
  }
  Case<T>(dtype, 160, 224, 1e-4f, 4, seed++);  // a small scale: saturation at 448
}

// The masked kernel's grid (64 x 128 tiles of A), one CTA after the other, 256 host threads each; `src` is
// what it reads (DenseSource: x and its mask; PackedSource: packed24's values and mask bits).
template <bool TRANS, class Src>
void EmulateMask(const Src& src, const float* scale, int64_t R, int64_t C, uint8_t* values, uint8_t* meta,
                 int64_t M, int64_t K, int64_t m_al) {
  const int64_t k_al = (K + kTileK - 1) / kTileK * kTileK;
  for (int64_t by = 0; by < k_al / kTileK; ++by)
    for (int64_t bx = 0; bx < m_al / kTileM; ++bx) {
      uint8_t staged[kTileK * kPitch];
      std::memset(staged, 0xAB, sizeof(staged));
      RunCta(kThreads, [&](int t, auto& sync) {
        Fp8MaskTile<TRANS>(src, scale, R, C, values, meta, M, K, m_al, t,
                              [&]() { return make_uint2(uint32_t(bx), uint32_t(by)); }, staged, sync);
      });
    }
}

// The masked compressor: x with zeros and tiny values, a mask keeping at most 2 of every 4 along the
// group axis (2 in most groups, fewer in some). PACKED: the same op on packed24's encoding of (x, mask)
// (groups of 4 along x's rows), the mask with extra kept elements (row groups keeping 3 or 4, of which
// the encoding holds the first two: the op compresses what unpack24 gives back).
template <typename T, bool TRANS, bool PACKED = false>
void MaskCase(const char* dtype, int64_t R, int64_t C, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  const std::vector<T> x = RandomG<T>(rng, R, C);
  const int64_t M = TRANS ? C : R, K = TRANS ? R : C, m_al = (M + 63) / 64 * 64, k_al = (K + 127) / 128 * 128;
  std::vector<uint8_t> mask8(R * C, 0);  // (R, C), groups of 4 along the K axis of A
  for (int64_t m = 0; m < M; ++m)
    for (int64_t gi = 0; gi < K / 4; ++gi) {
      const uint32_t r = rng();
      const int keep = (r & 7) == 0 ? int(r >> 3) % 2 : 2;  // 0 or 1 kept in 1/8 of the groups
      int lanes[4] = {0, 1, 2, 3};
      for (int e = 3; e > 0; --e) std::swap(lanes[e], lanes[(r >> (4 + 2 * e)) % (e + 1)]);
      for (int e = 0; e < keep; ++e) {
        const int64_t k = 4 * gi + lanes[e];
        mask8[TRANS ? k * C + m : m * C + k] = 1;
      }
    }
  if (PACKED && TRANS) {  // groups along K = x's rows: some keep 3 or 4
    for (auto& b : mask8) if (rng() % 12 == 0) b = 1;
  }
  std::unique_ptr<bool[]> mask(new bool[R * C]);
  for (int64_t i = 0; i < R * C; ++i) mask[i] = mask8[i] != 0;
  std::vector<uint8_t> vals(M * K / 2, 0xFF), meta(m_al * k_al / 8, 0xFF);  // poisoned
  std::vector<T> pv(R / 2 * C);
  std::vector<uint8_t> pb(R / 8 * C, 0);
  if constexpr (PACKED) {
    std::memset(static_cast<void*>(pv.data()), 0, pv.size() * sizeof(T));
    for (int64_t c = 0; c < C; ++c)
      for (int64_t g = 0; g < R / 4; ++g)
        for (int q = 0, n = 0; q < 4; ++q) {
          const int64_t r = 4 * g + q;
          if (!mask[r * C + c]) continue;
          pb[(r / 8) * C + c] |= static_cast<uint8_t>(1u << (r % 8));
          if (n < 2) pv[(2 * g + n) * C + c] = x[r * C + c];
          if (++n > 2) mask[r * C + c] = false;  // what unpack24 gives back: the first two kept
        }
    EmulateMask<TRANS>(PackedSource<T>{pv.data(), pb.data(), C}, &scale, R, C, vals.data(), meta.data(), M, K, m_al);
  } else {
    EmulateMask<TRANS>(DenseSource<T>{x.data(), mask.get(), C}, &scale, R, C, vals.data(), meta.data(), M, K, m_al);
  }
  const float inv = 1.0f / scale;
  std::vector<uint8_t> A(M * K);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) {
      const int64_t i = TRANS ? k * C + m : m * C + k;
      A[m * K + k] = mask[i] ? static_cast<uint8_t>(__nv_cvt_float_to_fp8(static_cast<float>(x[i]) * inv,
                                                                         __NV_SATFINITE, __NV_E4M3))
                             : uint8_t(0);
    }
  std::vector<uint8_t> want_vals, want_meta;
  RefCompress8(A, M, K, want_vals, want_meta);
  char what[160];
  snprintf(what, sizeof(what), "%s %s %s R=%lld C=%lld scale=%g", PACKED ? "packed" : "masked",
           TRANS ? "transposed" : "direct", dtype,
           (long long)R, (long long)C, scale);
  Check(what, vals, want_vals, meta, want_meta);
}

template <typename T>
void AllMask(const char* dtype) {
  // transposed: A = x^T (M = C, K = R: R % 32, C % 8); direct: A = x (M = R, K = C: C % 32)
  const int64_t trans_shapes[][2] = {{128, 64}, {256, 192}, {160, 72}, {96, 8}, {32, 200}};
  const int64_t direct_shapes[][2] = {{64, 128}, {192, 256}, {72, 160}, {8, 96}, {200, 32}};
  uint32_t seed = 100;
  for (auto& s : trans_shapes) {
    MaskCase<T, true>(dtype, s[0], s[1], 0.01f, seed++);
    MaskCase<T, true>(dtype, s[0], s[1], 300.0f, seed++);
  }
  for (auto& s : direct_shapes) {
    MaskCase<T, false>(dtype, s[0], s[1], 0.01f, seed++);
    MaskCase<T, false>(dtype, s[0], s[1], 300.0f, seed++);
  }
  // packed24's encoding (weight rows a multiple of 8)
  for (auto& s : trans_shapes) MaskCase<T, true, true>(dtype, s[0], s[1], 0.01f, seed++);
  for (auto& s : direct_shapes) {
    if (s[0] % 8 == 0) MaskCase<T, false, true>(dtype, s[0], s[1], 0.01f, seed++);
  }
}

// The quantize-transpose kernel (q(x)^T, dense e4m3, the weight gradient's K-major operand): its grid of
// 64 x 64 tiles of x on host threads, against e4m3(x / scale) transposed.
template <typename T>
void QtCase(const char* dtype, int64_t R, int64_t C, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  const std::vector<T> x = RandomG<T>(rng, R, C);
  std::vector<uint8_t> out(C * R, 0xFF), want(C * R);  // poisoned (0xFF: no saturating e4m3 result)
  for (int64_t by = 0; by < (R + kQtTile - 1) / kQtTile; ++by)
    for (int64_t bx = 0; bx < (C + kQtTile - 1) / kQtTile; ++bx) {
      uint8_t tile[kQtTile * kQtPitch];
      std::memset(tile, 0xAB, sizeof(tile));
      RunCta(kThreads, [&](int t, auto& sync) {
        Fp8QuantizeTransposeTile<T>(x.data(), &scale, R, C, out.data(), t,
                                    [&]() { return make_uint2(uint32_t(bx), uint32_t(by)); }, tile, sync);
      });
    }
  const float inv = 1.0f / scale;
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c)
      want[c * R + r] = static_cast<uint8_t>(__nv_cvt_float_to_fp8(static_cast<float>(x[r * C + c]) * inv,
                                                                   __NV_SATFINITE, __NV_E4M3));
  char what[160];
  snprintf(what, sizeof(what), "quantize-transpose %s R=%lld C=%lld scale=%g", dtype, (long long)R, (long long)C, scale);
  const std::vector<uint8_t> none;
  Check(what, out, want, none, none);
}

template <typename T>
void AllQt(const char* dtype) {
  // R % 16 == 0, C % 8 == 0 (the handler's checks); tiles of 64 x 64, partial ones included
  const int64_t shapes[][2] = {{64, 64}, {128, 200}, {48, 72}, {16, 8}, {208, 136}};
  uint32_t seed = 500;
  for (auto& s : shapes) {
    QtCase<T>(dtype, s[0], s[1], 0.01f, seed++);
    QtCase<T>(dtype, s[0], s[1], 1e-4f, seed++);  // saturates at 448
  }
}

int main() {
  All<__nv_bfloat16>("bfloat16");
  All<__half>("float16");
  All<float>("float32");
  AllMask<__nv_bfloat16>("bfloat16");
  AllMask<__half>("float16");
  AllMask<float>("float32");
  AllQt<__nv_bfloat16>("bfloat16");
  AllQt<__half>("float16");
  AllQt<float>("float32");
  printf(g_fail ? "EMULATION FAILED (%d cases)\n" : "emulation: all cases ok\n", g_fail);
  return g_fail != 0;
}

