"""Run the fused compressors once each at GPT FFN shapes (d = 1280), for Nsight Compute:

    ncu --kernel-name regex:CompressTile --set full python scripts/profile_compress.py
"""

import jax
import jax.numpy as jnp

import jax_sparse24 as s24
from jax_sparse24._src import cuda_compress_ops as cc

w = jax.random.normal(jax.random.key(0), (1280, 5120), jnp.float32).astype(jnp.bfloat16)
g = jax.random.normal(jax.random.key(1), (8192, 5120), jnp.float32).astype(jnp.bfloat16)
m = s24.transposable_mask24(w)
jax.block_until_ready((w, g, m))
for f in (lambda: cc.masked_compress(w, m, transposed=True), lambda: cc.masked_compress(w, m, transposed=False),
          lambda: cc.mvue24_compress(jax.random.key(2), g)):
    jax.block_until_ready(f())
print("profile_compress: ok")
