"""Sparse24Array in the CUTLASS layout: to_sparse / todense / matmul on the sparse tensor cores."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_sparse24 as s24
from gpu_util import skip_module_without_kernels

pytestmark = pytest.mark.gpu
skip_module_without_kernels()


def _x(shape, seed, dtype):
    return jnp.asarray(np.random.default_rng(seed).normal(size=shape), dtype)


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / np.linalg.norm(b)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("shape", [(256, 128), (96, 320)])
def test_cutlass_layout_roundtrip_and_matmul(dtype, shape):
    from jax_sparse24._src import cuda_spmm_ops as cs

    if not cs.cutlass_supports(shape[1], 16, shape[0], dtype):
        pytest.skip(f"{jnp.dtype(dtype)} not compiled in this build")
    seed = shape[0] + shape[1]
    w = _x(shape, seed, dtype)  # (in, out), groups along in
    sw = s24.to_sparse(w, axis=0)  # auto -> cutlass on a GPU
    assert sw.layout == "cutlass", sw
    masked = jnp.where(s24.mask24(w, axis=0), w, 0)
    np.testing.assert_array_equal(np.asarray(sw.todense()), np.asarray(masked))
    x = _x((64, shape[0]), seed + 1, dtype)
    b = _x((shape[1],), seed + 2, dtype)
    ref = np.asarray(x, np.float64) @ np.asarray(masked, np.float64) + np.asarray(b, np.float64)
    assert _rel(s24.matmul(x, sw) + b, ref) < 1e-2
    assert _rel(jax.jit(s24.matmul)(x, sw), ref - np.asarray(b, np.float64)) < 1e-2
    # sparse lhs: groups along the contraction (last) axis
    a = _x((shape[1], shape[0]), seed + 3, dtype)
    sa = s24.to_sparse(a)
    assert sa.layout == "cutlass"
    am = np.asarray(jnp.where(s24.mask24(a, axis=-1), a, 0), np.float64)
    assert _rel(s24.matmul(sa, x.T), am @ np.asarray(x, np.float64).T) < 1e-2


def test_portable_layout_still_available():
    w = _x((128, 64), 0, jnp.bfloat16)
    sw = s24.to_sparse(w, axis=0, layout="portable")
    assert sw.layout == "portable"
    np.testing.assert_array_equal(np.asarray(sw.todense()), np.asarray(jnp.where(s24.mask24(w, axis=0), w, 0)))
