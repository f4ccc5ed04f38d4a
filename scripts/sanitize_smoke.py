"""Run every CUDA kernel once on small inputs (for compute-sanitizer memcheck/racecheck)."""

import jax
import jax.numpy as jnp
import numpy as np

import jax_sparse24 as s24
from jax_sparse24._src import ffi

assert ffi.cuda_kernels_available(), ffi.extension_error() or "no GPU visible"
rng = np.random.default_rng(0)
for dtype in (jnp.float32, jnp.bfloat16, jnp.float16):
    x = jnp.asarray(rng.normal(size=(64, 96)), dtype)
    outs = [
        s24.mask24(x), s24.mask24(x, axis=0), s24.transposable_mask24(x),
        *s24.soft_threshold24(x), s24.mvue24(jax.random.key(0), x, axis=0),
    ]
    jax.block_until_ready(outs)
for dtype in (jnp.bfloat16, jnp.float16):
    w = jnp.asarray(rng.normal(size=(256, 256)), dtype)
    x = jnp.asarray(rng.normal(size=(128, 256)), dtype)
    m = s24.transposable_mask24(w)
    y, grads = jax.value_and_grad(
        lambda x, w: s24.sparse24_linear(x, w, m, backend="cutlass", key=jax.random.key(1)).astype(jnp.float32).sum(),
        argnums=(0, 1))(x, w)
    jax.block_until_ready(grads)
# Fused compressors (every op and direction) and the cuSPARSELt backend (when its library loads).
from jax_sparse24._src import cuda_compress_ops as cc  # noqa: E402
from jax_sparse24._src import cuda_cusparselt_ops as lt  # noqa: E402

for dtype in (jnp.bfloat16, jnp.float16):
    w = jnp.asarray(rng.normal(size=(144, 272)), dtype)  # partial 128 x 128 tiles, metadata padding
    m = s24.transposable_mask24(w)
    outs = [cc.prune24_compress(w), cc.prune24_compress(w, transposed=True), cc.masked_compress(w, m),
            cc.masked_compress_both(w, m), cc.mvue24_compress(jax.random.key(2), w),
            cc.mvue24_compress(jax.random.key(2), w, transposed=False),
            cc.soft_threshold24_compress(w, jnp.float32(1.3), transposed=True)]
    jax.block_until_ready(outs)
    if lt.cusparselt_available():
        x = jnp.asarray(rng.normal(size=(128, 256)), dtype)
        w = jnp.asarray(rng.normal(size=(256, 256)), dtype)
        m = s24.transposable_mask24(w)
        y, grads = jax.value_and_grad(
            lambda x, w: s24.sparse24_linear(x, w, m, backend="cusparselt", key=jax.random.key(1)).astype(
                jnp.float32).sum(), argnums=(0, 1))(x, w)
        jax.block_until_ready(grads)
print("sanitize smoke: ok")
