"""Public 2:4 ops: one definition (``reference_ops.py``), two lowerings.

Each op validates its arguments at trace time (through the reference's checks), then lowers to
the CUDA kernel on a GPU when the extension is built and the kernel supports the arguments, and
to the reference everywhere else — chosen by ``lax.platform_dependent`` inside
:func:`ffi.per_platform`, never by ``if gpu:`` branches.

Grouping axis: pass ``axis`` explicitly — ``axis=0`` for a Flax ``(in, out)`` kernel, whose 2:4
groups run along ``in`` (the contraction axis of ``x @ kernel``). ``axis=None`` (the default) means
axis 0 of a 1-D array; for an array of rank >= 2 it still groups along the last axis (the old
default) but emits a ``FutureWarning``; a future version will require ``axis``.

NaN, ±inf, ±0, subnormals and ties are handled by one rule in every mask function and CUDA kernel:
a non-finite element ranks above every finite one (NaN above inf) and so is always kept, surfacing a
diverging weight instead of hiding it; ``-0 == +0``; ties go to the lower index. The details per op
are in :mod:`jax_sparse24._src.reference_ops` (module docstring) and docs/special_values.md.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np

from jax_sparse24._src import cuda_mask_ops, ffi, reference_ops, partitioning, validation

__all__ = ["nm_mask", "mask24", "transposable_mask24", "soft_threshold24", "mvue24", "flip_rate"]

def _kernel(name: str, x, **kwargs):
    """``cuda_mask_ops.<name>`` bound to ``kwargs``, or None where no kernel applies to ``x``."""
    if not ffi.cuda_kernels_available() or not cuda_mask_ops.dtype_supported(jnp.result_type(x)):
        return None
    return functools.partial(getattr(cuda_mask_ops, name), **kwargs)


def nm_mask(x, n: int, m: int, axis: int | None = None):
    """Boolean mask keeping the ``n`` largest ``|x|`` of every ``m`` consecutive elements along ``axis``.

    Ties go to the lower index; NaN ranks above ±inf, ±inf above every finite value, so non-finite
    elements are kept; ``-0 == +0``. ``m`` may be up to 32; built on ``lax.top_k``. The 2:4 case
    runs a CUDA kernel on GPUs.

    Args:
      x: floating-point array (or list of floats) whose ``axis`` is divisible by ``m``.
      n: elements kept per group (``1 <= n < m``).
      m: group size (``2 <= m <= 32``).
      axis: grouping axis — the contraction axis of the matmul ``x`` feeds: ``0`` for a Flax
        ``(in, out)`` kernel. ``None``: axis 0 of a 1-D array; deprecated for rank >= 2 (last axis,
        with a ``FutureWarning``).

    Returns:
      ``bool`` array of ``x``'s shape with exactly ``n`` True per group.

    Raises:
      ValueError: non-float dtype, ``n``/``m`` out of range, or ``x.shape[axis] % m != 0``.

    >>> import jax.numpy as jnp, jax_sparse24 as s24
    >>> s24.nm_mask(jnp.array([1., -4., 2., 3., 0., 0., 5., 1.]), 1, 4)
    Array([False,  True, False, False, False, False,  True, False], dtype=bool)
    """
    x = reference_ops.as_array(x, "x", "nm_mask")
    validation.check_float(x, "x", "nm_mask")
    axis = reference_ops.resolve_axis(x, axis, "nm_mask")
    if (n, m) == (2, 4):
        return mask24(x, axis)
    return reference_ops.nm_mask(x, n, m, axis)


def mask24(x, axis: int | None = None):
    """2:4 magnitude mask: keep the 2 largest ``|x|`` of every 4 consecutive elements along ``axis``.

    Equal to ``nm_mask(x, 2, 4, axis)`` (same tie and NaN/inf rule). For a Flax kernel
    ``(in, out)`` pass ``axis=0``; ``axis=None`` is axis 0 of a 1-D array and, deprecated, the last
    axis of a higher-rank one (with a ``FutureWarning``).

    >>> import jax.numpy as jnp, jax_sparse24 as s24
    >>> s24.mask24(jnp.array([[1.0, -5.0, 3.0, 0.0]]), axis=1)
    Array([[False,  True,  True, False]], dtype=bool)
    >>> s24.mask24(jnp.array([1.0, jnp.nan, 3.0, 0.0]))  # 1-D: axis 0; NaN is kept
    Array([False,  True,  True, False], dtype=bool)
    """
    x = reference_ops.as_array(x, "x", "mask24")
    axis = reference_ops.resolve_axis(x, axis, "mask24")
    # Validates (trace time) and defines the op; the kernel must match it exactly.
    ref = lambda x: reference_ops.mask24(x, axis)  # noqa: E731
    partitioning.eval_shape(ref, x)
    kernel = _kernel("mask24_cuda", x, axis=axis)
    return partitioning.partitioned_per_platform(partitioning.grouped_rule("mask24", np.ndim(x), axis), ref, kernel, jnp.asarray(x))


def transposable_mask24(x):
    """Transposable 2:4 mask of a 2-D array: 2:4 along both axes, max kept ``Σ|x|`` per 4×4 block.

    Each 4×4 block gets the exact optimum over the 90 patterns with two ones in every row and
    column (first pattern in canonical order on ties, see
    :func:`jax_sparse24.transposable_patterns`). A block with NaN/inf elements keeps as many of them
    as a pattern can, then maximises the finite kept ``Σ|x|``. Use it for weights that feed both ``x·W`` (2:4
    along ``in``) and ``∇y·Wᵀ`` (2:4 along ``out``).

    Args:
      x: floating-point array of shape (R, C), R and C divisible by 4.

    Returns:
      ``bool`` mask of shape (R, C).

    >>> import jax, jax_sparse24 as s24
    >>> m = s24.transposable_mask24(jax.random.normal(jax.random.key(0), (8, 8)))
    >>> int(m.sum(0).max()), int(m.sum(1).max())
    (4, 4)
    """
    x = reference_ops.as_array(x, "x", "transposable_mask24")
    partitioning.eval_shape(reference_ops.transposable_mask24, x)
    kernel = _kernel("transposable_mask24_cuda", x)
    return partitioning.partitioned_per_platform(partitioning.transposable_rule(), reference_ops.transposable_mask24, kernel, jnp.asarray(x))


def soft_threshold24(x, axis: int | None = None):
    """S-STE soft threshold along groups of 4: ``(sign(x)·max(|x| − t, 0), mask)``.

    ``t`` is the 2nd smallest ``|x|`` of each group, so exactly the two largest survive, shrunk
    by ``t``. ``axis`` as in :func:`mask24` (``0`` for a Flax ``(in, out)`` kernel). Non-finite:
    a kept ``±inf``/NaN stays ``±inf``/NaN; a group that drops one (3 or 4 non-finite) is NaN in
    both kept positions. S-STE training scales the result by a β frozen at initialisation
    (:func:`jax_sparse24.soft_threshold_beta`) and passes gradients straight through.

    Returns:
      ``(y, mask)`` with ``y`` in ``x``'s dtype and ``mask`` the 2:4 magnitude mask.

    >>> import jax.numpy as jnp, jax_sparse24 as s24
    >>> y, m = s24.soft_threshold24(jnp.array([0.1, -3.0, 2.0, 0.5]))
    >>> y
    Array([ 0. , -2.5,  1.5,  0. ], dtype=float32)
    """
    x = reference_ops.as_array(x, "x", "soft_threshold24")
    axis = reference_ops.resolve_axis(x, axis, "soft_threshold24")
    ref = lambda x: reference_ops.soft_threshold24(x, axis)  # noqa: E731
    partitioning.eval_shape(ref, x)
    kernel = _kernel("soft_threshold24_cuda", x, axis=axis)
    rule = partitioning.grouped_rule("soft_threshold24", np.ndim(x), axis, n_results=2)
    return partitioning.partitioned_per_platform(rule, ref, kernel, jnp.asarray(x))


def mvue24(key, x, axis: int = -1):
    """Unbiased stochastic 2:4 estimate of ``x`` (MVUE), groups of 4 along ``axis``.

    Keeps two elements per group, drawn without replacement with probability proportional to
    ``|x| + ε``, and rescales them by their inclusion probability so ``E[mvue24(key, x)] = x``.
    Reproducible for a given ``key``. The CUDA kernel draws from a counter-based generator keyed
    by ``key``, so GPU and CPU samples differ but follow the same distribution. A group holding a
    NaN or ±inf returns NaN in the two positions :func:`mask24` keeps and 0 elsewhere.

    Args:
      key: JAX PRNG key.
      x: floating-point array, ``x.shape[axis] % 4 == 0``.
      axis: grouping axis (the token axis for the weight-gradient GEMM).

    >>> import jax, jax.numpy as jnp, jax_sparse24 as s24
    >>> y = s24.mvue24(jax.random.key(0), jnp.arange(8.0))
    >>> int((y != 0).sum())
    4
    """
    x = reference_ops.as_array(x, "x", "mvue24")
    ref = lambda k, x: reference_ops.mvue24(k, x, axis)  # noqa: E731
    partitioning.eval_shape(ref, key, x)
    kernel = _kernel("mvue24_cuda", x, axis=axis)
    return partitioning.partitioned_per_platform(partitioning.mvue_rule(key, np.ndim(x), axis), ref, kernel, key, jnp.asarray(x))


def flip_rate(old_mask, new_mask):
    """Fraction of entries that changed between two masks (float32 scalar in [0, 1]).

    >>> import jax.numpy as jnp, jax_sparse24 as s24
    >>> float(s24.flip_rate(jnp.array([True, False, True, False]), jnp.array([True, True, False, False])))
    0.5
    """
    return reference_ops.flip_rate(old_mask, new_mask)
