"""``sparse24_linear``: the 2:4 sparse linear layer as a ``jax.custom_vjp`` op.

Math (DESIGN.md "Sparse linear", transposable SR-STE recipe), with ``W̃ = W ⊙ M``:

* forward ``y = x·W̃ + b``            (W̃ is 2:4 along ``in``)
* input grad ``∇x = ∇y·W̃ᵀ``          (2:4 along ``out`` when ``M`` is transposable)
* weight grad ``∇W = xᵀ·MVUE(∇y)``   (MVUE groups along the token axis) or ``xᵀ·∇y`` without a
  key; dense and straight-through to the dense master weight ``W``.
* bias grad ``Σ_tokens ∇y``.

The GEMMs go through :mod:`jax_sparse24._src.gemm`, which picks the sparse CUDA kernel or a
dense GEMM on the masked weight per backend and shape; on a CPU they are dense ``jnp.dot``.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jax_sparse24._src import gemm
from jax_sparse24._src import sharding
from jax_sparse24._src import validation as v

__all__ = ["sparse24_linear", "linear_plan", "BACKENDS"]

BACKENDS = gemm.BACKENDS


class _Config(NamedTuple):
    backend: str
    precision: object
    transposable: bool


def _flatten_tokens(x):
    return x.reshape(-1, x.shape[-1])


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _linear(x, w, mask, bias, key, cfg: _Config):
    y, _ = _linear_fwd(x, w, mask, bias, key, cfg)
    return y


def _linear_fwd(x, w, mask, bias, key, cfg: _Config):
    x2 = _flatten_tokens(x)
    y2 = gemm.forward(x2, w, mask, backend=cfg.backend, precision=cfg.precision)
    if bias is not None:
        y2 = y2 + bias.astype(y2.dtype)
    y = y2.reshape(x.shape[:-1] + (w.shape[1],))
    return y, (x, w, mask, bias, key)


def _linear_bwd(cfg: _Config, res, g):
    x, w, mask, bias, key = res
    x2 = _flatten_tokens(x)
    g2 = g.reshape(-1, g.shape[-1])
    dx2 = gemm.input_grad(g2, w, mask, transposable=cfg.transposable, backend=cfg.backend,
                          precision=cfg.precision)
    dx = dx2.reshape(x.shape).astype(x.dtype)
    if key is not None:
        # MVUE groups of 4 along the token axis (gemm.weight_grad_mvue pads T with zero rows, which
        # changes nothing). With the sparse backend one fused pass draws MVUE(∇y) and compresses it
        # for the sparse weight-gradient GEMM; otherwise ops.mvue24 then the dense GEMM.
        dw = gemm.weight_grad_mvue(key, x2, g2, backend=cfg.backend, precision=cfg.precision)
    else:
        dw = gemm.weight_grad(x2, g2, backend=cfg.backend, precision=cfg.precision)
    dw = dw.astype(w.dtype)
    db = None if bias is None else jnp.sum(g2, axis=0).astype(bias.dtype)
    return dx, dw, None, db, None


_linear.defvjp(_linear_fwd, _linear_bwd)


def sparse24_linear(x, w, mask, bias=None, *, key=None, backend: str = "auto", precision=None,
                    transposable: bool | None = None):
    """2:4 sparse linear layer ``y = x·(w ⊙ mask) + bias`` with the sparse-training backward.

    Gradients (a ``jax.custom_vjp``): ``∇x = ∇y·(w⊙mask)ᵀ``; ``∇w = xᵀ·MVUE(∇y)`` with MVUE
    groups along the token axis when ``key`` is given, else ``xᵀ·∇y`` — dense, passed straight
    through to ``w``; ``∇bias = Σ ∇y``; no gradient for ``mask`` or ``key``.

    Args:
      x: input ``(..., in)``; all leading axes are tokens.
      w: dense weight ``(in, out)`` (Flax layout), ``in % 4 == 0``.
      mask: ``bool`` (or 0/1) mask of ``w``'s shape, 2:4 along ``in`` (checked when concrete).
      bias: optional ``(out,)``.
      key: optional PRNG key; enables the MVUE weight gradient.
      backend: ``"auto"`` (sparse CUDA kernel where it beats dense for the shape, else dense on
        the masked weight), ``"cutlass"`` (force the sparse kernel; error if unavailable),
        ``"dense"`` (dense GEMM on the masked weight) or ``"reference"`` (plain ``jnp``).
      precision: ``lax.Precision`` for the dense GEMMs.
      transposable: whether ``mask`` is also 2:4 along ``out`` (lets ``∇x`` use the sparse
        kernel). ``None``: checked when the mask is concrete, else assumed False.

    Returns:
      ``(..., out)`` array.

    >>> import jax, jax.numpy as jnp, jax_sparse24 as s24
    >>> w = jax.random.normal(jax.random.key(0), (8, 4))
    >>> x = jax.random.normal(jax.random.key(1), (3, 8))
    >>> m = s24.mask24(w, axis=0)
    >>> y = s24.sparse24_linear(x, w, m)
    >>> bool(jnp.allclose(y, x @ (w * m)))
    True
    """
    op = "sparse24_linear"
    v.check_float(x, "x", op)
    v.check_float(w, "w", op)
    v.check_rank(w, 2, op, "w")
    if np.ndim(x) < 1 or np.shape(x)[-1] != np.shape(w)[0]:
        raise ValueError(f"{op}: x's last axis must equal w's in dimension, got x {np.shape(x)} and w {np.shape(w)}")
    v.check_divisible(w, 0, 4, op, what="w axis (in)")
    v.check_same_shape(w, mask, op, ("w", "mask"))
    if bias is not None and np.shape(bias) != (np.shape(w)[1],):
        raise ValueError(f"{op}: bias must have shape ({np.shape(w)[1]},), got {np.shape(bias)}")
    if backend not in BACKENDS:
        raise ValueError(f"{op}: backend must be one of {BACKENDS}, got {backend!r}")
    v.check_nm_mask_concrete(mask, 2, 4, 0, op)
    if transposable is None:
        transposable = False
        if v.is_concrete(mask) and np.shape(w)[1] % 4 == 0:
            arr = np.asarray(mask) != 0
            transposable = bool(arr.reshape(arr.shape[0], -1, 4).sum(-1).max(initial=0) <= 2)
    mask = jnp.asarray(mask)
    if mask.dtype != jnp.bool_:
        mask = mask != 0
    cfg = _Config(backend, precision, bool(transposable))
    x, w = jnp.asarray(x), jnp.asarray(w)
    bias = None if bias is None else jnp.asarray(bias)
    # Issue 6, shard_map: operands varying over different mesh axes (x over data, w over model)
    # are cast to the union first, so the custom_vjp's cotangents match their primals.
    x, w, mask, bias = sharding.vary_to_union(x, w, mask, bias)
    return _linear(x, w, mask, bias, key, cfg)


def linear_plan(tokens: int, features_in: int, features_out: int, dtype=jnp.bfloat16, *, backend: str = "auto",
                transposable: bool = True, mvue: bool = True) -> dict:
    """Which kernel each GEMM of :func:`sparse24_linear` runs for this layer shape on this machine.

    The same choices the op makes at trace time (``backend="auto"``: the measured table
    ``spmm_autotune.json``), without tracing anything — to see whether a model is large enough for
    the sparse kernels (``docs/performance.md``). Under ``jit`` + sharding the op decides on the
    local shard shapes: pass those (e.g. ``tokens`` per device).

    Args:
      tokens: rows of ``x`` per call (all leading axes together).
      features_in, features_out: the weight's ``(in, out)``.
      dtype: compute dtype of the GEMMs.
      backend, transposable: as in :func:`sparse24_linear`.
      mvue: whether a ``key`` is passed (the MVUE weight gradient); without one it is exact dense.

    Returns:
      ``{"forward": k, "input_grad": k, "weight_grad": k}`` with ``k`` one of ``"cutlass"``,
      ``"cusparselt"``, ``"dense"``, ``"reference"``, and for the weight gradient also
      ``"dense (exact)"`` (``xᵀ·∇y``) or ``"<k> (MVUE)"``. Sparse kernels run on CUDA devices only;
      elsewhere every GEMM is the dense reference (``auto`` then plans ``"dense"``).

    >>> plan = linear_plan(8192, 1024, 4096)
    >>> sorted(plan)
    ['forward', 'input_grad', 'weight_grad']
    """
    op = "linear_plan"
    if backend not in BACKENDS:
        raise ValueError(f"{op}: backend must be one of {BACKENDS}, got {backend!r}")
    for name, n in (("tokens", tokens), ("features_in", features_in), ("features_out", features_out)):
        if int(n) != n or n < 1:
            raise ValueError(f"{op}: {name} must be a positive integer, got {n!r}")
    if features_in % 4:
        raise ValueError(f"{op}: features_in must be a multiple of 4 (2:4 groups), got {features_in}")
    t, i, o = int(tokens), int(features_in), int(features_out)
    forward = gemm.choose(backend, o, t, i, dtype)
    input_grad = gemm.choose(backend, i, t, o, dtype) if transposable else (
        "reference" if backend == "reference" else "dense")
    if not mvue:
        weight_grad = "reference" if backend == "reference" else "dense (exact)"
    else:
        path = gemm.weight_grad_path(backend, o, i, t, dtype)
        weight_grad = "dense (exact)" if path == "exact" else f"{path} (MVUE)"
    return {"forward": forward, "input_grad": input_grad, "weight_grad": weight_grad}
