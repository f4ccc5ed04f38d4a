"""fp8 (float8_e4m3fn) training of 2:4 layers: the quantization math and the fp8 linear ops.

``sparse24_linear(..., fp8=True)``, ``nn.Sparse24Dense(fp8=True)`` and ``nnx.Sparse24Linear(fp8=True)``
run their forward and input-gradient GEMMs in fp8 (docs/fp8.md). This module exposes the single
definition of the math they use (:mod:`jax_sparse24._src.fp8_math`), for tests, custom layers and
debugging:

* :data:`FP8_DTYPE` (float8_e4m3fn), :data:`FP8_MAX` (448);
* :func:`current_scale` (``amax/448``; 1 for an all-zero or non-finite tensor), :func:`scale_from_amax`,
  :func:`amax`;
* :func:`quantize` / :func:`dequantize`;
* :func:`scaled_matmul`: the fp8 GEMM (float32 accumulation, scales applied to the accumulator,
  bfloat16 result);
* :func:`fp8_dense_linear`: a dense layer with the same fp8 GEMMs (the dense phase of an fp8 layer);
* delayed scaling (``Sparse24Dense(fp8=True, fp8_scaling="delayed")``, ``sparse24_linear(fp8_meta=)``):
  :data:`META_COLLECTION` / :data:`META_NAMES` (Flax's overwrite-with-gradient state), :func:`init_meta`,
  :func:`delayed_scale`, :func:`update_amax_history` and :func:`combine_meta` (two updates of one
  state, e.g. from gradient-accumulation micro-batches: their maximum, never their sum).
"""

from jax_sparse24._src.fp8_math import (FP8_DTYPE, FP8_MAX, GEMM_OUT_DTYPE, META_COLLECTION, META_NAMES, SCALINGS, amax,
                                   combine_meta, current_scale, delayed_scale, dequantize, init_meta, keep_unupdated,
                                   quantize, scale_from_amax, scaled_matmul, update_amax_history)
from jax_sparse24._src.linear import fp8_dense_linear

__all__ = ["FP8_DTYPE", "FP8_MAX", "GEMM_OUT_DTYPE", "META_COLLECTION", "META_NAMES", "SCALINGS", "amax",
           "combine_meta", "current_scale", "delayed_scale", "dequantize", "fp8_dense_linear", "init_meta",
           "keep_unupdated", "quantize",
           "scale_from_amax", "scaled_matmul", "update_amax_history"]
