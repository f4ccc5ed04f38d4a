// Host emulation of the fused compressors (xla_ffi/compress_kernels.cu), run by
// tests/test_compress_emulation.py on machines without a GPU: the real TileLoop of every kernel
// instantiation runs with 256 host threads per CTA (a futex barrier as __syncthreads, several grid
// sizes so the grid-stride loop is exercised) and every output byte -- values and metadata, padding
// included -- is compared with an independent host implementation of CUTLASS's compressor
// (transform/kernel/sm90_sparse_gemm_compressor.hpp + the all-zero fix-up) applied to the dense op
// result, laid out by compress_layout.h's MetaByteOffset (itself checked against CuTe's
// fill_layoutE); the many-tensor kernel's table walk (ManyTileLoop) is checked the same way, per
// tensor. Host arithmetic differs from the device's only in Recip (exact division here), which both
// sides share, so MVUE is checked for numbering and layout, not device rounding (the GPU test
// compares with the MVUE kernel bit for bit). Build: nvcc -std=c++20 -I xla_ffi -I <jaxlib>/include.
#include "compress_kernels.cu"
#include "emulation_util.h"

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

using namespace jax_sparse24::compress;
namespace mk = jax_sparse24::mask_kernels;

static int g_fail = 0;

template <typename T>
uint16_t F2B(float f) { return (uint16_t)Elem16<T>::FromFloat(f); }
template <typename T>
float B2F(uint16_t b) { return Elem16<T>::ToFloat(b); }

// Reference CUTLASS compressor (transform/kernel/sm90_sparse_gemm_compressor.hpp) + fix-up on A (m x k),
// the 16-bit metadata layout (MetaByteOffset).
void RefCompress(const std::vector<uint16_t>& A, int64_t m, int64_t k, std::vector<uint16_t>& vals,
                 std::vector<uint8_t>& meta) {
  RefCompressMatrix<uint16_t>(A, m, k, 0x7FFF, [](int64_t r, int64_t c, int64_t m_al) { return MetaByteOffset(r, c, m_al); },
                              vals, meta);
}

// The same operand in cuSPARSELt's layout (compress_layout.h LtMetaNibble): one buffer of m * k / 2
// values then m * k / 8 metadata bytes; the nibbles are the reference's, read back from `meta`.
std::vector<uint8_t> RefLtBuffer(const std::vector<uint16_t>& vals, const std::vector<uint8_t>& meta, int64_t m,
                                 int64_t k) {
  const int64_t mal = (m + 63) / 64 * 64;
  std::vector<uint8_t> buf(m * k + m * k / 8, 0);
  std::memcpy(buf.data(), vals.data(), m * k);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t g = 0; g < k / 4; ++g) {
      const uint32_t nib = (meta[MetaByteOffset(r, 4 * g, mal)] >> (4 * (g & 1))) & 0xF;
      const int64_t n = LtMetaNibble(r, 4 * g, k);
      buf[m * k + n / 2] |= static_cast<uint8_t>(nib << (4 * (n & 1)));
    }
  return buf;
}

template <typename T, Op OP, bool D, bool TR>
void Emulate(TileParams p, int64_t grid) {
  p.col_tiles = (p.cols + kTile - 1) / kTile;
  p.tiles = ((p.rows + kTile - 1) / kTile) * p.col_tiles;
  grid = std::min<int64_t>(grid, p.tiles);
  for (int64_t b = 0; b < grid; ++b) {
    TileSmem<D, TR> sm;
    std::memset(&sm, 0xAB, sizeof(sm));
    RunCta(kThreads, [&](int t, auto& sync) { TileLoop<T, OP, D, TR>(p, t, b, grid, sm, sync); });
  }
}

template <typename T>
std::vector<uint16_t> RandomX(std::mt19937& rng, int64_t R, int64_t C) {
  std::normal_distribution<float> nd;
  std::uniform_real_distribution<float> ud;
  std::vector<uint16_t> x(R * C);
  for (auto& v : x) {
    float u = ud(rng);
    float f = nd(rng);
    if (u < 0.05f) f = 0.0f;                 // zeros
    else if (u < 0.07f) f = -0.0f;           // negative zeros
    else if (u < 0.10f) f = 0.5f;            // ties
    else if (u < 0.12f) f = -0.5f;
    v = F2B<T>(f);
  }
  return x;
}

