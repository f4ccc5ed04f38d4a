"""The three GEMMs of a 2:4 linear layer, per backend.

``forward``      y  = x · (W ⊙ M)          (T, I) · (I, O)
``input_grad``   ∇x = ∇y · (W ⊙ M)ᵀ        (T, O) · (O, I)
``weight_grad``  ∇W = xᵀ · G               (I, T) · (T, O), G = ∇y or MVUE(∇y)

Backends (one object each, :mod:`jax_sparse24._src.backends`): ``reference`` and ``dense`` — XLA's
GEMM on the masked weight, every platform; ``cutlass`` and ``cusparselt`` — the sparse GEMMs on a
CUDA device (the same math, dense, on any other platform), RuntimeError where they cannot run the
shape/dtype; ``auto`` — the planner's choice from the measured table (``spmm_autotune.json``).

This module runs the GEMMs: which backend each runs is decided by the planner
(:func:`jax_sparse24._src.autotune.resolve`, :func:`~jax_sparse24._src.autotune.weight_grad_path`), and
the chosen backend object (:mod:`jax_sparse24._src.backends`) gives the CUDA lowering; GEMMs on a weight
compressed once for many calls are in :mod:`jax_sparse24._src.prepared_weight`. Each GEMM is one
custom-partitioned op (:func:`jax_sparse24._src.partitioning.partitioned_gemm`, rule
:func:`~jax_sparse24._src.partitioning.gemm_rule`): under ``jit`` + ``NamedSharding`` it runs on the local
shards (local shapes, so the backend choice and any compression are per shard) with a ``psum`` over a
sharded contraction axis, instead of having its operands all-gathered.

Sparse formulation: the 2:4 operand is CUTLASS's A (K-major);
``y (T, O) = x (T, I) · W̃``  is  D(O×T) = W̃ᵀ(O×I) · xᵀ  with x and y used in place, and
``∇x (T, I) = ∇y · W̃ᵀ`` is D(I×T) = W̃(I×O) · ∇yᵀ (needs W̃ 2:4 along O: a transposable mask).
The weight operands are compressed by one fused pass over W and the mask
(:func:`~jax_sparse24._src.cuda_compress_ops.masked_compress`). Under FSDP the forward and input-gradient
GEMMs receive the weight all-gathered packed (:class:`~jax_sparse24._src.packed24.Packed24`, ``w`` in
place of W and ``None`` for the mask): the sparse GEMMs compress the encoding directly
(:func:`~jax_sparse24._src.cuda_compress_ops.packed_compress`), the dense ones unpack it.

``weight_grad_mvue`` (``∇W = xᵀ·MVUE(∇y)``, MVUE groups along tokens) is sparse too:
D(O×I) = MVUE(∇y)ᵀ(O×T) · x(T×I) with the MVUE sample drawn and compressed in one pass over ∇y
(:func:`~jax_sparse24._src.cuda_compress_ops.mvue24_compress`, no transpose materialised) and B = x
read N-major in place (:func:`~jax_sparse24._src.cuda_spmm_ops.cutlass_spmm_kn`), so ∇W comes out
as (I, O) — Flax layout.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_sparse24._src import autotune, cuda_mask_ops, ffi, ops, packed24, reference_ops, partitioning
from jax_sparse24._src.backends import DENSE, Backend, bool_mask, masked_weight
from jax_sparse24._src.backends import pad_rows as _pad_rows

__all__ = ["forward", "input_grad", "weight_grad", "weight_grad_mvue", "masked_weight", "bool_mask"]


def _dot(a, b, precision):
    return jnp.dot(a, b, precision=precision)


def _masked(w, mask, dtype):
    """W̃ in ``dtype``: ``w ⊙ mask``, or a packed weight (:class:`~jax_sparse24._src.packed24.Packed24`,
    ``mask`` None) unpacked."""
    if isinstance(w, packed24.Packed24):
        return packed24.unpacked_weight(w.values, w.bits).astype(dtype)
    return masked_weight(w, mask).astype(dtype)


def _weight_gemm(chosen: Backend, b2, w, mask, dense, *, m: int, n: int, k: int, transposed: bool, dtype):
    """``D (n, m) = b2 (n, k) · Aᵀ`` with the 2:4 operand A made from W ⊙ M in one fused pass:
    ``transposed=True``: A = W̃ᵀ (O, I) (the forward GEMM), False: A = W̃ (I, O) (the input gradient),
    on the ``chosen`` sparse backend; ``dense(b2, W̃)`` off CUDA. A packed ``w`` (``mask`` None) is
    compressed from its encoding."""
    packed = isinstance(w, packed24.Packed24)
    sparse = chosen.weight_gemm(m=m, n=n, k=k, transposed=transposed, dtype=dtype,
                                config_of=lambda *a: autotune.kernel_config(chosen, *a), packed=packed)
    # the two arrays the kernel reads, and how the reference makes W̃ of them
    a, b = (w.values.astype(dtype), w.bits) if packed else (w.astype(dtype), bool_mask(mask))
    weight_of = packed24.unpacked_weight if packed else masked_weight
    dense3 = lambda b2, a, b: dense(b2, weight_of(a, b))  # noqa: E731
    return ffi.per_platform(dense3, sparse, b2, a, b, barrier=True)


@partitioning.partitioned_gemm("forward", packed_weight=True)
def forward(x2, w, mask, *, backend: str, precision=None):
    dtype = jnp.result_type(x2, w.dtype)
    x2 = x2.astype(dtype)
    t, i = x2.shape
    o = w.shape[1]
    dense = lambda x2, wm: DENSE.forward(x2, wm, precision)  # noqa: E731
    chosen = autotune.resolve(backend, "forward", o, t, i, dtype)
    if not chosen.sparse:
        return dense(x2, _masked(w, mask, dtype))
    # y (T, O) = x · W̃: D (T, O) with A = W̃ᵀ (O, I), 2:4 along I
    return _weight_gemm(chosen, x2, w, mask, dense, m=o, n=t, k=i, transposed=True, dtype=dtype)


@partitioning.partitioned_gemm("input_grad", packed_weight=True)
def input_grad(g2, w, mask, *, transposable: bool, backend: str, precision=None):
    dtype = jnp.result_type(g2, w.dtype)
    g2 = g2.astype(dtype)
    t, o = g2.shape
    i = w.shape[0]
    dense = lambda g2, wm: DENSE.input_grad(g2, wm, precision)  # noqa: E731
    # ∇x needs W̃ 2:4 along `out`; without a transposable mask it stays dense.
    chosen = autotune.resolve(backend, "input_grad", i, t, o, dtype) if transposable else DENSE
    if not chosen.sparse:
        return dense(g2, _masked(w, mask, dtype))
    # ∇x (T, I) = ∇y · W̃ᵀ: D (T, I) with A = W̃ (I, O), 2:4 along O
    return _weight_gemm(chosen, g2, w, mask, dense, m=i, n=t, k=o, transposed=False, dtype=dtype)


@partitioning.partitioned_gemm("weight_grad")
def weight_grad(x2, g2, *, backend: str, precision=None):
    # Dense GEMM (xᵀ·G): the sparse weight-gradient GEMM needs a fused MVUE+compress kernel.
    dtype = jnp.result_type(x2, g2)
    # Both operands materialised before the GEMM: without the barrier XLA fused the producer of ∇y
    # (the concatenation of a fused gate/up projection's two gradients) into a Triton GEMM fusion
    # that ran at ~60% of cuBLAS's rate (0.41 ms per LLaMA-300M layer at 16384 tokens; the srste
    # step went from 1.062x to 1.158x dense with the barrier, measured on an H100). ∇y is materialised
    # anyway for the input gradient.
    x2, g2 = jax.lax.optimization_barrier((x2.astype(dtype), g2.astype(dtype)))
    return DENSE.weight_grad(x2, g2, precision)


# --- Sparse weight gradient ----------------------------------------------------------------------
#: Token padding of the sparse weight-gradient GEMM (K = tokens a multiple of 16); defined with the
#: decision that pads the same way (:func:`~jax_sparse24._src.autotune.weight_grad_path`).
_WGRAD_TOKEN_ALIGN = autotune.WGRAD_TOKEN_ALIGN


def _mvue_weight_grad_reference(key, x2, g2, precision):
    """``xᵀ·MVUE(∇y)`` in plain jnp (tokens padded to a multiple of 4 with zero rows)."""
    xp, gp = _pad_rows(x2, 4), _pad_rows(g2, 4)
    return _dot(xp.T, reference_ops.mvue24(key, gp, axis=0), precision)


def weight_grad_mvue(key, x2, g2, *, backend: str, precision=None):
    """``∇W (I, O) = xᵀ·MVUE(∇y)``, MVUE groups of 4 along the token axis.

    ``cutlass`` (or ``auto`` where the measured table says so): one fused pass draws the MVUE sample
    of ``∇y`` and writes it compressed as the sparse GEMM's A operand (``MVUE(∇y)ᵀ``, no transpose
    materialised), then the "kn" sparse GEMM reads ``x`` in place. ``auto`` elsewhere (every CPU,
    and GPU shapes where the sparse path is measured slower than XLA's dense ``xᵀ·∇y``): the exact
    dense gradient, no MVUE. ``dense`` / ``reference``: the MVUE op (``ops.mvue24``) then the dense
    :func:`weight_grad` (the sparse path's math, for tests and quality studies). The CUDA sample is drawn with the
    same generator in both paths on a GPU (the CPU reference draws differently: same distribution).
    Under sharding the op runs on each device's shards (tokens, and O or I under tensor parallelism);
    a shard whose sizes the sparse kernel does not take draws the same sample and multiplies dense.

    Args:
      key: PRNG key of the MVUE sample.
      x2: (T, I) layer input; g2: (T, O) output gradient. Tokens are padded with zero rows (16 for
        the sparse kernel, 4 otherwise), which changes nothing: a zero gradient row stays zero.
    """
    dtype = jnp.result_type(x2, g2)
    t, i = x2.shape
    o = g2.shape[1]
    path = autotune.weight_grad_path(backend, o, i, t, dtype)
    if not path.mvue:
        return weight_grad(x2, g2, backend=path.backend.name, precision=precision)
    chosen = path.backend
    if not chosen.sparse:
        gs = ops.mvue24(key, _pad_rows(g2, 4), axis=0)
        return weight_grad(_pad_rows(x2, 4), gs, backend=backend, precision=precision)
    x2, g2 = x2.astype(dtype), g2.astype(dtype)

    def reference_fn(key, x2, g2):
        return _mvue_weight_grad_reference(key, x2, g2, precision)

    def local(key, x2, g2):
        # On the local shards: the tokens of a data-parallel shard, and O (or I) of a tensor-parallel
        # one — every size below comes from the shards, never from the global (o, i, t) above.
        tl, i = x2.shape
        o = g2.shape[1]
        tlp = tl + (-tl) % _WGRAD_TOKEN_ALIGN
        cfg = autotune.lookup_weight_grad(o, i, tlp, dtype)

        def mvue_dense(key, x2, g2):  # a shard the sparse kernel cannot take: the same draws, dense GEMM
            gs = cuda_mask_ops.mvue24_cuda(key, _pad_rows(g2, _WGRAD_TOKEN_ALIGN), axis=0)
            return _dot(_pad_rows(x2, _WGRAD_TOKEN_ALIGN).T, gs, precision)

        cuda_fn = (chosen.mvue_weight_grad(o=o, i=i, tl=tl, tokens=tlp, align=_WGRAD_TOKEN_ALIGN, dtype=dtype,
                                           config=-1 if cfg is None else cfg[1])
                   if chosen.supports(o, i, tlp, dtype, gemm="weight_grad") else mvue_dense)
        return ffi.per_platform(reference_fn, cuda_fn, key, x2, g2)

    # Partitioned like the dense weight gradient (tokens contracted: psum over a sharded token axis),
    # with the key folded with the index of the token shard as the MVUE op does (partitioning.mvue_rule),
    # so every shard draws its own sample — the same draws as the unfused path.
    typed = jnp.issubdtype(jnp.result_type(key), jax.dtypes.prng_key)
    kdims = () if typed else tuple(f"k{j}" for j in range(jnp.ndim(key)))
    rule = partitioning.Rule("sparse24 weight-gradient GEMM (MVUE)", (kdims, ("t", "i"), ("t", "o")), (("i", "o"),),
                    contract=("t",), multiple_of=(("t", 4),), replicated=kdims, fold_key=(0, 2))
    return partitioning.partitioned(rule, local, reference_fn=reference_fn)(key, x2, g2)
