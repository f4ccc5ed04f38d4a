// Fused fp8 quantize + 2:4 mask + compress: read a dense (R, C) bf16/fp16/fp32 array and its mask
// once and write the CUTLASS SM90 compressed fp8 (e4m3) operand of the fp8 sparse GEMM
// (spmm_cutlass_fp8.cu): values + metadata.
//
//   Sparse24Fp8MaskCompress: x (R, C), mask (R, C) bool, scale () f32 -> values (M, K/2) e4m3, meta u8
//                            attr transposed: A = x^T (M = C, K = R) if true, else A = x (M = R, K = C).
//
// Math (the reference is jax_sparse24/_src/fp8.py): q = e4m3(saturate(x * (1 / scale))) where mask is
// set, else 0, rounded to nearest even; 1 / scale is the correctly rounded float32 reciprocal. The
// output equals CUTLASS's compressor (+ the all-zero-group fix-up, spmm_cutlass.cu) applied to the
// dense quantized A: the GPU tests check it bit for bit.
//
// Layout of the fp8 operand (Sm90GemmSparseConfig with 8-bit A, tile K >= 128; checked against CuTe's
// fill_layoutE): values row-major (M, K/2), the two kept bytes of each group of 4 in order; metadata
// one nibble per group (low nibble: the even group of a byte), M padded to 64 rows and K to 128
// columns, in blocks of 128 columns: byte (m, k) at (k / 128) * M_al * 16 + m * 16 + (k % 128) / 8.
// Padding is written as all-zero groups (nibble 0x4).
//
// Kernel: one CTA (256 threads) per 64 (m) x 128 (k) tile of A; each thread owns 8 consecutive k of
// one row m (one metadata byte, 4 value bytes) four times. Direct (A = x): the thread loads its 8
// elements with 16-byte loads and compresses them from registers. Transposed (A = x^T): the tile of x
// (128 rows x 64 columns) is loaded row-wise (16-byte loads along x's rows), quantized, and staged as
// bytes in shared memory (row pitch 65 bytes: the column reads of the second phase hit distinct banks).
// Command-buffer compatible: no allocation, no synchronisation; the scale is read on the device.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "compress_layout.h"
#include "ffi_common.h"
#include "spmm_cutlass.h"

namespace jax_sparse24 {
namespace fp8 {
namespace {

constexpr int kThreads = 256;
constexpr int kTileM = 64;
constexpr int kTileK = 128;
constexpr int kPitch = kTileM + 1;  // bytes per staged x row (transposed path)

template <typename T>
struct Load8;  // 8 consecutive elements -> float[8]

template <>
struct Load8<float> {
  static __device__ __forceinline__ void Run(const float* p, float* v) {
    const float4 a = reinterpret_cast<const float4*>(p)[0];
    const float4 b = reinterpret_cast<const float4*>(p)[1];
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
    v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
  }
};

template <>
struct Load8<__nv_bfloat16> {
  static __device__ __forceinline__ void Run(const __nv_bfloat16* p, float* v) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __bfloat1622float2(h[i]);
      v[2 * i] = f.x;
      v[2 * i + 1] = f.y;
    }
  }
};

template <>
struct Load8<__half> {
  static __device__ __forceinline__ void Run(const __half* p, float* v) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const __half2* h = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __half22float2(h[i]);
      v[2 * i] = f.x;
      v[2 * i + 1] = f.y;
    }
  }
};

template <typename T>
__device__ __forceinline__ float ToFloat(T v);
template <>
__device__ __forceinline__ float ToFloat<float>(float v) { return v; }
template <>
__device__ __forceinline__ float ToFloat<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <>
__device__ __forceinline__ float ToFloat<__half>(__half v) { return __half2float(v); }

__device__ __forceinline__ uint8_t Quantize(float v, float inv) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v * inv, __NV_SATFINITE, __NV_E4M3));
}

__device__ __forceinline__ bool Nonzero(uint32_t b) { return (b & 0x7Fu) != 0; }  // +-0 count as zero

