// Element-wise 2:4 kernels as XLA FFI handlers (CUDA, sm_90a):
//
//   Sparse24Mask24              2:4 magnitude mask along dim -2 of an (outer..., L, inner) view
//   Sparse24SoftThreshold24     S-STE soft threshold + its mask, same view
//   Sparse24TransposableMask24  exact best transposable 2:4 pattern per 4x4 block of (..., R, C)
//   Sparse24Mvue24              unbiased stochastic 2:4 (MVUE), Philox4x32-7 keyed by a JAX key
//
// The math is the one in jax_sparse24/_src/reference_ops.py (DESIGN.md "The math"); the GPU tests
// compare against it. All handlers are command-buffer compatible: no host synchronisation, no
// allocation, the PRNG key is read on the device.
//
// Layout. A grouped tensor is seen as (outer, L, inner) without any transpose: groups are the 4
// elements x[o, 4g + 0..3, i]. Leading dims beyond 3 (a vmap batch, "broadcast_all") fold into
// `outer`; for MVUE each leading batch element uses its own key (the key then has the same
// leading dims). Two kernel families:
//   * contiguous (inner == 1): each thread handles "items" of 8 consecutive elements (2 groups),
//     16-byte loads/stores, UNROLL items in flight per thread, grid-stride loop;
//   * strided (inner > 1, or a misaligned buffer): each thread handles W consecutive `i` of one
//     group row (W groups), loading 4 rows of W elements (16 bytes when inner % (16/sizeof) == 0)
//     — coalesced across the warp along `inner`.
//
// Tie and special-value rules (match the reference, reference.py module docstring): mask24 keeps
// the 2 largest magnitude keys (mvue_rng.cuh MagKey: |x| as an integer, -0 == +0, subnormals
// exact, every NaN one key above inf) with ties toward the lower index (lax.top_k), so NaN/inf are
// always kept. Transposable: the pattern maximising (number of non-finite elements kept, float32
// sum of the finite kept |x| 2^-4, |x| < 2^-122 counted as 0) lexicographically, the first in
// increasing 16-bit order (bit 4*r + c = element (r, c)) among the best. Soft threshold and MVUE:
// mvue_rng.cuh.
//
// MVUE randomness: Philox4x32-7 (Random123 constants) with key (k0, k1) and counter (octet lo,
// octet hi, k2, k3), where k0..k3 are the JAX key's words (zero beyond its length) and octet =
// (group index within the key's batch element) / 8, the group index running over (outer, L/4,
// inner) in row-major order. One call serves eight groups, 16 random bits each (mvue_rng.cuh,
// GroupBitsRun). So the draws depend only on the key and the group's position, never on the
// launch configuration.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>

#include "ffi_common.h"

#define SP24_HD __host__ __device__ __forceinline__
#define SP24_D __device__ __forceinline__

// Per-group math (mask24 / soft threshold / MVUE) and the MVUE Philox generator, shared with
// the fused compressors (compress_kernels.cu).
#include "mvue_rng.cuh"

