// Per-group 2:4 math and the MVUE random generator, shared by the element-wise kernels
// (mask_kernels.cu) and the fused compressors (compress_kernels.cu), so both draw exactly the same
// MVUE sample for a key. Host+device so the math can be unit-tested on a CPU.
//
// MVUE 2:4 of a group g (4 values; jnp reference: reference.mvue24): weights a_k = |g_k| + eps, S =
// sum a; keep two lanes with inclusion probabilities p_k = a_k/S + a_k sum_{m != k} (a_m/S) / (S - a_m)
// (those of drawing i ~ a_i / S, then j != i ~ a_j / (S - a_i); sum p = 2) and output g_k / p_k there,
// 0 elsewhere. So E[out] = g and Var(out_k) = g_k^2 (1/p_k - 1), the MVUE's per-element variance.
//
// How the two lanes are drawn (Mvue24Draw): systematic sampling on the p_k -- lane k owns the
// interval [P_{k-1}, P_k) of [0, 2) (P = cumulative sums of p in lane order), and the lanes holding u
// and u + 1 are kept, for one uniform u in (0, 1). Each lane is kept with probability exactly p_k
// (every p_k <= 1, so no interval holds both points), which is all that unbiasedness and the
// per-element variance above depend on; it needs one uniform and no second reciprocal-weighted draw
// (the successive draw it replaces took two uniforms and ~13 more instructions per group). What
// differs is the joint law of the pair (e.g. p = (1/2, 1/2, 1/2, 1/2) keeps lanes {0, 2} or {1, 3}
// only, where the successive draw kept each of the six pairs with probability 1/6): the covariances
// between a group's lanes, which the per-element variance -- what the MVUE minimises -- does not
// involve.
//
// Random bits: 16 per group, u = (h + 1/2) 2^-16 (never 0 or 1) -- each lane's inclusion
// probability moves by at most 2^-16 (absolute), so a lane's mean is off by at most ~2^-16 |g|/p
// (<= 2^-16 S per group), far below the bf16/fp16 rounding of the stored g / p (2^-9 |g|).
// Generator: Philox4x32-7 (Random123 constants and key schedule, 7 rounds) with key (k0, k1) and
// counter (octet lo, octet hi, k2, k3), octet = (group index within the key's batch element) / 8;
// group g takes word (g / 2) % 4 (x, y, z, w) of its octet's output, an even g its bits 7..22 and
// an odd g its bits 23..31, 0..6 (the word with its halves swapped) (GroupBitsRun). Salmon et al.
// (SC'11, "Parallel random numbers: as easy as 1, 2, 3") report Philox4x32 Crush-resistant (no
// TestU01 BigCrush failures) from 7 rounds; their default of 10 is a safety margin for general
// use (no statistical defect is known at 7 either). Here each output word only feeds two 16-bit
// uniforms of a statistical estimator, which needs them uniform and independent across groups:
// 7 rounds give that at 70% of the cost. The host test checks the round function against
// Random123's Philox4x32-10 known-answer vectors (Philox4x32<10>).
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

// A read-only global load: the non-coherent path on the device, a plain copy in the host emulations
// (tests/cpp/): shared by the fused compressors (compress_kernels.cu, fp8_compress_kernels.cu).
template <typename V>
SP24_HD V LoadGlobal(const V* p) {
#ifdef __CUDA_ARCH__
  return __ldg(p);
#else
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
#endif
}

// Makes x depend on y for the compiler (no instruction): the next MVUE group starts once the
// previous one has its nibble, so that ptxas does not interleave groups (which spills registers).
SP24_HD void After(float& x, uint32_t y) {
#ifdef __CUDA_ARCH__
  asm volatile("" : "+f"(x) : "r"(y));
#else
  (void)x;
  (void)y;
#endif
}

// a * b rounded once, never contracted into an FMA with a following add. nvcc contracts a * b + c
// (-fmad=true) where the surrounding code lets it, so the same inline function could round
// differently in two kernels; every kernel that draws the MVUE sample must agree bit for bit.
SP24_HD float MulRn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

