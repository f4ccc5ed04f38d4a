// Shared pieces of the host emulations of the compressor kernels (compress_emulation.cu,
// fp8_compress_emulation.cu; included after the kernel file): one CTA on host threads, CUTLASS's
// compressor rule for a group and a matrix, and the stub of CUTLASS's shape query.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

// One CTA: body(t, sync) on `threads` host threads, sync() a barrier of all of them (__syncthreads).
// The threads are a pool started once per thread count and reused by every CTA (starting 256
// std::threads per CTA cost most of the run time); each CTA still gets its own fresh barrier, and
// RunCta returns only after every thread has finished the body, as a join would.
class CtaPool {
 public:
  explicit CtaPool(int n) : n_(n) {
    for (int t = 0; t < n; ++t) th_.emplace_back([this, t]() { Worker(t); });
  }
  ~CtaPool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
      ++gen_;
    }
    cv_.notify_all();
    for (auto& x : th_) x.join();
  }
  void Run(const std::function<void(int)>& job) {
    std::unique_lock<std::mutex> lk(mu_);
    job_ = &job;
    done_ = 0;
    ++gen_;
    cv_.notify_all();
    done_cv_.wait(lk, [this]() { return done_ == n_; });
    job_ = nullptr;
  }

 private:
  void Worker(int t) {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      cv_.wait(lk, [&]() { return gen_ != seen; });
      seen = gen_;
      if (stop_) return;
      const std::function<void(int)>* job = job_;
      lk.unlock();
      (*job)(t);
      lk.lock();
      if (++done_ == n_) done_cv_.notify_one();
    }
  }
  int n_;
  std::vector<std::thread> th_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int)>* job_ = nullptr;
  uint64_t gen_ = 0;
  int done_ = 0;
  bool stop_ = false;
};

// __syncthreads for the host threads of one CTA: a generation counter that the last thread to arrive
// bumps; the others sleep on it in the kernel (futex) right away. (std::barrier spins and yields first,
// which with 256 threads on a few cores cost more than the emulated kernels themselves.)
class CtaBarrier {
 public:
  explicit CtaBarrier(int n) : n_(n) {}
  void ArriveAndWait() {
    const int gen = gen_.load(std::memory_order_acquire);
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == n_) {
      arrived_.store(0, std::memory_order_relaxed);
      gen_.fetch_add(1, std::memory_order_acq_rel);
      syscall(SYS_futex, reinterpret_cast<int*>(&gen_), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
    } else {
      while (gen_.load(std::memory_order_acquire) == gen)
        syscall(SYS_futex, reinterpret_cast<int*>(&gen_), FUTEX_WAIT_PRIVATE, gen, nullptr, nullptr, 0);
    }
  }

 private:
  const int n_;
  std::atomic<int> arrived_{0};
  std::atomic<int> gen_{0};
};

template <class Body>
void RunCta(int threads, Body&& body) {
  static std::map<int, std::unique_ptr<CtaPool>> pools;  // the emulations call RunCta from one thread
  auto& pool = pools[threads];
  if (!pool) pool = std::make_unique<CtaPool>(threads);
  CtaBarrier bar(threads);
  auto sync = [&bar]() { bar.ArriveAndWait(); };
  const std::function<void(int)> job = [&body, &sync](int t) { body(t, sync); };
  pool->Run(job);
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