// 2:4 along both axes: per 4x4 block a circulant pattern, some ones dropped.
std::vector<uint8_t> RandomMask(std::mt19937& rng, int64_t R, int64_t C, bool both, bool along_rows) {
  std::vector<uint8_t> m(R * C, 0);
  std::uniform_int_distribution<int> sd(0, 3);
  std::uniform_real_distribution<float> ud;
  if (both) {
    for (int64_t br = 0; br < R / 4; ++br)
      for (int64_t bc = 0; bc < C / 4; ++bc) {
        int s = sd(rng);
        for (int r = 0; r < 4; ++r)
          for (int q = 0; q < 2; ++q)
            if (ud(rng) > 0.1f) m[(4 * br + r) * C + 4 * bc + (r + s + q) % 4] = 1;
      }
  } else {
    // random 2-of-4 (or fewer) along the group axis
    const int64_t L = along_rows ? R : C, W = along_rows ? C : R;
    for (int64_t w = 0; w < W; ++w)
      for (int64_t g = 0; g < L / 4; ++g) {
        int a = sd(rng), b = sd(rng);
        for (int e : {a, b}) {
          int64_t r = along_rows ? 4 * g + e : w, c = along_rows ? w : 4 * g + e;
          if (ud(rng) > 0.1f) m[r * C + c] = 1;
        }
      }
  }
  return m;
}

// packed24.pack24's encoding of (x * mask) (R, C), groups of 4 along rows: values (R / 2, C) -- per
// group its first then its second kept element, 0 where it keeps fewer -- and bits (R / 8, C), bit
// j of byte r = mask row 8 r + j.
void HostPack(const std::vector<uint16_t>& x, const std::vector<uint8_t>& mask, int64_t R, int64_t C,
              std::vector<uint16_t>& values, std::vector<uint8_t>& bits) {
  values.assign(R / 2 * C, 0);
  bits.assign(R / 8 * C, 0);
  for (int64_t c = 0; c < C; ++c)
    for (int64_t g = 0; g < R / 4; ++g) {
      int n = 0;
      for (int q = 0; q < 4; ++q) {
        const int64_t r = 4 * g + q;
        if (!mask[r * C + c]) continue;
        bits[(r / 8) * C + c] |= static_cast<uint8_t>(1u << (r % 8));
        if (n < 2) values[(2 * g + n) * C + c] = x[r * C + c];
        ++n;
      }
    }
}

template <typename T, Op OP>
std::vector<uint16_t> RefOp(const std::vector<uint16_t>& x, const std::vector<uint8_t>& mask, int64_t R, int64_t C,
                            bool trans, const uint32_t* key, int nkw) {
  std::vector<uint16_t> y(x.size(), 0);
  if (OP == Op::kMask) {
    for (size_t i = 0; i < x.size(); ++i) y[i] = mask[i] ? x[i] : 0;
    return y;
  }
  if (OP == Op::kPacked) {  // unpack24(pack24(x, mask)): the first two kept elements of each row group
    for (int64_t c = 0; c < C; ++c)
      for (int64_t g = 0; g < R / 4; ++g)
        for (int q = 0, n = 0; q < 4; ++q) {
          const int64_t i = (4 * g + q) * C + c;
          if (mask[i] && n++ < 2) y[i] = x[i];
        }
    return y;
  }
  mk::KeyWords kw = mk::MakeKey(key[0], nkw > 1 ? key[1] : 0, nkw > 2 ? key[2] : 0, nkw > 3 ? key[3] : 0);
  const int64_t ngr = trans ? R / 4 : R, ngc = trans ? C : C / 4;
  for (int64_t a = 0; a < ngr; ++a)
    for (int64_t b = 0; b < ngc; ++b) {
      int64_t pos[4];
      float v[4];
      for (int q = 0; q < 4; ++q) {
        pos[q] = trans ? (4 * a + q) * C + b : a * C + 4 * b + q;
        v[q] = B2F<T>(x[pos[q]]);
      }
      const int64_t gin = trans ? a * C + b : a * (C / 4) + b;  // mask_kernels' numbering
      float o[4];
      bool keep[4];
      mk::Mvue24(v, mk::GroupBits(kw, gin), o, keep);
      for (int q = 0; q < 4; ++q) y[pos[q]] = F2B<T>(o[q]);
    }
  return y;
}