// ------------------------------------------------------------------------------------------------
// Per-group math (host+device so it can be unit-tested on a CPU).
//
// Special values, one rule for every mask (reference.py module docstring, reference.magnitude_key):
// elements rank by the magnitude key = the bits of |v| with every NaN mapped to one value above
// +inf (0x7f800001): -0 == +0, subnormals ordered exactly (integer compares, no flush), NaN > inf >
// every finite value, equal keys -> lower index. So non-finite elements are always kept (surfaced).
// Converting bf16/fp16 to float is exact and monotone, so the keys order like the reference's keys
// of the original dtype.

// The magnitude key of v (see above).
SP24_HD uint32_t MagKey(float v) {
  const uint32_t a = FloatBits(v) & 0x7fffffffu;
  return a < 0x7f800001u ? a : 0x7f800001u;  // every NaN -> one key above inf
}

// Flush a subnormal to a zero of the same sign (host emulation of the device's .ftz arithmetic and
// of XLA's CPU backend, which the reference follows).
SP24_HD float FlushSubnormal(float x) { return fabsf(x) < 0x1p-126f ? copysignf(0.0f, x) : x; }

// a - b with subnormal inputs and result flushed to zero (sub.rn.ftz.f32): the reference's rule for
// the soft-threshold values, so the kernels match it bit for bit on subnormal inputs too.
SP24_HD float SubFtz(float a, float b) {
#ifdef __CUDA_ARCH__
  float r;
  asm("sub.rn.ftz.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return FlushSubnormal(FlushSubnormal(a) - FlushSubnormal(b));
#endif
}

// keep[k]: element k is one of the 2 largest magnitude keys (ties -> lower index; NaN > inf > finite).
SP24_HD void Mask24Keep(const float (&v)[4], bool (&keep)[4]) {
  const uint32_t a0 = MagKey(v[0]), a1 = MagKey(v[1]), a2 = MagKey(v[2]), a3 = MagKey(v[3]);
  // cjk (j < k): element j beats element k.
  int c01 = a0 >= a1, c02 = a0 >= a2, c03 = a0 >= a3;
  int c12 = a1 >= a2, c13 = a1 >= a3, c23 = a2 >= a3;
  // rank = number of elements that beat this one; keep the two with rank 0 and 1.
  keep[0] = (3 - c01 - c02 - c03) < 2;
  keep[1] = (c01 + 2 - c12 - c13) < 2;
  keep[2] = (c02 + c12 + 1 - c23) < 2;
  keep[3] = (c03 + c13 + c23) < 2;
}

// y = keep ? sign(v) * (|v| - t) : 0 with t the 2nd smallest |v| = the |v| of the dropped element
// with the larger magnitude key (NaN when a NaN is dropped: fmaxf would have ignored it), the
// subtraction flushing subnormals (SubFtz). A kept +-inf stays +-inf, a kept NaN NaN; a group that
// drops a non-finite element (3 or 4 of them) is NaN in both kept positions (inf - inf, x - NaN).
SP24_HD void SoftThreshold24(const float (&v)[4], float (&y)[4], bool (&keep)[4]) {
  Mask24Keep(v, keep);
  uint32_t tk = 0u;
  float t = 0.0f;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint32_t key = MagKey(v[k]);
    const bool take = !keep[k] && key >= tk;
    tk = take ? key : tk;
    t = take ? fabsf(v[k]) : t;
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) y[k] = keep[k] ? copysignf(SubFtz(fabsf(v[k]), t), v[k]) : 0.0f;
}

// Philox4x32-R (Salmon et al. 2011, Random123 constants and key schedule). The MVUE draws use
// kPhiloxRounds; the round count is a parameter so that the host test can check the 10-round
// function against Random123's known-answer vectors.
constexpr int kPhiloxRounds = 7;

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

// The R round keys (Weyl sequence), computed once per key and reused for every counter.
template <int R = kPhiloxRounds>
struct PhiloxKey {
  uint32_t k0[R], k1[R];
};

