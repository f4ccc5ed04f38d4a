// A/B timing of the fused fp8 MVUE compressor (Sparse24Fp8Mvue24Compress: dy (R, C) bf16 ->
// q(MVUE(dy))^T, e4m3 values + metadata in CUTLASS's fp8 layout) without JAX or a full build, as
// ab_mvue_compress.cu does for the 16-bit one: compiles xla_ffi/fp8_compress_kernels.cu from the
// directory on the include path, so variants can be timed side by side in one run. Prints, per
// shape, the median of 60 launches over 3 inputs (larger than L2 together; each one too from 16384
// rows), the effective TB/s (dense bytes read + compressed bytes written) and a hash of the outputs
// (poisoned before the run; a poisoned byte left is an error): equal across variants that draw and
// quantize the same samples. Shapes: the weight-gradient operands of the LLaMA-7B step (16384 tokens
// x qkv 12288, o / down 4096, gate+up 22016), GPT-2's (8192 x 3072, 768) and 8224 x 776 (neither a
// multiple of 128: the layout's padding rows and columns). Run through scripts/ab_mvue_compress.sh
// with AB_HARNESS=scripts/ab_fp8_mvue_compress.cu.
#include "fp8_compress_kernels.cu"
#include "ab_common.cuh"


using namespace jax_sparse24::fp8;

int main() {
  const int64_t shapes[][2] = {{16384, 22016}, {16384, 12288}, {16384, 4096}, {8192, 3072}, {8192, 768}, {8224, 776}};
  cudaStream_t st; CK(cudaStreamCreate(&st));
  for (auto& sh : shapes) {
    const int64_t R = sh[0], C = sh[1];
    const int nsets = 3;
    __nv_bfloat16* x[nsets];
    uint32_t* key;
    if (MakeInputs(R * C, nsets, x, &key)) return 1;
    float* scale; CK(cudaMalloc(&scale, 4)); const float hs = 0.01f; CK(cudaMemcpy(scale, &hs, 4, cudaMemcpyHostToDevice));
    Operand o;  // A = q(MVUE(g))^T: M = C, K = R (the handler's CheckOperand, by hand)
    o.R = R; o.C = C; o.M = C; o.K = R; o.m_al = (C + 63) / 64 * 64; o.k_al = (R + 127) / 128 * 128;
    const int64_t vbytes = o.M * (o.K / 2), mbytes = o.m_al * (o.k_al / 8);
    CK(cudaMalloc(&o.values, vbytes)); CK(cudaMalloc(&o.meta, mbytes)); o.scale = scale;
    CK(cudaMemset(o.values, 0xFF, vbytes)); CK(cudaMemset(o.meta, 0xFF, mbytes));  // poisoned
    if (!LaunchMvue<__nv_bfloat16>(st, key, 2, x[0], o).success()) { printf("launch failed\n"); return 1; }
    CK(cudaStreamSynchronize(st));
    std::vector<uint8_t> hv(vbytes), hm(mbytes);
    CK(cudaMemcpy(hv.data(), o.values, vbytes, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(hm.data(), o.meta, mbytes, cudaMemcpyDeviceToHost));
    // 0xFF is neither a metadata byte (nibble 0xF never occurs) nor a value (saturating e4m3 has no NaN
    // output): any left means a byte the kernel did not write.
    const auto poison = [](uint8_t b) { return b == 0xFF; };
    if (std::any_of(hm.begin(), hm.end(), poison) || std::any_of(hv.begin(), hv.end(), poison)) {
      printf("R=%lld C=%lld: poisoned bytes left: the kernel did not write its whole output\n", (long long)R,
             (long long)C);
      return 1;
    }
    const double bytes = double(R * C * 2 + vbytes + mbytes);
    if (TimeAndReport(st, R, C, bytes, HashBytes({&hv, &hm}), [&](int it) {
          return LaunchMvue<__nv_bfloat16>(st, key, 2, x[it % nsets], o).success();
        }))
      return 1;
    for (int s = 0; s < nsets; ++s) cudaFree(x[s]);
    cudaFree(key); cudaFree(scale); cudaFree(o.values); cudaFree(o.meta);
  }
  return 0;
}
