"""Fused 2:4 compressors (CUDA only): one pass over a dense array, CUTLASS SM90 compressed output.

Each function reads a dense ``(R, C)`` bfloat16/float16 array once and writes the compressed
``(values, meta)`` of the sparse GEMM's A operand (the layout of
:func:`jax_sparse24._src.cuda_spmm_ops.cutlass_compress`, read by
:func:`~jax_sparse24._src.cuda_spmm_ops.cutlass_spmm`):

* ``transposed=False``: ``A = op(x)`` (M = R, K = C; groups of 4 along x's axis 1);
* ``transposed=True``:  ``A = op(x).T`` (M = C, K = R; groups of 4 along x's axis 0), read in x's
  natural layout — e.g. ``W (I, O) -> W̃ᵀ`` for the forward GEMM, ``∇y (T, O) -> MVUE(∇y)ᵀ`` for
  the weight gradient. No transpose is materialised.

Every result is bit-identical to ``cutlass_compress`` of the dense op result (rounded to x's
dtype), e.g. ``mvue24_compress(key, g, transposed=True) == cutlass_compress(mvue24_cuda(key, g,
axis=0).T)`` (same Philox draws as the element-wise MVUE kernel).

* :func:`prune24_compress`          magnitude 2:4 prune (``mask24``, ties to the lower index);
* :func:`masked_compress`           ``x * mask`` (mask 2:4 along the compressed axis);
* :func:`masked_compress_both`      ``x * mask`` compressed as both ``A = (x*mask).T`` and
  ``A = x*mask`` in one pass (transposable mask: the forward and input-gradient operands of W);
* :func:`mvue24_compress`           unbiased MVUE 2:4 sample;
* :func:`soft_threshold24_compress` ``β · soft_threshold24(x)`` (S-STE), β a float32 scalar array.

Shape rules (ValueError at trace time, checked again by the handlers): R and C multiples of 8, the
compressed K (C, or R when transposed) a multiple of 16. These functions lower only on CUDA; callers
select them with ``lax.platform_dependent`` (:func:`jax_sparse24._src.ffi.per_platform`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jax_sparse24._src import cuda_spmm_ops as _spmm
from jax_sparse24._src import ffi as _ffi

__all__ = [
    "compress_supports",
    "masked_compress",
    "masked_compress_both",
    "mvue24_compress",
    "prune24_compress",
    "soft_threshold24_compress",
]

_T_PRUNE = "jax_sparse24_prune24_compress"
_T_MASK = "jax_sparse24_masked_compress"
_T_MASK_BOTH = "jax_sparse24_masked_compress_both"
_T_MVUE = "jax_sparse24_mvue24_compress"
_T_SOFT = "jax_sparse24_soft_threshold24_compress"


def _operand_shape(shape, transposed: bool) -> tuple[int, int]:
    r, c = shape
    return (c, r) if transposed else (r, c)


def _reason(x, transposed: bool) -> str | None:
    shape = tuple(int(s) for s in np.shape(x))
    dtype = jnp.result_type(x)
    if len(shape) != 2:
        return f"x must be 2-D (rows, cols), got shape {shape}"
    if dtype not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return f"x must be bfloat16 or float16, got {dtype}"
    r, c = shape
    if r % 8 or c % 8:
        return f"x's rows and cols must be multiples of 8, got shape {shape}"
    m, k = _operand_shape(shape, transposed)
    try:
        _spmm.cutlass_compressed_shapes(m, k, dtype)
    except ValueError as e:
        return f"the compressed operand A = {'x.T' if transposed else 'x'} (m={m}, k={k}): {e}"
    return None


def compress_supports(x, *, transposed: bool = False) -> bool:
    """True when the extension is built and the fused compressors handle ``x`` (shape, dtype)."""
    if _ffi.extension() is None:
        return False
    return _reason(x, transposed) is None


def _out_types(x, transposed: bool):
    m, k = _operand_shape(np.shape(x), transposed)
    values_shape, meta_shape = _spmm.cutlass_compressed_shapes(m, k, jnp.result_type(x))
    return (jax.ShapeDtypeStruct(values_shape, jnp.result_type(x)), jax.ShapeDtypeStruct(meta_shape, jnp.uint8))


def _check(x, transposed: bool, op: str):
    reason = _reason(x, transposed)
    if reason is not None:
        raise ValueError(f"{op}: {reason}")
    return jnp.asarray(x)


def _check_mask(mask, x, op: str):
    if tuple(np.shape(mask)) != tuple(np.shape(x)):
        raise ValueError(f"{op}: mask must have x's shape {tuple(np.shape(x))}, got {tuple(np.shape(mask))}")
    mask = jnp.asarray(mask)
    if mask.dtype != jnp.bool_:
        mask = mask != 0
    return mask


def prune24_compress(x, *, transposed: bool = False):
    """Compress ``x * mask24(x)`` (2:4 magnitude prune along the compressed K axis) in one pass.

    Args:
      x: (R, C) bfloat16/float16.
      transposed: compress ``A = pruned(x).T`` (groups along axis 0) instead of ``A = pruned(x)``.

    Returns:
      ``(values, meta)`` of A (:func:`~jax_sparse24._src.cuda_spmm_ops.cutlass_compressed_shapes`).
    """
    x = _check(x, transposed, "prune24_compress")
    return tuple(_ffi.ffi_call(_T_PRUNE, _out_types(x, transposed), x, transposed=np.int64(bool(transposed))))


def masked_compress(x, mask, *, transposed: bool = False):
    """Compress ``x * mask`` (``mask`` 2:4 along the compressed axis) in one pass over ``x`` and ``mask``.

    A group with more than two kept elements keeps its first two (not a 2:4 mask: undefined math).
    """
    op = "masked_compress"
    x = _check(x, transposed, op)
    mask = _check_mask(mask, x, op)
    return tuple(_ffi.ffi_call(_T_MASK, _out_types(x, transposed), x, mask, transposed=np.int64(bool(transposed))))


def masked_compress_both(x, mask):
    """Compress ``x * mask`` as both ``A = (x*mask).T`` and ``A = x*mask``, reading ``x`` once.

    For a weight ``W (I, O)`` with a transposable mask: the first pair is the forward GEMM's operand
    ``W̃ᵀ`` (M = O, K = I), the second the input-gradient GEMM's ``W̃`` (M = I, K = O).

    Returns:
      ``((values_t, meta_t), (values, meta))``.
    """
    op = "masked_compress_both"
    for transposed in (True, False):
        _check(x, transposed, op)
    x = jnp.asarray(x)
    mask = _check_mask(mask, x, op)
    out_types = _out_types(x, True) + _out_types(x, False)
    vt, mt, vd, md = _ffi.ffi_call(_T_MASK_BOTH, out_types, x, mask)
    return (vt, mt), (vd, md)


def mvue24_compress(key, x, *, transposed: bool = True):
    """Unbiased MVUE 2:4 of ``x`` (groups along the compressed axis) compressed in one pass.

    Same Philox stream and group numbering as ``mvue24_cuda(key, x, axis=0 if transposed else 1)``,
    so ``mvue24_compress(key, g) == cutlass_compress(mvue24_cuda(key, g, axis=0).T)`` bit for bit.

    Args:
      key: a single PRNG key (typed or raw uint32 key data).
      x: (R, C) bfloat16/float16, e.g. ``∇y (T, O)``.
      transposed: True (default): ``A = MVUE(x).T`` (M = C, K = R: groups along x's rows, the token
        axis of ``∇y``); False: ``A = MVUE(x)`` (groups along x's columns).
    """
    from jax_sparse24._src import cuda_mask_ops

    op = "mvue24_compress"
    x = _check(x, transposed, op)
    try:
        words = cuda_mask_ops._key_words(key)
    except ValueError as e:
        raise ValueError(str(e).replace("mvue24_cuda", op)) from None
    return tuple(_ffi.ffi_call(_T_MVUE, _out_types(x, transposed), words, x, transposed=np.int64(bool(transposed))))


def soft_threshold24_compress(x, beta, *, transposed: bool = False):
    """Compress ``β · soft_threshold24(x)`` (S-STE) in one pass.

    Bit-identical to compressing ``(beta * soft_threshold24(x)[0].astype(float32)).astype(x.dtype)``
    (the S-STE layer's weight): the soft threshold is rounded to x's dtype before the scale.

    Args:
      x: (R, C) bfloat16/float16 weight.
      beta: float32 scalar (array; read on the device).
      transposed: groups along axis 0 (``A = (β·S(x)).T``, e.g. W (I, O) -> forward operand).
    """
    op = "soft_threshold24_compress"
    x = _check(x, transposed, op)
    if np.size(beta) != 1:
        raise ValueError(f"{op}: beta must be a scalar, got shape {tuple(np.shape(beta))}")
    beta = jnp.asarray(beta, jnp.float32).reshape(())
    return tuple(_ffi.ffi_call(_T_SOFT, _out_types(x, transposed), x, beta, transposed=np.int64(bool(transposed))))
