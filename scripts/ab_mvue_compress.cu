// A/B timing of the fused MVUE compressor (Sparse24Mvue24Compress, transposed: dy (R, C) bf16 ->
// MVUE(dy)^T in CUTLASS's layout) without JAX or a full build: compiles xla_ffi/compress_kernels.cu
// from the directory on the include path, so variants of the kernel (copies of xla_ffi/ with a
// change) can be timed side by side in one run. Prints, per shape of the GPT FFN gradients, the
// median of 60 launches over 3 inputs (each larger than L2), the effective TB/s (dense bytes read +
// compressed bytes written, as benchmarks/bench_layer.py) and a hash of the outputs (poisoned
// before the run), which must be equal across variants that draw the same samples (a change of the
// generator or the formula changes it). Shapes: the GPT FFN gradients (8192 tokens) and the
// LLaMA-7B FFN's (16384 tokens x 11008, issue 20's target: >= 2.5 TB/s).
// scripts/ab_mvue_compress.sh builds and runs it.
#include "compress_kernels.cu"
#include "ab_common.cuh"


using namespace jax_sparse24::compress;

int main() {
  const int64_t shapes[][2] = {{16384, 11008}, {16384, 4096}, {8192, 5120}, {8192, 3072}, {8192, 1280}, {8192, 768}};
  int sms = 0; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaStream_t st; CK(cudaStreamCreate(&st));
  for (auto& sh : shapes) {
    const int64_t R = sh[0], C = sh[1];
    const int nsets = 3;
    __nv_bfloat16* x[nsets];
    uint32_t* key;
    if (MakeInputs(R * C, nsets, x, &key)) return 1;
    const int64_t m64 = (C + 63) / 64 * 64, kb = (R + 127) / 128;
    const int64_t vbytes = C * (R / 2) * 2, mbytes = kb * m64 * 16;
    void* tv; uint8_t* tm; CK(cudaMalloc(&tv, vbytes)); CK(cudaMalloc(&tm, mbytes));
    TileParams p{};
    p.rows = R; p.cols = C; p.key = key; p.nkw = 2; p.t_values = tv; p.t_meta = tm; p.t_meta_rows = m64; p.lt = false;
    CK(cudaMemset(tv, 0xFF, vbytes)); CK(cudaMemset(tm, 0xFF, mbytes));  // poisoned
    p.x = x[0];
    SetTiles(p);  // the tile grid (the handlers fill it in Validate; Launch only launches)
    if (!Launch<__nv_bfloat16, Op::kMvue, false, true>(st, sms, p).success()) { printf("launch failed\n"); return 1; }
    CK(cudaStreamSynchronize(st));
    std::vector<uint8_t> hv(vbytes), hm(mbytes);
    CK(cudaMemcpy(hv.data(), tv, vbytes, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(hm.data(), tm, mbytes, cudaMemcpyDeviceToHost));
    if (std::all_of(hm.begin(), hm.end(), [](uint8_t b) { return b == 0xFF; })) {
      printf("R=%lld C=%lld: the metadata is still the poison: the kernel wrote nothing\n", (long long)R, (long long)C);
      return 1;
    }
    const double bytes = double(R * C * 2 + vbytes + mbytes);
    if (TimeAndReport(st, R, C, bytes, HashBytes({&hv, &hm}), [&](int it) {
          p.x = x[it % nsets];
          return Launch<__nv_bfloat16, Op::kMvue, false, true>(st, sms, p).success();
        }))
      return 1;
    for (int s = 0; s < nsets; ++s) cudaFree(x[s]);
    cudaFree(key); cudaFree(tv); cudaFree(tm);
  }
  return 0;
}