namespace jax_sparse24 {
namespace mask_kernels {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = int64_t{1} << 20;  // grid-stride beyond this

enum class GroupOp { kMask24, kSoftThreshold24, kMvue24 };

// ------------------------------------------------------------------------------------------------
// Small compile-time helpers.

template <class F, int... I>
SP24_HD void StaticForImpl(F&& f, std::integer_sequence<int, I...>) {
  (f(std::integral_constant<int, I>{}), ...);
}
// Calls f(std::integral_constant<int, i>) for i = 0 .. N-1, fully unrolled with constant indices.
template <int N, class F>
SP24_HD void StaticFor(F&& f) {
  StaticForImpl(f, std::make_integer_sequence<int, N>{});
}

// ------------------------------------------------------------------------------------------------
// Transposable 4x4 patterns.
//
// A pattern = one 2-of-4 column pair per row (6 choices, q = 0..5 in increasing nibble order
// 0b0011, 0b0101, 0b0110, 0b1001, 0b1010, 0b1100) such that every column is used twice. Split
// rows {0,1} ("A", index n = q1*6 + q0) and rows {2,3} ("B", index n = q3*6 + q2): a pattern is
// valid iff A's column counts are 2 minus B's. A's are grouped in 19 classes by column counts.
// Increasing 16-bit p = lexicographic (q3, q2, q1, q0) = (B index, A index). So: per class, the
// first-max A in index order; then over B in index order, the first max of B + bestA[class(B)].

struct PatternTables {
  int pair_c0[6], pair_c1[6], pair_nib[6];
  int a_class[36];   // class of A index n = q1*6 + q0
  bool a_first[36];  // first A of its class (in index order)
  int a_code[36];    // (nib(q1) << 4) | nib(q0)
  int b_class[36];   // A class compatible with B index n = q3*6 + q2
  int b_code[36];    // (nib(q3) << 12) | (nib(q2) << 8)
  int class_size[19];
  int class_single_code[19];  // a_code of the only member of a one-member class
  int n_classes;
  int n_patterns;
};

constexpr PatternTables MakePatternTables() {
  PatternTables t{};
  const int nibs[6] = {0x3, 0x5, 0x6, 0x9, 0xA, 0xC};
  for (int q = 0; q < 6; ++q) {
    t.pair_nib[q] = nibs[q];
    int first = -1, second = -1;
    for (int c = 0; c < 4; ++c) {
      if ((nibs[q] >> c) & 1) {
        if (first < 0) first = c;
        else second = c;
      }
    }
    t.pair_c0[q] = first;
    t.pair_c1[q] = second;
  }
  // Class id per column-count code (base 3).
  int code_to_class[81] = {};
  for (int i = 0; i < 81; ++i) code_to_class[i] = -1;
  int n_classes = 0;
  for (int n = 0; n < 36; ++n) {
    const int q0 = n % 6, q1 = n / 6;
    int code = 0, p3 = 1;
    for (int c = 0; c < 4; ++c) {
      code += (((nibs[q0] >> c) & 1) + ((nibs[q1] >> c) & 1)) * p3;
      p3 *= 3;
    }
    if (code_to_class[code] < 0) {
      code_to_class[code] = n_classes;
      t.class_size[n_classes] = 0;
      t.class_single_code[n_classes] = (nibs[q1] << 4) | nibs[q0];
      t.a_first[n] = true;
      ++n_classes;
    } else {
      t.a_first[n] = false;
    }
    t.a_class[n] = code_to_class[code];
    t.class_size[t.a_class[n]] += 1;
    t.a_code[n] = (nibs[q1] << 4) | nibs[q0];
  }
  t.n_classes = n_classes;
  int n_patterns = 0;
  for (int n = 0; n < 36; ++n) {
    const int q2 = n % 6, q3 = n / 6;
    int code = 0, p3 = 1;
    for (int c = 0; c < 4; ++c) {
      code += (2 - ((nibs[q2] >> c) & 1) - ((nibs[q3] >> c) & 1)) * p3;
      p3 *= 3;
    }
    t.b_class[n] = code_to_class[code];
    t.b_code[n] = (nibs[q3] << 12) | (nibs[q2] << 8);
    n_patterns += t.class_size[t.b_class[n]];
  }
  t.n_patterns = n_patterns;
  return t;
}

static_assert(MakePatternTables().n_classes == 19, "19 column-count classes of two 2-of-4 rows");
static_assert(MakePatternTables().n_patterns == 90, "90 transposable 4x4 patterns");

// Table look-ups as constexpr functions, so device code only ever sees their constant values
// (a namespace-scope constexpr object would be an undefined identifier in device code).
constexpr int PairC0(int q) { return MakePatternTables().pair_c0[q]; }
constexpr int PairC1(int q) { return MakePatternTables().pair_c1[q]; }
constexpr int AClass(int n) { return MakePatternTables().a_class[n]; }
constexpr bool AFirst(int n) { return MakePatternTables().a_first[n]; }
constexpr int ACode(int n) { return MakePatternTables().a_code[n]; }
constexpr int BClass(int n) { return MakePatternTables().b_class[n]; }
constexpr int BCode(int n) { return MakePatternTables().b_code[n]; }
constexpr int ClassSize(int c) { return MakePatternTables().class_size[c]; }
constexpr int ClassSingleCode(int c) { return MakePatternTables().class_single_code[c]; }

// Best pattern (16-bit p) of the 4x4 block at columns OFF..OFF+3 of a (finite |x| 2^-4 as float32,
// |x| < 2^-122 and non-finite as 0). LEX: the score is (non-finite kept, sum) compared
// lexicographically, nf[r][c] = 1 where x is NaN or +-inf; without LEX (a block of finite values,
// the usual case) only the sum, and nf is unused.
template <int OFF, int NC, bool LEX>
SP24_HD uint32_t BestPattern(const float (&a)[4][NC], const int (&nf)[4][NC]) {
  float pair[4][6];
  int pc[4][6];
  StaticFor<24>([&](auto I) {
    constexpr int r = I / 6, q = I % 6;
    pair[r][q] = a[r][OFF + PairC0(q)] + a[r][OFF + PairC1(q)];
    if constexpr (LEX) pc[r][q] = nf[r][OFF + PairC0(q)] + nf[r][OFF + PairC1(q)];
  });
  // (c, s) beats (bc, bs): lexicographic with LEX, else s > bs.
  auto beats = [](int c, float s, int bc, float bs) {
    if constexpr (LEX) return c > bc || (c == bc && s > bs);
    else return s > bs;
  };
  float best_a[19];
  int cnt_a[19];
  uint32_t code_a[19];
  StaticFor<36>([&](auto I) {
    constexpr int n = I;
    constexpr int c = AClass(n);
    const float s = pair[0][n % 6] + pair[1][n / 6];
    int k = 0;
    if constexpr (LEX) k = pc[0][n % 6] + pc[1][n / 6];
    if constexpr (AFirst(n)) {
      best_a[c] = s;
      cnt_a[c] = k;
      code_a[c] = ACode(n);
    } else {
      const bool gt = beats(k, s, cnt_a[c], best_a[c]);
      best_a[c] = gt ? s : best_a[c];
      cnt_a[c] = gt ? k : cnt_a[c];
      code_a[c] = gt ? static_cast<uint32_t>(ACode(n)) : code_a[c];
    }
  });
  float best = 0.0f;
  int best_cnt = 0;
  uint32_t best_b = 0, best_code_a = 0;
  StaticFor<36>([&](auto I) {
    constexpr int n = I;
    constexpr int c = BClass(n);
    const float s = pair[2][n % 6] + pair[3][n / 6] + best_a[c];
    int k = 0;
    if constexpr (LEX) k = pc[2][n % 6] + pc[3][n / 6] + cnt_a[c];
    uint32_t ca;
    if constexpr (ClassSize(c) == 1) {
      ca = ClassSingleCode(c);
    } else {
      ca = code_a[c];
    }
    if constexpr (n == 0) {
      best = s;
      best_cnt = k;
      best_b = BCode(n);
      best_code_a = ca;
    } else {
      const bool gt = beats(k, s, best_cnt, best);
      best = gt ? s : best;
      best_cnt = gt ? k : best_cnt;
      best_b = gt ? static_cast<uint32_t>(BCode(n)) : best_b;
      best_code_a = gt ? ca : best_code_a;
    }
  });
  return best_b | best_code_a;
}

// Nibble (4 mask bits of one row) -> 4 bytes of 0/1.
SP24_HD uint32_t NibbleToBytes(uint32_t n) { return (n * 0x00204081u) & 0x01010101u; }

// ------------------------------------------------------------------------------------------------
// Device memory helpers: raw loads/stores of 1..32 bytes, element (un)packing.

template <int BYTES>
struct Raw;
template <>
struct Raw<1> {
  static constexpr int kWords = 1;
  SP24_D static void Store(void* p, const uint32_t* w) {
    *reinterpret_cast<unsigned char*>(p) = static_cast<unsigned char>(w[0]);
  }
};
template <>
struct Raw<2> {
  static constexpr int kWords = 1;
  SP24_D static void Load(const void* p, uint32_t* w) {
    w[0] = __ldg(reinterpret_cast<const unsigned short*>(p));
  }
  SP24_D static void Store(void* p, const uint32_t* w) {
    *reinterpret_cast<unsigned short*>(p) = static_cast<unsigned short>(w[0]);
  }
};
template <>
struct Raw<4> {
  static constexpr int kWords = 1;
  SP24_D static void Load(const void* p, uint32_t* w) { w[0] = __ldg(reinterpret_cast<const unsigned int*>(p)); }
  SP24_D static void Store(void* p, const uint32_t* w) { *reinterpret_cast<unsigned int*>(p) = w[0]; }
};
template <>
struct Raw<8> {
  static constexpr int kWords = 2;
  SP24_D static void Load(const void* p, uint32_t* w) {
    const uint2 v = __ldg(reinterpret_cast<const uint2*>(p));
    w[0] = v.x;
    w[1] = v.y;
  }
  SP24_D static void Store(void* p, const uint32_t* w) { *reinterpret_cast<uint2*>(p) = make_uint2(w[0], w[1]); }
};
template <>
struct Raw<16> {
  static constexpr int kWords = 4;
  SP24_D static void Load(const void* p, uint32_t* w) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
    w[0] = v.x;
    w[1] = v.y;
    w[2] = v.z;
    w[3] = v.w;
  }
  SP24_D static void Store(void* p, const uint32_t* w) {
    *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
  }
};
template <>
struct Raw<32> {
  static constexpr int kWords = 8;
  SP24_D static void Load(const void* p, uint32_t* w) {
    Raw<16>::Load(p, w);
    Raw<16>::Load(static_cast<const char*>(p) + 16, w + 4);
  }
  SP24_D static void Store(void* p, const uint32_t* w) {
    Raw<16>::Store(p, w);
    Raw<16>::Store(static_cast<char*>(p) + 16, w + 4);
  }
};

template <typename T>
struct Elt;
template <>
struct Elt<float> {
  static constexpr int kPerWord = 1;
  SP24_D static void Unpack(uint32_t w, float* o) { o[0] = __uint_as_float(w); }
  SP24_D static uint32_t Pack(const float* v) { return __float_as_uint(v[0]); }
};
template <>
struct Elt<__nv_bfloat16> {
  static constexpr int kPerWord = 2;
  SP24_D static void Unpack(uint32_t w, float* o) {
    o[0] = __uint_as_float(w << 16);
    o[1] = __uint_as_float(w & 0xffff0000u);
  }
  SP24_D static uint32_t Pack(const float* v) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(v[0], v[1]);  // .x (low half) = v[0]
    return *reinterpret_cast<const uint32_t*>(&h);
  }
};
template <>
struct Elt<__half> {
  static constexpr int kPerWord = 2;
  SP24_D static void Unpack(uint32_t w, float* o) {
    __half2 h;
    *reinterpret_cast<uint32_t*>(&h) = w;
    const float2 f = __half22float2(h);
    o[0] = f.x;
    o[1] = f.y;
  }
  SP24_D static uint32_t Pack(const float* v) {
    const __half2 h = __floats2half2_rn(v[0], v[1]);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
};

// W consecutive elements of T <-> float. Vector access of W*sizeof(T) bytes (must be aligned).
template <typename T, int W>
SP24_D void LoadElems(const T* p, float (&v)[W]) {
  constexpr int kBytes = W * static_cast<int>(sizeof(T));
  constexpr int kPer = Elt<T>::kPerWord;
  uint32_t w[Raw<kBytes>::kWords];
  Raw<kBytes>::Load(p, w);
  if constexpr (kBytes >= 4) {
#pragma unroll
    for (int i = 0; i < kBytes / 4; ++i) {
      float t[kPer];
      Elt<T>::Unpack(w[i], t);
#pragma unroll
      for (int e = 0; e < kPer; ++e) v[i * kPer + e] = t[e];
    }
  } else {
    float t[2];
    Elt<T>::Unpack(w[0], t);
    v[0] = t[0];
  }
}

// Element-by-element loads (any alignment).
template <typename T, int W>
SP24_D void LoadElemsScalar(const T* p, float (&v)[W]) {
#pragma unroll
  for (int e = 0; e < W; ++e) {
    float t[2];
    uint32_t w[1];
    Raw<sizeof(T)>::Load(p + e, w);
    Elt<T>::Unpack(w[0], t);
    v[e] = t[0];
  }
}

template <typename T, int W>
SP24_D void StoreElems(T* p, const float (&v)[W]) {
  constexpr int kBytes = W * static_cast<int>(sizeof(T));
  constexpr int kPer = Elt<T>::kPerWord;
  uint32_t w[Raw<kBytes>::kWords];
  if constexpr (kBytes >= 4) {
#pragma unroll
    for (int i = 0; i < kBytes / 4; ++i) w[i] = Elt<T>::Pack(v + i * kPer);
  } else {
    const float t[2] = {v[0], 0.0f};
    w[0] = Elt<T>::Pack(t);
  }
  Raw<kBytes>::Store(p, w);
}

// W mask bytes (0/1) in one store of W bytes.
template <int W>
SP24_D void StoreMask(uint8_t* p, const bool (&keep)[W]) {
  constexpr int kWords = W >= 4 ? W / 4 : 1;
  uint32_t w[kWords];
#pragma unroll
  for (int i = 0; i < kWords; ++i) w[i] = 0;
#pragma unroll
  for (int e = 0; e < W; ++e) w[e / 4] |= static_cast<uint32_t>(keep[e]) << (8 * (e % 4));
  Raw<W>::Store(p, w);
}

// ------------------------------------------------------------------------------------------------
// MVUE randomness: see the top of this file (mvue_rng.cuh GroupBitsRun). Independent of the
// launch configuration.

struct RngArgs {
  const uint32_t* key = nullptr;  // (nb, nkw) uint32 on the device
  int nkw = 0;                    // words per key, 1..4
  int64_t nb = 1;                 // number of keys (leading batch elements)
  int64_t gpb = 0;                // groups per key (per batch element)
  int64_t rows_pb = 0;            // group rows (outer * L/4) per batch element; gpb = rows_pb * inner
};

SP24_D KeyWords LoadKey(const RngArgs& r, int64_t b) {
  const uint32_t* k = r.key + b * r.nkw;
  return MakeKey(__ldg(k), r.nkw > 1 ? __ldg(k + 1) : 0u, r.nkw > 2 ? __ldg(k + 2) : 0u,
                 r.nkw > 3 ? __ldg(k + 3) : 0u);
}

// ------------------------------------------------------------------------------------------------
// Element-wise group kernels.

template <GroupOp OP>
SP24_D void ApplyGroup(const float (&v)[4], uint32_t bits, float (&y)[4], bool (&keep)[4]) {
  if constexpr (OP == GroupOp::kMask24) {
    Mask24Keep(v, keep);
  } else if constexpr (OP == GroupOp::kSoftThreshold24) {
    SoftThreshold24(v, y, keep);
  } else {
    Mvue24(v, bits, y, keep);
  }
}

template <GroupOp OP>
constexpr bool kWritesY = OP != GroupOp::kMask24;
template <GroupOp OP>
constexpr bool kWritesMask = OP != GroupOp::kMvue24;

// W groups whose 4 rows start at x + e0 + k * stride (k = 0..3), W consecutive elements per row.
// MVUE: g_in0 is the index of the first group within its batch element (even when W is even),
// key that element's key. VEC: W-element vector accesses are aligned.
template <typename T, GroupOp OP, int W, bool VEC>
SP24_D void ProcessStridedChunk(const T* __restrict__ x, T* __restrict__ y, uint8_t* __restrict__ mask,
                                int64_t e0, int64_t stride, int64_t g_in0, const KeyWords& key) {
  float v[4][W];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    if constexpr (VEC) LoadElems<T, W>(x + e0 + k * stride, v[k]);
    else LoadElemsScalar<T, W>(x + e0 + k * stride, v[k]);
  }
  uint32_t bits[W];  // MVUE: each group's random word
  if constexpr (OP == GroupOp::kMvue24) {
    GroupBitsRun<W>(key, g_in0, bits);  // g_in0 % W == 0 (W = 1, 2, 4, 8)
  } else {
#pragma unroll
    for (int e = 0; e < W; ++e) bits[e] = 0u;
  }
  float yv[4][W];
  bool keep[4][W];
#pragma unroll
  for (int e = 0; e < W; ++e) {
    const float g[4] = {v[0][e], v[1][e], v[2][e], v[3][e]};
    float yo[4];
    bool ko[4];
    ApplyGroup<OP>(g, bits[e], yo, ko);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      yv[k][e] = yo[k];
      keep[k][e] = ko[k];
    }
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    if constexpr (kWritesY<OP>) StoreElems<T, W>(y + e0 + k * stride, yv[k]);
    if constexpr (kWritesMask<OP>) StoreMask<W>(mask + e0 + k * stride, keep[k]);
  }
}

