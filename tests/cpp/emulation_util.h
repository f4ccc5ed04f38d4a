// Shared pieces of the host emulations of the compressor kernels (compress_emulation.cu,
// fp8_compress_emulation.cu): one CTA on host threads, and CUTLASS's compressor rule for a group.
#pragma once

#include <barrier>
#include <cstdint>
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