std::vector<uint16_t> Transpose(const std::vector<uint16_t>& y, int64_t R, int64_t C) {
  std::vector<uint16_t> t(y.size());
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) t[c * R + r] = y[r * C + c];
  return t;
}

template <typename T, Op OP>
void Case(const char* name, int64_t R, int64_t C, bool dir, bool trans, int64_t grid, uint32_t seed, bool lt = false) {
  std::mt19937 rng(seed);
  auto x = RandomX<T>(rng, R, C);
  // kPacked: groups along rows (the packing's); a mask 2:4 along both axes where the direct operand
  // (groups along columns) is written, else some row groups keep 3 or 4 (the packing keeps two)
  constexpr bool kPk = OP == Op::kPacked;
  auto mask = RandomMask(rng, R, C, (dir && trans) || (kPk && dir), trans || kPk);
  if (kPk && !dir) {
    std::uniform_real_distribution<float> ud;
    for (auto& m : mask) if (ud(rng) < 0.08f) m = 1;
  }
  uint32_t key[2] = {seed * 2654435761u, 0xdeadbeefu};
  auto y = RefOp<T, OP>(x, mask, R, C, trans && !dir, key, 2);
  TileParams p{};
  p.x = x.data();
  p.rows = R;
  p.cols = C;
  p.mask = mask.data();
  p.key = key;
  p.nkw = 2;
  std::vector<uint16_t> pv;
  std::vector<uint8_t> pb;
  if constexpr (kPk) {
    HostPack(x, mask, R, C, pv, pb);
    p.x = pv.data();
    p.mask = pb.data();
  }
  std::vector<uint16_t> dv, tv;
  std::vector<uint8_t> dm, tm;
  std::vector<uint8_t> dbuf, tbuf;  // lt: values + metadata in one buffer
  p.lt = lt;
  // Poisoned outputs of the operand with m rows and k columns (A = x: R x C; A = x^T: C x R).
  auto outputs = [&](int64_t m, int64_t k, std::vector<uint16_t>& v, std::vector<uint8_t>& meta,
                     std::vector<uint8_t>& buf, void*& values, uint8_t*& meta_ptr, int64_t& meta_rows) {
    if (lt) {
      buf.assign(m * k + m * k / 8, 0xCD);
      values = buf.data();
      meta_ptr = buf.data() + m * k;
      meta_rows = m;
    } else {
      const int64_t mal = (m + 63) / 64 * 64, kal = (k + 127) / 128 * 128;
      v.assign(m * k / 2, 0xCDCD);
      meta.assign(mal * kal / 8, 0xCD);
      values = v.data();
      meta_ptr = meta.data();
      meta_rows = mal;
    }
  };
  if (dir) outputs(R, C, dv, dm, dbuf, p.d_values, p.d_meta, p.d_meta_rows);
  if (trans) outputs(C, R, tv, tm, tbuf, p.t_values, p.t_meta, p.t_meta_rows);
  if (dir && trans) {
    if constexpr (OP == Op::kMask) Emulate<T, OP, true, true>(p, grid);
  } else if (dir) Emulate<T, OP, true, false>(p, grid);
  else Emulate<T, OP, false, true>(p, grid);
  int bad = 0;
  std::vector<uint16_t> rv;
  std::vector<uint8_t> rm;
  if (dir && lt) {
    RefCompress(y, R, C, rv, rm);
    const auto ref = RefLtBuffer(rv, rm, R, C);
    for (size_t i = 0; i < ref.size(); ++i) if (ref[i] != dbuf[i] && bad++ < 6) printf("  %s direct lt[%zu] %02x vs ref %02x\n", name, i, dbuf[i], ref[i]);
  } else if (dir) {
    RefCompress(y, R, C, rv, rm);
    for (size_t i = 0; i < rv.size(); ++i) if (rv[i] != dv[i] && bad++ < 3) printf("  %s direct values[%zu] %04x vs ref %04x\n", name, i, dv[i], rv[i]);
    for (size_t i = 0; i < rm.size(); ++i) if (rm[i] != dm[i] && bad++ < 6) printf("  %s direct meta[%zu] %02x vs ref %02x\n", name, i, dm[i], rm[i]);
  }
  if (trans && lt) {
    RefCompress(Transpose(y, R, C), C, R, rv, rm);
    const auto ref = RefLtBuffer(rv, rm, C, R);
    for (size_t i = 0; i < ref.size(); ++i) if (ref[i] != tbuf[i] && bad++ < 12) printf("  %s trans lt[%zu] %02x vs ref %02x\n", name, i, tbuf[i], ref[i]);
  } else if (trans) {
    RefCompress(Transpose(y, R, C), C, R, rv, rm);
    for (size_t i = 0; i < rv.size(); ++i) if (rv[i] != tv[i] && bad++ < 9) printf("  %s trans values[%zu] %04x vs ref %04x\n", name, i, tv[i], rv[i]);
    for (size_t i = 0; i < rm.size(); ++i) if (rm[i] != tm[i] && bad++ < 12) printf("  %s trans meta[%zu] %02x vs ref %02x\n", name, i, tm[i], rm[i]);
  }
  printf("%-8s %-5s R=%-4ld C=%-4ld dir=%d trans=%d grid=%ld%s: %s\n", name, sizeof(T) == 2 && std::is_same<T, __half>::value ? "f16" : "bf16",
         (long)R, (long)C, dir, trans, (long)grid, lt ? " cusparselt" : "", bad ? "FAIL" : "ok");
  g_fail += bad != 0;
}

