// Per-group 2:4 math and the MVUE random generator, shared by the element-wise kernels
// (mask_kernels.cu) and the fused compressors (compress_kernels.cu), so both draw exactly the same
// MVUE sample for a key: Philox4x32-10 (Random123 constants) with key (k0, k1) and counter
// (pair lo, pair hi, k2, k3), pair = (group index within the key's batch element) / 2; words (x, y)
// are the uniforms of the even group of the pair, (z, w) of the odd one; u = (word >> 8) * 2^-24.
// Host+device so the math can be unit-tested on a CPU.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#ifndef SP24_HD
#define SP24_HD __host__ __device__ __forceinline__
#endif
#ifndef SP24_D
#define SP24_D __device__ __forceinline__
#endif

namespace jax_sparse24 {
namespace mask_kernels {

// Must equal reference.MVUE_EPS.
constexpr float kMvueEps = 1e-20f;

SP24_HD uint32_t FloatBits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

SP24_HD float BitsFloat(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// Reciprocal to ~1 ulp (one MUFU.RCP). Subnormal arguments/results flush to zero: callers keep
// arguments in [2^-126, 2^126].
SP24_HD float Recip(float x) {
#ifdef __CUDA_ARCH__
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
#else
  return 1.0f / x;
#endif
}

// ------------------------------------------------------------------------------------------------
// Per-group math (host+device so it can be unit-tested on a CPU).

// keep[k]: element k is one of the 2 largest |v| (ties -> lower index; NaN ranks largest).
SP24_HD void Mask24Keep(const float (&v)[4], bool (&keep)[4]) {
  uint32_t a0 = FloatBits(v[0]) & 0x7fffffffu, a1 = FloatBits(v[1]) & 0x7fffffffu;
  uint32_t a2 = FloatBits(v[2]) & 0x7fffffffu, a3 = FloatBits(v[3]) & 0x7fffffffu;
  // cjk (j < k): element j beats element k.
  int c01 = a0 >= a1, c02 = a0 >= a2, c03 = a0 >= a3;
  int c12 = a1 >= a2, c13 = a1 >= a3, c23 = a2 >= a3;
  // rank = number of elements that beat this one; keep the two with rank 0 and 1.
  keep[0] = (3 - c01 - c02 - c03) < 2;
  keep[1] = (c01 + 2 - c12 - c13) < 2;
  keep[2] = (c02 + c12 + 1 - c23) < 2;
  keep[3] = (c03 + c13 + c23) < 2;
}

// y = keep ? sign(v) * (|v| - t) : 0 with t the 2nd smallest |v| (= the larger dropped |v|).
SP24_HD void SoftThreshold24(const float (&v)[4], float (&y)[4], bool (&keep)[4]) {
  Mask24Keep(v, keep);
  float t = 0.0f;
#pragma unroll
  for (int k = 0; k < 4; ++k) t = keep[k] ? t : fmaxf(t, fabsf(v[k]));
#pragma unroll
  for (int k = 0; k < 4; ++k) y[k] = keep[k] ? copysignf(fabsf(v[k]) - t, v[k]) : 0.0f;
}

// Philox4x32-10 (Salmon et al. 2011, Random123 constants and key schedule).
struct U32x4 {
  uint32_t x, y, z, w;
};

SP24_HD U32x4 PhiloxRound(U32x4 c, uint32_t k0, uint32_t k1) {
  const uint64_t p0 = uint64_t{0xD2511F53u} * c.x;
  const uint64_t p1 = uint64_t{0xCD9E8D57u} * c.z;
  const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
  const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
  return U32x4{hi1 ^ c.y ^ k0, lo1, hi0 ^ c.w ^ k1, lo0};
}

// The 10 round keys (Weyl sequence), computed once per key and reused for every counter.
struct PhiloxKey {
  uint32_t k0[10], k1[10];
};

SP24_HD PhiloxKey PhiloxSchedule(uint32_t k0, uint32_t k1) {
  PhiloxKey s;
#pragma unroll
  for (int r = 0; r < 10; ++r) {
    s.k0[r] = k0 + static_cast<uint32_t>(r) * 0x9E3779B9u;
    s.k1[r] = k1 + static_cast<uint32_t>(r) * 0xBB67AE85u;
  }
  return s;
}

SP24_HD U32x4 Philox4x32_10(U32x4 c, const PhiloxKey& k) {
#pragma unroll
  for (int r = 0; r < 10; ++r) c = PhiloxRound(c, k.k0[r], k.k1[r]);
  return c;
}

SP24_HD U32x4 Philox4x32_10(U32x4 c, uint32_t k0, uint32_t k1) { return Philox4x32_10(c, PhiloxSchedule(k0, k1)); }

// Uniform float in [0, 1) with 24 random bits.
SP24_HD float Uniform01(uint32_t r) { return static_cast<float>(r >> 8) * (1.0f / 16777216.0f); }

// MVUE 2:4 of one group, in parts that Mvue24 (dense output, the element-wise kernel) and the
// fused compressor (compress_kernels.cu, which needs only the two kept lanes) share through
// Mvue24Sample / Mvue24Kept, so both give the same bits. a[k] = |g[k]| + kMvueEps.
//
// Mvue24Draw: the two drawn lanes i != j (mirroring reference.mvue24 step by step) and the sum s.
SP24_HD void Mvue24Draw(const float (&a)[4], float u1, float u2, int* i_out, int* j_out, float* s_out) {
  // First draw: i = #{k : cumsum_k <= u1 * S}, clamped to 3.
  const float c0 = a[0], c1 = c0 + a[1], c2 = c1 + a[2], s = c2 + a[3];
  const float r1 = u1 * s;
  const int i = (c0 <= r1) + (c1 <= r1) + (c2 <= r1);
  // Second draw among the others: weights a with a_i zeroed.
  float b[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) b[k] = (k == i) ? 0.0f : a[k];
  const float d0 = b[0], d1 = d0 + b[1], d2 = d1 + b[2], s2 = d2 + b[3];
  const float r2 = u2 * s2;
  int j = (d0 <= r2) + (d1 <= r2) + (d2 <= r2);
  const int last_other = (i == 3) ? 2 : 3;
  j = j < last_other ? j : last_other;
  j = (j == i) ? last_other : j;  // unreachable except through rounding (as in the reference)
  *i_out = i;
  *j_out = j;
  *s_out = s;
}

// Mvue24Scales: 1 / p_k for every lane, with p_k = a_k/S + a_k * sum_{m != k} (a_m/S) / R_m the
// inclusion probability (R_m = S - a_m summed from the other three). p is invariant to scaling a,
// so huge groups (s > 2^100) are scaled by 2^-64 first: every reciprocal below then has a normal
// argument and a normal result.
SP24_HD void Mvue24Scales(const float (&a)[4], float s, float (&inv_p)[4]) {
  const float sc = s > 0x1p100f ? 0x1p-64f : 1.0f;
  float as[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) as[k] = a[k] * sc;
  const float t01 = as[0] + as[1], t23 = as[2] + as[3];
  const float rest[4] = {as[1] + t23, as[0] + t23, t01 + as[3], t01 + as[2]};
  const float inv_s = Recip(t01 + t23);
  float q[4], w[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    q[k] = as[k] * inv_s;
    w[k] = q[k] * Recip(rest[k]);
  }
  const float v01 = w[0] + w[1], v23 = w[2] + w[3];
  const float others[4] = {w[1] + v23, w[0] + v23, v01 + w[3], v01 + w[2]};
#pragma unroll
  for (int k = 0; k < 4; ++k) inv_p[k] = Recip(fmaf(as[k], others[k], q[k]));
}

// The sample of one group given two uniforms in [0, 1): the drawn lanes i != j and y[k] = g[k] / p_k
// for every lane (only lanes i and j are used: Mvue24Kept).
SP24_HD void Mvue24Sample(const float (&g)[4], float u1, float u2, int* i, int* j, float (&y)[4]) {
  float a[4], inv_p[4], s;
#pragma unroll
  for (int k = 0; k < 4; ++k) a[k] = fabsf(g[k]) + kMvueEps;
  Mvue24Draw(a, u1, u2, i, j, &s);
  Mvue24Scales(a, s, inv_p);
#pragma unroll
  for (int k = 0; k < 4; ++k) y[k] = g[k] * inv_p[k];
}

// The output of one lane, as the reference: g / p where the lane is kept and g != 0, else 0.
SP24_HD float Mvue24Kept(float g, float y, bool keep) { return (keep && g != 0.0f) ? y : 0.0f; }

// MVUE 2:4 of one group given two uniforms in [0, 1) (dense output, the element-wise kernel).
SP24_HD void Mvue24(const float (&g)[4], float u1, float u2, float (&out)[4], bool (&keep)[4]) {
  float y[4];
  int i, j;
  Mvue24Sample(g, u1, u2, &i, &j, y);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    keep[k] = (k == i) || (k == j);
    out[k] = Mvue24Kept(g[k], y[k], keep[k]);
  }
}

// ------------------------------------------------------------------------------------------------
// MVUE randomness (see the top of this file).

struct KeyWords {
  PhiloxKey sched;  // round keys from key words 0, 1
  uint32_t k2 = 0, k3 = 0;
};

SP24_HD KeyWords MakeKey(uint32_t k0, uint32_t k1, uint32_t k2, uint32_t k3) {
  KeyWords w;
  w.sched = PhiloxSchedule(k0, k1);
  w.k2 = k2;
  w.k3 = k3;
  return w;
}

// Random words of the pair of groups holding group g_in (index within its batch element).
SP24_HD U32x4 PhiloxPair(const KeyWords& k, int64_t g_in) {
  const uint64_t pair = static_cast<uint64_t>(g_in) >> 1;
  return Philox4x32_10(U32x4{static_cast<uint32_t>(pair), static_cast<uint32_t>(pair >> 32), k.k2, k.k3}, k.sched);
}

}  // namespace mask_kernels
}  // namespace jax_sparse24