template <int R = kPhiloxRounds>
SP24_HD PhiloxKey<R> PhiloxSchedule(uint32_t k0, uint32_t k1) {
  PhiloxKey<R> s;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    s.k0[r] = k0 + static_cast<uint32_t>(r) * 0x9E3779B9u;
    s.k1[r] = k1 + static_cast<uint32_t>(r) * 0xBB67AE85u;
  }
  return s;
}

template <int R>
SP24_HD U32x4 Philox4x32(U32x4 c, const PhiloxKey<R>& k) {
#pragma unroll
  for (int r = 0; r < R; ++r) c = PhiloxRound(c, k.k0[r], k.k1[r]);
  return c;
}

// ------------------------------------------------------------------------------------------------
// MVUE 2:4 of one group (see the top of this file; reference.mvue24 is the same algorithm in jnp).
//
// How, in float32, per group (~65 instructions on sm_90a, 7 reciprocals):
//  * a is computed as |g| 2^-32 + eps 2^-32: p and the draw are invariant to scaling a, and the
//    scaled a lie in [2^-98, 2^96], so S, 1/S, every S - a_m (the sum of the other three, never a
//    difference) and its reciprocal are normal floats for every finite input (float32 included);
//  * the four p_k share 1/S and the four 1/(S - a_m), each sum formed without a difference (no
//    cancellation when one lane dominates); every factor is a ratio <= 1, so nothing overflows;
//  * the draw compares u against P_0, P_1 and 1 + u against P_1, P_2 (1 + u from the random bits,
//    u = (1 + u) - 1 exactly): lo = [u >= P_0] + [u >= P_1], hi = 1 + [1 + u >= P_1] + [1 + u >= P_2].
//    A rounded p_k may exceed 1 by an ulp, so hi's comparisons are or-ed with lo's (implied in exact
//    arithmetic): lo < hi always. A kept lane's interval is then non-empty in float unless that
//    rounding decided (probability ~2^-23 per affected group), so its p_k is a normal float and
//    g / p finite; a lane with p_k below 2^-126 exists only when the group's sum of |g| exceeds
//    ~8e17;
//  * only the two kept lanes' outputs are formed (lanes lo < hi, one reciprocal each), as
//    fma(g, 1/p, +0): +0 where g = +-0 (the reference's "0 where g == 0"), with no select.
//
// Recip: one MUFU.RCP (~1 ulp) on the device, exact division on the host (the host emulation).

// 1 + (h + 1/2) 2^-16 (exactly representable) for the 16-bit value h held in bits 7..22 of w.
SP24_HD float OnePlusUniform16(uint32_t w) { return BitsFloat(0x3F800040u | (w & 0x007FFF80u)); }

// `bits` with its 16-bit halves swapped: bits 7..22 are then the bits 23..31 and 0..6 of `bits`.
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
  float s;        // S
  float rest[4];  // S - a_k as the sum of the other three
};

SP24_HD Mvue24Sums Mvue24Weights(const float (&g)[4]) {
  constexpr float kScale = 0x1p-32f;
  constexpr float kEpsScaled = kMvueEps * 0x1p-32f;
  Mvue24Sums m;
#pragma unroll
  for (int k = 0; k < 4; ++k) m.a[k] = fmaf(fabsf(g[k]), kScale, kEpsScaled);
  const float t01 = m.a[0] + m.a[1], t23 = m.a[2] + m.a[3];
  m.s = t01 + t23;
  m.rest[0] = m.a[1] + t23;
  m.rest[1] = m.a[0] + t23;
  m.rest[2] = t01 + m.a[3];
  m.rest[3] = t01 + m.a[2];
  return m;
}

// The four inclusion probabilities p_k = a_k/S + a_k sum_{m != k} (a_m/S) / (S - a_m), each sum
// formed without a difference (so no cancellation when one lane dominates).
SP24_HD void Mvue24Probabilities(const Mvue24Sums& m, float (&p)[4]) {
  const float inv_s = Recip(m.s);
  float q[4], w[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    q[k] = MulRn(m.a[k], inv_s);
    w[k] = MulRn(q[k], Recip(m.rest[k]));  // not contracted into the sums below (see MulRn)
  }
  const float v01 = w[0] + w[1], v23 = w[2] + w[3];
  const float others[4] = {w[1] + v23, w[0] + v23, v01 + w[3], v01 + w[2]};
#pragma unroll
  for (int k = 0; k < 4; ++k) p[k] = fmaf(m.a[k], others[k], q[k]);
}