template <typename T>
void All() {
  struct S { int64_t R, C; };
  // direct: C % 16; trans: R % 16; both: both.
  for (auto s : {S{128, 128}, S{256, 384}, S{144, 272}, S{16, 16}, S{400, 48}}) {
    for (int64_t grid : {1, 3, 1000}) {
      Case<T, Op::kMask>("mask", s.R, s.C, true, false, grid, 3 + grid);
      Case<T, Op::kMask>("mask", s.R, s.C, false, true, grid, 4 + grid);
      Case<T, Op::kMask>("mask2", s.R, s.C, true, true, grid, 5 + grid);
      Case<T, Op::kPacked>("packed", s.R, s.C, true, false, grid, 31 + grid);
      Case<T, Op::kPacked>("packed", s.R, s.C, false, true, grid, 32 + grid);
      Case<T, Op::kMvue>("mvue", s.R, s.C, false, true, grid, 6 + grid);
      Case<T, Op::kMvue>("mvue", s.R, s.C, true, false, grid, 7 + grid);
    }
  }
  // cuSPARSELt's layout (operand m % 64, k % 32); 384 x 192 ends in partial tiles along k and m
  for (auto s : {S{128, 128}, S{256, 384}, S{384, 192}}) {
    for (int64_t grid : {1, 3, 1000}) {
      Case<T, Op::kMask>("mask", s.R, s.C, true, false, grid, 23 + grid, true);
      Case<T, Op::kMask>("mask2", s.R, s.C, true, true, grid, 25 + grid, true);
      Case<T, Op::kPacked>("packed", s.R, s.C, false, true, grid, 34 + grid, true);
      Case<T, Op::kPacked>("packed", s.R, s.C, true, false, grid, 36 + grid, true);
      Case<T, Op::kMvue>("mvue", s.R, s.C, false, true, grid, 26 + grid, true);
    }
  }
  // odd shapes: direct only (C % 16, R % 8) and trans only (R % 16, C % 8)
  Case<T, Op::kMask>("mask", 40, 208, true, false, 2, 11);
  Case<T, Op::kMask>("mask", 208, 40, false, true, 2, 12);
  Case<T, Op::kMvue>("mvue", 208, 72, false, true, 7, 13);
  Case<T, Op::kMvue>("mvue", 72, 208, true, false, 7, 14);
}