// inner == 1: items of 8 consecutive elements (2 groups); UNROLL items per thread per step, the
// k-th at tile_base + k * kThreads + tid so every load/store instruction is coalesced.
// Requires x, y 16-byte aligned and mask 8-byte aligned; MVUE: a single key (nb == 1). The odd
// last group (n_groups odd) is done by thread 0.
template <typename T, GroupOp OP, int UNROLL>
__global__ void __launch_bounds__(kThreads)
    ContiguousGroupKernel(const T* __restrict__ x, T* __restrict__ y, uint8_t* __restrict__ mask,
                          int64_t n_items, int64_t n_groups, RngArgs rng) {
  const int64_t tile = int64_t{kThreads} * UNROLL;
  KeyWords key;
  if constexpr (OP == GroupOp::kMvue24) key = LoadKey(rng, 0);
  for (int64_t base = int64_t{blockIdx.x} * tile; base < n_items; base += int64_t{gridDim.x} * tile) {
    float v[UNROLL][8];
#pragma unroll
    for (int k = 0; k < UNROLL; ++k) {
      // Out-of-range lanes re-load the last item (always valid) instead of predicating the load.
      int64_t it = base + k * kThreads + threadIdx.x;
      it = it < n_items ? it : n_items - 1;
      LoadElems<T, 8>(x + it * 8, v[k]);
    }
#pragma unroll
    for (int k = 0; k < UNROLL; ++k) {
      const int64_t it = base + k * kThreads + threadIdx.x;
      if (it < n_items) {
        uint32_t bits[2] = {0u, 0u};
        if constexpr (OP == GroupOp::kMvue24) {
          // groups 2 it, 2 it + 1: one word of octet it / 4 (one key: the host guarantees nb == 1 here)
          GroupBitsRun<2>(key, 2 * it, bits);
        }
        float yv[8];
        bool keep[8];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float g[4] = {v[k][4 * h], v[k][4 * h + 1], v[k][4 * h + 2], v[k][4 * h + 3]};
          float yo[4];
          bool ko[4];
          ApplyGroup<OP>(g, bits[h], yo, ko);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            yv[4 * h + e] = yo[e];
            keep[4 * h + e] = ko[e];
          }
        }
        if constexpr (kWritesY<OP>) StoreElems<T, 8>(y + it * 8, yv);
        if constexpr (kWritesMask<OP>) StoreMask<8>(mask + it * 8, keep);
      }
    }
  }
  if ((n_groups & 1) && blockIdx.x == 0 && threadIdx.x == 0) {
    const int64_t g = n_groups - 1;
    ProcessStridedChunk<T, OP, 1, true>(x, y, mask, 4 * g, 1, g, key);
  }
}

