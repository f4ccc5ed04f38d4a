"""Reference implementations of every 2:4 op in plain ``jax.numpy``.

These functions are the single definition of each op. They are the
CPU path and the oracle the CUDA kernels are tested against; the public ops in ``ops.py`` lower
to them on every platform without a kernel. Groups are always ``m`` consecutive elements along
``axis`` (the contraction axis of the matmul the tensor feeds).

Special values (one rule for every mask function, the CUDA kernels included)
-----------------------------------------------------------------------------
Elements are ranked by the *magnitude key* of :func:`magnitude_key`: ``|x|`` compared exactly, with
``-0 == +0``, subnormals ordered by their magnitude (never flushed), ``+inf == -inf`` above every
finite value and every NaN (any sign or payload) above ``inf``; equal keys go to the lower index.
So a non-finite element is always among the kept ones — a diverging weight or gradient is
surfaced in the forward pass, not hidden by the mask:

* ``mask24`` / ``nm_mask``: the ``n`` largest keys of each group are kept (NaN first, then inf,
  then the finite values by magnitude).
* ``transposable_mask24``: each 4×4 block's pattern maximises first the number of non-finite
  elements it keeps, then ``Σ|x|`` of the finite kept elements (float32 sums of ``|x|·2⁻⁴``, which
  cannot overflow; magnitudes below ``2⁻¹²²``, subnormals included, count as 0), the first pattern
  in canonical order on ties — so the finite weights of a block
  holding a NaN or inf are still chosen optimally among the patterns that keep it.
* ``soft_threshold24``: the mask is ``mask24``'s; ``t`` is the larger dropped ``|x|`` (that of the
  dropped element with the larger key) and the kept values are ``sign(x)·(|x| − t)`` in float32:
  a kept ``±inf`` stays ``±inf``, a kept NaN stays NaN, and a group that has to drop a non-finite
  element (three or four of them) gets NaN in both kept positions (``t`` is inf or NaN).
* ``mvue24``: a group holding a NaN or inf has no unbiased estimate: it returns NaN in the two
  positions ``mask24`` keeps and 0 elsewhere (still 2:4); every other group is unaffected.

Subnormal arithmetic results (soft threshold values, transposable scores) are flushed to zero, as
XLA's CPU backend does, so the kernels match the reference bit for bit on every mask.
"""

from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_sparse24._src import validation as v