// One group of 4 quantized bytes (b0 lowest) -> nibble, and the two stored bytes (slot 0 low).
__device__ __forceinline__ uint32_t CompressGroup(uint32_t g, uint32_t* vals) {
  uint32_t p = 0;
#pragma unroll
  for (int e = 0; e < 4; ++e) p |= uint32_t(Nonzero((g >> (8 * e)) & 0xFFu)) << e;
  const uint32_t nib = uint32_t(compress::kNibbleTable >> (4 * p)) & 0xFu;
  const uint32_t i0 = nib & 3u, i1 = nib >> 2;
  const uint32_t v0 = ((p >> i0) & 1u) ? ((g >> (8 * i0)) & 0xFFu) : 0u;
  const uint32_t v1 = ((p >> i1) & 1u) ? ((g >> (8 * i1)) & 0xFFu) : 0u;
  *vals = v0 | (v1 << 8);
  return nib;
}

// 8 quantized bytes along k (lo: k..k+3, hi: k+4..k+7) -> 4 value bytes and the metadata byte.
__device__ __forceinline__ void CompressChunk(uint32_t lo, uint32_t hi, uint32_t* values4, uint8_t* meta) {
  uint32_t v_lo, v_hi;
  const uint32_t n_lo = CompressGroup(lo, &v_lo);
  const uint32_t n_hi = CompressGroup(hi, &v_hi);
  *values4 = v_lo | (v_hi << 16);
  *meta = static_cast<uint8_t>(n_lo | (n_hi << 4));
}

__device__ __forceinline__ int64_t MetaOffset(int64_t m, int64_t k, int64_t m_al) {
  return (k >> 7) * m_al * 16 + m * 16 + ((k & 127) >> 3);
}

template <typename T, bool TRANS>
__global__ void __launch_bounds__(kThreads) Fp8MaskCompressKernel(const T* __restrict__ x,
                                                                  const bool* __restrict__ mask,
                                                                  const float* __restrict__ scale, int64_t R,
                                                                  int64_t C, uint8_t* __restrict__ values,
                                                                  uint8_t* __restrict__ meta, int64_t M, int64_t K,
                                                                  int64_t m_al) {
  __shared__ uint8_t staged[TRANS ? kTileK * kPitch : 1];
  const float inv = 1.0f / __ldg(scale);
  const int64_t m0 = int64_t(blockIdx.x) * kTileM;
  const int64_t k0 = int64_t(blockIdx.y) * kTileK;
  const int t = threadIdx.x;
  const int c = t & 15;  // chunk of 8 along k
  const int r = t >> 4;  // row within a pass of 16 rows

  if constexpr (TRANS) {
    // x rows k0 .. k0+127, columns m0 .. m0+63: 8 chunks of 8 columns per row, 1024 chunks.
#pragma unroll
    for (int pass = 0; pass < 4; ++pass) {
      const int idx = pass * kThreads + t;
      const int row = idx >> 3, col = (idx & 7) * 8;
      const int64_t gr = k0 + row, gc = m0 + col;
      float v[8];
      bool keep[8];
      if (gr < R && gc + 8 <= C) {
        Load8<T>::Run(x + gr * C + gc, v);
        const uint2 mk = *reinterpret_cast<const uint2*>(mask + gr * C + gc);
        const uint8_t* mb = reinterpret_cast<const uint8_t*>(&mk);
#pragma unroll
        for (int e = 0; e < 8; ++e) keep[e] = mb[e] != 0;
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const bool in = gr < R && gc + e < C;
          v[e] = in ? ToFloat<T>(x[gr * C + gc + e]) : 0.0f;
          keep[e] = in && mask[gr * C + gc + e];
        }
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) staged[row * kPitch + col + e] = keep[e] ? Quantize(v[e], inv) : uint8_t(0);
    }
    __syncthreads();
  }