// General layout: unit u = (og, ic) with og = o * (L/4) + g the group row and ic the chunk of W
// consecutive inner indices. Requires inner % W == 0 and W-element accesses aligned.
template <typename T, GroupOp OP, int W>
__global__ void __launch_bounds__(kThreads)
    StridedGroupKernel(const T* __restrict__ x, T* __restrict__ y, uint8_t* __restrict__ mask,
                       int64_t n_units, int64_t n_chunks, int64_t inner, RngArgs rng) {
  const bool idx32 = n_units <= int64_t{0xffffffff};
  KeyWords key;
  if constexpr (OP == GroupOp::kMvue24) {
    if (rng.nb == 1) key = LoadKey(rng, 0);
  }
  for (int64_t u = int64_t{blockIdx.x} * kThreads + threadIdx.x; u < n_units; u += int64_t{gridDim.x} * kThreads) {
    int64_t og, ic;
    if (idx32) {
      const uint32_t uu = static_cast<uint32_t>(u), nc = static_cast<uint32_t>(n_chunks);
      const uint32_t q = uu / nc;
      og = q;
      ic = uu - q * nc;
    } else {
      og = u / n_chunks;
      ic = u - og * n_chunks;
    }
    const int64_t i0 = ic * W;
    int64_t og_in = og;  // group row within its batch element (batch boundaries are row boundaries)
    if constexpr (OP == GroupOp::kMvue24) {
      if (rng.nb > 1) {
        const int64_t b = og / rng.rows_pb;
        og_in -= b * rng.rows_pb;
        key = LoadKey(rng, b);
      }
    }
    ProcessStridedChunk<T, OP, W, true>(x, y, mask, og * 4 * inner + i0, inner, og_in * inner + i0, key);
  }
}