// The many-tensor kernel (CompressManyKernel: ManyTileLoop over a tile table): several (x, mask)
// pairs of mixed shapes, partial tiles included, in one emulated launch; every tensor's outputs --
// values and metadata, padding included -- against the reference, as Case checks the one-tensor
// kernel (whose tile body, CompressTile, is the same code).
template <typename T>
void ManyCase(const char* name, const std::vector<std::pair<int64_t, int64_t>>& shapes, bool dir, bool trans, bool lt,
              int64_t grid, uint32_t seed) {
  std::mt19937 rng(seed);
  const size_t n = shapes.size();
  std::vector<std::vector<uint16_t>> xs(n), dv(n), tv(n);
  std::vector<std::vector<uint8_t>> masks(n), dm(n), tm(n), dbuf(n), tbuf(n);
  ManyParams mp{};
  mp.n = static_cast<int32_t>(n);
  mp.lt = lt;
  int64_t total = 0;
  for (size_t i = 0; i < n; ++i) {
    const auto [R, C] = shapes[i];
    xs[i] = RandomX<T>(rng, R, C);
    masks[i] = RandomMask(rng, R, C, dir && trans, trans);
    ManyTensor& e = mp.t[i];
    e.x = xs[i].data();
    e.mask = masks[i].data();
    e.rows = static_cast<int32_t>(R);
    e.cols = static_cast<int32_t>(C);
    auto outputs = [&](int64_t m, int64_t k, std::vector<uint16_t>& v, std::vector<uint8_t>& meta,
                       std::vector<uint8_t>& buf, void*& values, uint8_t*& meta_ptr) {
      if (lt) {
        buf.assign(m * k + m * k / 8, 0xCD);
        values = buf.data();
        meta_ptr = buf.data() + m * k;
      } else {
        v.assign(m * k / 2, 0xCDCD);
        meta.assign((m + 63) / 64 * 64 * ((k + 127) / 128 * 128) / 8, 0xCD);
        values = v.data();
        meta_ptr = meta.data();
      }
    };
    if (dir) outputs(R, C, dv[i], dm[i], dbuf[i], e.d_values, e.d_meta);
    if (trans) outputs(C, R, tv[i], tm[i], tbuf[i], e.t_values, e.t_meta);
    mp.tile_start[i] = static_cast<int32_t>(total);
    total += ManyEntryParams(e, lt).tiles;
  }
  mp.tile_start[n] = static_cast<int32_t>(total);
  grid = std::min<int64_t>(grid, total);
  for (int64_t b = 0; b < grid; ++b) {
    auto run = [&](auto& sm) {
      std::memset(&sm, 0xAB, sizeof(sm));
      RunCta(kThreads, [&](int t, auto& sync) {
        using S = std::remove_reference_t<decltype(sm)>;
        if constexpr (std::is_same_v<S, TileSmem<true, true>>) {
          ManyTileLoop<T, true, true>(mp, t, b, grid, sm, sync);
        } else if constexpr (std::is_same_v<S, TileSmem<true, false>>) {
          ManyTileLoop<T, true, false>(mp, t, b, grid, sm, sync);
        } else {
          ManyTileLoop<T, false, true>(mp, t, b, grid, sm, sync);
        }
      });
    };
    if (dir && trans) { TileSmem<true, true> sm; run(sm); }
    else if (dir) { TileSmem<true, false> sm; run(sm); }
    else { TileSmem<false, true> sm; run(sm); }
  }
  int bad = 0;
  for (size_t i = 0; i < n; ++i) {
    const auto [R, C] = shapes[i];
    const auto y = RefOp<T, Op::kMask>(xs[i], masks[i], R, C, false, nullptr, 0);
    std::vector<uint16_t> rv;
    std::vector<uint8_t> rm;
    if (dir) {
      RefCompress(y, R, C, rv, rm);
      if (lt) {
        const auto ref = RefLtBuffer(rv, rm, R, C);
        for (size_t j = 0; j < ref.size(); ++j) if (ref[j] != dbuf[i][j] && bad++ < 6) printf("  %s tensor %zu direct lt[%zu] %02x vs ref %02x\n", name, i, j, dbuf[i][j], ref[j]);
      } else {
        for (size_t j = 0; j < rv.size(); ++j) if (rv[j] != dv[i][j] && bad++ < 6) printf("  %s tensor %zu direct values[%zu] %04x vs ref %04x\n", name, i, j, dv[i][j], rv[j]);
        for (size_t j = 0; j < rm.size(); ++j) if (rm[j] != dm[i][j] && bad++ < 6) printf("  %s tensor %zu direct meta[%zu] %02x vs ref %02x\n", name, i, j, dm[i][j], rm[j]);
      }
    }
    if (trans) {
      RefCompress(Transpose(y, R, C), C, R, rv, rm);
      if (lt) {
        const auto ref = RefLtBuffer(rv, rm, C, R);
        for (size_t j = 0; j < ref.size(); ++j) if (ref[j] != tbuf[i][j] && bad++ < 12) printf("  %s tensor %zu trans lt[%zu] %02x vs ref %02x\n", name, i, j, tbuf[i][j], ref[j]);
      } else {
        for (size_t j = 0; j < rv.size(); ++j) if (rv[j] != tv[i][j] && bad++ < 12) printf("  %s tensor %zu trans values[%zu] %04x vs ref %04x\n", name, i, j, tv[i][j], rv[j]);
        for (size_t j = 0; j < rm.size(); ++j) if (rm[j] != tm[i][j] && bad++ < 12) printf("  %s tensor %zu trans meta[%zu] %02x vs ref %02x\n", name, i, j, tm[i][j], rm[j]);
      }
    }
  }
  printf("%-8s %-5s many: %zu tensors, %ld tiles, dir=%d trans=%d grid=%ld%s: %s\n", name,
         std::is_same<T, __half>::value ? "f16" : "bf16", n, (long)total, dir, trans, (long)grid,
         lt ? " cusparselt" : "", bad ? "FAIL" : "ok");
  g_fail += bad != 0;
}