#pragma unroll
  for (int pass = 0; pass < 4; ++pass) {
    const int lm = pass * 16 + r;
    const int64_t m = m0 + lm;
    const int64_t k = k0 + 8 * c;
    uint32_t lo = 0, hi = 0;
    if constexpr (TRANS) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        lo |= uint32_t(staged[(8 * c + e) * kPitch + lm]) << (8 * e);
        hi |= uint32_t(staged[(8 * c + 4 + e) * kPitch + lm]) << (8 * e);
      }
    } else if (m < M && k < K) {  // K % 32 == 0: a chunk is entirely inside or outside
      float v[8];
      Load8<T>::Run(x + m * C + k, v);
      const uint2 mk = *reinterpret_cast<const uint2*>(mask + m * C + k);
      const uint8_t* mb = reinterpret_cast<const uint8_t*>(&mk);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        lo |= uint32_t(mb[e] ? Quantize(v[e], inv) : 0) << (8 * e);
        hi |= uint32_t(mb[4 + e] ? Quantize(v[4 + e], inv) : 0) << (8 * e);
      }
    }
    uint32_t vals;
    uint8_t mbyte;
    CompressChunk(lo, hi, &vals, &mbyte);
    if (m < m_al) meta[MetaOffset(m, k, m_al)] = mbyte;  // padding rows / columns too
    if (m < M && k < K) *reinterpret_cast<uint32_t*>(values + m * (K / 2) + k / 2) = vals;
  }
}

const char* Name(ffi::DataType t) {
  if (t == ffi::DataType::F8E4M3FN) return "float8_e4m3fn";
  return DataTypeName(t);
}

template <typename T>
ffi::Error Launch(cudaStream_t stream, bool transposed, const void* x, const bool* mask, const float* scale,
                  int64_t R, int64_t C, uint8_t* values, uint8_t* meta, int64_t M, int64_t K, int64_t m_al,
                  int64_t k_al) {
  const dim3 grid(static_cast<unsigned>(m_al / kTileM), static_cast<unsigned>(k_al / kTileK));
  if (transposed) {
    Fp8MaskCompressKernel<T, true><<<grid, kThreads, 0, stream>>>(static_cast<const T*>(x), mask, scale, R, C, values,
                                                                   meta, M, K, m_al);
  } else {
    Fp8MaskCompressKernel<T, false><<<grid, kThreads, 0, stream>>>(static_cast<const T*>(x), mask, scale, R, C,
                                                                    values, meta, M, K, m_al);
  }
  SP24_CHECK_LAUNCH("Fp8MaskCompressKernel");
  return ffi::Error::Success();
}