// Transposable mask: unit u = (block row br, chunk cc of BPT consecutive 4x4 blocks).
template <typename T, int BPT, bool VEC>
__global__ void __launch_bounds__(kThreads)
    TransposableMaskKernel(const T* __restrict__ x, uint8_t* __restrict__ mask, int64_t n_units,
                           int64_t n_chunks, int64_t cols) {
  constexpr int NC = 4 * BPT;
  const bool idx32 = n_units <= int64_t{0xffffffff};
  for (int64_t u = int64_t{blockIdx.x} * kThreads + threadIdx.x; u < n_units; u += int64_t{gridDim.x} * kThreads) {
    int64_t br, cc;
    if (idx32) {
      const uint32_t uu = static_cast<uint32_t>(u), nc = static_cast<uint32_t>(n_chunks);
      const uint32_t q = uu / nc;
      br = q;
      cc = uu - q * nc;
    } else {
      br = u / n_chunks;
      cc = u - br * n_chunks;
    }
    const int64_t e0 = br * 4 * cols + cc * NC;
    float a[4][NC];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      if constexpr (VEC) LoadElems<T, NC>(x + e0 + r * cols, a[r]);
      else LoadElemsScalar<T, NC>(x + e0 + r * cols, a[r]);
    }
    // Scores: finite |x| 2^-4 (no sum of 8 overflows), |x| < 2^-122 (subnormals too) as 0 so every
    // backend's flush mode agrees, and, in a
    // block holding a NaN or inf, the number of non-finite elements kept first (module header).
    int nf[4][NC];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
#pragma unroll
      for (int c = 0; c < NC; ++c) {
        const float m = fabsf(a[r][c]);
        nf[r][c] = !(m <= 3.402823466e38f);  // NaN or inf
        a[r][c] = (m >= 0x1p-122f && m <= 3.402823466e38f) ? m * 0x1p-4f : 0.0f;  // exact; sums < 2^127
      }
    }
    uint32_t p[BPT];
    StaticFor<BPT>([&](auto B) {
      int any = 0;
#pragma unroll
      for (int r = 0; r < 4; ++r) {
#pragma unroll
        for (int c = 0; c < 4; ++c) any |= nf[r][4 * B + c];
      }
      p[B] = any ? BestPattern<4 * B, NC, true>(a, nf) : BestPattern<4 * B, NC, false>(a, nf);
    });
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      uint32_t w[BPT];
#pragma unroll
      for (int b = 0; b < BPT; ++b) w[b] = NibbleToBytes((p[b] >> (4 * r)) & 0xFu);
      uint8_t* dst = mask + e0 + r * cols;
      if constexpr (VEC) {
        Raw<4 * BPT>::Store(dst, w);
      } else {
#pragma unroll
        for (int b = 0; b < BPT; ++b) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const uint32_t byte = (w[b] >> (8 * e)) & 0xFFu;
            Raw<1>::Store(dst + 4 * b + e, &byte);
          }
        }
      }
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Host side: validation and launches.



