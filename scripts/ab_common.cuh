// Shared pieces of the compressor A/B harnesses (ab_mvue_compress.cu, ab_fp8_mvue_compress.cu; built by
// ab_mvue_compress.sh; included after the kernel file): the input generator, the CUDA error check, the output
// hash, the timing loop and the stub of CUTLASS's shape query.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <vector>

// Returns 1 from the enclosing function (main) on a CUDA error.
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e_), __LINE__); return 1; } } while (0)

// Deterministic bf16 values in (-2, 2), one in eight 100x smaller (never all zeros).
__global__ void Fill(__nv_bfloat16* x, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 0x9E3779B9u ^ seed; h ^= h >> 16; h *= 0x85EBCA6Bu; h ^= h >> 13; h *= 0xC2B2AE35u; h ^= h >> 16;
    float u = (h >> 8) * (1.0f / 16777216.0f);
    x[i] = __float2bfloat16((u - 0.5f) * 4.0f * ((h & 7) == 0 ? 0.01f : 1.0f));
  }
}

// nsets device inputs of n bf16 values (Fill, seeds 1234, 1235, ...) and the MVUE key {42, 7} on the device.
// Returns 1 on a CUDA error.
inline int MakeInputs(int64_t n, int nsets, __nv_bfloat16** x, uint32_t** key) {
  for (int s = 0; s < nsets; ++s) { CK(cudaMalloc(&x[s], n * 2)); Fill<<<1024, 256>>>(x[s], n, 1234u + s); }
  CK(cudaMalloc(key, 8));
  const uint32_t hk[2] = {42u, 7u};
  CK(cudaMemcpy(*key, hk, 8, cudaMemcpyHostToDevice));
  return 0;
}

// FNV-1a over the outputs' bytes, in order.
inline uint64_t HashBytes(std::initializer_list<const std::vector<uint8_t>*> parts) {
  uint64_t h = 1469598103934665603ull;
  for (const auto* p : parts) {
    for (uint8_t b : *p) h = (h ^ b) * 1099511628211ull;
  }
  return h;
}

// Times launch(it) (true: launched) for 5 warm-up and 60 timed iterations, one event pair each; prints the
// median, the effective TB/s over `bytes` and the hash. Returns 1 on a CUDA error or a failed launch.
template <class Launch>
int TimeAndReport(cudaStream_t st, int64_t R, int64_t C, double bytes, uint64_t hash, Launch&& launch) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> ts;
  for (int it = 0; it < 5 + 60; ++it) {
    CK(cudaEventRecord(e0, st));
    if (!launch(it)) { printf("launch failed\n"); return 1; }
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    if (it >= 5) ts.push_back(ms);
  }
  std::sort(ts.begin(), ts.end());
  const double med = ts[ts.size() / 2];
  printf("R=%lld C=%lld median %.4f ms  %.3f TB/s  min %.4f  hash %016llx\n", (long long)R, (long long)C, med,
         bytes / (med * 1e-3) / 1e12, ts[0], (unsigned long long)hash);
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  return 0;
}

// The harnesses do not call the FFI handlers, whose shape checks query CUTLASS's compressor (defined in the
// extension's CUTLASS unit, not built here): a stub. (This header comes after the kernel file, which declares it.)
namespace jax_sparse24 {
bool CutlassCompressedShapes(int64_t, int64_t, int, CompressedShapes*, std::string* e) { *e = "stub"; return false; }
}  // namespace jax_sparse24