__all__ = [
    "magnitude_key",
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


AXIS_WARNING = (
    "{op}: called without `axis`; for an array of rank >= 2 this groups along the last axis (-1), the "
    "old default. Pass the grouping axis explicitly: a Flax kernel of shape (in, out) feeds x @ kernel, "
    "whose 2:4 groups run along `in`, so it needs axis=0. A future version will require `axis`."
)


def resolve_axis(x, axis, op: str, stacklevel: int = 3) -> int:
    """The grouping axis of ``op``: ``axis`` itself when given; for ``axis=None`` axis 0 of a 1-D
    array, or the last axis (the old default) of an array of rank >= 2 with a ``FutureWarning``."""
    if axis is not None:
        return axis
    if np.ndim(x) <= 1:
        return 0
    warnings.warn(AXIS_WARNING.format(op=op), FutureWarning, stacklevel=stacklevel)
    return -1


def as_array(x, name: str, op: str):
    """``x`` as an array: Python lists, tuples and scalars go through ``jnp.asarray``; anything that
    cannot be converted is a ``ValueError`` naming the argument."""
    if isinstance(x, (list, tuple, int, float)):
        try:
            return jnp.asarray(x)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{op}: `{name}` must be an array or a (nested) list of numbers, got {type(x).__name__}: {e}") from None
    return x


def magnitude_key(x):
    """Integer rank of ``|x|`` used by every mask function (see the module docstring).

    The bits of ``|x|`` as a signed integer of ``x``'s width (a monotone code of the magnitude:
    ``-0`` and ``+0`` equal, subnormals exact, ``inf`` above every finite value), with every NaN
    mapped to the largest value of that integer type, above ``inf``. Computed with integer
    operations only, so no flush-to-zero mode can change the order.
    """
    x = jnp.asarray(x)
    bits = jnp.dtype(x.dtype).itemsize * 8
    idt = {8: jnp.int8, 16: jnp.int16, 32: jnp.int32, 64: jnp.int64}[bits]
    top = np.iinfo(idt).max
    key = lax.bitcast_convert_type(x, idt) & idt(top)  # clear the sign bit
    key = jnp.where(jnp.isnan(x), idt(top), key)
    return key if bits >= 32 else key.astype(jnp.int32)


def _grouped(x, axis: int, m: int):
    """Move ``axis`` last and split it into (..., L/m, m) groups."""
    xm = jnp.moveaxis(x, axis, -1)
    return xm.reshape(*xm.shape[:-1], xm.shape[-1] // m, m)


def _ungrouped(g, axis: int, shape):
    moved_shape = tuple(np.delete(np.array(shape), axis)) + (shape[axis],)
    return jnp.moveaxis(g.reshape(moved_shape), -1, axis)


def nm_mask(x, n: int, m: int, axis: int | None = None):
    """Boolean mask keeping the ``n`` largest ``|x|`` of every ``m`` consecutive elements along ``axis``.

    Elements are ranked by :func:`magnitude_key` (NaN > ±inf > finite by magnitude, ``-0 == +0``);
    ties go to the lower index. ``m`` may be up to 32.

    Args:
      x: floating-point array (or a list of floats).
      n: elements kept per group, ``1 <= n < m``.
      m: group size, ``2 <= m <= 32``; ``x.shape[axis]`` must be divisible by ``m``.
      axis: the grouping axis (the contraction axis of the matmul ``x`` feeds: 0 for a Flax
        ``(in, out)`` kernel). ``None`` (deprecated for rank >= 2) means axis 0 of a 1-D array and
        the last axis, with a ``FutureWarning``, of a higher-rank one.

    Returns:
      A ``bool`` array of ``x``'s shape with exactly ``n`` True per group.

    >>> import jax.numpy as jnp
    >>> nm_mask(jnp.array([0.1, -3.0, 2.0, 0.5, 4.0, 0.0, -1.0, 1.0]), 2, 4)
    Array([False,  True,  True, False,  True, False,  True, False], dtype=bool)
    >>> nm_mask(jnp.array([1.0, jnp.nan, -jnp.inf, 2.0]), 2, 4, axis=0)
    Array([False,  True,  True, False], dtype=bool)
    """
    op = "nm_mask"
    x = as_array(x, "x", op)
    axis = resolve_axis(x, axis, op)
    v.check_float(x, "x", op)
    v.check_nm(n, m, op)
    axis = v.normalize_axis(axis, np.ndim(x), op, np.shape(x))
    v.check_divisible(x, axis, m, op)
    x = jnp.asarray(x)
    if x.size == 0:
        return jnp.zeros(x.shape, jnp.bool_)
    g = _grouped(magnitude_key(x), axis, m)
    _, idx = lax.top_k(g, n)  # (..., G, n); equal keys: lower index first
    keep = jnp.any(idx[..., :, None] == jnp.arange(m, dtype=idx.dtype), axis=-2)
    return _ungrouped(keep, axis, x.shape)


def mask24(x, axis: int | None = None):
    """2:4 magnitude mask: ``nm_mask(x, 2, 4, axis)`` (pass ``axis=0`` for a Flax ``(in, out)`` kernel).

    >>> import jax.numpy as jnp
    >>> mask24(jnp.array([[1.0, -5.0, 3.0, 0.0]]), axis=1)
    Array([[False,  True,  True, False]], dtype=bool)
    """
    x = as_array(x, "x", "mask24")
    v.check_float(x, "x", "mask24")
    return nm_mask(x, 2, 4, resolve_axis(x, axis, "mask24"))


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
    ``(blocks × 16) @ (16 × 90)`` and taking the first argmax. Non-finite elements: the pattern
    keeps as many of them as possible first, then maximises the finite kept ``Σ|x|`` (magnitudes
    below ``2⁻¹²²`` count as 0); see the module docstring.

    Args:
      x: floating-point array of shape (R, C) with R and C divisible by 4.

    Returns:
      ``bool`` mask of shape (R, C), 2:4 along axis 0 and along axis 1.
    """
    op = "transposable_mask24"
    x = as_array(x, "x", op)
    v.check_float(x, "x", op)
    v.check_rank(x, 2, op)
    v.check_divisible(x, 0, 4, op)
    v.check_divisible(x, 1, 4, op)
    x = jnp.asarray(x)
    r, c = x.shape
    if x.size == 0:
        return jnp.zeros(x.shape, jnp.bool_)
    a = jnp.abs(x.astype(jnp.float32))
    finite = jnp.isfinite(a)
    # Finite magnitudes scaled by 2^-4 (exact) so that no sum of 8 overflows float32; those below
    # 2^-122 (subnormals included) count as 0, explicitly, whatever the backend's flush mode.
    a = jnp.where(finite & (a >= np.float32(2.0**-122)), a * np.float32(2.0**-4), 0.0)

    def blocks_of(t):
        return t.reshape(r // 4, 4, c // 4, 4).transpose(0, 2, 1, 3).reshape(-1, 16)

    pats = jnp.asarray(transposable_patterns())
    scores = jnp.dot(blocks_of(a), pats.T, precision=lax.Precision.HIGHEST)  # (blocks, 90)
    # Non-finite kept per pattern: small integers, exact.
    counts = jnp.dot(blocks_of((~finite).astype(jnp.float32)), pats.T, precision=lax.Precision.HIGHEST)
    top = jnp.max(counts, axis=-1, keepdims=True)
    scores = jnp.where(counts == top, scores, -1.0)  # finite scores are >= 0
    best = jnp.argmax(scores, axis=-1)
    chosen = pats[best] > 0.5
    return chosen.reshape(r // 4, c // 4, 4, 4).transpose(0, 2, 1, 3).reshape(r, c)


def soft_threshold24(x, axis: int | None = None):
    """S-STE soft threshold: ``S(x) = sign(x) * max(|x| - t, 0)`` with t the 2nd smallest ``|x|`` per group of 4.

    ``t`` is the ``|x|`` of the larger dropped element (by :func:`magnitude_key`); the kept values
    are ``sign(x)·(|x| − t)`` in float32 with subnormal results flushed to zero. A kept ``±inf``
    stays ``±inf``, a kept NaN stays NaN, and a group that drops a non-finite element gets NaN in
    both kept positions (module docstring). ``axis`` as in :func:`nm_mask`.

    Returns:
      ``(y, mask)``: ``y`` has ``x``'s dtype and is non-zero only where ``mask`` (the 2:4
      magnitude mask of ``x``) is True; the math is done in float32.

    >>> import jax.numpy as jnp
    >>> soft_threshold24(jnp.array([jnp.inf, 1.0, -3.0, 0.5]))[0]
    Array([inf,  0., -2.,  0.], dtype=float32)
    """
    op = "soft_threshold24"
    x = as_array(x, "x", op)
    axis = resolve_axis(x, axis, op)
    v.check_float(x, "x", op)
    axis = v.normalize_axis(axis, np.ndim(x), op, np.shape(x))
    v.check_divisible(x, axis, 4, op)
    x = jnp.asarray(x)
    mask = mask24(x, axis)
    if x.size == 0:
        return x, mask
    xf = x.astype(jnp.float32)
    g = _grouped(jnp.abs(xf), axis, 4)
    key = jnp.where(_grouped(mask, axis, 4), -1, _grouped(magnitude_key(x), axis, 4))
    t = jnp.take_along_axis(g, jnp.argmax(key, axis=-1)[..., None], axis=-1)  # the larger dropped |x|
    t = _ungrouped(jnp.broadcast_to(t, g.shape), axis, x.shape)
    tiny = np.float32(np.finfo(np.float32).tiny)

    def flush(z):  # subnormal inputs and results flush to zero on every backend (as sub.ftz.f32)
        return jnp.where(jnp.abs(z) < tiny, jnp.zeros((), z.dtype), z)

    d = flush(flush(jnp.abs(xf)) - flush(t))
    y = jnp.where(mask, jnp.where(jnp.signbit(xf), -d, d), 0.0).astype(x.dtype)
    return y, mask


def soft_threshold_beta(w, axis: int | None = None):
    """S-STE scale β = ⟨w, S(w)⟩ / ⟨S(w), S(w)⟩ (computed once at initialisation, then frozen).

    ``axis`` as in :func:`soft_threshold24` (0 for a Flax ``(in, out)`` kernel)."""
    w = as_array(w, "w", "soft_threshold_beta")
    s, _ = soft_threshold24(w, resolve_axis(w, axis, "soft_threshold_beta"))
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
    """Unbiased 2:4 estimate of ``x`` (minimum-variance unbiased estimator).

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

    A group holding a NaN or ``±inf`` has no unbiased estimate: its output is NaN in the two
    positions :func:`mask24` keeps (the non-finite ones first) and 0 elsewhere, so the output stays
    2:4 and the divergence is surfaced; the other groups are unaffected (module docstring).

    Args:
      key: a JAX PRNG key (typed or raw uint32).
      x: floating-point array; ``x.shape[axis]`` divisible by 4.
      axis: the grouping axis.
    """
    op = "mvue24"
    x = as_array(x, "x", op)
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
    # Groups with a non-finite element: NaN where mask24 keeps, 0 elsewhere.
    bad = jnp.any(~jnp.isfinite(g), axis=-1, keepdims=True)
    _, top2 = lax.top_k(_grouped(magnitude_key(x), axis, 4), 2)
    keep24 = jnp.any(top2[..., :, None] == jnp.arange(4, dtype=top2.dtype), axis=-2)
    out = jnp.where(bad, jnp.where(keep24, jnp.float32(jnp.nan), 0.0), out)
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