bool IsKernelFloat(ffi::DataType t) {
  return t == ffi::DataType::F32 || t == ffi::DataType::BF16 || t == ffi::DataType::F16;
}

bool Aligned(const void* p, size_t bytes) { return (reinterpret_cast<uintptr_t>(p) % bytes) == 0; }

int64_t NumBlocks(int64_t work_per_block_units, int64_t units) {
  int64_t b = (units + work_per_block_units - 1) / work_per_block_units;
  if (b < 1) b = 1;
  if (b > kMaxBlocks) b = kMaxBlocks;
  return b;
}

ffi::Error CheckSameShape(const char* op, const char* what, ffi::AnyBuffer::Dimensions x,
                          ffi::AnyBuffer::Dimensions out) {
  bool same = x.size() == out.size();
  for (size_t i = 0; same && i < x.size(); ++i) same = x[i] == out[i];
  if (!same) {
    return InvalidArgument(std::string(op) + ": output `" + what + "` must have the input's shape " +
                           DimsString(x) + ", got " + DimsString(out));
  }
  return ffi::Error::Success();
}

template <typename T, GroupOp OP>
ffi::Error LaunchGroupOp(cudaStream_t stream, const char* op, const void* x_ptr, void* y_ptr, void* mask_ptr,
                         int64_t rows, int64_t inner, const RngArgs& rng) {
  // rows = outer * L (number of length-`inner` rows); groups of 4 rows.
  const T* x = static_cast<const T*>(x_ptr);
  T* y = static_cast<T*>(y_ptr);
  uint8_t* mask = static_cast<uint8_t*>(mask_ptr);
  const int64_t n = rows * inner;
  const bool y_ok16 = !kWritesY<OP> || Aligned(y, 16);
  const bool m_ok8 = !kWritesMask<OP> || Aligned(mask, 8);
  const bool rng_pairs_ok = OP != GroupOp::kMvue24 || rng.nb == 1;  // batched keys: strided kernel
  if (inner == 1 && Aligned(x, 16) && y_ok16 && m_ok8 && rng_pairs_ok) {
    constexpr int kUnroll = sizeof(T) == 4 ? 2 : 4;  // 64 bytes of x in flight per thread
    const int64_t n_items = n / 8, n_groups = n / 4;
    const int64_t blocks = NumBlocks(int64_t{kThreads} * kUnroll, n_items);
    ContiguousGroupKernel<T, OP, kUnroll>
        <<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(x, y, mask, n_items, n_groups, rng);
    SP24_CHECK_LAUNCH("ContiguousGroupKernel");
    return ffi::Error::Success();
  }
  // Widest W (<= 16 bytes of T) with inner % W == 0 and aligned accesses.
  auto fits = [&](int w) {
    return inner % w == 0 && Aligned(x, w * sizeof(T)) && (!kWritesY<OP> || Aligned(y, w * sizeof(T))) &&
           (!kWritesMask<OP> || Aligned(mask, w));
  };
  auto launch = [&](auto w_const) -> ffi::Error {
    constexpr int W = decltype(w_const)::value;
    const int64_t n_chunks = inner / W;
    const int64_t n_units = (rows / 4) * n_chunks;
    const int64_t blocks = NumBlocks(kThreads, n_units);
    StridedGroupKernel<T, OP, W>
        <<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(x, y, mask, n_units, n_chunks, inner, rng);
    SP24_CHECK_LAUNCH("StridedGroupKernel");
    return ffi::Error::Success();
  };
  constexpr int kWMax = 16 / static_cast<int>(sizeof(T));
  if (fits(kWMax)) return launch(std::integral_constant<int, kWMax>{});
  if (fits(kWMax / 2)) return launch(std::integral_constant<int, kWMax / 2>{});
  if constexpr (kWMax / 4 >= 2) {
    if (fits(kWMax / 4)) return launch(std::integral_constant<int, kWMax / 4>{});
  }
  return launch(std::integral_constant<int, 1>{});  // scalar accesses: any inner, any alignment
}

