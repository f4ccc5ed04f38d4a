// Per-group 2:4 math and the MVUE random generator, shared by the element-wise kernels
// (mask_kernels.cu) and the fused compressors (compress_kernels.cu), so both draw exactly the same
// MVUE sample for a key. Generator: Philox4x32-10 (Random123 constants) with key (k0, k1) and
// counter (quad lo, quad hi, k2, k3), quad = (group index within the key's batch element) / 4; group
// g takes word g % 4 (x, y, z, w) of its quad's output; its two uniforms are u = (h + 1/2) * 2^-16 with
// h = that word's bits 7..22 (u1) and bits 23..31, 0..6 (u2, the bits 7..22 of the word with its
// halves swapped) (Mvue24Draw). Host+device so the math can be unit-tested on a CPU.
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

// ------------------------------------------------------------------------------------------------
// MVUE 2:4 of one group (DESIGN.md "MVUE 2:4"; reference.mvue24 is the same algorithm in jnp):
// a_k = |g_k| + eps, S = sum a. Draw i with probability a_i / S, then j != i with probability
// a_j / (S - a_i); keep lanes i and j with values g_k / p_k, p_k = a_k/S + a_k sum_{m != k} (a_m/S) /
// (S - a_m) the inclusion probability, so E[out] = g.
//
// How, in float32, per group (~95 instructions on sm_90a, 7 reciprocals):
//  * a is computed as |g| 2^-32 + eps 2^-32: p and the draws are invariant to scaling a, and the
//    scaled a lie in [2^-98, 2^96], so S, 1/S, every S - a_m (the sum of the other three, never a
//    difference) and its reciprocal are normal floats for every finite input (float32 included);
//  * first draw: r1 = u1 S against the cumulative sums a_0, a_0 + a_1, a_0 + a_1 + a_2 (i = how many
//    are <= r1); second draw: r2 = u2 (S - a_i) against the cumulative sums of the other three lanes
//    in lane order (accurate even when a_i dominates: no interval is lost to absorption in S), j =
//    the n-th other lane, n = how many are <= r2. Always j != i, no clamping;
//  * u = (h + 1/2) 2^-16 from 16 random bits h, never 0 or 1 (a drawn lane's p is then a normal
//    float: g / p is finite). r = u S is computed as fma(1 + u, S, -S), 1 + u built from the bits
//    (exact: the same value as u * S rounded once). Drawing with 16-bit uniforms moves each draw's
//    probabilities by at most 2^-16 (absolute): a lane's E[out] is off by at most ~2^-15 |g| / p,
//    i.e. <= 2^-15 S per group -- far below the bf16/fp16 rounding of the stored g / p (2^-9 |g|);
//  * only the two kept lanes' outputs are formed (lanes lo < hi, one reciprocal each); the four
//    inclusion probabilities share 1/S and the four 1/(S - a_m).
//
// Recip: one MUFU.RCP (~1 ulp) on the device, exact division on the host (the host emulation).

// 1 + (h + 1/2) 2^-16 (exactly representable) for the 16-bit value h held in bits 7..22 of w.
SP24_HD float OnePlusUniform16(uint32_t w) { return BitsFloat(0x3F800040u | (w & 0x007FFF80u)); }

// The group's 32 random bits with its 16-bit halves swapped: bits 7..22 are then the bits 23..31
// and 0..6 of `bits`, the second uniform's.
SP24_HD uint32_t Rotate16(uint32_t bits) {
#ifdef __CUDA_ARCH__
  return __byte_perm(bits, bits, 0x1032);
#else
  return (bits << 16) | (bits >> 16);
#endif
}

// The group's weights a (scaled, see above) and their sums.
struct Mvue24Sums {
  float a[4];
  float t01, s, c2;  // a0 + a1, S, a0 + a1 + a2
  float rest[4];     // S - a_k as the sum of the other three
};

SP24_HD Mvue24Sums Mvue24Weights(const float (&g)[4]) {
  constexpr float kScale = 0x1p-32f;
  constexpr float kEpsScaled = kMvueEps * 0x1p-32f;
  Mvue24Sums m;
#pragma unroll
  for (int k = 0; k < 4; ++k) m.a[k] = fmaf(fabsf(g[k]), kScale, kEpsScaled);
  m.t01 = m.a[0] + m.a[1];
  const float t23 = m.a[2] + m.a[3];
  m.s = m.t01 + t23;
  m.c2 = m.t01 + m.a[2];
  m.rest[0] = m.a[1] + t23;
  m.rest[1] = m.a[0] + t23;
  m.rest[2] = m.t01 + m.a[3];
  m.rest[3] = m.c2;
  return m;
}

// The two draws from the 32 random bits (u1 from bits 7..22, u2 from bits 23..31 and 0..6), as
// predicates: i = b0 + b1 + b2 (b2 => b1 => b0), j = the n-th other lane, n = e1 + e2 (e2 => e1).
struct Mvue24Flags {
  bool b0, b1, b2, e1, e2;
};

