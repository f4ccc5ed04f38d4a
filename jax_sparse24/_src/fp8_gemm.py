"""The three GEMMs of a 2:4 linear layer in fp8 (``sparse24_linear(..., fp8=True)``).

``forward``           y  = q(x)·q(W̃) · (s_x·s_w)              (T, I) · (I, O)
``input_grad``        ∇x = q(∇y)·q(W̃)ᵀ · (s_g·s_w)            (T, O) · (O, I)
``weight_grad_mvue``  ∇W = q(x)ᵀ·q(MVUE(∇y)) · (s_x·s_m)       (I, T) · (T, O), s_m = 2·s_g

Math and scales: :mod:`jax_sparse24._src.fp8_math` (current scaling; GEMM outputs bfloat16). Each GEMM
runs on the backend :func:`jax_sparse24._src.autotune.resolve` returns with ``fp8=True`` (by name:
:func:`choose`):

* ``"cutlass"`` — on a CUDA device, the fused quantize + mask + compress kernel writes ``q(W̃)ᵀ``
  (forward) or ``q(W̃)`` (input gradient) in CUTLASS's fp8 sparse layout, XLA quantizes the dense
  operand (``x`` or ``∇y``), and the sparse fp8 GEMM applies ``alpha`` in its epilogue
  (:mod:`jax_sparse24._src.cuda_fp8_ops`); on any other platform the same op lowers to the XLA
  math below (:func:`jax_sparse24._src.ffi.per_platform`).
* ``"xla"`` — quantize both operands, :func:`jax_sparse24._src.fp8_math.scaled_matmul` (an fp8 dot with
  float32 accumulation: the same numbers up to the accumulation order). Used on CPUs, for
  ``backend="dense"``/``"reference"``, where the kernels are not built or the shape is not
  aligned (m % 8, n % 16, k % 32), and for ``∇x`` without a transposable mask. Never a silent
  bfloat16 GEMM.

The weight gradient (:func:`~jax_sparse24._src.autotune.fp8_weight_grad_backend`) runs in fp8 where it is sparse: with an MVUE key the
sample of ``∇y`` is 2:4 along the token axis, so on a CUDA device the fused MVUE + quantize +
compress kernel writes ``q(MVUE(∇y))ᵀ`` (O, T) and the sparse fp8 GEMM multiplies it by ``q(x)ᵀ``
(written by the quantize-transpose kernel: the GEMM's dense operand must be K-major), where the shape
is aligned (O % 8, I % 16, T % 32 after padding T with zero rows) and within the kernels' grids
(:func:`~jax_sparse24._src.cuda_fp8_ops.fp8_weight_grad_supports`). Elsewhere — no key, or a shape
where the 16-bit planner takes the exact gradient — it is the 16-bit gradient of
:mod:`jax_sparse24._src.gemm`. ``dense`` / ``reference`` draw the same sample (``ops.mvue24``: on a
GPU the same draws as the kernel) and multiply with XLA's fp8 dot. Under ``jit`` + ``NamedSharding``
the sparse fp8 weight gradient is one custom-partitioned op, like the 16-bit one: it runs on each
device's shards (tokens, and O or I), each token shard drawing its own sample, with a ``psum`` over
sharded tokens.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_sparse24._src import autotune, cuda_mask_ops, ffi, fp8_math, gemm, ops, packed24, reference_ops, partitioning
from jax_sparse24._src.backends import DENSE, Backend, bool_mask, masked_weight
from jax_sparse24._src.backends import pad_rows as _pad_rows

__all__ = ["choose", "weight_amax", "weight_scale", "forward", "input_grad", "weight_grad_mvue", "plan"]


def choose(backend: str, m: int, n: int, k: int) -> str:
    """``"cutlass"`` or ``"xla"`` for the fp8 GEMM D(m×n) = A(m×k, 2:4)·B(k×n): the fp8 label of
    :func:`~jax_sparse24._src.autotune.resolve`'s backend.

    ``auto``: the sparse fp8 kernel wherever it can run (built, aligned, a CUDA device), else XLA's
    fp8 math (no measured fp8 table yet). ``cutlass``: the kernel, RuntimeError where it cannot run.
    ``dense`` / ``reference``: XLA's fp8 math. ``cusparselt``: ValueError (no fp8 cuSPARSELt path).
    """
    return autotune.resolve(backend, "forward", m, n, k, fp8=True).fp8_label


FP8_WGRAD_TOKEN_ALIGN = autotune.FP8_WGRAD_TOKEN_ALIGN


def _padded_tokens(t: int) -> int:
    return t + (-t) % FP8_WGRAD_TOKEN_ALIGN


def plan(backend: str, tokens: int, i: int, o: int, *, transposable: bool) -> tuple[str, str]:
    """``(forward, input_grad)`` of :func:`choose` for a layer ``(i, o)`` at ``tokens`` rows."""
    fwd = autotune.resolve(backend, "forward", o, tokens, i, fp8=True)
    dx = autotune.resolve(backend, "input_grad", i, tokens, o, fp8=True) if transposable else DENSE
    return fwd.fp8_label, dx.fp8_label


def weight_amax(w, mask, dtype):
    """``max |W̃|`` of ``W̃ = w ⊙ mask`` in the compute ``dtype`` (float32 scalar)."""
    return fp8_math.amax(masked_weight(w.astype(dtype), bool_mask(mask)))


def weight_scale(w, mask, dtype):
    """``s_w``: the current scale of ``W̃ = w ⊙ mask`` in the compute ``dtype``."""
    return fp8_math.scale_from_amax(weight_amax(w, mask, dtype))


def _gemm(kind: str, chosen: Backend, b2, w, mask, s_b, s_w):
    """D (n, m) = (s_b·s_w) · q(b2)·orient(q(W̃)): ``kind`` ``"forward"`` (A = q(W̃)ᵀ, b2 = x) or
    ``"input_grad"`` (A = q(W̃), b2 = ∇y; a transposable mask).

    ``"xla"``: XLA's fp8 math (XLA partitions it). ``"cutlass"``: one custom-partitioned op
    (:func:`jax_sparse24._src.partitioning.gemm_rule`, the scales replicated) whose local function
    compresses the local weight shard and runs the sparse fp8 GEMM on the shard's sizes — a shard the
    kernel cannot take runs XLA's fp8 math — with a ``psum`` over a sharded contraction axis.
    """
    transposed = kind == "forward"
    xla = chosen.fp8_weight_gemm_xla(transposed=transposed)
    if not chosen.sparse:
        return xla(b2, w, mask, s_b, s_w)

    def local(b2, wc, mk, s_b, s_w):
        # every size from the shards (never the global shapes); a weight gathered packed (FSDP) arrives as a
        # Packed24 (mk None), which the kernel compresses as it is and XLA's math unpacks
        i, o = wc.shape
        m, k = (o, i) if transposed else (i, o)
        packed = isinstance(wc, packed24.Packed24)
        cuda_fn = (chosen.weight_gemm(m=m, n=b2.shape[0], k=k, transposed=transposed, dtype=b2.dtype, packed=packed)
                   if chosen.can_run(m, b2.shape[0], k) else None)
        ref = xla
        if packed:  # the arrays the kernel reads; XLA's math unpacks them
            ref = lambda b2, values, bits, s_b, s_w: xla(b2, *packed24.unpack24(values, bits), s_b, s_w)  # noqa: E731
            wc, mk = wc.values, wc.bits
        return ffi.per_platform(ref, cuda_fn, b2, wc, mk, s_b, s_w, barrier=True)

    rule = chosen.sharding_rule(kind, packed_weight=True)
    return partitioning.partitioned(rule, local, reference_fn=xla)(b2, w, mask, s_b, s_w)


def forward(x2, w, mask, *, backend: str, scales=None):
    """``(y (T, O) bfloat16, s_x, s_w)``: the fp8 forward, and the scales the backward reuses.

    ``scales``: ``(s_x, s_w)`` to quantize with (delayed scaling), or None for their current scales.
    """
    dtype = jnp.result_type(x2, w)
    x2, wc, mk = x2.astype(dtype), w.astype(dtype), bool_mask(mask)
    t, i = x2.shape
    o = wc.shape[1]
    s_x, s_w = (fp8_math.current_scale(x2), weight_scale(wc, mk, dtype)) if scales is None else scales
    chosen = autotune.resolve(backend, "forward", o, t, i, fp8=True)
    # y (T, O) = q(x)·q(W̃): D (T, O) with A = q(W̃)ᵀ (O, I), 2:4 along I
    return _gemm("forward", chosen, x2, wc, mk, s_x, s_w), s_x, s_w


def input_grad(g2, w, mask, s_w, *, transposable: bool, backend: str, s_g=None):
    """``∇x (T, I)`` bfloat16 = q(∇y)·q(W̃)ᵀ · (s_g·s_w) with the forward's ``s_w`` (``s_g``: given,
    delayed scaling, or ``∇y``'s current scale)."""
    dtype = jnp.result_type(g2, w)
    g2, wc, mk = g2.astype(dtype), w.astype(dtype), bool_mask(mask)
    t, o = g2.shape
    i = wc.shape[0]
    s_g = fp8_math.current_scale(g2) if s_g is None else s_g
    # ∇x needs q(W̃) 2:4 along `out` for the sparse kernel: without a transposable mask, XLA's fp8 math.
    chosen = autotune.resolve(backend, "input_grad", i, t, o, fp8=True) if transposable else DENSE
    # ∇x (T, I) = q(∇y)·q(W̃)ᵀ: D (T, I) with A = q(W̃) (I, O), 2:4 along O
    return _gemm("input_grad", chosen, g2, wc, mk, s_g, s_w)


