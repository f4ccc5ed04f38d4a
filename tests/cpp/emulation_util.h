// Shared pieces of the host emulations of the compressor kernels (compress_emulation.cu,
// fp8_compress_emulation.cu; included after the kernel file): one CTA on host threads, CUTLASS's
// compressor rule for a group and a matrix, and the stub of CUTLASS's shape query.
#pragma once

#include <barrier>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

// One CTA: body(t, sync) on `threads` host threads, sync() a barrier of all of them (__syncthreads).
template <class Body>
void RunCta(int threads, Body&& body) {
  std::barrier bar(threads);
  auto sync = [&bar]() { bar.arrive_and_wait(); };
  std::vector<std::thread> th;
  for (int t = 0; t < threads; ++t) th.emplace_back([&body, &sync, t]() { body(t, sync); });
  for (auto& x : th) x.join();
}

// CUTLASS's compressor (transform/kernel/sm90_sparse_gemm_compressor.hpp + the all-zero fix-up) on one
// group of 4 element bit patterns b (a nonzero: b & nonzero_mask != 0, so +-0 count as zero): the first
// two nonzeros kept in lane order; a lone nonzero at lane 3 -> lanes (0, 3) with values (0, b3), another
// lone one at lane i -> lanes (i, 3) with (b_i, 0); none -> nibble 0x4 with (0, 0). Writes the two values
// to v and returns the nibble lo | hi << 2.
template <typename E>
uint32_t RefCompressGroup(const E* b, E nonzero_mask, E* v) {
  int cnt = 0, idx[2] = {0, 0};
  v[0] = v[1] = 0;
  for (int e = 0; e < 4; ++e) {
    if ((b[e] & nonzero_mask) != 0) {
      if (cnt < 2) { idx[cnt] = e; v[cnt] = b[e]; }
      ++cnt;
    }
  }
  if (cnt == 1 && idx[0] == 3) { v[1] = v[0]; v[0] = 0; idx[0] = 0; idx[1] = 3; }
  else if (cnt == 1) { v[1] = 0; idx[1] = 3; }
  const uint32_t nib = idx[0] | (idx[1] << 2);
  return nib == 0 ? 4u : nib;  // 0 only without a nonzero
}

// CUTLASS's compressor on an (M, K) row-major matrix of element bit patterns (RefCompressGroup on each
// group of 4 along K): the kept values, (M, K / 2), and the metadata, m_al * k_al / 8 bytes (m_al, k_al: M
// and K rounded up to 64 and 128; 0x44 where no group writes), the nibble of row m's group g at byte
// meta_offset(m, 4 g, m_al), bits 4 (g & 1) up. The metadata layout is the caller's: it differs between
// 16- and 8-bit elements.
template <typename E, class MetaOffset>
void RefCompressMatrix(const std::vector<E>& A, int64_t M, int64_t K, E nonzero_mask, MetaOffset meta_offset,
                       std::vector<E>& vals, std::vector<uint8_t>& meta) {
  const int64_t m_al = (M + 63) / 64 * 64, k_al = (K + 127) / 128 * 128;
  vals.assign(M * K / 2, 0);
  meta.assign(m_al * k_al / 8, 0x44);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t g = 0; g < K / 4; ++g) {
      E v[2];
      const uint32_t nib = RefCompressGroup<E>(&A[m * K + 4 * g], nonzero_mask, v);
      vals[m * (K / 2) + 2 * g] = v[0];
      vals[m * (K / 2) + 2 * g + 1] = v[1];
      const int64_t off = meta_offset(m, 4 * g, m_al);
      const int sh = 4 * (g & 1);
      meta[off] = static_cast<uint8_t>((meta[off] & ~(0xF << sh)) | (nib << sh));
    }
}

// The emulations do not call the FFI handlers, whose shape checks query CUTLASS's compressor (defined in
// the extension's CUTLASS unit, not built here): a stub. (This header comes after the kernel file, which
// declares it.)
namespace jax_sparse24 {
bool CutlassCompressedShapes(int64_t, int64_t, int, CompressedShapes*, std::string*) { return false; }
}  // namespace jax_sparse24