SP24_HD Mvue24Flags Mvue24Draw(const Mvue24Sums& m, uint32_t bits) {
  Mvue24Flags f;
  const float r1 = fmaf(OnePlusUniform16(bits), m.s, -m.s);
  f.b0 = r1 >= m.a[0];
  f.b1 = r1 >= m.t01;
  f.b2 = r1 >= m.c2;
  // Other lanes o_0 < o_1 < o_2 of i: thresholds d1 = a_{o_0}, d2 = a_{o_0} + a_{o_1}, total S - a_i.
  const float d1 = f.b0 ? m.a[0] : m.a[1];
  const float d2 = f.b1 ? m.t01 : d1 + m.a[2];
  const float ri = f.b2 ? m.rest[3] : (f.b1 ? m.rest[2] : (f.b0 ? m.rest[1] : m.rest[0]));
  const float r2 = fmaf(OnePlusUniform16(Rotate16(bits)), ri, -ri);
  f.e1 = r2 >= d1;
  f.e2 = r2 >= d2;
  return f;
}

// The four inclusion probabilities p_k = a_k/S + a_k sum_{m != k} (a_m/S) / (S - a_m), each sum
// formed without a difference (so no cancellation when one lane dominates).
SP24_HD void Mvue24Probabilities(const Mvue24Sums& m, float (&p)[4]) {
  const float inv_s = Recip(m.s);
  float q[4], w[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    q[k] = m.a[k] * inv_s;
    w[k] = q[k] * Recip(m.rest[k]);
  }
  const float v01 = w[0] + w[1], v23 = w[2] + w[3];
  const float others[4] = {w[1] + v23, w[0] + v23, v01 + w[3], v01 + w[2]};
#pragma unroll
  for (int k = 0; k < 4; ++k) p[k] = fmaf(m.a[k], others[k], q[k]);
}

// The result of one group: lanes lo < hi kept, g and g / p_k at each (before the "g == 0 -> 0" rule).
struct Mvue24Kept2 {
  uint32_t nib;  // lo | hi << 2 (CUTLASS's metadata nibble of the two lanes)
  float g_lo, g_hi, y_lo, y_hi;
  SP24_HD int lo() const { return static_cast<int>(nib & 3u); }
  SP24_HD int hi() const { return static_cast<int>(nib >> 2); }
};

// bits: the group's 32 random bits.
SP24_HD Mvue24Kept2 Mvue24Pick(const float (&g)[4], uint32_t bits) {
  const Mvue24Sums m = Mvue24Weights(g);
  const Mvue24Flags f = Mvue24Draw(m, bits);
  // lo = min(i, j) = [i >= 1 && n >= 1] + [i >= 2 && n >= 2], hi = max(i, j) = 1 + [i >= 2 || n >= 1] +
  // [i >= 3 || n >= 2] (j = o_n = n + (n >= i)); the selects below use the same predicates.
  const bool lo_gt0 = f.b0 && f.e1, lo_gt1 = f.b1 && f.e2;
  const bool hi_gt1 = f.b1 || f.e1, hi_gt2 = f.b2 || f.e2;
  float p[4];
  Mvue24Probabilities(m, p);
  Mvue24Kept2 r;
  r.nib = (lo_gt1 ? 2u : (lo_gt0 ? 1u : 0u)) | (hi_gt2 ? 12u : (hi_gt1 ? 8u : 4u));
  const float p_lo = lo_gt0 ? (lo_gt1 ? p[2] : p[1]) : p[0];
  const float p_hi = hi_gt2 ? p[3] : (hi_gt1 ? p[2] : p[1]);
  r.g_lo = lo_gt0 ? (lo_gt1 ? g[2] : g[1]) : g[0];
  r.g_hi = hi_gt2 ? g[3] : (hi_gt1 ? g[2] : g[1]);
  r.y_lo = r.g_lo * Recip(p_lo);
  r.y_hi = r.g_hi * Recip(p_hi);
  return r;
}

// The output of one kept lane, as the reference: g / p, or 0 where g == 0.
SP24_HD float Mvue24Value(float g, float y) { return g != 0.0f ? y : 0.0f; }

// MVUE 2:4 of one group, dense output (the element-wise kernel).
SP24_HD void Mvue24(const float (&g)[4], uint32_t bits, float (&out)[4], bool (&keep)[4]) {
  const Mvue24Kept2 r = Mvue24Pick(g, bits);
  const float vlo = Mvue24Value(r.g_lo, r.y_lo), vhi = Mvue24Value(r.g_hi, r.y_hi);
  const int lo = r.lo(), hi = r.hi();
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    keep[k] = (k == lo) || (k == hi);
    out[k] = k == lo ? vlo : (k == hi ? vhi : 0.0f);
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

// Random words of the quad of groups holding group g_in (index within its batch element): word
// g_in % 4 is that group's.
SP24_HD U32x4 PhiloxQuad(const KeyWords& k, int64_t g_in) {
  const uint64_t quad = static_cast<uint64_t>(g_in) >> 2;
  return Philox4x32_10(U32x4{static_cast<uint32_t>(quad), static_cast<uint32_t>(quad >> 32), k.k2, k.k3}, k.sched);
}

// Word q (0..3) of a quad's output.
SP24_HD uint32_t QuadWord(const U32x4& r, int q) { return q == 0 ? r.x : (q == 1 ? r.y : (q == 2 ? r.z : r.w)); }

// The 32 random bits of group g_in alone (one Philox call).
SP24_HD uint32_t GroupBits(const KeyWords& k, int64_t g_in) { return QuadWord(PhiloxQuad(k, g_in), static_cast<int>(g_in & 3)); }

}  // namespace mask_kernels
}  // namespace jax_sparse24