// Shared by mask24 / soft threshold / mvue. key: MVUE only; y / mask: null when not produced.
template <GroupOp OP>
ffi::Error GroupOpImpl(const char* op, cudaStream_t stream, const ffi::AnyBuffer* key, const ffi::AnyBuffer& x,
                       ffi::AnyBuffer* y, ffi::AnyBuffer* mask) {
  const auto dims = x.dimensions();
  const int64_t rank = static_cast<int64_t>(dims.size());
  if (rank < 3) {
    return InvalidArgument(std::string(op) + ": x must have rank >= 3, viewed as (outer..., L, inner) with groups "
                           "of 4 along L; got shape " + DimsString(dims));
  }
  if (!IsKernelFloat(x.element_type())) {
    return InvalidArgument(std::string(op) + ": x must be float32, bfloat16 or float16, got " +
                           DataTypeName(x.element_type()) + " with shape " + DimsString(dims));
  }
  const int64_t L = dims[rank - 2], inner = dims[rank - 1];
  if (L % 4 != 0) {
    return InvalidArgument(std::string(op) + ": the grouped axis (dim -2 of the (outer, L, inner) view) must be "
                           "divisible by 4, got L = " + std::to_string(L) + " in shape " + DimsString(dims));
  }
  if (y != nullptr) {
    SP24_RETURN_IF_ERROR(CheckSameShape(op, "y", dims, y->dimensions()));
    if (y->element_type() != x.element_type()) {
      return InvalidArgument(std::string(op) + ": output `y` must have x's dtype " +
                             DataTypeName(x.element_type()) + ", got " + DataTypeName(y->element_type()));
    }
  }
  if (mask != nullptr) {
    SP24_RETURN_IF_ERROR(CheckSameShape(op, "mask", dims, mask->dimensions()));
    if (mask->element_type() != ffi::DataType::PRED) {
      return InvalidArgument(std::string(op) + ": output `mask` must be bool (PRED), got " +
                             DataTypeName(mask->element_type()));
    }
  }
  int64_t total = 1;
  for (int64_t d : dims) total *= d;

  RngArgs rng;
  if (key != nullptr) {
    const auto kd = key->dimensions();
    const int64_t krank = static_cast<int64_t>(kd.size());
    if (key->element_type() != ffi::DataType::U32) {
      return InvalidArgument(std::string(op) + ": key must be uint32 key data (jax.random.key_data), got " +
                             DataTypeName(key->element_type()) + " with shape " + DimsString(kd));
    }
    if (krank < 1 || kd[krank - 1] < 1 || kd[krank - 1] > 4) {
      return InvalidArgument(std::string(op) + ": key data must have shape (..., n) with 1 <= n <= 4 words, got " +
                             DimsString(kd));
    }
    // Batched keys (vmap "broadcast_all"): key (B..., n) pairs with x (B..., outer, L, inner).
    bool batch_ok = krank - 1 <= rank - 3;
    int64_t nb = 1;
    for (int64_t i = 0; batch_ok && i < krank - 1; ++i) {
      batch_ok = kd[i] == dims[i];
      nb *= kd[i];
    }
    if (!batch_ok || krank - 1 != rank - 3) {
      return InvalidArgument(std::string(op) + ": key data of shape " + DimsString(kd) +
                             " must be (n,) for x of rank 3, or have x's leading batch dims (B..., n) for x of "
                             "shape (B..., outer, L, inner); got x of shape " + DimsString(dims));
    }
    rng.key = static_cast<const uint32_t*>(key->untyped_data());
    rng.nkw = static_cast<int>(kd[krank - 1]);
    rng.nb = nb;
    if (total > 0) {
      rng.gpb = total / 4 / nb;
      rng.rows_pb = rng.gpb / inner;
    }
  }
  if (total == 0) return ffi::Error::Success();
  const int64_t rows = total / inner;
  void* y_ptr = y ? y->untyped_data() : nullptr;
  void* m_ptr = mask ? mask->untyped_data() : nullptr;
  switch (x.element_type()) {
    case ffi::DataType::F32:
      return LaunchGroupOp<float, OP>(stream, op, x.untyped_data(), y_ptr, m_ptr, rows, inner, rng);
    case ffi::DataType::BF16:
      return LaunchGroupOp<__nv_bfloat16, OP>(stream, op, x.untyped_data(), y_ptr, m_ptr, rows, inner, rng);
    case ffi::DataType::F16:
      return LaunchGroupOp<__half, OP>(stream, op, x.untyped_data(), y_ptr, m_ptr, rows, inner, rng);
    default:
      return InvalidArgument(std::string(op) + ": unsupported dtype");
  }
}