template <typename T>
void AllMany() {
  using Sh = std::vector<std::pair<int64_t, int64_t>>;
  // both directions (R % 16, C % 16): partial tiles along both axes, a one-tile tensor, a wide one
  const Sh both = {{144, 272}, {16, 16}, {256, 384}, {128, 128}, {400, 48}};
  // one direction: direct needs C % 16 (R % 8), transposed R % 16 (C % 8)
  const Sh direct = {{136, 272}, {40, 208}, {256, 128}, {8, 16}};
  const Sh trans = {{272, 136}, {208, 40}, {128, 256}, {16, 8}};
  const Sh lt = {{128, 128}, {384, 192}, {256, 384}};  // cuSPARSELt: operand m % 64, k % 32
  for (int64_t grid : {1, 3, 7, 1000}) {
    ManyCase<T>("mask2", both, true, true, false, grid, 101 + grid);
    ManyCase<T>("mask", direct, true, false, false, grid, 102 + grid);
    ManyCase<T>("mask", trans, false, true, false, grid, 103 + grid);
    ManyCase<T>("mask2", lt, true, true, true, grid, 104 + grid);
    ManyCase<T>("mask", lt, true, false, true, grid, 105 + grid);
    ManyCase<T>("mask", lt, false, true, true, grid, 106 + grid);
  }
  ManyCase<T>("mask2", Sh{{64, 64}}, true, true, false, 2, 107);  // a table of one
}

