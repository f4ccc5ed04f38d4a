"""The two weight GEMMs of a 2:4 linear layer in fp8 (``sparse24_linear(..., fp8=True)``).

``forward``     y  = q(x)·q(W̃) · (s_x·s_w)        (T, I) · (I, O)
``input_grad``  ∇x = q(∇y)·q(W̃)ᵀ · (s_g·s_w)      (T, O) · (O, I)

Math and scales: :mod:`jax_sparse24._src.fp8` (current scaling; GEMM outputs bfloat16). Each GEMM
runs as :func:`choose` says:

* ``"cutlass"`` — on a CUDA device, the fused quantize + mask + compress kernel writes ``q(W̃)ᵀ``
  (forward) or ``q(W̃)`` (input gradient) in CUTLASS's fp8 sparse layout, XLA quantizes the dense
  operand (``x`` or ``∇y``), and the sparse fp8 GEMM applies ``alpha`` in its epilogue
  (:mod:`jax_sparse24._src.cuda_fp8_ops`); on any other platform the same op lowers to the XLA
  math below (:func:`jax_sparse24._src.ffi.per_platform`).
* ``"xla"`` — quantize both operands, :func:`jax_sparse24._src.fp8.scaled_matmul` (an fp8 dot with
  float32 accumulation: the same numbers up to the accumulation order). Used on CPUs, for
  ``backend="dense"``/``"reference"``, where the kernels are not built or the shape is not
  aligned (m % 8, n % 16, k % 32), and for ``∇x`` without a transposable mask. Never a silent
  bfloat16 GEMM.

The weight gradient is not here: it stays the 16-bit GEMM of :mod:`jax_sparse24._src.gemm`.
"""

from __future__ import annotations

import jax.numpy as jnp

from jax_sparse24._src import ffi
from jax_sparse24._src import fp8
from jax_sparse24._src.gemm import bool_mask, masked_weight

__all__ = ["choose", "weight_scale", "forward", "input_grad", "plan"]


def _fp8_reason(m: int, n: int, k: int) -> str | None:
    """Why the fp8 sparse kernels cannot run D(m×n) = A(m×k)·B(k×n) here (None: they can)."""
    if ffi.extension() is None:
        return ffi.extension_error()
    from jax_sparse24._src import cuda_fp8_ops as cf

    if not cf.fp8_kernels_built():
        return "the loaded extension was built without the fp8 kernels"
    if not cf.fp8_gemm_supports(m, n, k):
        am, an, ak = cf.cutlass_alignment_fp8()
        return f"the fp8 sparse GEMM needs m % {am}, n % {an}, k % {ak} == 0, got m={m}, n={n}, k={k}"
    return None


def choose(backend: str, m: int, n: int, k: int) -> str:
    """``"cutlass"`` or ``"xla"`` for the fp8 GEMM D(m×n) = A(m×k, 2:4)·B(k×n).

    ``auto``: the sparse fp8 kernel wherever it can run (built, aligned, a CUDA device), else XLA's
    fp8 math (no measured fp8 table yet). ``cutlass``: the kernel, RuntimeError where it cannot run.
    ``dense`` / ``reference``: XLA's fp8 math. ``cusparselt``: ValueError (no fp8 cuSPARSELt path).
    """
    if backend in ("dense", "reference"):
        return "xla"
    if backend == "cusparselt":
        raise ValueError("fp8=True: backend='cusparselt' has no fp8 path in this version; use 'auto', "
                         "'cutlass', 'dense' or 'reference'")
    reason = _fp8_reason(m, n, k)
    if backend == "cutlass":
        if reason is not None:
            raise RuntimeError(f"backend='cutlass' with fp8=True: {reason}")
        return "cutlass"
    return "cutlass" if reason is None and ffi.cuda_kernels_available() else "xla"


def plan(backend: str, tokens: int, i: int, o: int, *, transposable: bool) -> tuple[str, str]:
    """``(forward, input_grad)`` of :func:`choose` for a layer ``(i, o)`` at ``tokens`` rows."""
    fwd = choose(backend, o, tokens, i)
    dx = choose(backend, i, tokens, o) if transposable else "xla"
    return fwd, dx


def weight_scale(w, mask, dtype):
    """``s_w``: the current scale of ``W̃ = w ⊙ mask`` in the compute ``dtype``."""
    return fp8.current_scale(masked_weight(w.astype(dtype), bool_mask(mask)))


def _gemm(chosen: str, b2, w, mask, s_b, s_w, *, m: int, k: int, transposed: bool):
    """D (n, m) = alpha · q(b2)·orient(q(W̃)) with A = q(W̃)ᵀ (``transposed``: forward) or q(W̃)."""
    alpha = s_b * s_w

    def xla(b2, wc, mk, s_b, s_w, alpha):
        qw = fp8.quantize(masked_weight(wc, mk), s_w)  # (I, O)
        return fp8.scaled_matmul(fp8.quantize(b2, s_b), qw, alpha, transpose_b=not transposed)

    if chosen != "cutlass":
        return xla(b2, w, mask, s_b, s_w, alpha)

    def cuda(b2, wc, mk, s_b, s_w, alpha):
        from jax_sparse24._src import cuda_fp8_ops as cf

        values, meta = cf.fp8_masked_compress(wc, mk, s_w, transposed=transposed)
        return cf.cutlass_spmm_fp8(values, meta, fp8.quantize(b2, s_b), alpha, m=m, k=k)

    return ffi.per_platform(xla, cuda, b2, w, mask, s_b, s_w, alpha)


def forward(x2, w, mask, *, backend: str):
    """``(y (T, O) bfloat16, s_w)``: the fp8 forward, and the weight scale for :func:`input_grad`."""
    dtype = jnp.result_type(x2, w)
    x2, wc, mk = x2.astype(dtype), w.astype(dtype), bool_mask(mask)
    t, i = x2.shape
    o = wc.shape[1]
    s_x, s_w = fp8.current_scale(x2), weight_scale(wc, mk, dtype)
    chosen = choose(backend, o, t, i)
    # y (T, O) = q(x)·q(W̃): D (T, O) with A = q(W̃)ᵀ (O, I), 2:4 along I
    return _gemm(chosen, x2, wc, mk, s_x, s_w, m=o, k=i, transposed=True), s_w


def input_grad(g2, w, mask, s_w, *, transposable: bool, backend: str):
    """``∇x (T, I)`` bfloat16 = q(∇y)·q(W̃)ᵀ · (s_g·s_w) with the forward's ``s_w``."""
    dtype = jnp.result_type(g2, w)
    g2, wc, mk = g2.astype(dtype), w.astype(dtype), bool_mask(mask)
    t, o = g2.shape
    i = wc.shape[0]
    s_g = fp8.current_scale(g2)
    # ∇x needs q(W̃) 2:4 along `out` for the sparse kernel: without a transposable mask, XLA's fp8 math.
    chosen = choose(backend, i, t, o) if transposable else "xla"
    # ∇x (T, I) = q(∇y)·q(W̃)ᵀ: D (T, I) with A = q(W̃) (I, O), 2:4 along O
    return _gemm(chosen, g2, wc, mk, s_g, s_w, m=i, k=o, transposed=False)
