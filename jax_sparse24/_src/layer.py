"""The math of a 2:4 sparse dense layer, shared by the Flax linen and NNX layers.

:class:`jax_sparse24.nn.Sparse24Dense` (linen) and :class:`jax_sparse24.nnx.Sparse24Linear` (NNX)
differ only in where they keep their parameters and sparsity state; both compute through
:func:`apply` (the recipes ``srste`` / ``ste`` / ``soft`` / ``dense`` on top of
:func:`jax_sparse24.sparse24_linear`) and refresh their ``srste`` masks through
:func:`refresh`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_sparse24._src import autotune, ops
from jax_sparse24._src import reference_ops
from jax_sparse24._src import fp8_math
from jax_sparse24._src.linear import fp8_dense_linear, sparse24_linear

#: Training methods of the sparse layers.
METHODS = ("srste", "ste", "soft", "dense")


def check_config(owner: str, method: str, backend: str, fp8: bool = False, fp8_scaling: str = "current",
                 amax_history_length: int = 1024) -> None:
    """ValueError for an unknown ``method`` or ``backend``, or a bad ``fp8`` / ``fp8_scaling`` /
    ``amax_history_length``."""
    if method not in METHODS:
        raise ValueError(f"{owner}: method must be one of {METHODS}, got {method!r}")
    if not isinstance(fp8, (bool, np.bool_)):
        raise ValueError(f"{owner}: fp8 must be a Python bool, got {fp8!r}")
    autotune.check_request(backend, owner, fp8=bool(fp8))
    if fp8_scaling not in fp8_math.SCALINGS:
        raise ValueError(f"{owner}: fp8_scaling must be one of {fp8_math.SCALINGS}, got {fp8_scaling!r}")
    if fp8_scaling == "delayed" and not fp8:
        raise ValueError(f"{owner}: fp8_scaling='delayed' needs fp8=True")
    fp8_math.check_history_length(amax_history_length, owner, "amax_history_length")


def init_mask(kernel, transposable: bool):
    """The initial ``srste`` mask of an ``(in, out)`` kernel, or of a stack ``(..., in, out)`` of them
    (``nn.scan``'s layer axis first): each ``(in, out)`` slice on its own."""
    if jnp.ndim(kernel) > 2:
        # (L, in, out) -> (L·in, out): with in % 4 == 0 every 2:4 group along in and every 4×4 block
        # lies inside one layer's slice, so this is the per-layer mask in one op
        shape = jnp.shape(kernel)
        return jnp.reshape(init_mask(jnp.reshape(kernel, (-1, shape[-1])), transposable), shape)
    return ops.transposable_mask24(kernel) if transposable else ops.mask24(kernel, axis=0)


def init_beta(kernel):
    """The frozen S-STE scale β of an ``(in, out)`` kernel (``soft``)."""
    return reference_ops.soft_threshold_beta(kernel, axis=0).astype(jnp.float32)


def soft_weight(w, beta):
    """``(β·S(w), its 2:4 mask)``: S-STE's sparse weight, S the soft threshold along ``in`` (axis 0)."""
    s, m = ops.soft_threshold24(w, axis=0)
    return (beta * s.astype(jnp.float32)).astype(w.dtype), m


def effective(method: str, w, mask, beta, transposable: bool):
    """``(weight passed to sparse24_linear, its mask, transposable)`` for a sparse ``method``."""
    if method == "srste":
        return w, mask, transposable
    if method == "ste":
        return w, lax.stop_gradient(ops.mask24(w, axis=0)), False
    if method == "soft":  # β·S(w), straight-through to w.
        w_eff, m = soft_weight(w, beta)
        return w + lax.stop_gradient(w_eff - w), lax.stop_gradient(m), False
    raise ValueError(f"effective: no sparse weight for method {method!r}")


def apply(inputs, kernel, bias, *, method: str, mask=None, beta=None, transposable: bool = False, key=None,
          backend: str = "auto", precision=None, sparse=None, prepared=None, fp8: bool = False,
          fp8_meta=None, owner: str = "Sparse24Dense"):
    """The layer's output for (dtype-promoted) ``inputs``, ``kernel`` ``(in, out)`` and ``bias``.

    ``sparse``: ``None`` (sparse unless ``method == "dense"``), a Python bool, or a scalar bool
    array (``lax.cond`` between the sparse and the dense computation). ``fp8``: the forward and
    input-gradient GEMMs in float8_e4m3fn, sparse (``sparse24_linear(fp8=True)``, the effective
    weight of the method) and dense (:func:`~jax_sparse24._src.linear.fp8_dense_linear`) alike;
    ``prepared`` is then ignored (fp8 weights are quantized and compressed per call). ``fp8_meta``:
    the layer's delayed-scaling state (both computations use it), or None for current scaling.
    """

    def dense_fn(x, w, b):
        if fp8:
            return fp8_dense_linear(x, w, b, precision=precision, fp8_meta=fp8_meta)
        y = lax.dot_general(x, w, (((x.ndim - 1,), (0,)), ((), ())), precision=precision)
        return y if b is None else y + jnp.reshape(b, (1,) * (y.ndim - 1) + (-1,))

    def sparse_fn(x, w, b):
        w_used, m, t = effective(method, w, mask, beta, transposable)
        # the masks of a layer are the library's own (made by init_mask / refresh, or by
        # effective() right here): trusted, no device check (validation.check_nm_mask)
        return sparse24_linear(x, w_used, m, b, key=key, backend=backend, precision=precision,
                               transposable=t, prepared=None if fp8 else prepared, fp8=fp8, fp8_meta=fp8_meta,
                               check_mask=False)

    if method == "dense" or sparse is False:
        return dense_fn(inputs, kernel, bias)
    if sparse is None or sparse is True:
        return sparse_fn(inputs, kernel, bias)
    sparse = jnp.asarray(sparse)
    if sparse.shape != () or sparse.dtype != jnp.bool_:
        raise ValueError(f"{owner}: `sparse` must be a Python bool or a scalar bool array, got {sparse!r}")
    return lax.cond(sparse, sparse_fn, dense_fn, inputs, kernel, bias)


def _per_layer(do, x):
    """A layer's refresh flag (a scalar, or shape ``x.shape[:-2]`` for a stack of layers) broadcast
    against its ``(..., in, out)`` mask ``x``."""
    do = jnp.asarray(do)
    return jnp.reshape(do, do.shape + (1,) * (jnp.ndim(x) - do.ndim))


def refresh(kernels, olds, transposables, everys, step=None, skip_idle=True):
    """New ``srste`` masks of several layers and the flip rate over the refreshed ones.

    Args:
      kernels: the layers' current ``(in, out)`` kernels, or stacks ``(L, in, out)`` of them
        (``nn.scan``'s layers; every slice refreshed on its own).
      olds: their current masks.
      transposables: per layer, whether its mask is transposable.
      everys: per layer, its refresh period (int or scalar array; values < 1 count as 1; for a
        stack, one per layer of it: shape ``(L,)``).
      step: optimizer step, or ``None`` to refresh every layer. With a step, a layer refreshes
        when ``step % every == 0``; one ``lax.cond`` for all layers skips the mask computation on
        steps where none refreshes (``jit``-friendly).
      skip_idle: with a step, whether that ``lax.cond`` is used. ``False``: no conditional (on a
        GPU, a conditional's predicate is read by the host, which waits for the stream to reach
        it: ~0.5% of a GPT-2 124M step on the H200); every layer's mask is computed and the due ones
        kept -- for a program the host runs only on steps where some layer is due.

    Returns:
      ``(masks, rate)``: the list of masks (a layer not due keeps its old one) and the fraction of
      the refreshed layers' mask entries that changed (0 when none refreshed).
    """
    kernels, olds = list(kernels), list(olds)

    def compute_all(ks):
        return [init_mask(k, t) for k, t in zip(ks, transposables)]

    def do_refresh(dos, ks, olds):
        """New masks (a layer not due keeps its old one), changed entries, entries refreshed."""
        masks = compute_all(ks)
        # `do` is a scalar, or one flag per layer of a stacked (L, in, out) mask (its periods (L,))
        masks = [jnp.where(_per_layer(do, old), m, old) for do, m, old in zip(dos, masks, olds)]
        flips = sum((jnp.sum((m != old) & _per_layer(do, old), dtype=jnp.float32)
                     for do, m, old in zip(dos, masks, olds)), jnp.zeros((), jnp.float32))
        total = sum((jnp.sum(jnp.broadcast_to(jnp.asarray(do), old.shape[:-2]), dtype=jnp.float32)
                     * jnp.float32(np.prod(old.shape[-2:])) for do, old in zip(dos, olds)),
                    jnp.zeros((), jnp.float32))
        return masks, flips, total

    if step is None:
        masks, flips, total = do_refresh([jnp.asarray(True)] * len(kernels), kernels, olds)
    else:
        step = jnp.asarray(step, jnp.int32)
        dos = [(step % jnp.maximum(jnp.asarray(every, jnp.int32), 1)) == 0 for every in everys]
        # One lax.cond for the whole model (a conditional per layer costs a host round trip each on
        # a GPU: ~11 ms of a GPT-2 step with 24 layers). Mask computation, per-layer selection and
        # the flip count all run inside it: a step where no layer refreshes only passes masks through.
        any_do = functools.reduce(jnp.logical_or, [jnp.any(d) for d in dos], jnp.asarray(False))
        zero = jnp.zeros((), jnp.float32)
        if not kernels:
            masks, flips, total = [], zero, zero
        elif skip_idle:
            masks, flips, total = lax.cond(any_do, do_refresh, lambda dos, ks, olds: (olds, zero, zero),
                                           dos, kernels, olds)
        else:
            masks, flips, total = do_refresh(dos, kernels, olds)
    rate = jnp.where(total > 0, flips / jnp.maximum(total, 1.0), 0.0)
    return list(masks), rate
