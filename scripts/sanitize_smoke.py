"""Run every CUDA kernel once on small inputs, for compute-sanitizer (memcheck, racecheck).

    python scripts/sanitize_smoke.py [CASE ...]     (default: every case; --list prints them)

Each case is one family of kernels, so a sanitizer run per case names the family that fails.
"""

import sys

import jax
import jax.numpy as jnp
import numpy as np

import jax_sparse24 as s24
from jax_sparse24._src import cuda_compress_ops as cc
from jax_sparse24._src import cuda_cusparselt_ops as lt
from jax_sparse24._src import ffi

rng = np.random.default_rng(0)


def masks():
    for dtype in (jnp.float32, jnp.bfloat16, jnp.float16):
        x = jnp.asarray(rng.normal(size=(64, 96)), dtype)
        jax.block_until_ready([s24.mask24(x, axis=-1), s24.mask24(x, axis=0), s24.transposable_mask24(x),
                               *s24.soft_threshold24(x, axis=-1)])


def mvue():
    for dtype in (jnp.float32, jnp.bfloat16, jnp.float16):
        x = jnp.asarray(rng.normal(size=(64, 96)), dtype)
        jax.block_until_ready([s24.mvue24(jax.random.key(0), x, axis=0), s24.mvue24(jax.random.key(0), x)])


def compress():
    """Fused compressors, every op and direction; partial 128 x 128 tiles and metadata padding."""
    for dtype in (jnp.bfloat16, jnp.float16):
        w = jnp.asarray(rng.normal(size=(144, 272)), dtype)
        m = s24.transposable_mask24(w)
        jax.block_until_ready([
            cc.masked_compress(w, m), cc.masked_compress(w, m, transposed=True),
            cc.masked_compress_both(w, m), cc.mvue24_compress(jax.random.key(2), w),
            cc.mvue24_compress(jax.random.key(2), w, transposed=False)])


def _linear(backend):
    for dtype in (jnp.bfloat16, jnp.float16):
        x = jnp.asarray(rng.normal(size=(128, 256)), dtype)
        w = jnp.asarray(rng.normal(size=(256, 256)), dtype)
        m = s24.transposable_mask24(w)
        f = lambda x, w: s24.sparse24_linear(x, w, m, backend=backend, key=jax.random.key(1)).astype(  # noqa: E731
            jnp.float32).sum()
        jax.block_until_ready(jax.jit(jax.value_and_grad(f, argnums=(0, 1)))(x, w))


def cutlass_linear():
    """Forward, input and weight gradient through CUTLASS (compressors + sparse GEMMs)."""
    _linear("cutlass")


def cutlass_configs():
    """Every compiled sparse-GEMM configuration (incl. stream-K, which uses a workspace), bf16,
    with a partial tile in M and N."""
    from jax_sparse24._src import cuda_spmm_ops as cs

    w = jnp.asarray(rng.normal(size=(256, 200)), jnp.bfloat16)  # (I, O): A = W~^T is (200, 256)
    x = jnp.asarray(rng.normal(size=(136, 256)), jnp.bfloat16)
    values, meta = cc.masked_compress(w, s24.mask24(w, axis=0), transposed=True)
    for config in range(len(cs.cutlass_configs())):
        jax.block_until_ready(cs.cutlass_spmm(values, meta, x, m=200, k=256, config=config))


def cusparselt_linear():
    if not lt.cusparselt_available():
        print("cuSPARSELt not loadable; case skipped")
        return
    _linear("cusparselt")


CASES = {f.__name__: f for f in (masks, mvue, compress, cutlass_linear, cutlass_configs, cusparselt_linear)}

if __name__ == "__main__":
    if "--list" in sys.argv:
        print(" ".join(CASES))
        sys.exit(0)
    assert ffi.cuda_kernels_available(), ffi.extension_error() or "no GPU visible"
    for name in sys.argv[1:] or CASES:
        print(f"case {name}", flush=True)
        CASES[name]()
    print("sanitize smoke: ok")