// The MVUE draw's exact distribution over all 2^16 values of a group's 16 random bits, against the
// inclusion probabilities p_k of the MVUE formula in float64: the 16-bit uniform moves each p_k by
// at most 2^-16 (+ float rounding). Also checks that Mvue24Pick keeps two distinct lanes, with
// g / p_k where g != 0 and +0 where g == 0.
void MvueExactDistribution() {
  const float groups[][4] = {
      {1.0f, 2.0f, 3.0f, 4.0f},       {0.3f, -2.0f, 0.0f, 1.5f},    {1.0f, 1e-9f, 1e-9f, 1e-9f},
      {0.0f, 0.0f, 0.0f, 0.0f},       {0.0f, -1.0f, 0.0f, 0.0f},    {1e30f, 1e-30f, 5.0f, 0.0f},
      {3.0f, -2.0f, 0.5f, 1e-3f},     {1e-38f, 1e-38f, 1e-30f, 0.0f}, {3.3e38f, -3.3e38f, 1.0f, 3.3e38f},
      {1e-3f, 2.0f, 0.0f, -0.5f},     {0.25f, 0.25f, 0.25f, 0.25f}, {5.0f, 0.0f, 1e-20f, 7.0f},
      {0.0f, 1.0f, 0.0f, 0.0f},       {-0.0f, 0.0f, 2.0f, 0.0f},    {1e-3f, 1e6f, 1e-3f, 1e-3f},
  };
  int bad = 0;
  for (const auto& g : groups) {
    // p_k in float64 from a = |g| + eps (unscaled: p is scale-invariant)
    double a[4], s = 0, rest[4] = {0, 0, 0, 0}, p[4];
    for (int k = 0; k < 4; ++k) s += (a[k] = std::fabs(double(g[k])) + double(mk::kMvueEps));
    for (int k = 0; k < 4; ++k)
      for (int j = 0; j < 4; ++j) rest[k] += j != k ? a[j] : 0.0;  // S - a_k without cancellation
    for (int k = 0; k < 4; ++k) {
      p[k] = a[k] / s;
      for (int j = 0; j < 4; ++j)
        if (j != k) p[k] += a[j] / s * a[k] / rest[j];
    }
    double incl[4] = {0, 0, 0, 0};
    for (uint32_t h = 0; h < 65536u; ++h) {
      // the same uniform from either half of a Philox word (GroupBitsRun)
      const uint32_t bits = (h & 1) ? mk::Rotate16(h << 23 | h >> 9) : h << 7;
      const mk::Mvue24Kept2 r = mk::Mvue24Pick(g, bits);
      const int lane[2] = {r.lo(), r.hi()};
      const float v[2] = {r.v_lo, r.v_hi};
      if (!(lane[0] < lane[1] && lane[1] <= 3)) {
        if (bad++ < 5) printf("  mvue lanes %d %d\n", lane[0], lane[1]);
        continue;
      }
      for (int e = 0; e < 2; ++e) {
        const int k = lane[e];
        incl[k] += 1.0 / 65536.0;
        // The kept value of lane k: g / p (host Recip is exact; float rounding only), +0 for g == 0.
        const double want = double(g[k]) / p[k];  // beyond float's range: inf
        const bool ok = g[k] == 0.0f              ? (v[e] == 0.0f && !std::signbit(v[e]))
                        : std::fabs(want) > 3.4e38 ? std::isinf(v[e])
                                                   : std::fabs(double(v[e]) / want - 1.0) <= 1e-5;
        if (!ok && bad++ < 5) {
          printf("  mvue value FAIL: group (%g %g %g %g) lane %d: %g vs %g\n", g[0], g[1], g[2], g[3], k, v[e], want);
        }
      }
    }
    for (int k = 0; k < 4; ++k) {
      if (std::fabs(incl[k] - p[k]) > 1.5 / 65536.0) {
        printf("  mvue exact distribution FAIL: group (%g %g %g %g) lane %d: drawn %.8f, p %.8f\n", g[0], g[1], g[2],
               g[3], k, incl[k], p[k]);
        ++bad;
      }
    }
  }
  printf("mvue exact distribution (%zu groups): %s\n", sizeof(groups) / sizeof(groups[0]), bad ? "FAIL" : "ok");
  g_fail += bad != 0;
}

