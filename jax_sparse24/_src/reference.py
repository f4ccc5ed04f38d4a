"""Reference implementations of every 2:4 op in plain ``jax.numpy``.

These functions are the single definition of each op (see DESIGN.md "The math"). They are the
CPU path and the oracle the CUDA kernels are tested against; the public ops in ``ops.py`` lower
to them on every platform without a kernel. Groups are always ``m`` consecutive elements along
``axis`` (the contraction axis of the matmul the tensor feeds).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_sparse24._src import validation as v

__all__ = [
    "nm_mask",
    "mask24",
    "transposable_mask24",
    "transposable_patterns",
    "soft_threshold24",
    "soft_threshold_beta",
    "mvue24",
    "mvue24_inclusion_probabilities",
    "flip_rate",
    "MVUE_EPS",
]

#: Added to |g| in MVUE so an all-zero group still has a valid distribution. The CUDA kernel uses
#: the same constant. Any positive value keeps the estimator exactly unbiased.
MVUE_EPS = 1e-20


def _grouped(x, axis: int, m: int):
    """Move ``axis`` last and split it into (..., L/m, m) groups."""
    xm = jnp.moveaxis(x, axis, -1)
    return xm.reshape(*xm.shape[:-1], xm.shape[-1] // m, m)


def _ungrouped(g, axis: int, shape):
    moved_shape = tuple(np.delete(np.array(shape), axis)) + (shape[axis],)
    return jnp.moveaxis(g.reshape(moved_shape), -1, axis)


def nm_mask(x, n: int, m: int, axis: int = -1):
    """Boolean mask keeping the ``n`` largest ``|x|`` of every ``m`` consecutive elements along ``axis``.

    Ties are broken toward the lower index (the order ``lax.top_k`` returns). ``m`` may be up to 32.

    Args:
      x: floating-point array.
      n: elements kept per group, ``1 <= n < m``.
      m: group size, ``2 <= m <= 32``; ``x.shape[axis]`` must be divisible by ``m``.
      axis: the grouping axis (the contraction axis of the matmul ``x`` feeds).

    Returns:
      A ``bool`` array of ``x``'s shape with exactly ``n`` True per group.

    >>> import jax.numpy as jnp
    >>> nm_mask(jnp.array([0.1, -3.0, 2.0, 0.5, 4.0, 0.0, -1.0, 1.0]), 2, 4)
    Array([False,  True,  True, False,  True, False,  True, False], dtype=bool)
    """
    op = "nm_mask"
    v.check_float(x, "x", op)
    v.check_nm(n, m, op)
    axis = v.normalize_axis(axis, np.ndim(x), op, np.shape(x))
    v.check_divisible(x, axis, m, op)
    x = jnp.asarray(x)
    if x.size == 0:
        return jnp.zeros(x.shape, jnp.bool_)
    g = _grouped(jnp.abs(x), axis, m)
    _, idx = lax.top_k(g, n)  # (..., G, n)
    keep = jnp.any(idx[..., :, None] == jnp.arange(m, dtype=idx.dtype), axis=-2)
    return _ungrouped(keep, axis, x.shape)


def mask24(x, axis: int = -1):
    """2:4 magnitude mask: ``nm_mask(x, 2, 4, axis)``.

    >>> import jax.numpy as jnp
    >>> mask24(jnp.array([[1.0, -5.0, 3.0, 0.0]]))
    Array([[False,  True,  True, False]], dtype=bool)
    """
    return nm_mask(x, 2, 4, axis)


@functools.lru_cache(maxsize=None)
def transposable_patterns() -> np.ndarray:
    """The 90 4×4 0/1 patterns with exactly two ones in every row and every column.

    Canonical order: increasing 16-bit integer ``p`` where bit ``4*r + c`` is block element
    ``(r, c)``. Returned as a float32 array of shape (90, 16) (row-major flattened blocks). The
    CUDA kernel uses the same order, so ties resolve to the same (first) pattern.
    """
    pats = []
    for p in range(1 << 16):
        bits = np.array([(p >> i) & 1 for i in range(16)], dtype=np.int64).reshape(4, 4)
        if (bits.sum(0) == 2).all() and (bits.sum(1) == 2).all():
            pats.append(bits.reshape(16))
    out = np.array(pats, dtype=np.float32)
    assert out.shape == (90, 16)
    return out


def transposable_mask24(x):
    """Transposable 2:4 mask of a 2-D array: both the mask and its transpose are 2:4.

    For every 4×4 block the pattern (out of the 90 with two ones in every row and column) with
    the largest kept ``Σ|x|`` is chosen exactly, by scoring all 90 with one matmul
    ``(blocks × 16) @ (16 × 90)`` and taking the first argmax.

    Args:
      x: floating-point array of shape (R, C) with R and C divisible by 4.

    Returns:
      ``bool`` mask of shape (R, C), 2:4 along axis 0 and along axis 1.
    """
    op = "transposable_mask24"
    v.check_float(x, "x", op)
    v.check_rank(x, 2, op)
    v.check_divisible(x, 0, 4, op)
    v.check_divisible(x, 1, 4, op)
    x = jnp.asarray(x)
    r, c = x.shape
    if x.size == 0:
        return jnp.zeros(x.shape, jnp.bool_)
    blocks = jnp.abs(x).astype(jnp.float32).reshape(r // 4, 4, c // 4, 4).transpose(0, 2, 1, 3)
    blocks = blocks.reshape(-1, 16)
    pats = jnp.asarray(transposable_patterns())
    scores = jnp.dot(blocks, pats.T, precision=lax.Precision.HIGHEST)  # (blocks, 90)
    best = jnp.argmax(scores, axis=-1)
    chosen = pats[best] > 0.5
    return chosen.reshape(r // 4, c // 4, 4, 4).transpose(0, 2, 1, 3).reshape(r, c)


def soft_threshold24(x, axis: int = -1):
    """S-STE soft threshold: ``S(x) = sign(x) * max(|x| - t, 0)`` with t the 2nd smallest ``|x|`` per group of 4.

    Returns:
      ``(y, mask)``: ``y`` has ``x``'s dtype and is non-zero only where ``mask`` (the 2:4
      magnitude mask of ``x``) is True; the math is done in float32.
    """
    op = "soft_threshold24"
    v.check_float(x, "x", op)
    axis = v.normalize_axis(axis, np.ndim(x), op, np.shape(x))
    v.check_divisible(x, axis, 4, op)
    x = jnp.asarray(x)
    mask = mask24(x, axis)
    if x.size == 0:
        return x, mask
    g = _grouped(jnp.abs(x).astype(jnp.float32), axis, 4)
    t = jnp.sort(g, axis=-1)[..., 1:2]
    t = _ungrouped(jnp.broadcast_to(t, g.shape), axis, x.shape)
    xf = x.astype(jnp.float32)
    y = jnp.where(mask, jnp.sign(xf) * (jnp.abs(xf) - t), 0.0).astype(x.dtype)
    return y, mask


def soft_threshold_beta(w, axis: int = -1):
    """S-STE scale β = ⟨w, S(w)⟩ / ⟨S(w), S(w)⟩ (computed once at initialisation, then frozen)."""
    s, _ = soft_threshold24(w, axis)
    wf, sf = jnp.asarray(w, jnp.float32), s.astype(jnp.float32)
    den = jnp.vdot(sf, sf)
    return jnp.where(den > 0, jnp.vdot(wf, sf) / jnp.where(den > 0, den, 1.0), 1.0)


def mvue24_inclusion_probabilities(a):
    """Inclusion probability of each element of groups of 4 weights ``a > 0`` (last axis).

    ``p_i = a_i/S + Σ_{j≠i} (a_j/S) · a_i/(S − a_j)``. Every factor is computed as a ratio ≤ 1
    (``S − a_j`` as the sum of the other three), so nothing overflows for any positive ``a``.
    """
    a0, a1, a2, a3 = (a[..., k] for k in range(4))
    t01, t23 = a0 + a1, a2 + a3
    s = (t01 + t23)[..., None]
    p_first = a / s  # (..., 4)
    # S - a_j as the sum of the other three (no cancellation when a_j dominates), >= a_i for i != j
    rest = jnp.stack([a1 + t23, a0 + t23, t01 + a3, t01 + a2], axis=-1)
    # second[i] = Σ_{j≠i} (a_j/S) · a_i / rest_j
    ratio = a[..., :, None] / rest[..., None, :]  # [i, j] = a_i / rest_j
    eye = jnp.eye(4, dtype=bool)
    second = jnp.sum(jnp.where(eye, 0.0, ratio * p_first[..., None, :]), axis=-1)
    return p_first + second


def _one_plus_uniform16(h):
    """``1 + (h + 1/2)·2⁻¹⁶`` as float32 for uint32 ``h < 2¹⁶``."""
    return lax.bitcast_convert_type(jnp.uint32(0x3F800040) | (h << 7), jnp.float32)


def mvue24(key, x, axis: int = -1):
    """Unbiased 2:4 estimate of ``x`` (minimum-variance unbiased estimator, DESIGN.md "MVUE 2:4").

    Per group of 4 along ``axis``: ``a_i = |x_i| + ε``, ``S = Σ a``; keep two positions, position
    ``i`` with probability ``p_i = a_i/S + Σ_{j≠i} (a_j/S)·a_i/(S − a_j)`` (that of drawing ``i``
    with probability ``a_i/S``, then ``j ≠ i`` with probability ``a_j/(S − a_i)``), and output
    ``x_i / p_i`` there, 0 elsewhere, so ``E[out] = x`` with the MVUE's per-element variance
    ``x_i²(1/p_i − 1)``. Reproducible for a given ``key``.

    The draw is the CUDA kernels' (``xla_ffi/mvue_rng.cuh``; the random bits come from
    ``jax.random.bits`` here and from Philox4x32-7 there, so the samples differ but their
    distribution is the same): systematic sampling on ``p`` in lane order -- with one uniform
    ``u = (h + 1/2)·2⁻¹⁶`` from 16 random bits ``h`` per group, the kept positions are those whose
    interval ``[P_{i-1}, P_i)`` of the cumulative sums of ``p`` holds ``u`` or ``u + 1``
    (``lo`` = how many of ``P_0``, ``P_1`` are ``<= u``, ``hi`` = 1 + how many of ``P_1``, ``P_2``
    are ``<= 1 + u``, or-ed with ``lo``'s so that a ``p_i`` rounded above 1 cannot keep one
    position twice). Each position is then kept with probability ``p_i`` up to the 16-bit
    uniform's 2⁻¹⁶ (a bias of at most ~2⁻¹⁶·|x_i|/p_i per element, far below the rounding of the
    stored ``x_i / p_i`` in bfloat16). ``a`` is scaled by 2⁻³² (as in the kernels; ``p`` does not
    depend on the scale) so that sums of float32 magnitudes cannot overflow.

    Args:
      key: a JAX PRNG key (typed or raw uint32).
      x: floating-point array; ``x.shape[axis]`` divisible by 4.
      axis: the grouping axis.
    """
    op = "mvue24"
    v.check_float(x, "x", op)
    axis = v.normalize_axis(axis, np.ndim(x), op, np.shape(x))
    v.check_divisible(x, axis, 4, op)
    x = jnp.asarray(x)
    if x.size == 0:
        return x
    g = _grouped(x.astype(jnp.float32), axis, 4)
    scale = np.float32(2.0**-32)
    a = jnp.abs(g) * scale + np.float32(MVUE_EPS) * scale
    p = mvue24_inclusion_probabilities(a)
    h = jax.random.bits(key, g.shape[:-1], jnp.uint16).astype(jnp.uint32)
    one_u = _one_plus_uniform16(h)
    u = one_u - 1.0  # exact
    c1 = p[..., 0] + p[..., 1]
    c2 = c1 + p[..., 2]
    lo_gt0, lo_gt1 = u >= p[..., 0], u >= c1
    hi_gt1, hi_gt2 = (one_u >= c1) | lo_gt0, (one_u >= c2) | lo_gt1
    i = lo_gt0.astype(jnp.int32) + lo_gt1.astype(jnp.int32)
    j = 1 + hi_gt1.astype(jnp.int32) + hi_gt2.astype(jnp.int32)
    lane = jnp.arange(4)
    kept = (lane == i[..., None]) | (lane == j[..., None])
    out = jnp.where(kept & (g != 0), g / jnp.where(kept, p, 1.0), 0.0)
    return _ungrouped(out, axis, x.shape).astype(x.dtype)


def flip_rate(old_mask, new_mask):
    """Fraction of mask entries that differ between two masks of the same shape (float32 scalar)."""
    op = "flip_rate"
    v.check_same_shape(old_mask, new_mask, op, ("old_mask", "new_mask"))
    old = jnp.asarray(old_mask) != 0
    new = jnp.asarray(new_mask) != 0
    if old.size == 0:
        return jnp.float32(0.0)
    return jnp.mean(old != new, dtype=jnp.float32)