ffi::Error Fp8MaskCompressImpl(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer mask, ffi::AnyBuffer scale,
                               ffi::Result<ffi::AnyBuffer> values, ffi::Result<ffi::AnyBuffer> meta, bool transposed) {
  const std::string op = "fp8_masked_compress";
  const ffi::DataType xt = x.element_type();
  if (xt != ffi::DataType::BF16 && xt != ffi::DataType::F16 && xt != ffi::DataType::F32) {
    return InvalidArgument(op + ": x must be bfloat16, float16 or float32, got " + Name(xt));
  }
  if (mask.element_type() != ffi::DataType::PRED) {
    return InvalidArgument(op + ": mask must be bool, got " + Name(mask.element_type()));
  }
  if (scale.element_type() != ffi::DataType::F32 || scale.element_count() != 1) {
    return InvalidArgument(op + ": scale must be one float32, got " + Name(scale.element_type()) + " of shape " +
                           DimsString(scale.dimensions()));
  }
  if (values->element_type() != ffi::DataType::F8E4M3FN || meta->element_type() != ffi::DataType::U8) {
    return InvalidArgument(op + ": values must be float8_e4m3fn and meta uint8, got " +
                           Name(values->element_type()) + " and " + Name(meta->element_type()));
  }
  const auto dims = x.dimensions();
  if (dims.size() != 2) return InvalidArgument(op + ": x must be 2-D, got shape " + DimsString(dims));
  const auto mdims = mask.dimensions();
  if (mdims.size() != 2 || mdims[0] != dims[0] || mdims[1] != dims[1]) {
    return InvalidArgument(op + ": mask must have x's shape " + DimsString(dims) + ", got " + DimsString(mdims));
  }
  const int64_t R = dims[0], C = dims[1];
  const int64_t M = transposed ? C : R, K = transposed ? R : C;
  CompressedShapes s;
  std::string error;
  if (!CutlassCompressedShapes(M, K, 2, &s, &error)) return InvalidArgument(op + ": " + error);
  if (!Is2D(values->dimensions(), s.values_rows, s.values_cols)) {
    return InvalidArgument(op + ": values must have shape " + Shape2(s.values_rows, s.values_cols) + ", got " +
                           DimsString(values->dimensions()));
  }
  if (!Is2D(meta->dimensions(), s.meta_rows, s.meta_cols)) {
    return InvalidArgument(op + ": meta must have shape " + Shape2(s.meta_rows, s.meta_cols) + ", got " +
                           DimsString(meta->dimensions()));
  }
  // The kernel's closed-form layout: values exactly (M, K/2), metadata (round_up(M, 64), round_up(K, 128) / 8).
  const int64_t m_al = (M + kTileM - 1) / kTileM * kTileM, k_al = (K + kTileK - 1) / kTileK * kTileK;
  if (s.values_rows != M || s.values_cols != K / 2 || s.meta_rows != m_al || s.meta_cols != k_al / 8) {
    return Internal(op + ": CUTLASS's fp8 compressed shapes differ from the kernel's layout");
  }
  if (m_al / kTileM > 0x7FFFFFFF || k_al / kTileK > 65535) {
    return InvalidArgument(op + ": operand too large for the kernel's grid: M=" + std::to_string(M) +
                           " K=" + std::to_string(K));
  }
  const uintptr_t align = reinterpret_cast<uintptr_t>(x.untyped_data()) | reinterpret_cast<uintptr_t>(mask.untyped_data()) |
                          reinterpret_cast<uintptr_t>(values->untyped_data()) |
                          reinterpret_cast<uintptr_t>(meta->untyped_data());
  if (align & 15u) return InvalidArgument(op + ": buffers must be 16-byte aligned");
  // 16-byte row loads: rows of x must keep 16-byte alignment (C % 8 elements; 8-byte mask loads).
  if (C % 8) return InvalidArgument(op + ": x's last axis must be a multiple of 8, got " + std::to_string(C));
  const bool* mp = static_cast<const bool*>(mask.untyped_data());
  const float* sp = static_cast<const float*>(scale.untyped_data());
  uint8_t* vp = static_cast<uint8_t*>(values->untyped_data());
  uint8_t* meta_p = static_cast<uint8_t*>(meta->untyped_data());
  if (xt == ffi::DataType::BF16) {
    return Launch<__nv_bfloat16>(stream, transposed, x.untyped_data(), mp, sp, R, C, vp, meta_p, M, K, m_al, k_al);
  }
  if (xt == ffi::DataType::F16) {
    return Launch<__half>(stream, transposed, x.untyped_data(), mp, sp, R, C, vp, meta_p, M, K, m_al, k_al);
  }
  return Launch<float>(stream, transposed, x.untyped_data(), mp, sp, R, C, vp, meta_p, M, K, m_al, k_al);
}

}  // namespace
}  // namespace fp8
}  // namespace jax_sparse24

XLA_FFI_DEFINE_HANDLER_SYMBOL(Sparse24Fp8MaskCompress, jax_sparse24::fp8::Fp8MaskCompressImpl,
                              ::xla::ffi::Ffi::Bind()
                                  .Ctx<::xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<::xla::ffi::AnyBuffer>()  // x (R, C)
                                  .Arg<::xla::ffi::AnyBuffer>()  // mask (R, C) bool
                                  .Arg<::xla::ffi::AnyBuffer>()  // scale () f32
                                  .Ret<::xla::ffi::AnyBuffer>()  // values (M, K/2) e4m3
                                  .Ret<::xla::ffi::AnyBuffer>()  // meta
                                  .Attr<bool>("transposed"),
                              {::xla::ffi::Traits::kCmdBufferCompatible});
