"""Thin wrappers around the element-wise 2:4 CUDA kernels (``xla_ffi/mask_kernels.cu``).

No dispatch logic lives here: ``ops.py`` calls these inside ``lax.platform_dependent`` so they
are only ever lowered on CUDA. Each wrapper views its input as ``(outer, L, inner)`` with a
reshape (never a transpose): ``outer = prod(shape[:axis])``, ``L = shape[axis]``,
``inner = prod(shape[axis + 1:])``; groups are 4 consecutive elements along ``L``.

vmap: every target is registered with ``vmap_method="broadcast_all"``; the handlers fold extra
leading (batch) dimensions into ``outer`` (into the rows for the transposable mask), and the
MVUE handler pairs a batch of keys ``(B, n)`` with ``x`` of shape ``(B, outer, L, inner)`` so that
``vmap(mvue24_cuda)(keys, x)[b] == mvue24_cuda(keys[b], x[b])`` bit for bit.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from jax_sparse24._src import ffi

__all__ = [
    "KERNEL_DTYPES",
    "dtype_supported",
    "mask24_cuda",
    "soft_threshold24_cuda",
    "transposable_mask24_cuda",
    "mvue24_cuda",
]

#: Element dtypes the kernels accept.
KERNEL_DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)

_TARGET_MASK24 = "jax_sparse24_mask24"
_TARGET_SOFT = "jax_sparse24_soft_threshold24"
_TARGET_TRANSPOSABLE = "jax_sparse24_transposable_mask24"
_TARGET_MVUE = "jax_sparse24_mvue24"


def dtype_supported(dtype) -> bool:
    """The element-wise kernels take ``dtype`` (:data:`KERNEL_DTYPES`); the shape rules are the wrappers' errors."""
    return jnp.dtype(dtype) in [jnp.dtype(d) for d in KERNEL_DTYPES]


def _unsupported_reason(x, axis: int) -> str | None:
    shape = tuple(np.shape(x))
    dtype = jnp.result_type(x)
    if not dtype_supported(dtype):
        return f"x must be float32, bfloat16 or float16, got dtype {dtype} with shape {shape}"
    if len(shape) == 0:
        return "x must have at least 1 dimension, got a scalar"
    if not -len(shape) <= axis < len(shape):
        return f"axis {axis} is out of range for an array of shape {shape}"
    if shape[axis % len(shape)] % 4:
        return (
            f"the size of axis {axis % len(shape)} must be divisible by 4 (groups of 4 consecutive "
            f"elements), got shape {shape}"
        )
    return None


def _transposable_reason(x) -> str | None:
    shape = tuple(np.shape(x))
    dtype = jnp.result_type(x)
    if not dtype_supported(dtype):
        return f"x must be float32, bfloat16 or float16, got dtype {dtype} with shape {shape}"
    if len(shape) != 2:
        return f"x must have rank 2, got shape {shape}"
    if shape[0] % 4 or shape[1] % 4:
        return f"both dims must be divisible by 4 (4x4 blocks), got shape {shape}"
    return None


def _key_words(key):
    """The raw uint32 words of a single PRNG key (typed or raw), as a 1-D array."""
    if jnp.issubdtype(jnp.result_type(key), jax.dtypes.prng_key):
        if np.shape(key) != ():
            raise ValueError(f"mvue24_cuda: expected a single PRNG key, got a key array of shape {np.shape(key)}")
        data = jax.random.key_data(key)
    else:
        data = jnp.asarray(key)
        if data.dtype != jnp.uint32:
            raise ValueError(
                f"mvue24_cuda: a raw key must be uint32 key data (e.g. jax.random.PRNGKey(0)), got dtype "
                f"{data.dtype} with shape {data.shape}"
            )
    data = data.reshape(-1)
    if not 1 <= data.shape[0] <= 4:
        raise ValueError(
            f"mvue24_cuda: a key must have 1 to 4 uint32 words (threefry: 2, rbg: 4), got {data.shape[0]}"
        )
    return data


def _view3(shape, axis: int):
    ndim = len(shape)
    axis = axis % ndim
    return (math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1 :]))


def _check(x, axis: int, op: str):
    reason = _unsupported_reason(x, axis)
    if reason is not None:
        raise ValueError(f"{op}: {reason}")
    x = jnp.asarray(x)
    return x, _view3(x.shape, axis)


def mask24_cuda(x, axis: int = -1):
    """2:4 magnitude mask of ``x`` along ``axis`` (CUDA kernel). Same result as ``reference.mask24``."""
    x, v3 = _check(x, axis, "mask24_cuda")
    mask = ffi.ffi_call(
        _TARGET_MASK24,
        jax.ShapeDtypeStruct(v3, jnp.bool_),
        x.reshape(v3),
        vmap_method="broadcast_all",
    )
    return mask.reshape(x.shape)


def soft_threshold24_cuda(x, axis: int = -1):
    """S-STE soft threshold ``(y, mask)`` of ``x`` along ``axis`` (CUDA kernel)."""
    x, v3 = _check(x, axis, "soft_threshold24_cuda")
    y, mask = ffi.ffi_call(
        _TARGET_SOFT,
        (jax.ShapeDtypeStruct(v3, x.dtype), jax.ShapeDtypeStruct(v3, jnp.bool_)),
        x.reshape(v3),
        vmap_method="broadcast_all",
    )
    return y.reshape(x.shape), mask.reshape(x.shape)


def transposable_mask24_cuda(x):
    """Transposable 2:4 mask of a 2-D ``x`` (CUDA kernel): exact best of the 90 patterns per 4x4 block."""
    reason = _transposable_reason(x)
    if reason is not None:
        raise ValueError(f"transposable_mask24_cuda: {reason}")
    x = jnp.asarray(x)
    # The handler folds leading (vmap) dims into the rows, so a batch of matrices is one launch.
    return ffi.ffi_call(
        _TARGET_TRANSPOSABLE,
        jax.ShapeDtypeStruct(x.shape, jnp.bool_),
        x,
        vmap_method="broadcast_all",
    )


def mvue24_cuda(key, x, axis: int = -1):
    """Unbiased 2:4 MVUE of ``x`` along ``axis`` (CUDA kernel, Philox4x32-7 keyed by ``key``).

    ``key`` is a typed key (``jax.random.key``) or raw uint32 key data (``jax.random.PRNGKey``);
    all of its words key the generator, and the counter is the group's index, so the output is
    reproducible for a key and independent of the launch configuration.
    """
    x, v3 = _check(x, axis, "mvue24_cuda")
    words = _key_words(key)
    out = ffi.ffi_call(
        _TARGET_MVUE,
        jax.ShapeDtypeStruct(v3, x.dtype),
        words,
        x.reshape(v3),
        vmap_method="broadcast_all",
    )
    return out.reshape(x.shape)
