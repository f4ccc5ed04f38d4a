// Host emulation of the fused fp8 MVUE compressor (xla_ffi/fp8_compress_kernels.cu: Fp8MvueTile, the
// body of Fp8Mvue24CompressKernel), run by tests/test_compress_emulation.py on machines without a GPU:
// every CTA of the kernel's grid runs with 256 std::threads (a std::barrier as __syncthreads), outputs
// poisoned first, and every output byte -- values and metadata, padding included -- is compared with
// an independent host implementation of the op:
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

#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

using namespace jax_sparse24::fp8;
namespace mk = jax_sparse24::mask_kernels;

static int g_fail = 0;

// The kernel's grid, one CTA after the other, 256 host threads each.
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
      std::barrier bar(kThreads);
      std::vector<std::thread> th;
      for (int t = 0; t < kThreads; ++t)
        th.emplace_back([&, t]() {
          Fp8MvueTile<T>(key, nkw, g, scale, R, C, values, meta, M, K, m_al, t, bx, by, s_val, s_meta,
                         [&]() { bar.arrive_and_wait(); });
        });
      for (auto& x : th) x.join();
    }
}

// The op, independently: dense q(MVUE(g))^T (M = C rows, K = R columns), then CUTLASS's compressor.
template <typename T>
void Reference(const uint32_t* key, int nkw, const std::vector<T>& g, float scale, int64_t R, int64_t C,
               std::vector<uint8_t>& vals, std::vector<uint8_t>& meta) {
  const int64_t M = C, K = R, m_al = (M + 63) / 64 * 64, k_al = (K + 127) / 128 * 128;
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
  vals.assign(M * K / 2, 0);
  meta.assign(m_al * k_al / 8, 0x44);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t gi = 0; gi < K / 4; ++gi) {
      int cnt = 0, idx[2] = {0, 0};
      uint8_t v[2] = {0, 0};
      for (int e = 0; e < 4; ++e) {
        const uint8_t b = A[m * K + 4 * gi + e];
        if ((b & 0x7F) != 0) {
          if (cnt < 2) { idx[cnt] = e; v[cnt] = b; }
          ++cnt;
        }
      }
      if (cnt == 1 && idx[0] == 3) { v[1] = v[0]; v[0] = 0; idx[0] = 0; idx[1] = 3; }
      else if (cnt == 1) { v[1] = 0; idx[1] = 3; }
      uint32_t nib = idx[0] | (idx[1] << 2);
      if (cnt == 0) nib = 4;
      vals[m * (K / 2) + 2 * gi] = v[0];
      vals[m * (K / 2) + 2 * gi + 1] = v[1];
      const int64_t k = 4 * gi, off = (k / 128) * m_al * 16 + m * 16 + (k % 128) / 8;
      const int sh = 4 * (gi & 1);
      meta[off] = static_cast<uint8_t>((meta[off] & ~(0xF << sh)) | (nib << sh));
    }
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
  int64_t bad_v = 0, bad_m = 0, first = -1;
  for (size_t i = 0; i < vals.size(); ++i)
    if (vals[i] != want_vals[i]) { ++bad_v; if (first < 0) first = int64_t(i); }
  for (size_t i = 0; i < meta.size(); ++i) bad_m += meta[i] != want_meta[i];
  const bool ok = bad_v == 0 && bad_m == 0;
  printf("%s %s R=%lld C=%lld scale=%g nkw=%d: %s", ok ? "ok  " : "FAIL", dtype, (long long)R, (long long)C, scale, nkw,
         ok ? "\n" : "");
  if (!ok) {
    printf("%lld value bytes, %lld metadata bytes differ\n", (long long)bad_v, (long long)bad_m);
    if (first >= 0)
      printf("  first value byte %lld: got %02x want %02x\n", (long long)first, vals[first], want_vals[first]);
    ++g_fail;
  }
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

int main() {
  All<__nv_bfloat16>("bfloat16");
  All<__half>("float16");
  All<float>("float32");
  printf(g_fail ? "EMULATION FAILED (%d cases)\n" : "emulation: all cases ok\n", g_fail);
  return g_fail != 0;
}

// The emulation does not call the handlers; stub the registry's shape function.
namespace jax_sparse24 {
bool CutlassCompressedShapes(int64_t, int64_t, int, CompressedShapes*, std::string*) { return false; }
}  // namespace jax_sparse24