// The Philox round function and key schedule against Random123's published known-answer vectors
// (Philox4x32-10, its tests/kat_vectors), and the 7-round generator the MVUE draws use against
// values from an independent implementation (the draws change if it does).
void PhiloxKnownAnswers() {
  struct Kat {
    uint32_t ctr[4], key[2], out[4];
  };
  const Kat kat10[] = {
      {{0u, 0u, 0u, 0u}, {0u, 0u}, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
      {{~0u, ~0u, ~0u, ~0u}, {~0u, ~0u}, {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
      {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
       {0xa4093822u, 0x299f31d0u},
       {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
  };
  const Kat kat7[] = {
      {{0x00000000u, 0x00000000u, 0x00000000u, 0x00000000u}, {0x00000000u, 0x00000000u},
       {0x5f6fb709u, 0x0d893f64u, 0x4f121f81u, 0x4f730a48u}},
      {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu},
       {0x5207ddc2u, 0x45165e59u, 0x4d8ee751u, 0x8c52f662u}},
      {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u},
       {0x4dfccabau, 0x190a87f0u, 0xc47362bau, 0xb6b5242au}},
      {{0x12345678u, 0x00000007u, 0x9abcdef0u, 0x0fedcba9u}, {0xdeadbeefu, 0x01234567u},
       {0xfd234f33u, 0x1dff3837u, 0x00897956u, 0x33fc2f33u}},
  };
  int bad = 0;
  auto check = [&](const Kat& k, const mk::U32x4& r, int rounds) {
    const uint32_t got[4] = {r.x, r.y, r.z, r.w};
    for (int i = 0; i < 4; ++i) {
      if (got[i] != k.out[i]) {
        printf("  philox4x32-%d FAIL: ctr %08x..., word %d: %08x vs %08x\n", rounds, k.ctr[0], i, got[i], k.out[i]);
        ++bad;
      }
    }
  };
  for (const Kat& k : kat10) {
    const mk::U32x4 c{k.ctr[0], k.ctr[1], k.ctr[2], k.ctr[3]};
    check(k, mk::Philox4x32(c, mk::PhiloxSchedule<10>(k.key[0], k.key[1])), 10);
  }
  static_assert(mk::kPhiloxRounds == 7, "update the 7-round vectors");
  for (const Kat& k : kat7) {
    const mk::U32x4 c{k.ctr[0], k.ctr[1], k.ctr[2], k.ctr[3]};
    check(k, mk::Philox4x32(c, mk::PhiloxSchedule(k.key[0], k.key[1])), 7);
  }
  // The MVUE counter: (octet lo, octet hi, k2, k3) with key (k0, k1).
  const Kat& k3 = kat7[3];
  const mk::KeyWords kw = mk::MakeKey(k3.key[0], k3.key[1], k3.ctr[2], k3.ctr[3]);
  const int64_t g_in = (int64_t{k3.ctr[1]} << 35) | (int64_t{k3.ctr[0]} << 3);  // octet (ctr[1], ctr[0])
  const mk::U32x4 r = mk::PhiloxOctet(kw, g_in + 5);
  check(k3, r, 7);
  uint32_t run[8];
  mk::GroupBitsRun<8>(kw, g_in, run);
  for (int c = 0; c < 8; ++c) {
    const uint32_t w = mk::QuadWord(r, c / 2), want = (c & 1) ? mk::Rotate16(w) : w;
    if (run[c] != want || mk::GroupBits(kw, g_in + c) != want) {
      printf("  GroupBitsRun FAIL: group %d\n", c);
      ++bad;
    }
  }
  printf("philox known answers: %s\n", bad ? "FAIL" : "ok");
  g_fail += bad != 0;
}

// CompressDrawn against CompressGroup of the dense group for every pair of lanes lo < hi and every
// zero pattern of their values.
void CompressDrawnMatchesCompressGroup() {
  int bad = 0;
  for (int lo = 0; lo < 4; ++lo)
    for (int hi = lo + 1; hi < 4; ++hi)
      for (int z = 0; z < 4; ++z) {
        const uint32_t vlo = (z & 1) ? 0u : 0xBF80u, vhi = (z & 2) ? 0u : 0x4040u;  // -1, 3 in bf16
        uint32_t b[4] = {0u, 0u, 0u, 0u};
        b[lo] = vlo;
        b[hi] = vhi;
        uint32_t want_pair, got_pair = vlo | (vhi << 16);
        const uint32_t want = CompressGroup(b[0], b[1], b[2], b[3], &want_pair);
        const uint32_t got = CompressDrawn(uint32_t(lo | (hi << 2)), &got_pair);
        if (got != want || got_pair != want_pair) {
          printf("  CompressDrawn FAIL: lanes %d %d zeros %d: %x %08x vs %x %08x\n", lo, hi, z, got, got_pair, want,
                 want_pair);
          ++bad;
        }
      }
  printf("CompressDrawn: %s\n", bad ? "FAIL" : "ok");
  g_fail += bad != 0;
}

int main() {
  PhiloxKnownAnswers();
  CompressDrawnMatchesCompressGroup();
  MvueExactDistribution();
  All<__nv_bfloat16>();
  All<__half>();
  AllMany<__nv_bfloat16>();
  AllMany<__half>();
  printf(g_fail ? "EMULATION FAILED (%d cases)\n" : "emulation: all cases ok\n", g_fail);
  return g_fail != 0;
}