def weight_grad_mvue(key, x2, g2, s_x, *, backend: str, precision=None, s_g=None):
    """``∇W (I, O)`` with an MVUE key, as :func:`~jax_sparse24._src.autotune.fp8_weight_grad_backend` says: bfloat16
    ``q(x)ᵀ·q(MVUE(∇y)) · (s_x·s_m)`` (MVUE groups of 4 along the tokens), or the 16-bit
    ``gemm.weight_grad_mvue``.

    Tokens are padded with zero rows (to 32 for the kernel, 4 otherwise; a zero row changes
    nothing). ``s_x`` is the forward's scale of ``x``; ``s_m = fp8_math.mvue_scale(∇y)``, or twice ``s_g``
    where it is given (delayed scaling).
    """
    dtype = jnp.result_type(x2, g2)
    t, i = x2.shape
    o = g2.shape[1]
    chosen = autotune.fp8_weight_grad_backend(backend, t, i, o, dtype, mvue=True)
    if chosen is None:
        return gemm.weight_grad_mvue(key, x2, g2, backend=backend, precision=precision)
    x2, g2 = x2.astype(dtype), g2.astype(dtype)
    # from the whole ∇y (XLA partitions the reduction), or from the delayed scale of ∇y
    s_m = fp8_math.mvue_scale(g2) if s_g is None else fp8_math.mvue_scale_from(s_g)

    fp8_dot = chosen.fp8_weight_grad_xla

    if not chosen.sparse:
        # ops.mvue24: the CUDA draws on a GPU (those of the kernel), the reference on a CPU; itself partitioned
        return fp8_dot(_pad_rows(x2, 4), ops.mvue24(key, _pad_rows(g2, 4), axis=0), s_x, s_m)

    def reference_fn(key, x2, g2, s_x, s_m):
        return fp8_dot(_pad_rows(x2, 4), reference_ops.mvue24(key, _pad_rows(g2, 4), axis=0), s_x, s_m)

    def local(key, x2, g2, s_x, s_m):
        # On the local shards (every size from the shards, never from the global (o, i, t) above).
        tl, il = x2.shape
        ol = g2.shape[1]
        tp = _padded_tokens(tl)

        def sample_fp8_dot(key, x2, g2, s_x, s_m):  # a shard the kernels cannot take: same draws, XLA's fp8 dot
            xp, gp = _pad_rows(x2, FP8_WGRAD_TOKEN_ALIGN), _pad_rows(g2, FP8_WGRAD_TOKEN_ALIGN)
            return fp8_dot(xp, cuda_mask_ops.mvue24_cuda(key, gp, axis=0), s_x, s_m)

        # D (I, O) = q(x)ᵀ (I, Tp) · q(MVUE(∇y)) (Tp, O)
        cuda_fn = (chosen.mvue_weight_grad(o=ol, i=il, tl=tl, tokens=tp, align=FP8_WGRAD_TOKEN_ALIGN, dtype=dtype)
                   if chosen.can_run(ol, il, tp, gemm="weight_grad") else sample_fp8_dot)
        return ffi.per_platform(reference_fn, cuda_fn, key, x2, g2, s_x, s_m)

    # Partitioned as the 16-bit MVUE weight gradient (gemm.weight_grad_mvue): tokens contracted (a psum
    # over a sharded token axis), the key folded with the token shard's index; the scales replicated.
    typed = jnp.issubdtype(jnp.result_type(key), jax.dtypes.prng_key)
    kdims = () if typed else tuple(f"k{j}" for j in range(jnp.ndim(key)))
    rule = partitioning.Rule("sparse24 fp8 weight-gradient GEMM (MVUE)", (kdims, ("t", "i"), ("t", "o"), (), ()),
                    (("i", "o"),), contract=("t",), multiple_of=(("t", 4),), replicated=kdims, fold_key=(0, 2))
    return partitioning.partitioned(rule, local, reference_fn=reference_fn)(key, x2, g2, s_x, s_m)