// The systematic draw from the group's random word (u from its bits 7..22), as predicates:
// lo = lo_gt0 + lo_gt1 (lo_gt1 => lo_gt0), hi = 1 + hi_gt1 + hi_gt2 (hi_gt2 => hi_gt1), lo < hi.
struct Mvue24Flags {
  bool lo_gt0, lo_gt1, hi_gt1, hi_gt2;
};

SP24_HD Mvue24Flags Mvue24Draw(const float (&p)[4], uint32_t bits) {
  const float one_u = OnePlusUniform16(bits);
  const float u = one_u - 1.0f;  // exact
  const float c1 = p[0] + p[1], c2 = c1 + p[2];
  Mvue24Flags f;
  f.lo_gt0 = u >= p[0];
  f.lo_gt1 = u >= c1;
  f.hi_gt1 = one_u >= c1 || f.lo_gt0;
  f.hi_gt2 = one_u >= c2 || f.lo_gt1;
  return f;
}

// A kept lane's output: g / p, +0 where g == +-0 (1/p is finite there, see above).
SP24_HD float Mvue24Value(float g, float p) { return fmaf(g, Recip(p), 0.0f); }

// The result of one group: lanes lo < hi kept with the values v_lo, v_hi (+0 where g == 0).
struct Mvue24Kept2 {
  uint32_t nib;  // lo | hi << 2 (CUTLASS's metadata nibble of the two lanes)
  float v_lo, v_hi;
  SP24_HD int lo() const { return static_cast<int>(nib & 3u); }
  SP24_HD int hi() const { return static_cast<int>(nib >> 2); }
};

// A group holding a NaN or +-inf has no unbiased estimate (p is NaN): it keeps the two lanes of
// Mask24Keep (the non-finite ones first) with the value NaN in both (reference.mvue24), so the
// divergence is surfaced and no other group is touched.
SP24_HD Mvue24Kept2 Mvue24NonFinite(const float (&g)[4]) {
  bool keep[4];
  Mask24Keep(g, keep);
  const uint32_t lo = keep[0] ? 0u : (keep[1] ? 1u : 2u);
  const uint32_t hi = keep[3] ? 3u : (keep[2] ? 2u : 1u);
  Mvue24Kept2 r;
  r.nib = lo | (hi << 2);
  r.v_lo = BitsFloat(0x7fc00000u);
  r.v_hi = r.v_lo;
  return r;
}

// Whether every lane of g is finite (integer test: no flush mode involved).
SP24_HD bool AllFinite4(const float (&g)[4]) {
  const uint32_t m = (FloatBits(g[0]) & 0x7f800000u) == 0x7f800000u || (FloatBits(g[1]) & 0x7f800000u) == 0x7f800000u ||
                     (FloatBits(g[2]) & 0x7f800000u) == 0x7f800000u || (FloatBits(g[3]) & 0x7f800000u) == 0x7f800000u;
  return !m;
}

// bits: the group's random word (its 16 random bits in bits 7..22, GroupBitsRun).
SP24_HD Mvue24Kept2 Mvue24Pick(const float (&g)[4], uint32_t bits) {
  float p[4];
  Mvue24Probabilities(Mvue24Weights(g), p);
  const Mvue24Flags f = Mvue24Draw(p, bits);
  Mvue24Kept2 r;
  r.nib = (f.lo_gt1 ? 2u : (f.lo_gt0 ? 1u : 0u)) | (f.hi_gt2 ? 12u : (f.hi_gt1 ? 8u : 4u));
  const float p_lo = f.lo_gt0 ? (f.lo_gt1 ? p[2] : p[1]) : p[0];
  const float p_hi = f.hi_gt2 ? p[3] : (f.hi_gt1 ? p[2] : p[1]);
  const float g_lo = f.lo_gt0 ? (f.lo_gt1 ? g[2] : g[1]) : g[0];
  const float g_hi = f.hi_gt2 ? g[3] : (f.hi_gt1 ? g[2] : g[1]);
  r.v_lo = Mvue24Value(g_lo, p_lo);
  r.v_hi = Mvue24Value(g_hi, p_hi);
  if (!AllFinite4(g)) r = Mvue24NonFinite(g);  // rare: a select, not a divergent early return
  return r;
}