template <typename T>
ffi::Error LaunchTransposable(cudaStream_t stream, const void* x_ptr, void* m_ptr, int64_t rows, int64_t cols) {
  const T* x = static_cast<const T*>(x_ptr);
  uint8_t* mask = static_cast<uint8_t*>(m_ptr);
  auto launch = [&](auto bpt_const, auto vec_const) -> ffi::Error {
    constexpr int BPT = decltype(bpt_const)::value;
    constexpr bool VEC = decltype(vec_const)::value;
    const int64_t n_chunks = cols / (4 * BPT);
    const int64_t n_units = (rows / 4) * n_chunks;
    const int64_t blocks = NumBlocks(kThreads, n_units);
    TransposableMaskKernel<T, BPT, VEC>
        <<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(x, mask, n_units, n_chunks, cols);
    SP24_CHECK_LAUNCH("TransposableMaskKernel");
    return ffi::Error::Success();
  };
  if constexpr (sizeof(T) == 2) {
    // Two blocks per thread: 16-byte loads, 8-byte mask stores.
    if (cols % 8 == 0 && Aligned(x, 16) && Aligned(mask, 8)) {
      return launch(std::integral_constant<int, 2>{}, std::true_type{});
    }
  }
  if (Aligned(x, 4 * sizeof(T)) && Aligned(mask, 4)) {
    return launch(std::integral_constant<int, 1>{}, std::true_type{});
  }
  return launch(std::integral_constant<int, 1>{}, std::false_type{});
}

}  // namespace mask_kernels

// ------------------------------------------------------------------------------------------------
// Handlers.

namespace {

using mask_kernels::GroupOp;

ffi::Error Mask24Impl(cudaStream_t stream, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> mask) {
  return mask_kernels::GroupOpImpl<GroupOp::kMask24>("jax_sparse24_mask24", stream, nullptr, x, nullptr,
                                                     &(*mask));
}

ffi::Error SoftThreshold24Impl(cudaStream_t stream, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                               ffi::Result<ffi::AnyBuffer> mask) {
  return mask_kernels::GroupOpImpl<GroupOp::kSoftThreshold24>("jax_sparse24_soft_threshold24", stream, nullptr, x,
                                                              &(*y), &(*mask));
}

ffi::Error Mvue24Impl(cudaStream_t stream, ffi::AnyBuffer key, ffi::AnyBuffer g, ffi::Result<ffi::AnyBuffer> out) {
  return mask_kernels::GroupOpImpl<GroupOp::kMvue24>("jax_sparse24_mvue24", stream, &key, g, &(*out), nullptr);
}

ffi::Error TransposableMask24Impl(cudaStream_t stream, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> mask) {
  constexpr const char* op = "jax_sparse24_transposable_mask24";
  const auto dims = x.dimensions();
  const int64_t rank = static_cast<int64_t>(dims.size());
  if (rank < 2) {
    return InvalidArgument(std::string(op) + ": x must have rank >= 2 ((batch..., R, C)), got shape " +
                           DimsString(dims));
  }
  if (!mask_kernels::IsKernelFloat(x.element_type())) {
    return InvalidArgument(std::string(op) + ": x must be float32, bfloat16 or float16, got " +
                           DataTypeName(x.element_type()) + " with shape " + DimsString(dims));
  }
  const int64_t R = dims[rank - 2], C = dims[rank - 1];
  if (R % 4 != 0 || C % 4 != 0) {
    return InvalidArgument(std::string(op) + ": both matrix dims R and C must be divisible by 4 (4x4 blocks), got "
                           "shape " + DimsString(dims));
  }
  SP24_RETURN_IF_ERROR(mask_kernels::CheckSameShape(op, "mask", dims, mask->dimensions()));
  if (mask->element_type() != ffi::DataType::PRED) {
    return InvalidArgument(std::string(op) + ": output `mask` must be bool (PRED), got " +
                           DataTypeName(mask->element_type()));
  }
  int64_t total = 1;
  for (int64_t d : dims) total *= d;
  if (total == 0) return ffi::Error::Success();
  const int64_t rows = total / C;  // leading batch dims fold into rows (R % 4 == 0 keeps blocks inside a matrix)
  switch (x.element_type()) {
    case ffi::DataType::F32:
      return mask_kernels::LaunchTransposable<float>(stream, x.untyped_data(), mask->untyped_data(), rows, C);
    case ffi::DataType::BF16:
      return mask_kernels::LaunchTransposable<__nv_bfloat16>(stream, x.untyped_data(), mask->untyped_data(), rows, C);
    case ffi::DataType::F16:
      return mask_kernels::LaunchTransposable<__half>(stream, x.untyped_data(), mask->untyped_data(), rows, C);
    default:
      return InvalidArgument(std::string(op) + ": unsupported dtype");
  }
}

}  // namespace
}  // namespace jax_sparse24

XLA_FFI_DEFINE_HANDLER_SYMBOL(Sparse24Mask24, jax_sparse24::Mask24Impl,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>(),
                              {xla::ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(Sparse24SoftThreshold24, jax_sparse24::SoftThreshold24Impl,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>(),
                              {xla::ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(Sparse24TransposableMask24, jax_sparse24::TransposableMask24Impl,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>(),
                              {xla::ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(Sparse24Mvue24, jax_sparse24::Mvue24Impl,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>(),
                              {xla::ffi::Traits::kCmdBufferCompatible});