// MVUE 2:4 of one group, dense output (the element-wise kernel).
SP24_HD void Mvue24(const float (&g)[4], uint32_t bits, float (&out)[4], bool (&keep)[4]) {
  const Mvue24Kept2 r = Mvue24Pick(g, bits);
  const int lo = r.lo(), hi = r.hi();
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    keep[k] = (k == lo) || (k == hi);
    out[k] = k == lo ? r.v_lo : (k == hi ? r.v_hi : 0.0f);
  }
}

// ------------------------------------------------------------------------------------------------
// MVUE randomness (see the top of this file).

struct KeyWords {
  PhiloxKey<> sched;  // round keys from key words 0, 1
  uint32_t k2 = 0, k3 = 0;
};

SP24_HD KeyWords MakeKey(uint32_t k0, uint32_t k1, uint32_t k2, uint32_t k3) {
  KeyWords w;
  w.sched = PhiloxSchedule(k0, k1);
  w.k2 = k2;
  w.k3 = k3;
  return w;
}

// Random words of the octet of groups holding group g_in (index within its batch element).
SP24_HD U32x4 PhiloxOctet(const KeyWords& k, int64_t g_in) {
  const uint64_t octet = static_cast<uint64_t>(g_in) >> 3;
  return Philox4x32(U32x4{static_cast<uint32_t>(octet), static_cast<uint32_t>(octet >> 32), k.k2, k.k3}, k.sched);
}

// Word q (0..3) of a Philox output (selects on q's bits: no indexed local array for a runtime q).
SP24_HD uint32_t QuadWord(const U32x4& r, int q) {
  const uint32_t lo = (q & 1) ? r.y : r.x, hi = (q & 1) ? r.w : r.z;
  return (q & 2) ? hi : lo;
}

// The random words (Mvue24Pick's `bits`) of the W consecutive groups g_in0, g_in0 + 1, ... of one
// batch element: word (g / 2) % 4 of g's octet, its halves swapped for an odd g. g_in0 must be a
// multiple of min(W, 8) (W = 1, 2, 4 or a multiple of 8): one Philox call per octet touched.
template <int W>
SP24_HD void GroupBitsRun(const KeyWords& k, int64_t g_in0, uint32_t (&bits)[W]) {
  static_assert(W == 1 || W == 2 || W == 4 || W % 8 == 0, "runs of 1, 2, 4 or whole octets");
  if constexpr (W == 1) {
    const uint32_t w = QuadWord(PhiloxOctet(k, g_in0), static_cast<int>(g_in0 >> 1) & 3);
    bits[0] = (g_in0 & 1) ? Rotate16(w) : w;
  } else if constexpr (W % 8 == 0) {
#pragma unroll
    for (int o = 0; o < W / 8; ++o) {
      const U32x4 r = PhiloxOctet(k, g_in0 + 8 * o);
      const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        bits[8 * o + 2 * q] = w[q];
        bits[8 * o + 2 * q + 1] = Rotate16(w[q]);
      }
    }
  } else {
    const U32x4 r = PhiloxOctet(k, g_in0);
    const int q0 = static_cast<int>(g_in0 >> 1) & 3;  // W == 4: 0 or 2
#pragma unroll
    for (int q = 0; q < W / 2; ++q) {
      const uint32_t w = QuadWord(r, q0 + q);
      bits[2 * q] = w;
      bits[2 * q + 1] = Rotate16(w);
    }
  }
}

// The random word of group g_in alone (one Philox call).
SP24_HD uint32_t GroupBits(const KeyWords& k, int64_t g_in) {
  uint32_t b[1];
  GroupBitsRun<1>(k, g_in, b);
  return b[0];
}

}  // namespace mask_kernels
}  // namespace jax_sparse24
